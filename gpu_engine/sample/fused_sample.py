"""The plain sampling step in one Triton kernel: bitmask, temperature / greedy and the draw.

:func:`gpu_engine.sample.sampler.sample` is ~25 torch kernels over ``[B, V]`` (unpack the bitmask to
``[B, W, 32]``, mask, finite checks, argmax, softmax, the counter RNG's ten ``[B, V]`` int64 passes,
``-log``, divide, argmax). On an H200 that Finish phase took 0.47 ms at B = 64 unconstrained and
0.78 ms with masks (``bench/results/engine_bench_h200_b958210.json``, ``gpu_finish_ms_p50``), a third
of a SmolLM2 decode step. :func:`sample_fused` computes the same thing for the rows it covers in one
kernel, one program per row, two passes over the row's logits:

1. the row's error (``SAMPLE_ERR_EMPTY_MASK``, ``SAMPLE_ERR_NONFINITE``), the legal maximum and its
   first index (the greedy token);
2. for ``T > 0``: the exponential race ``argmax_i w_i / E_i`` with ``w_i = exp((z_i - max z) / T)``
   over legal tokens and ``E_i = -log(u_i)`` from the same counter RNG as
   :mod:`gpu_engine.sample.rng` (splitmix64, keyed by seed, output position, purpose, token id).

Same semantics as the torch reference for ``use_filters=False`` and no penalties (seed 000 §sampling,
DESIGN.md "Masked sampling"): illegal tokens never drawn, ties to the smaller id, a row with NaN or
``+inf`` anywhere (or no finite legal logit) is ``SAMPLE_ERR_NONFINITE``, an enabled row whose mask
allows nothing is ``SAMPLE_ERR_EMPTY_MASK`` (it wins when both hold), error rows get token ``-1``.
The draw is the same random variable as the reference's; the token agrees unless two candidates'
``w / E`` are within float32 rounding of each other (the reference divides by the softmax sum first,
and Triton's ``exp`` / ``log`` may differ from torch's by an ulp).

Top-k / top-p / min-p (a sort) and penalties stay on the torch path. Runs on CUDA, or on the CPU
under ``TRITON_INTERPRET=1`` (tests/gpu_engine/test_fused_sample.py).
"""
from __future__ import annotations

import functools

import torch

from gpu_engine.sample.rng import Purpose
from gpu_engine.sample.sampler import SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SAMPLE_OK

__all__ = ["sample_fused", "BLOCK_V"]

#: Tokens per loop iteration of a row's program (a power of two).
BLOCK_V = 2048


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _sample_row(logits_ptr, words_ptr, enabled_ptr, temp_ptr, seed_ptr, pos_ptr, purpose_ptr,
                    tok_ptr, err_ptr, V, LOGITS_STRIDE, WORDS_STRIDE, PURPOSE,
                    MASKED: tl.constexpr, HAS_ENABLED: tl.constexpr, PURPOSE_PER_ROW: tl.constexpr,
                    BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        neg_inf = float("-inf")
        lrow = logits_ptr + row * LOGITS_STRIDE
        if HAS_ENABLED:
            off = tl.load(enabled_ptr + row).to(tl.int64) == 0  # an unconstrained row: its words are ignored
        else:
            off = tl.full([], 0, tl.int32) != 0
        # pass 1: error flags, the legal maximum and its first index
        best = tl.full([], neg_inf, tl.float32)
        best_i = tl.full([], 0, tl.int64)
        bad = tl.full([], 0, tl.int32)        # a NaN or +inf logit anywhere in the row
        n_legal = tl.full([], 0, tl.int32)    # legal tokens (mask bits in [0, V))
        n_finite = tl.full([], 0, tl.int32)   # legal tokens with a finite logit
        for start in range(0, V, BLOCK):
            idx = start + offs
            inb = idx < V
            z = tl.load(lrow + idx, mask=inb, other=0.0).to(tl.float32)
            bad = tl.maximum(bad, tl.max(((z != z) | (z == float("inf"))).to(tl.int32), axis=0))
            legal = inb
            if MASKED:
                w = tl.load(words_ptr + row * WORDS_STRIDE + (idx >> 5), mask=inb, other=0)
                bit = ((w >> (idx & 31).to(tl.int32)) & 1) != 0
                legal = inb & (bit | off)
            n_legal += tl.sum(legal.to(tl.int32), axis=0)
            zm = tl.where(legal, z, neg_inf)
            n_finite += tl.sum((zm > neg_inf).to(tl.int32), axis=0)
            m = tl.max(zm, axis=0)
            mi = tl.argmax(zm, axis=0).to(tl.int64) + start
            take = m > best
            best_i = tl.where(take, mi, best_i)
            best = tl.where(take, m, best)
        err = tl.where(n_legal == 0, 1, tl.where((bad != 0) | (n_finite == 0), 2, 0))
        temp = tl.load(temp_ptr + row)
        tok = best_i
        if (temp > 0) & (err == 0):
            # pass 2: exponential race over the legal tokens (rng.py: key = mix(mix(seed + G) + ctr * G),
            # ctr = position << 8 | purpose; u_i from the top 23 bits of mix(key + (i + 1) * G))
            seed = tl.load(seed_ptr + row).to(tl.uint64, bitcast=True)
            pos = tl.load(pos_ptr + row).to(tl.uint64, bitcast=True)
            if PURPOSE_PER_ROW:
                pur = tl.load(purpose_ptr + row).to(tl.uint64, bitcast=True)
            else:
                pur = tl.full([], PURPOSE, tl.uint64)
            # splitmix64's finaliser written out (a nested @jit helper is not visible from this closure)
            x = seed + 0x9E3779B97F4A7C15
            x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
            x = (x ^ (x >> 27)) * 0x94D049BB133111EB
            x = (x ^ (x >> 31)) + ((pos << 8) | pur) * 0x9E3779B97F4A7C15
            x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
            x = (x ^ (x >> 27)) * 0x94D049BB133111EB
            key = x ^ (x >> 31)
            r_best = tl.full([], -1.0, tl.float32)
            for start in range(0, V, BLOCK):
                idx = start + offs
                inb = idx < V
                z = tl.load(lrow + idx, mask=inb, other=0.0).to(tl.float32)
                legal = inb
                if MASKED:
                    w = tl.load(words_ptr + row * WORDS_STRIDE + (idx >> 5), mask=inb, other=0)
                    bit = ((w >> (idx & 31).to(tl.int32)) & 1) != 0
                    legal = inb & (bit | off)
                wt = tl.where(legal, tl.exp((z - best) / temp), 0.0)
                h = key + (idx + 1).to(tl.uint64) * 0x9E3779B97F4A7C15
                h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9
                h = (h ^ (h >> 27)) * 0x94D049BB133111EB
                h = h ^ (h >> 31)
                u = ((h >> 41).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
                ratio = wt / (-tl.log(u))
                m = tl.max(ratio, axis=0)
                mi = tl.argmax(ratio, axis=0).to(tl.int64) + start
                take = m > r_best
                tok = tl.where(take, mi, tok)
                r_best = tl.where(take, m, r_best)
        tl.store(tok_ptr + row, tl.where(err == 0, tok, -1))
        tl.store(err_ptr + row, err)

    return _sample_row


def sample_fused(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    words: torch.Tensor | None = None,
    enabled: torch.Tensor | None = None,
    purpose: int | torch.Tensor = Purpose.SAMPLE,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~gpu_engine.sample.sampler.sample` without filters or penalties, in one Triton kernel.

    No host syncs, static shapes: safe inside a captured CUDA graph.

    Args:
        logits: ``[B, V]`` float32 / bfloat16 / float16 with unit stride along ``V``.
        temperature: ``[B]`` float32; ``<= 0`` ⇒ greedy (the legal argmax, ties to the smaller id).
        seed, positions: ``[B]`` int64 (positions: output position of the token being decided).
            Every per-row tensor (these, ``temperature``, ``enabled``, a tensor ``purpose`` and ``out``) must
            be contiguous.
        words: ``[B, W]`` int32 packed bitmask (unit stride along ``W``, ``W >= ceil(V / 32)``), or
            ``None`` for an unmasked batch.
        enabled: ``[B]`` bool or integer: rows whose mask applies (``None`` = every row when ``words``
            is given).
        purpose: a :class:`~gpu_engine.sample.rng.Purpose`, or ``[B]`` int64 of them.
        out: optional ``(tokens [B] int64, errors [B] int32 or int64)`` to write into.

    Returns:
        ``(tokens [B] int64 (-1 on error rows), errors [B])`` with the codes of
        :mod:`gpu_engine.sample.sampler`.

    Raises:
        ValueError: a shape, dtype, stride or device the kernel does not handle (every per-row tensor
            must be a contiguous ``[B]`` of the dtype above, on the logits' device; ``V >= 1``).
    """
    if logits.dim() != 2 or logits.shape[1] == 0 or logits.stride(-1) != 1:
        raise ValueError(f"sample_fused needs [B, V > 0] logits with unit stride along V, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    b, v = logits.shape
    dev = logits.device
    if words is not None and (words.dim() != 2 or words.dtype != torch.int32 or words.stride(-1) != 1
                              or words.shape[0] != b or words.shape[-1] * 32 < v):
        raise ValueError(f"sample_fused words must be [B, >= ceil(V/32)] int32 with unit stride, got "
                         f"{tuple(words.shape)} {words.dtype}")
    if out is None:
        out = (torch.empty(b, dtype=torch.int64, device=dev), torch.empty(b, dtype=torch.int32, device=dev))
    tok, err = out
    # the kernel reads and writes element ``row`` of each per-row tensor at ``ptr + row``
    checks = {"temperature": (temperature, (torch.float32,)), "seed": (seed, (torch.int64,)),
              "positions": (positions, (torch.int64,)), "out tokens": (tok, (torch.int64,)),
              "out errors": (err, (torch.int32, torch.int64))}
    if enabled is not None:
        checks["enabled"] = (enabled, (torch.bool, torch.int32, torch.int64))
    if isinstance(purpose, torch.Tensor):
        checks["purpose"] = (purpose, (torch.int64,))
    for name, (t, dtypes) in checks.items():
        if t.shape != (b,) or t.dtype not in dtypes or (b > 1 and t.stride(0) != 1) or t.device != dev:
            raise ValueError(f"sample_fused {name} must be a contiguous [{b}] {' / '.join(map(str, dtypes))} tensor "
                             f"on {dev}, got {tuple(t.shape)} {t.dtype} strides {t.stride()} on {t.device}")
    if b == 0:
        return tok, err
    per_row = isinstance(purpose, torch.Tensor)
    dummy = tok  # any device tensor for pointers a variant never reads
    _kernel()[(b,)](
        logits, words if words is not None else dummy, enabled if enabled is not None else dummy,
        temperature, seed, positions, purpose if per_row else dummy, tok, err,
        v, logits.stride(0),
        words.stride(0) if words is not None else 0, 0 if per_row else int(purpose),
        MASKED=words is not None, HAS_ENABLED=enabled is not None, PURPOSE_PER_ROW=per_row, BLOCK=BLOCK_V,
        num_warps=8,
    )
    return tok, err


assert (SAMPLE_OK, SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE) == (0, 1, 2)  # the codes the kernel writes
