"""StepBatch: one engine step's rows in the fixed-shape form the executors consume.

The engine builds it once per step with :func:`build_step_batch` (after drafting, before the
forward) and hands it to :meth:`Executor.forward`, :meth:`Executor.stage_masks` and
:meth:`Executor.sample` (:mod:`gpu_engine.executor.base`). Two derived batches exist, both
made here: :meth:`StepBatch.with_drafts` once device-side (deferred) drafts are read back,
and :meth:`StepBatch.select` when rows failed between forward and sampling.

Host tensors (``lanes``, ``start``, ``drafts``, ``num_drafts``) are plain (not pinned) CPU
tensors: the executors pack them into their own pinned upload buffers (``CudaProgram``) or
upload them with the step's other inputs (``Program``). ``draft_q`` lives on the executor's
device because only the verifier reads it.

It lives in ``gpu_engine.core`` (not ``gpu_engine.executor``) because both the executors and
the verifier (:mod:`gpu_engine.spec.step`, called by the executors) consume it: the
``acyclic_siblings`` import contract forbids ``spec -> executor``.

Drafts and q (seed 000 §8; Leviathan et al. 2023, Chen et al. 2023): row ``i`` has
``num_drafts[i]`` draft ids ``drafts[i, :num_drafts[i]]``; the rest of the row is ``-1``.
The drafter's proposal distribution is kept in the sparse form the sampled early-exit drafter
produces (its top-``S`` support, ``S`` = 16 today) instead of a dense ``[B, K, V]`` tensor
(``V`` ~ 150k makes the dense form ~600 KB per draft position): ``q_ids [B, K, S]`` int64
(``-1`` = unused slot) and ``q_probs [B, K, S]`` float32. A one-hot drafter's row (n-gram,
greedy early exit) is stored as ``(draft, 1.0)``, which gives the same acceptance test and
residual as an exact one-hot ``q``. ``draft_q`` is None when every drafting row is one-hot.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np
import torch

from gpu_engine.core.request import Request

__all__ = ["StepBatch", "build_step_batch", "NO_SLOT"]

NO_SLOT = -1  # StepBatch.slot of a step without masks (no constrained row, or the sidecar is gone)


@dataclass(frozen=True, eq=False)
class StepBatch:
    """One step's rows, in batch-row order (``B`` rows; ``K`` = the longest draft list).

    Attributes:
        rows: the :class:`Request` of each batch row (row metadata the executors read:
            ``prompt_ids``, ``output_ids``, ``num_cached`` (updated by forward / sample),
            ``sampling``, ``constraint``).
        lanes: ``[B]`` int32 CPU, the KV-cache lane of each row.
        start: ``[B]`` int32 CPU, ``num_cached`` of each row when the batch was built: the
            position of the row's first input token this step (0 for a prefill row).
        prefill: ``[B]`` bool CPU, rows with nothing cached and no output yet (they run their prompt).
        drafts: ``[B, K]`` int32 CPU draft ids, ``-1`` padded (``K = 0`` on a step without
            drafts). Rows of :attr:`deferred` drafts are all ``-1`` here until :meth:`with_drafts`.
        num_drafts: ``[B]`` int32 CPU, drafts per row (deferred rows included: their count is
            known when they are queued).
        draft_q: ``(q_ids [B, K, S] int64, q_probs [B, K, S] float32)`` on the executor's device
            (``-1`` / 0 in unused slots and in rows without drafts), or None (every q is one-hot).
        deferred: :class:`gpu_engine.spec.drafters.DeviceDrafts` whose ids are still on the device
            (the draft-ready overlap, issue 6); empty once read back.
        slot: the ring slot holding this step's bitmasks, or :data:`NO_SLOT` (-1): no masks.
    """

    rows: tuple[Request, ...]
    lanes: torch.Tensor
    start: torch.Tensor
    prefill: torch.Tensor
    drafts: torch.Tensor
    num_drafts: torch.Tensor
    draft_q: tuple[torch.Tensor, torch.Tensor] | None = None
    deferred: tuple = ()
    slot: int = NO_SLOT

    @property
    def size(self) -> int:
        """B, the number of rows."""
        return len(self.rows)

    @property
    def max_drafts(self) -> int:
        """The step's ``T - 1``: the largest ``num_drafts`` (0 without drafts), i.e. ``K``."""
        return self.drafts.shape[1]

    @property
    def speculative(self) -> bool:
        """True when some row carries drafts (host or deferred)."""
        return self.max_drafts > 0

    def row_drafts(self, i: int) -> list[int]:
        """The host draft ids of row ``i`` (``[]`` for a deferred row before :meth:`with_drafts`)."""
        n = int(self.num_drafts[i])
        d = self.drafts[i, :n].tolist()
        return [] if n and d[0] < 0 else d

    def with_drafts(self, drafts: Mapping[int, Sequence[int]], draft_q: Mapping | None = None, *,
                    device: torch.device | str | None = None) -> "StepBatch":
        """This batch after its deferred drafts were read back: host drafts from ``drafts`` (lane ->
        ids, all rows; ``draft_q`` and ``device`` as in :func:`build_step_batch`), no :attr:`deferred`;
        same rows, start positions, prefill flags and slot."""
        b = build_step_batch(self.rows, drafts, draft_q, slot=self.slot, device=device or self._q_device())
        return replace(b, start=self.start, prefill=self.prefill)

    def without_masks(self) -> "StepBatch":
        """The same batch with :attr:`slot` = :data:`NO_SLOT` (the sidecar did not answer)."""
        return replace(self, slot=NO_SLOT)

    def select(self, idx: Sequence[int]) -> "StepBatch":
        """Rows ``idx`` (batch-row indices, in that order) of this batch."""
        sel = torch.tensor(list(idx), dtype=torch.int64)
        num = self.num_drafts.index_select(0, sel)
        k = int(num.max()) if len(idx) else 0  # K stays the longest draft list of the rows kept
        q = self.draft_q
        if q is not None:
            sq = sel.to(q[0].device)
            q = (q[0].index_select(0, sq)[:, :k], q[1].index_select(0, sq)[:, :k]) if k else None
        return replace(self, rows=tuple(self.rows[i] for i in idx), lanes=self.lanes.index_select(0, sel),
                       start=self.start.index_select(0, sel), prefill=self.prefill.index_select(0, sel),
                       drafts=self.drafts.index_select(0, sel)[:, :k].contiguous(), num_drafts=num, draft_q=q)

    def _q_device(self) -> torch.device | None:
        return None if self.draft_q is None else self.draft_q[0].device


def build_step_batch(rows: Sequence[Request], drafts: Mapping[int, Sequence[int]] | None = None,
                     draft_q: Mapping | None = None, deferred: Sequence = (), *, slot: int = NO_SLOT,
                     device: torch.device | str | None = None) -> StepBatch:
    """The :class:`StepBatch` of one step (the engine's one builder).

    Args:
        rows: the step's rows, in batch-row order (each with its ``lane`` set).
        drafts: lane -> host draft ids (rows absent or with ``[]`` have none).
        draft_q: lane -> ``(q_ids [n, S] int64, q_probs [n, S] float32)`` for rows whose drafter
            has a sparse q (``n`` = that row's drafts); rows absent have a one-hot q.
        deferred: :class:`gpu_engine.spec.drafters.DeviceDrafts` (ids still on the device); their
            rows get ``num_drafts = ks[i]`` and ``-1`` ids.
        slot: ring slot of this step's masks, or :data:`NO_SLOT`.
        device: where ``draft_q`` is built (the executor's device; default: the q tensors' own).

    Raises:
        ValueError: a lane has both host and deferred drafts, or a row's q has fewer
            positions than its drafts.
    """
    drafts = drafts or {}
    draft_q = draft_q or {}
    rows = tuple(rows)
    b = len(rows)
    pending = {r.lane: k for dd in deferred for r, k in zip(dd.rows, dd.ks)}
    nd = [0] * b
    if drafts or pending:
        for i, r in enumerate(rows):
            host = len(drafts.get(r.lane, ()))
            if host and r.lane in pending:
                raise ValueError(f"lane {r.lane} has both host and deferred drafts")
            nd[i] = host or pending.get(r.lane, 0)
    k = max(nd, default=0)
    # numpy, then one torch.from_numpy each: the per-step host cost stays a few microseconds
    ids_np = np.full((b, k), -1, dtype=np.int32)
    if drafts:
        for i, r in enumerate(rows):
            d = drafts.get(r.lane)
            if d:
                ids_np[i, : len(d)] = d
    ids = torch.from_numpy(ids_np)
    lanes = torch.from_numpy(np.array([r.lane for r in rows], dtype=np.int32).reshape(b))
    start = torch.from_numpy(np.array([r.num_cached for r in rows], dtype=np.int32).reshape(b))
    prefill = torch.from_numpy(np.array([not (r.num_cached or r.output_ids) for r in rows], dtype=np.bool_).reshape(b))
    num = torch.from_numpy(np.asarray(nd, dtype=np.int32).reshape(b))
    q = _sparse_q(rows, nd, ids, draft_q, device) if draft_q and any(
        r.lane in draft_q and nd[i] for i, r in enumerate(rows)) else None
    return StepBatch(rows, lanes, start, prefill, ids, num, q, tuple(deferred), slot)


def _sparse_q(rows: tuple[Request, ...], nd: list[int], ids: torch.Tensor, draft_q: Mapping,
              device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_ids [B, K, S] int64, q_probs [B, K, S] float32)``; one-hot rows get ``(draft, 1.0)``."""
    b, k = ids.shape
    src = [draft_q[r.lane] for i, r in enumerate(rows) if r.lane in draft_q and nd[i]]
    dev = torch.device(device) if device is not None else src[0][0].device
    s = max(qi.shape[-1] for qi, _ in src)
    q_ids = torch.full((b, k, s), -1, dtype=torch.int64, device=dev)
    q_probs = torch.zeros(b, k, s, dtype=torch.float32, device=dev)
    for j, (r, m) in enumerate(zip(rows, nd)):
        if not m:
            continue
        if r.lane in draft_q:
            qi, qp = draft_q[r.lane]
            if qi.shape[0] < m:
                raise ValueError(f"lane {r.lane}: q has {qi.shape[0]} positions for {m} drafts")
            q_ids[j, :m, : qi.shape[-1]] = qi[:m].to(dev)
            q_probs[j, :m, : qi.shape[-1]] = qp[:m].to(dev, torch.float32)
        else:
            q_ids[j, :m, 0] = ids[j, :m].to(dev, torch.int64)
            q_probs[j, :m, 0] = 1.0
    return q_ids, q_probs
