"""Finishing a request (a mixin of :class:`gpu_engine.engine.loop.Engine`).

A constrained request's final commit and the close of its sidecar session travel
on the ``Step`` stream (a ``RowStep`` with ``close`` set), never as a blocking
RPC on the engine thread: :meth:`Closing._finish` frees the lane at once and
queues the close; the next Step message carries it (a close-only Step when no
row is resident), and the request's :class:`~gpu_engine.core.request.Finish` is
published when the sidecar's answer arrives (it reports ``complete`` /
``terminated`` of the committed output).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ninfer_common.errors import RowError, Status

from gpu_engine.core.request import ConstraintResult, Delta, Finish, FinishReason, Request
from gpu_engine.sidecar.client import RowStatus, SidecarUnavailable, StepRow, StepRowResult

log = logging.getLogger("ninfer.engine")


@dataclass
class _Close:
    """A finished constrained request whose session close is pending."""

    request: Request
    reason: FinishReason
    error: RowError | None
    constraint: ConstraintResult
    final_tokens: list[int]
    settled: bool = False  # its Finish is published, or it is parked for a replay (Closing._closed, _park_closes)


class Closing:
    """Finish / publish / close; uses ``self.sidecar``, ``self._lanes``, ``self._closing``, ``self._seq``,
    ``self.ring``, ``self.metrics``, ``self.program``, ``self.max_lanes`` and the supervision mixin's
    ``_constrained_of`` / ``_sidecar_lost`` (a close whose answer is lost is parked, not failed)."""

    def _finish(self, r: Request, reason: str, error: RowError | None = None) -> None:
        """End ``r``: free its lane now, stream the detokenizer's tail, and publish its Finish —
        at once, or after its sidecar session is closed on the next Step message."""
        if r.finished:
            return
        self._publish_pending(r)  # its deferred Delta goes before its tail and Finish
        r.finished = True
        if 0 <= r.lane < self.max_lanes:  # a request cancelled before it had a lane (-1) holds no KV
            if self._lanes[r.lane] is r:
                self._lanes[r.lane] = None
            self.program.release_lane(r.lane)
        reason = FinishReason(reason)
        if r.output is not None:  # a turn with an output plan: last deltas + reasoning / tool calls
            out, r.output_result = r.output.finish(str(reason))
            self._put_deltas(r, out, [])
        else:
            tail = r.detok.flush() if r.detok is not None else ""
            if tail:
                r.events.put(Delta(tail, []))
        constraint = None
        if r.constraint is not None:
            info = r.constraint_info
            constraint = ConstraintResult(r.constraint.kind if r.constraint.kind is not None else r.constraint.label,
                                          cache=info.get("cache"),
                                          prepare_seconds=float(info.get("prepare_seconds", 0.0)))
            if r.output_result is not None:
                constraint.branch = r.output_result.branch
            sc = self.sidecar
            if sc is not None:
                if r.sidecar_generation == sc.generation:
                    final = [] if reason in (FinishReason.CANCELLED, FinishReason.ERROR) else list(r.pending_commit)
                    self._closing.append(_Close(r, reason, error, constraint, final))
                    return
                lost = RowError("ConstraintServiceUnavailable", "the constraint sidecar restarted; session lost",
                                status=Status.UNAVAILABLE)
                reason, error = _with_close_error(reason, error, lost)
        self._publish(r, reason, error, constraint)

    def _publish(self, r: Request, reason: FinishReason, error: RowError | None,
                 constraint: ConstraintResult | None) -> None:
        res = r.output_result
        if res is not None and reason == FinishReason.STOP and res.tool_calls:
            reason = FinishReason.TOOL_CALLS
        self.metrics.request_finished(reason, r.constraint.label if r.constraint else "", len(r.output_ids),
                                      r.draft_tokens, r.accepted_draft_tokens, constraint)
        r.events.put(Finish(
            finish_reason=reason, prompt_tokens=len(r.prompt_ids), completion_tokens=len(r.output_ids),
            draft_tokens=r.draft_tokens, accepted_draft_tokens=r.accepted_draft_tokens, constraint=constraint,
            error=error, reasoning=None if res is None else res.reasoning,
            tool_calls=[] if res is None else [{"id": c.id, "name": c.name, "arguments_json": c.arguments_json}
                                               for c in res.tool_calls]))

    def _take_closing(self) -> list[_Close]:
        closing, self._closing = self._closing, []
        self._inflight_closes = closing  # what a failed step leaves unsettled (Closing._abandon_step)
        return closing

    def _abandon_step(self, pending) -> None:
        """After an engine step failed: read the answer of a Step it left outstanding (so the next Step's answer
        is not mistaken for it) and settle the session closes that Step, or the abandoned ``pending`` step,
        carried: those in the answer are published from it; the others (their Step never went out, or its
        answer was lost) go back to the queue and ride on the next Step (nothing else would ever publish them)."""
        stale = [c for c in list(self._inflight_closes) + (list(pending.closing) if pending is not None else [])
                 if not c.settled]
        self._inflight_closes = []
        got = None
        if self.sidecar is not None:
            try:
                got = self.sidecar.drain_step()
            except Exception:  # noqa: BLE001 - an engine bug path: the closes are retried below
                log.exception("reading the outstanding Step answer failed")
        by_id = {x.request_id: x for x in got[0]} if got else {}
        self._closed([c for c in stale if c.request.request_id in by_id], by_id)
        self._closing[:0] = [c for c in stale if c.request.request_id not in by_id]

    @staticmethod
    def _close_rows(closing: list[_Close]) -> list[StepRow]:
        return [StepRow(c.request.request_id, max(c.request.lane, 0), c.final_tokens, [], close=True)
                for c in closing]

    def _closed(self, closing: list[_Close], by_id: dict[str, StepRowResult] | None, why: str = "") -> None:
        """Publish the Finish of each closed request from the sidecar's answer (``by_id``), or, when
        the answer never came (``why``), as a lost session (a cancelled request stays cancelled)."""
        for c in closing:
            c.settled = True
            reason, error = c.reason, c.error
            x = None if by_id is None else by_id.get(c.request.request_id)
            if x is None:
                lost = RowError("ConstraintServiceUnavailable", f"closing the session failed: {why or 'no answer'}",
                                status=Status.UNAVAILABLE)
                reason, error = _with_close_error(reason, error, lost)
            else:
                c.constraint.complete, c.constraint.terminated = x.complete, x.terminated
                c.constraint.mask_positions = x.mask_positions
                if x.status is not RowStatus.OK and error is None:
                    reason, error = FinishReason.ERROR, RowError("IntegrityError", x.error)
            self._publish(c.request, reason, error, c.constraint)

    def _close_only_step(self, interruptible: bool = True) -> bool:
        """Send the pending closes in a Step of their own (no resident rows); False when none are pending.

        With ``interruptible`` the answer is awaited like a mask answer (:meth:`MaskWait._await`): a request
        submitted meanwhile ends the wait and the closes become the pending step (settled by a later step),
        so a new request never waits behind a slow or hung sidecar's close answer."""
        _, closing = self._constrained_of([])  # closes of a dead generation are parked for a re-prepare
        if not closing:
            return False
        self._seq += 1
        seq = self._seq
        slot = seq % self.ring.geometry.num_slots
        try:
            self.sidecar.send_step(seq, slot, self._close_rows(closing), generation=self._step_gen)
            got = self._await(seq, None) if interruptible else self.sidecar.recv_step(seq)
        except SidecarUnavailable as e:
            self._sidecar_lost([], str(e), closing)
            return True
        if got is None:  # a request came in: these closes are the pending step now
            self._defer_closes(seq, slot, closing)
            return True
        results, _ = got
        self._closed(closing, {x.request_id: x for x in results})
        return True


def _with_close_error(reason: FinishReason, error: RowError | None, lost: RowError) -> tuple[FinishReason,
                                                                                          RowError | None]:
    """A failed close turns a clean finish into an error; an earlier error or a cancel stays as it was."""
    if error is None and reason != FinishReason.CANCELLED:
        return FinishReason.ERROR, lost
    return reason, error
