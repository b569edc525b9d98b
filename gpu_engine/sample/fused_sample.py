"""The plain sampling step in Triton kernels: bitmask, temperature / greedy and the draw.

:func:`gpu_engine.sample.sampler.sample` is ~25 torch kernels over ``[B, V]`` (unpack the bitmask to
``[B, W, 32]``, mask, finite checks, argmax, softmax, the counter RNG's ten ``[B, V]`` int64 passes,
``-log``, divide, argmax). On an H200 that Finish phase took 0.47 ms at B = 64 unconstrained and
0.78 ms with masks (``bench/results/engine_bench_h200_b958210.json``, ``gpu_finish_ms_p50``), a third
of a SmolLM2 decode step. :func:`sample_fused` computes the same thing for the rows it covers in one
kernel per pass (three kernels), two passes over the row's logits:

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

**Split rows** (small batches). One program per row leaves most of the GPU idle when ``B`` is small: at
``B = 1`` one streaming multiprocessor walks the whole vocabulary twice (0.09 ms for SmolLM2's 49k tokens,
0.21-0.30 ms for the 128k / 152k vocabularies of the 8B shapes on the H200, ``gpu_finish_ms_p50`` in
``bench/results/engine_bench_h200*.json``). With ``splits = S > 1`` each row's vocabulary is cut into
runs of ``ceil(blocks / S)`` whole ``BLOCK_V`` blocks (so at most ``S`` runs: ``ceil(blocks / ceil(blocks /
S))``) and three kernels do the same two passes: per run the pass-1 partials (maximum, its first index, the
counts); per run the race over the run, against the row's maximum reduced from those partials; per row the
reduction of the race partials. A maximum's first index is the smallest index among the runs that reach the
maximum, and the runs are whole blocks in token order, so every token and error code is bit-identical to one
run (the per-token arithmetic is unchanged, only where the argmax reductions meet). One run (``S = 1``, B >
SMs / 2 by default) takes the same three kernels with one program per row each; through the engine its Finish
measured as the single kernel before the split did (B = 1, ``engine_bench --finish fused-one``: 0.096-0.097 ms
event time against 0.094 ms in the ``2677545`` table, ``bench/results/engine_bench_h200.json``). A lane past ``V`` (the last run
can hold a whole block past ``V`` when the runs do not divide the blocks) scores 0 in the race, like the
padding of the last block before the split; it never wins, because a row without an error has a legal
token scoring ``1 / E > 0``. ``splits=None`` picks ``S``
from the device's multiprocessor count (:func:`split_count`): 1 on the CPU and whenever ``B`` rows already
fill the GPU. Measured on the H200 (``bench/sample_bench.py``, ``bench/results/session26_split/``): at B = 1
62.6 -> 6.6 us per call for SmolLM2's vocabulary, 188 -> 8.0 us for Qwen3's; at B = 64 63.5 -> 36.4 us.

Top-k / top-p / min-p (a sort) and penalties stay on the torch path. Runs on CUDA, or on the CPU
under ``TRITON_INTERPRET=1`` (tests/gpu_engine/test_fused_sample.py).
"""
from __future__ import annotations

import functools

import torch

from gpu_engine.sample.rng import Purpose
from gpu_engine.sample.sampler import SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SAMPLE_OK

__all__ = ["sample_fused", "split_count", "BLOCK_V"]

#: Tokens per loop iteration of a row's program (a power of two).
BLOCK_V = 2048


@functools.cache
def _kernels():
    from gpu_engine.sample import fused_sample_kernels as k  # imports Triton

    return k._run_stats, k._run_race, k._row_result


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def split_count(b: int, v: int, device: torch.device) -> int:
    """Runs per row (``splits``) :func:`sample_fused` uses by default for ``b`` rows of ``v`` logits.

    About as many programs as the device has multiprocessors: ``min(blocks, SMs // b)`` runs, at least 1, rounded
    to whole ``BLOCK_V`` blocks per run (``blocks = ceil(v / BLOCK_V)``). 1 off CUDA, for ``b <= 0`` and for one
    block. On the H200 (132 SMs):
    SmolLM2 (``v`` = 49,152, 24 blocks) 24 runs at ``b`` = 1, 4 at 32, 2 at 64, 1 from 67 rows up.
    """
    if device.type != "cuda" or b <= 0 or v <= BLOCK_V:
        return 1
    blocks = -(-v // BLOCK_V)
    want = max(1, min(blocks, _multiprocessors(device.index if device.index is not None else
                                               torch.cuda.current_device()) // b))
    return _runs(blocks, want)[1]


def _runs(blocks: int, most: int) -> tuple[int, int]:
    """``(blocks per run, runs)`` cutting ``blocks`` into at most ``most`` runs of whole blocks, every run with one."""
    per_run = -(-blocks // most)
    return per_run, -(-blocks // per_run)


def sample_fused(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    words: torch.Tensor | None = None,
    enabled: torch.Tensor | None = None,
    purpose: int | torch.Tensor = Purpose.SAMPLE,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    splits: int | None = None,
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
        splits: the most runs of whole ``BLOCK_V`` blocks per row (module docstring, "Split rows"); ``None``
            = :func:`split_count`; 1 = one program per row. The result does not depend on it.

    Returns:
        ``(tokens [B] int64 (-1 on error rows), errors [B])`` with the codes of
        :mod:`gpu_engine.sample.sampler`.

    Raises:
        ValueError: a shape, dtype, stride or device the kernel does not handle (every per-row tensor
            must be a contiguous ``[B]`` of the dtype above, on the logits' device; ``V >= 1``; ``splits`` an
            int ``>= 1`` or None).
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
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"sample_fused splits must be an int >= 1 or None, got {splits!r}")
    if b == 0:
        return tok, err
    blocks = -(-v // BLOCK_V)
    want = split_count(b, v, dev) if splits is None else min(splits, blocks)
    per_run, runs = _runs(blocks, want)
    per_row = isinstance(purpose, torch.Tensor)
    dummy = tok  # any device tensor for pointers a variant never reads
    stats, race, result = _kernels()
    masked, has_enabled = words is not None, enabled is not None
    w_arg = words if masked else dummy
    e_arg = enabled if has_enabled else dummy
    p_arg = purpose if per_row else dummy
    w_stride = words.stride(0) if masked else 0
    pur = 0 if per_row else int(purpose)
    n = b * runs
    # partials of the runs: float32 [2, n] (pass-1 maximum, race maximum), int64 [5, n] (the maximum's first
    # index, NaN/+inf seen, legal count, finite legal count, the race's first index); from the graph pool
    # when captured
    pf = torch.empty((2, n), dtype=torch.float32, device=dev)
    pi = torch.empty((5, n), dtype=torch.int64, device=dev)
    s_pow2 = 1 << (runs - 1).bit_length()
    stats[(b, runs)](logits, w_arg, e_arg, pf, pi, v, logits.stride(0), w_stride, runs, per_run, n,
                     MASKED=masked, HAS_ENABLED=has_enabled, BLOCK=BLOCK_V, num_warps=8)
    race[(b, runs)](logits, w_arg, e_arg, temperature, seed, positions, p_arg, pf, pi,
                    v, logits.stride(0), w_stride, pur, runs, per_run, n,
                    MASKED=masked, HAS_ENABLED=has_enabled, PURPOSE_PER_ROW=per_row, BLOCK=BLOCK_V,
                    S_POW2=s_pow2, num_warps=8)
    result[(b,)](pf, pi, temperature, tok, err, runs, n, S_POW2=s_pow2, num_warps=1)
    return tok, err


assert (SAMPLE_OK, SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE) == (0, 1, 2)  # the codes the kernel writes
