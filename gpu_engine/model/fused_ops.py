"""Fused Triton kernels for the decoder's elementwise work (CUDA; ``TRITON_INTERPRET=1`` on the CPU).

Eager torch spends about 45 kernels per layer on work that moves a few kilobytes per row: RMSNorm
(float cast, square, mean, rsqrt, two multiplies, cast back), RoPE (a cos/sin gather and cast, two
multiplies, a negate, a concat, an add, for q and for k), the KV-cache writes (two permuted copies
and two ``index_copy_``) and SiLU-and-multiply. Inside a CUDA graph each of those kernels still costs
a few microseconds of launch and tail, which is what made a SmolLM2 decode step ~4 ms on an H200
whatever the batch (1,373 kernels per step, profiled 2026-12-01; ``bench/results/forward_profile_h200.md``).
The three kernels here do the same arithmetic in one pass each:

* :func:`add_rms_norm` — ``x += delta`` (the residual add) then ``h = RMSNorm(x) * weight``;
* :func:`rope_kv_write` — optional per-head RMSNorm (Qwen3's q/k-norm), rotary embedding of q and k,
  and the store of k and v into the paged KV pool;
* :func:`silu_mul` — ``silu(gate) * up`` from the fused gate/up projection.

Every intermediate is rounded to the model dtype where the torch reference
(:mod:`gpu_engine.model.llama`) rounds it, so the results agree with the eager path up to float32
summation order (tests/gpu_engine/test_fused_ops.py checks them in Triton's CPU interpreter, and on
CUDA in bf16).

Formulas: RMSNorm (Zhang & Sennrich 2019) as Hugging Face's ``LlamaRMSNorm``; RoPE (Su et al. 2021)
in the "rotate half" layout of Hugging Face Llama.
"""
from __future__ import annotations

import functools

import torch

__all__ = ["add_rms_norm", "next_pow2", "rope_kv_write", "silu_mul"]


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``): Triton block sizes (``tl.arange`` lengths)."""
    return 1 << max(0, int(n) - 1).bit_length()


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _add_rms_norm(x_ptr, d_ptr, w_ptr, h_ptr, N, eps, HAS_D: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < N
        dt = x_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * N + offs, mask=m, other=0.0)
        if HAS_D:
            d = tl.load(d_ptr + row * N + offs, mask=m, other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(dt)
            tl.store(x_ptr + row * N + offs, x, mask=m)
        xf = x.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
        n = (xf * r).to(dt).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * N + offs, (w * n).to(dt), mask=m)

    @triton.jit
    def _silu_mul(gu_ptr, o_ptr, I, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < I
        dt = o_ptr.dtype.element_ty
        g = tl.load(gu_ptr + row * 2 * I + offs, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * I + I + offs, mask=m, other=0.0).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(o_ptr + row * I + offs, (s * u).to(dt), mask=m)

    @triton.jit
    def _rope_kv(qkv_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_ptr, k_ptr, v_ptr,
                 NH, NKV, QKV_STRIDE, POOL_SLOTS, eps,
                 HD: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr, QK_NORM: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        dt = q_ptr.dtype.element_ty
        offs = tl.arange(0, HALF_P2)
        m = offs < HALF
        pos = tl.load(pos_ptr + row)
        # cos/sin tables are float32 [S, HD] (two equal halves); the reference casts them to the model dtype
        c = tl.load(cos_ptr + pos * HD + offs, mask=m, other=0.0).to(dt).to(tl.float32)
        s = tl.load(sin_ptr + pos * HD + offs, mask=m, other=0.0).to(dt).to(tl.float32)
        is_q = head < NH
        kh = head - NH
        col = tl.where(is_q, head * HD, NH * HD + kh * HD)
        base = qkv_ptr + row * QKV_STRIDE + col
        x1 = tl.load(base + offs, mask=m, other=0.0)
        x2 = tl.load(base + HALF + offs, mask=m, other=0.0)
        if QK_NORM:
            f1 = x1.to(tl.float32)
            f2 = x2.to(tl.float32)
            r = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / HD + eps)
            wp = tl.where(is_q, qn_ptr, kn_ptr)
            w1 = tl.load(wp + offs, mask=m, other=0.0).to(tl.float32)
            w2 = tl.load(wp + HALF + offs, mask=m, other=0.0).to(tl.float32)
            x1 = (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt)
            x2 = (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt)
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        # q*cos + rotate_half(q)*sin, rotate_half(q) = cat(-q2, q1); each product rounded like the reference
        o1 = ((f1 * c).to(dt).to(tl.float32) + (-f2 * s).to(dt).to(tl.float32)).to(dt)
        o2 = ((f2 * c).to(dt).to(tl.float32) + (f1 * s).to(dt).to(tl.float32)).to(dt)
        if is_q:
            qo = q_ptr + (row * NH + head) * HD
            tl.store(qo + offs, o1, mask=m)
            tl.store(qo + HALF + offs, o2, mask=m)
        else:
            slot = tl.load(slot_ptr + row)
            ko = k_ptr + (kh * POOL_SLOTS + slot) * HD
            tl.store(ko + offs, o1, mask=m)
            tl.store(ko + HALF + offs, o2, mask=m)
            vb = qkv_ptr + row * QKV_STRIDE + NH * HD + NKV * HD + kh * HD
            vo = v_ptr + (kh * POOL_SLOTS + slot) * HD
            tl.store(vo + offs, tl.load(vb + offs, mask=m, other=0.0), mask=m)
            tl.store(vo + HALF + offs, tl.load(vb + HALF + offs, mask=m, other=0.0), mask=m)

    return _add_rms_norm, _silu_mul, _rope_kv


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Residual add and RMSNorm in one kernel: ``x += delta`` (in place, skipped when ``delta`` is
    ``None``), then return ``weight * RMSNorm(x)`` (float32 statistics, like Hugging Face).

    Args:
        x: ``[..., D]`` contiguous, model dtype; updated in place when ``delta`` is given.
        delta: ``None`` or the same shape and dtype as ``x`` (contiguous).
        weight: ``[D]``.
        eps: the norm's epsilon.
    Returns:
        ``[..., D]`` new tensor in ``x.dtype``.
    Raises:
        ValueError: ``x`` or ``delta`` is not contiguous.
    """
    if not x.is_contiguous() or (delta is not None and not delta.is_contiguous()):
        raise ValueError("add_rms_norm needs contiguous x and delta")
    D = x.shape[-1]
    h = torch.empty_like(x)
    rows = x.numel() // D
    k, _, _ = _kernels()
    block = next_pow2(D)
    k[(rows,)](x, x if delta is None else delta, weight, h, D, float(eps), HAS_D=delta is not None,
               BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return h


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = cat(gate, up, -1)`` (SwiGLU, Shazeer 2020).

    Args:
        gate_up: ``[..., 2 * I]`` contiguous, model dtype.
    Returns:
        ``[..., I]`` in ``gate_up.dtype``.
    Raises:
        ValueError: ``gate_up`` is not contiguous or its last dim is odd.
    """
    if not gate_up.is_contiguous() or gate_up.shape[-1] % 2:
        raise ValueError("silu_mul needs a contiguous [..., 2*I] tensor")
    I = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], I, device=gate_up.device, dtype=gate_up.dtype)
    rows = gate_up.numel() // (2 * I)
    _, k, _ = _kernels()
    block = min(1024, next_pow2(I))
    k[(rows, -(-I // block))](gate_up, out, I, BLOCK=block, num_warps=4)
    return out


def rope_kv_write(qkv: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, num_heads: int,
                  q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                  eps: float = 1e-6) -> torch.Tensor:
    """Rotary embedding of q and k, with k and v stored into the paged KV pool, in one kernel.

    Args:
        qkv: ``[M, (nh + 2 * nkv) * hd]`` (rows = B*T tokens, last-dim contiguous) — the fused
            projection output, q heads then k heads then v heads.
        pos: ``[M]`` int64 absolute positions; slots: ``[M]`` int64 pool slots
            (:meth:`PagedKVCache.slots`).
        cos, sin: ``[max_seq_len, hd]`` float32 tables (two equal halves).
        k_pool, v_pool: one layer's pool ``[nkv, num_blocks + 1, block_size, hd]``, contiguous.
        num_heads: ``nh``.
        q_norm, k_norm: ``[hd]`` per-head RMSNorm weights applied before the rotation (Qwen3), or ``None``.
        eps: the q/k-norm epsilon.
    Returns:
        ``[M, nh, hd]`` rotated queries in ``qkv.dtype``.
    Raises:
        ValueError: shapes that do not fit together, or a non-contiguous pool.
    """
    nkv, nb1, bs, hd = k_pool.shape
    M = qkv.shape[0]
    if qkv.dim() != 2 or qkv.shape[1] != (num_heads + 2 * nkv) * hd or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be [M, {(num_heads + 2 * nkv) * hd}] with a unit last stride")
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()) or hd % 2:
        raise ValueError("k_pool/v_pool must be contiguous and head_dim even")
    q = torch.empty(M, num_heads, hd, device=qkv.device, dtype=qkv.dtype)
    _, _, k = _kernels()
    qk = q_norm is not None
    half = hd // 2
    k[(M, num_heads + nkv)](qkv, pos, slots, cos, sin, q_norm if qk else cos, k_norm if qk else cos,
                            q, k_pool, v_pool, num_heads, nkv, qkv.stride(0), nb1 * bs, float(eps),
                            HD=hd, HALF=half, HALF_P2=max(2, next_pow2(half)), QK_NORM=qk, num_warps=1)
    return q
