"""A Triton GEMV for decode steps with few token rows (the "skinny GEMM" of B = 1 decoding).

At one to a few token rows a decode step's projections are matrix-vector products: every weight byte is
read once and used for one multiply-add per row. cuBLAS picks GEMM tiles for them that leave most of the
H200's memory bandwidth unused: on a Qwen3-0.6B shape at B = 1 its four projections per layer ran at
0.8-1.6 TB/s (28 us of a 6.5 us bandwidth bound per layer; ``bench/results/forward_profile_h200.json``,
revision ``f93ac52``), so a step cost 1.44 ms against a 0.28 ms bound. :func:`gemv` reads the weight
in ``[BLOCK_N, BLOCK_K]`` tiles, one program per ``BLOCK_N`` outputs for up to 8 rows, with float32
accumulation; on the same shapes it runs at 1.2-4.2x cuBLAS's speed at ``M = 1`` (``bench/gemv_bench.py``).
From ``M = 2``-4 up cuBLAS is as fast or faster on the larger projections, so the model uses it for
single-row forwards only (:data:`GEMV_MAX_ROWS`).

* **Per-row results do not depend on the number of rows**: each row's products and tile reductions are
  the same whatever the number of rows (the order depends only on ``(N, K)``, :func:`gemv_config`).
* ``silu_input=True`` takes ``gate_up = cat(gate, up)`` ``[M, 2K]`` and multiplies ``silu(gate) * up``
  (rounded to the dtype as :func:`~gpu_engine.model.fused_ops.silu_mul` rounds it) into the weight: the
  MLP's down projection without the SiLU kernel, the same numbers as ``gemv(silu_mul(gate_up), w)``.
* :func:`add_rms_norm_gemv` does the residual add and RMSNorm before a projection in the same kernel
  (each program normalises the row itself), so a one-row layer is six kernels: two norm + projection,
  RoPE + KV write, attention, the output projection and the SiLU + down projection.

Used by :meth:`~gpu_engine.model.llama.LlamaModel._forward_fused` for forwards of at most
``GEMV_MAX_ROWS`` token rows (CUDA; ``TRITON_INTERPRET=1`` on the CPU for tests).
"""
from __future__ import annotations

import functools
import math
import os

import torch

from gpu_engine.model.fused_ops import next_pow2

__all__ = ["GEMV_MAX_ROWS", "NORM_FUSE_MAX_K", "add_rms_norm_gemv", "fits_one_tile", "gemv", "gemv_config",
           "gemv_max_rows", "norm_fusion_pays"]

#: Forwards with at most this many token rows (B * T) use :func:`gemv` for their layer projections on
#: the fused (Triton) path (``NINFER_GEMV_MAX_ROWS`` overrides; 0 = never). From ``bench/gemv_bench.py``
#: on the H200: at M = 1 every layer projection of the three shapes was faster than cuBLAS, at M = 2 the
#: larger ones were 5-10% slower, at M = 4 most were 20-50% slower.
GEMV_MAX_ROWS = 1
#: The add + RMSNorm is fused into a projection only for hidden sizes up to this: every program normalises
#: its rows again (about 1.5x the weight's bytes in extra L2 reads at two outputs per program), which paid
#: at hidden size 576 and 1,024 (SmolLM2 B = 1 step 0.741 -> 0.676 ms, Qwen3-0.6B 1.001 -> 0.990 ms) and
#: cost at 4,096 (Llama-3.1-8B 4.505 -> 4.774 ms; H200, ``bench/forward_profile.py``).
NORM_FUSE_MAX_K = 1024
#: Rows per kernel launch (each program keeps them all in registers); more rows take more launches.
MAX_ROWS_PER_CALL = 8


def gemv_max_rows() -> int:
    """``NINFER_GEMV_MAX_ROWS`` if set (an int >= 0), else :data:`GEMV_MAX_ROWS`.

    Raises:
        ValueError: the variable is not a non-negative integer.
    """
    v = os.environ.get("NINFER_GEMV_MAX_ROWS", "").strip()
    if not v:
        return GEMV_MAX_ROWS
    if not (v.isascii() and v.isdigit()):  # isdigit alone takes other scripts' digits and "\u00b2"
        raise ValueError(f"NINFER_GEMV_MAX_ROWS must be an integer >= 0, got {v!r}")
    return int(v)


def gemv_config(n: int, k: int) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_K, num_warps)`` for an ``[N, K]`` weight: a function of the shape only, so a
    row's summation order is the same for any number of rows.

    Two outputs per program (the most programs, so the most loads in flight per SM) and a ``K`` tile of
    up to 4,096 elements: the best or within 5% of the best of a 4 x 4 x 3 grid for every layer projection of
    the SmolLM2-135M, Qwen3-0.6B and Llama-3.1-8B shapes at ``M = 1`` on the H200 (``bench/gemv_bench.py
    --sweep``, ``bench/results/gemv_sweep_m1_h200.json``).
    """
    block_k = min(4096, max(16, next_pow2(k)))
    return 2, block_k, 8 if block_k >= 4096 else 4


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _gemv(x_ptr, w_ptr, b_ptr, o_ptr, d_ptr, nw_ptr, xo_ptr, M, N, K, SX, SO, eps,
              HAS_B: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr, HAS_D: tl.constexpr,
              M_P2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        nb = tl.program_id(0)
        dt = o_ptr.dtype.element_ty
        rn = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < N
        rk = tl.arange(0, BLOCK_K)
        rows = tl.arange(0, M_P2)
        acc = tl.zeros([M_P2, BLOCK_N], tl.float32)
        wrow = w_ptr + rn.to(tl.int64)[:, None] * K
        sx = tl.cast(SX, tl.int64)  # row offsets m * SX in int64: a strided x can have 7 * SX >= 2**31
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            kmask = kk < K
            w = tl.load(wrow + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            # each row: the same products and the same tile reduction whatever M_P2 is, so a row's
            # bits do not depend on how many rows share the call
            for m in tl.static_range(M_P2):
                xm = kmask & (tl.full([BLOCK_K], m, tl.int32) < M)
                if SILU:
                    g = tl.load(x_ptr + m * sx + kk, mask=xm, other=0.0).to(tl.float32)
                    u = tl.load(x_ptr + m * sx + K + kk, mask=xm, other=0.0).to(tl.float32)
                    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
                    x = (s * u).to(dt).to(tl.float32)
                elif NORM:  # one K tile (checked by the caller): the row's add + RMSNorm, as add_rms_norm
                    x = tl.load(x_ptr + m * sx + kk, mask=xm, other=0.0)
                    if HAS_D:
                        d = tl.load(d_ptr + m * K + kk, mask=xm, other=0.0)
                        x = (x.to(tl.float32) + d.to(tl.float32)).to(dt)
                        if nb == 0:  # the new residual, once per row, into a separate tensor
                            tl.store(xo_ptr + m * K + kk, x, mask=xm)
                    xf = x.to(tl.float32)
                    r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / K + eps)
                    nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
                    x = (nw * (xf * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
                else:
                    x = tl.load(x_ptr + m * sx + kk, mask=xm, other=0.0).to(tl.float32)
                part = tl.sum(w * x[None, :], axis=1)
                acc = tl.where(rows[:, None] == m, acc + part[None, :], acc)
        if HAS_B:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(o_ptr + rows.to(tl.int64)[:, None] * SO + rn[None, :], acc.to(dt),
                 mask=(rows < M)[:, None] & nmask[None, :])

    return _gemv


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         silu_input: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for few rows, as a Triton GEMV (float32 accumulation).

    Args:
        x: ``[..., K]`` (or ``[..., 2K]`` with ``silu_input``), model dtype; any row stride (a last
            stride other than 1 is copied to a contiguous tensor first).
        weight: ``[N, K]`` contiguous, same dtype.
        bias: ``None`` or ``[N]`` with unit stride (any float dtype; added in float32).
        silu_input: multiply by ``silu(gate) * up`` of ``x = cat(gate, up, -1)`` (SwiGLU, Shazeer 2020).
    Returns:
        ``[..., N]`` in ``x.dtype``.
    Raises:
        ValueError: shapes or layouts that do not fit (including a bias that is not ``[N]`` with unit stride).
    """
    n, k = weight.shape
    width = 2 * k if silu_input else k
    if x.shape[-1] != width or not weight.is_contiguous() or x.dtype != weight.dtype:
        raise ValueError(f"gemv: x {tuple(x.shape)} {x.dtype} does not fit weight {tuple(weight.shape)} "
                         f"{weight.dtype} (contiguous weight, last dim {width})")
    _check_vector("gemv: bias", bias, n)
    x2 = x.reshape(math.prod(x.shape[:-1]), width)  # not -1: a 0-element x (K = 0) has no inferable rows
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = _launch(x2, weight, bias, silu=silu_input)
    return out.view(*x.shape[:-1], n)


def add_rms_norm_gemv(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add, RMSNorm and the projection in one kernel:
    ``x_new = x + delta``; ``out = F.linear(norm_weight * RMSNorm(x_new), weight, bias)``.

    Each program normalises its rows itself (the whole row is one ``K`` tile), with the roundings of
    :func:`~gpu_engine.model.fused_ops.add_rms_norm`; the first program also stores ``x_new``. RMSNorm:
    Zhang & Sennrich 2019, float32 statistics as Hugging Face's ``LlamaRMSNorm``.

    Args:
        x: ``[..., K]`` contiguous residual stream, model dtype (not modified).
        delta: ``None`` (``x_new = x``) or the same shape and dtype, contiguous (may be ``x`` itself).
        norm_weight: ``[K]`` with unit stride; eps: the norm's epsilon.
        weight: ``[N, K]`` contiguous, same dtype as ``x``; bias: ``None`` or ``[N]`` with unit stride.
    Returns:
        ``(out [..., N], x_new [..., K])``; ``x_new`` is ``x`` itself when ``delta`` is ``None``.
    Raises:
        ValueError: shapes, dtypes or layouts that do not fit, or ``K`` over one tile (:func:`fits_one_tile`).
    """
    n, k = weight.shape
    if (x.shape[-1] != k or not x.is_contiguous() or x.dtype != weight.dtype or not weight.is_contiguous()
            or (delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype
                                       or not delta.is_contiguous()))):
        raise ValueError(f"add_rms_norm_gemv: x {tuple(x.shape)} / delta does not fit weight {tuple(weight.shape)}")
    _check_vector("add_rms_norm_gemv: bias", bias, n)
    _check_vector("add_rms_norm_gemv: norm_weight", norm_weight, k)
    if not fits_one_tile(n, k):
        raise ValueError(f"add_rms_norm_gemv: K = {k} is over one tile ({gemv_config(n, k)[1]})")
    rows = math.prod(x.shape[:-1])
    x2 = x.reshape(rows, k)
    x_new = x if delta is None else torch.empty_like(x)
    out = _launch(x2, weight, bias, norm=(None if delta is None else delta.reshape(rows, k), norm_weight,
                                          x_new.reshape(rows, k), float(eps)))
    return out.view(*x.shape[:-1], n), x_new


def _launch(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool = False,
            norm: tuple | None = None) -> torch.Tensor:
    """Run the kernel over the ``[rows, width]`` input ``x2`` (unit last stride), :data:`MAX_ROWS_PER_CALL`
    rows per launch: ``[rows, N]`` output in ``x2.dtype``. ``norm`` = ``(delta [rows, K] or None, norm_weight,
    x_new [rows, K], eps)`` selects the add + RMSNorm input (``x2`` is then the residual, contiguous)."""
    n, k = weight.shape
    rows = x2.shape[0]
    out = torch.empty(rows, n, device=x2.device, dtype=x2.dtype)
    delta, norm_weight, x_new, eps = norm if norm is not None else (None, x2, x2, 0.0)
    d2 = x2 if delta is None else delta
    block_n, block_k, warps = gemv_config(n, k)
    for r0 in range(0, rows, MAX_ROWS_PER_CALL):
        r = min(MAX_ROWS_PER_CALL, rows - r0)
        _kernel()[(-(-n // block_n),)](
            x2[r0:], weight, weight if bias is None else bias, out[r0:], d2[r0:], norm_weight, x_new[r0:], r, n, k,
            x2.stride(0), out.stride(0), eps, HAS_B=bias is not None, SILU=silu, NORM=norm is not None,
            HAS_D=delta is not None, M_P2=next_pow2(r), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return out


def _check_vector(what: str, v: torch.Tensor | None, size: int) -> None:
    """The kernel reads ``v[i]`` at ``v_ptr + i``: ``v`` must be ``None`` or ``[size]`` with unit stride.

    Raises:
        ValueError: otherwise (the kernel would read past its end, or the wrong elements).
    """
    if v is not None and (v.dim() != 1 or v.shape[0] != size or (size > 1 and v.stride(0) != 1)):
        raise ValueError(f"{what} {tuple(v.shape)} (stride {tuple(v.stride())}) does not fit: need [{size}], "
                         f"unit stride")


def fits_one_tile(n: int, k: int) -> bool:
    """Whether an ``[N, K]`` weight's rows are one ``K`` tile of :func:`gemv_config` (what
    :func:`add_rms_norm_gemv` needs: each program normalises whole rows)."""
    return gemv_config(n, k)[1] >= k


def norm_fusion_pays(n: int, k: int) -> bool:
    """Whether the model fuses the add + RMSNorm into this ``[N, K]`` projection: rows of one tile and
    ``K <= NORM_FUSE_MAX_K`` (measured, see there)."""
    return k <= NORM_FUSE_MAX_K and fits_one_tile(n, k)
