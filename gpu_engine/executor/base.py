"""The :class:`Executor` protocol: what the scheduler needs from a model runner.

Two implementations: :class:`gpu_engine.executor.eager.Program` (eager; CPU, or CUDA
without graphs) and :class:`gpu_engine.executor.cuda_graph.CudaProgram` (CUDA graphs per
batch bucket, masks copied straight from the registered ring). One step, in the order
the engine calls it (DESIGN.md "The hot path")::

    logits = ex.forward_rows(rows, drafts, deferred)        # queued, async on CUDA
    words, status, nbytes = ex.stage_masks(ring, slot, rows)  # after the sidecar answered
    out = ex.sample_rows(rows, logits, drafts, draft_q, words, status, enabled)
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from gpu_engine.core.request import Request
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

    def forward_rows(self, rows: list[Request], drafts: dict[int, list[int]],
                     deferred: Sequence = ()) -> torch.Tensor:
        """Forward prefill, decode and speculative rows; ``[B, T, V]`` float32 logits, ``T = 1 + max drafts``.

        ``drafts``: lane -> host draft ids; ``deferred``: device-side drafts
        (:class:`gpu_engine.spec.drafters.DeviceDrafts`, ids ``[b, K]`` int64 padded with -1)."""
        ...

    def stage_masks(self, ring, slot: int, rows: list[Request]) -> tuple[object, torch.Tensor | None, int]:
        """Bring ring slot ``slot``'s bitmasks to the sampler: ``(words, status, nbytes)``; ``words``
        is ``[B, K+1, W]`` int32 in row order or a lane-addressed device copy (``RingMask``)."""
        ...

    def sample_rows(self, rows: list[Request], logits: torch.Tensor, drafts: dict[int, list[int]],
                    draft_q: dict, words, status: torch.Tensor | None,
                    enabled: torch.Tensor | None) -> list[tuple[list[int], RowError | None]]:
        """Sample (or verify drafts of) every row: per row the committed tokens and an error or None."""
        ...

    def release_lane(self, lane: int) -> None:
        """Forget per-lane state of a finished request."""
        ...

    def close(self) -> None:
        """Release device resources tied to the ring (call before the ring is unmapped)."""
        ...
