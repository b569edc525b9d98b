"""The :class:`Executor` protocol: what the scheduler needs from a model runner.

Two implementations: :class:`gpu_engine.executor.eager.Program` (eager; CPU, or CUDA
without graphs) and :class:`gpu_engine.executor.cuda_graph.CudaProgram` (CUDA graphs per
batch bucket, masks copied straight from the registered ring). One step, in the order
the engine calls it (DESIGN.md "The hot path"), on the step's
:class:`~gpu_engine.core.batch.StepBatch` (built once by
:func:`~gpu_engine.core.batch.build_step_batch`)::

    logits = ex.forward(batch)                          # queued, async on CUDA
    batch = batch.with_drafts(drafts, draft_q)          # only if batch.deferred (draft-ready overlap)
    words, status, nbytes = ex.stage_masks(ring, batch)   # after the sidecar answered (batch.slot >= 0)
    out = ex.sample(batch, logits, words, status, enabled)  # batch.select(live) if rows failed meanwhile
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from gpu_engine.core.batch import StepBatch
from ninfer_common.errors import RowError

__all__ = ["Executor"]


@runtime_checkable
class Executor(Protocol):
    """A model runner for one resident batch of ``max_lanes`` lanes.

    Attributes:
        device: where the model and the logits live.
        vocab_size: V, the logits width.
        max_lanes: L, resident batch slots (KV-cache lanes).
        max_seq_len: usable positions per lane, in tokens.
        eos_ids: end-of-sequence ids (set by the engine; speculative verify stops at one).
        prefill_token_budget: padded prompt tokens per batched prefill forward.
    """

    device: torch.device
    vocab_size: int
    max_lanes: int
    max_seq_len: int
    eos_ids: tuple[int, ...]
    prefill_token_budget: int

    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Forward prefill, decode and speculative rows of ``batch``; ``[B, T, V]`` float32 logits on
        :attr:`device`, ``T = 1 + batch.max_drafts`` (prefill rows fill column 0 only).

        Host drafts are ``batch.drafts``; ``batch.deferred`` drafts (ids ``[b, K]`` int64 still on the
        device, -1 padded) are scattered into the input on the device. Sets ``num_cached`` of prefill rows."""
        ...

    def stage_masks(self, ring, batch: StepBatch) -> tuple[object, torch.Tensor | None, int]:
        """Bring ring slot ``batch.slot``'s bitmasks to the sampler: ``(words, status, nbytes)``; ``words``
        is ``[B, K+1, W]`` int32 in row order or a lane-addressed device copy (``RingMask``)."""
        ...

    def sample(self, batch: StepBatch, logits: torch.Tensor, words, status: torch.Tensor | None,
               enabled: torch.Tensor | None, launch_next=None) -> list[tuple[list[int], RowError | None]]:
        """Sample (or verify the host drafts of) every row of ``batch`` (the forward's rows or a
        :meth:`~gpu_engine.core.batch.StepBatch.select` of them, no deferred drafts): per row the
        committed tokens and an error or None. Advances ``num_cached`` of decode rows.

        ``launch_next`` (overlap scheduling, :mod:`gpu_engine.engine.overlap`): an executor that can queue
        the next step's forward ahead (it has ``forward_ahead``) calls it once this step's sampling is
        queued and before it waits for the tokens; others never call it."""
        ...

    def release_lane(self, lane: int) -> None:
        """Forget per-lane state of a finished request."""
        ...

    def close(self) -> None:
        """Release device resources tied to the ring (call before the ring is unmapped)."""
        ...
