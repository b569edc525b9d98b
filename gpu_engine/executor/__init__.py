"""Executors (model runners): run the forward pass and the sampler for one step's rows.

:class:`~gpu_engine.executor.eager.Program` runs eagerly (CPU, or CUDA without graphs);
:class:`~gpu_engine.executor.cuda_graph.CudaProgram` replays captured CUDA graphs per batch
bucket. :func:`make_program` picks one for a loaded model.
"""
from __future__ import annotations

import torch

from gpu_engine.executor.eager import Program

__all__ = ["Program", "make_program", "select_mask_rows"]


def select_mask_rows(words, status: torch.Tensor | None, enabled: torch.Tensor, idx: torch.Tensor):
    """The staged masks of the live rows ``idx`` (``[n]`` int64, CPU) of a step.

    ``words`` is what ``stage_masks`` returned: ``[B, K+1, W]`` int32 in batch-row order
    (eager: rows are selected) or a :class:`~gpu_engine.executor.cuda_graph.RingMask`
    (already on the device, addressed by lane: unchanged). ``status`` ``[B, K+1]`` uint8
    or None, ``enabled`` ``[B]`` bool. Returns ``(words, status, enabled)``.
    """
    if isinstance(words, torch.Tensor):
        words = words.index_select(0, idx)
    status = None if status is None else status.index_select(0, idx)
    return words, status, enabled.index_select(0, idx)


def make_program(loaded, ring, cuda_graphs: str = "auto") -> Program:
    """The Program for a loaded model: CUDA (graphs, cuda-python events, pinned ring) or eager CPU.

    Args:
        loaded: a :class:`gpu_engine.model.loader.LoadedModel`.
        ring: the engine's :class:`shared_memory.ring.MaskRing` (registered as
            pinned host memory on CUDA).
        cuda_graphs: ``"auto"`` (on when CUDA), ``"on"`` or ``"off"`` (CUDA: same static
            buffers and phases, run eagerly).

    With a speculative ring (``K_ring >= 1``) speculative steps replay CUDA graphs too (``spec_graphs``:
    the target forward and the verification; H200, SmolLM2, n-gram drafts on JSON at B = 1: 1.6 ms per
    speculative step instead of 8.0, ``bench/results/spec_graphs_ab_h200_{off,on}.json``).
    ``NINFER_SPEC_GRAPHS=off`` (or ``0`` / ``false`` / ``no``) runs them eagerly (default ``on``).
    """
    dev = loaded.model.device
    if dev.type == "cuda":
        from gpu_engine.executor.cuda_graph import CudaProgram  # lazy: cuda-python only where CUDA runs

        import os

        spec = os.environ.get("NINFER_SPEC_GRAPHS", "on").strip().lower() not in ("off", "0", "false", "no")
        return CudaProgram(loaded.model, loaded.vocab.vocab_size, dev, ring, use_graphs=cuda_graphs != "off",
                           spec_graphs=spec and ring is not None and ring.geometry.num_positions > 1)
    return Program(loaded.model, loaded.vocab.vocab_size, dev)
