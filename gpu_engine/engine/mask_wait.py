"""Waiting for the sidecar's masks, deferred when unconstrained rows ride along (a mixin of
:class:`gpu_engine.engine.loop.Engine`; issue 14: unconstrained rows never wait on a constrained problem).

After the forward, a step that carries constrained **and** unconstrained rows waits for the sidecar's
Step answer only up to a short *soft* budget (``mask_soft_wait_s``, ``--mask-soft-wait`` in ms). If the
answer is not there by then, the step is split:

* the unconstrained rows are sampled and committed now (their logits need no mask);
* the constrained rows become the one **pending step** (:class:`_PendingStep`): their logits (a copy:
  the executor may reuse its logits buffer in the next forward), their subset of the batch (ring slot
  and drafts included) and the step's session closes. Their KV for this position is already written;
  they are not fed again until they are sampled.

While a step is pending, no Step message is sent (the stream is ordered and the answer's ring slot
must not be overwritten): every constrained row sits out and finished rows' closes wait in
``_closing``; the unconstrained rows keep stepping and each step polls the answer without blocking.
When it arrives, the slot's sequence is checked, its masks are staged for the pending rows and they
are sampled with their saved logits (speculative rows the same way: their drafts and ``[P, T, V]``
logits are kept). A step left with only constrained rows waits for the answer, in slices of the soft
budget: a request submitted meanwhile (with a free lane) ends the wait, the step becomes the pending
one, and the new request is admitted at once (``--mask-soft-wait 0``: block, no thread hop). When the
hard deadline (``--sidecar-deadline``) passes, the Step stream reports the sidecar lost and the
pending rows take the supervision path (:mod:`gpu_engine.engine.supervision`: parked, re-prepared,
replayed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ninfer_common.errors import RowError

from gpu_engine.core.batch import StepBatch, build_step_batch
from gpu_engine.cuda.transfer import to_device_async
from gpu_engine.core.request import Request
from gpu_engine.sidecar.client import RowStatus, SidecarUnavailable

# Default soft budget (seconds) of a mixed step's mask wait. Healthy steps stay far below it: the exposed
# wait is ~0.2-3 ms p50 on the H200 (bench/results/engine_bench_h200.json: the mask fill overlaps the
# forward), and every one of a healthy 16-stream run on 2 loaded CPU cores was <= 25 ms with 0 deferrals
# (bench/results/supervision_bench_cpu.json "healthy").
DEFAULT_MASK_SOFT_WAIT_S = 0.2
DEFERRED = object()  # _recv_masks: the soft budget passed, the answer is still outstanding


@dataclass
class _PendingStep:
    """A sent Step whose answer is outstanding, with the constrained rows it masks."""

    seq: int
    batch: StepBatch  # the constrained rows' subset of the step's batch (its ring slot, drafts)
    logits: torch.Tensor  # [P, T, V] float32 on the executor's device (a copy)
    closing: list  # closing._Close entries of that Step
    drafts: dict[int, list[int]]  # lane -> draft ids of the pending rows
    waited_s: float  # exposed wait so far (the soft budget)


class MaskWait:
    """Mask wait with deferral; uses ``self.sidecar``, ``self.ring``, ``self.program``, ``self.stats``,
    ``self.step_send``, ``self.metrics``, ``self._finish``, ``self._closed``, ``self._sidecar_lost``,
    ``self._sample_commit``."""

    _pending: _PendingStep | None
    mask_soft_wait_s: float
    _waited_s: float

    def _init_mask_wait(self, soft_wait_s: float) -> None:
        if soft_wait_s < 0:
            raise ValueError(f"mask_soft_wait_s must be >= 0, got {soft_wait_s}")
        self.mask_soft_wait_s = float(soft_wait_s)
        self._pending = None
        self._waited_s = 0.0

    def _runnable(self) -> list[Request]:
        """Rows that may join this step: not parked, and no constrained row while a Step is pending."""
        pending = self._pending is not None
        return [r for r in self._lanes if r is not None and not r.parked and not (pending and r.constraint is not None)]

    def _soft_wait(self, rows: list[Request]) -> float | None:
        """The soft budget for a step of ``rows`` (None: wait for the answer, see :meth:`_await`)."""
        if self.mask_soft_wait_s > 0 and any(r.constraint is None and not r.finished for r in rows):
            return self.mask_soft_wait_s
        return None

    def _new_work(self) -> bool:
        """A submitted request waits and a lane is free for it (it must not wait behind a mask wait)."""
        return self._waiting.qsize() > 0 and any(lane is None for lane in self._lanes)

    def _await(self, seq: int, timeout: float | None):
        """The Step answer to ``seq``, or None when ``timeout`` passed first. ``timeout=None`` waits up to the
        hard deadline, but in slices of the soft budget: between slices a newly submitted request that has a
        free lane ends the wait (None), so it is admitted at once instead of waiting on a slow or hung
        sidecar. With ``--mask-soft-wait 0`` the engine thread blocks on the answer itself (no thread hop).

        Raises:
            SidecarUnavailable: the stream broke or the hard deadline passed.
        """
        if timeout is not None:
            return self.sidecar.recv_step(seq, timeout)
        if self.mask_soft_wait_s <= 0:
            return self.sidecar.recv_step(seq)
        while True:
            got = self.sidecar.recv_step(seq, self.mask_soft_wait_s)
            if got is not None or self._new_work():
                return got

    def _recv_masks(self, seq: int, batch: StepBatch, constrained: list[Request], closing: list,
                    timeout: float | None = None, waited_s: float = 0.0):
        """Wait for the sidecar's answer to ``seq`` (the exposed wait; at most ``timeout`` s when given),
        publish closed requests, fail rows the sidecar reports, and stage ``batch.slot``'s masks:
        ``(words, status, enabled)``, Nones (sidecar lost: rows parked), or :data:`DEFERRED`."""
        slot, rows = batch.slot, batch.rows
        tw = time.perf_counter()
        try:
            got = self._await(seq, timeout)
        except SidecarUnavailable as e:
            self._sidecar_lost(constrained, str(e), closing)
            return None, None, None
        tr = time.perf_counter()
        self.stats.add_phase("wait", tw, tr)
        wait = tr - tw + waited_s
        if got is None:
            self._waited_s = wait  # exposed so far; carried by the pending step
            return DEFERRED
        results, work = got
        self.stats.sidecar_work_s += work
        if constrained and not batch.speculative:  # the work the Step-send choice is about (no close-only, no drafts)
            self.step_send.observe_work(work * 1e3)
        self.stats.sidecar_steps += 1
        by_id = {x.request_id: x for x in results}
        self._closed(closing, by_id)
        if not constrained:
            return None, None, None
        self.stats.sidecar_wait_s += wait
        self.stats.per_step_wait_ms.append(wait * 1e3)
        self.metrics.sidecar_wait(wait)
        self.stats.constrained_steps += 1
        self.ring.check_slot(slot, seq)
        for r in constrained:
            x = by_id.get(r.request_id)
            if x is None or x.status is not RowStatus.OK:
                self._finish(r, "error", error=RowError(
                    "IntegrityError", (x.error if x else "row missing from the sidecar's answer")))
        # A dead end is not reported here: the slot's status byte says DEAD_END and the
        # sampler / verifier fail the row with ConstraintDeadEnd where the draw happens.
        # CPU: [B, K+1, W] int32 copy of the slot; CUDA: one async copy from the
        # registered ring into the device bitmask (prog.stage_masks documents both).
        words, status, nbytes = self.program.stage_masks(self.ring, batch)
        enabled = torch.from_numpy(np.array([r.constraint is not None and not r.finished for r in rows],
                                            dtype=np.bool_))  # via numpy: half the time of torch.tensor(list)
        self.stats.mask_h2d_bytes += nbytes
        self.stats.add_phase("stage", tr, time.perf_counter())
        return words, status, enabled

    def _defer(self, seq: int, rows: list[Request], batch: StepBatch, logits: torch.Tensor,
               constrained: list[Request], closing: list, drafts: dict[int, list[int]]):
        """Keep the constrained rows of this step as the pending step; return ``(rows, batch, logits)`` of
        the unconstrained rows, to be sampled now without masks."""
        con = {id(r) for r in constrained}
        pi = [i for i, r in enumerate(rows) if id(r) in con]
        ui = [i for i, r in enumerate(rows) if id(r) not in con]
        # index_select copies: the saved logits survive the executor's next forward (CUDA graphs reuse a buffer)
        self._pending = _PendingStep(seq, batch.select(pi), logits.index_select(0, to_device_async(torch.tensor(pi, dtype=torch.int64), logits.device)),
                                     closing, {r.lane: drafts[r.lane] for r in constrained if r.lane in drafts},
                                     self._waited_s)
        self.stats.mask_waits_deferred += 1
        self.metrics.mask_wait_deferred()
        sel = torch.tensor(ui, dtype=torch.int64)  # may be empty: a step of constrained rows only
        return [rows[i] for i in ui], batch.select(ui).without_masks(), logits.index_select(0, to_device_async(sel, logits.device))

    def _defer_closes(self, seq: int, slot: int, closing: list) -> None:
        """A close-only Step whose answer is outstanding becomes the pending step (no rows to sample)."""
        batch = build_step_batch([], slot=slot, device=self.program.device)
        self._pending = _PendingStep(seq, batch, torch.zeros(0, 1, 0), closing, {}, 0.0)
        self.stats.mask_waits_deferred += 1
        self.metrics.mask_wait_deferred()

    def _settle_pending(self, block: bool) -> bool:
        """Poll (or, with ``block``, wait up to the hard deadline for) the pending step's answer; when it
        is there, sample and commit its rows with their saved logits. True when the pending step is settled
        (sampled, or its rows parked because the sidecar was lost)."""
        p = self._pending
        got = self._recv_masks(p.seq, p.batch, list(p.batch.rows), p.closing, None if block else 0.0, p.waited_s)
        if got is DEFERRED:
            p.waited_s = self._waited_s
            return False
        self._pending = None
        words, status, enabled = got
        self._sample_commit(list(p.batch.rows), p.batch, p.logits, words, status, enabled, p.drafts, allow_ahead=False)
        return True
