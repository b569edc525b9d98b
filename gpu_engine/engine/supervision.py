"""Nothing lost when the sidecar dies: park, re-prepare, replay (a mixin of :class:`gpu_engine.engine.loop.Engine`).

When the Step stream breaks or misses its deadline, the step's constrained rows are **parked**: they
keep their lane, KV cache and committed output but leave the batch (unconstrained rows keep decoding;
they never wait on a constrained problem). A parked row whose prompt was prefilled in the failed step
but never sampled gives its KV back and is prefilled again later. A request queued with a session of
a dead generation is parked when it is admitted; a finished request whose session close was lost is
parked as a *close*.

When the supervisor has a new sidecar generation up
(:class:`gpu_engine.sidecar.supervisor.SidecarSupervisor`), each parked request is prepared again
(same constraint, wrapper and assistant prefix) on a small thread pool, never on the engine thread.
Then its committed tokens are **replayed**: the row's next Step commits every token of ``output_ids``
into the fresh matcher (the sidecar previews them first: a token the fresh matcher rejects is an
integrity error, never a silently loosened constraint), and decoding continues. A parked close is
closed with all its tokens, which yields the same ``complete`` / ``terminated`` as before the crash.

Bounded: when the supervisor gives up (``FAILED``: too many restarts in its window), every parked
request fails with ``ConstraintServiceUnavailable`` (structured, no Python repr), and so does a
request parked longer than ``PARK_LIMIT_STARTUPS`` start-up timeouts; a re-prepare the sidecar
refuses fails the request with the sidecar's error. Only the engine thread touches a request's mutable state; the pool
threads read only its id and its (immutable) constraint.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ninfer_common.errors import RequestError, RowError, Status
from ninfer_common.telemetry import get_tracer

from gpu_engine.core.request import FinishReason, Request
from gpu_engine.sidecar.client import PrepareInfo
from gpu_engine.sidecar.supervisor import SidecarState

log = logging.getLogger("ninfer.engine")
_tracer = get_tracer("ninfer.gpu_engine")
# Threads re-preparing parked requests (the sidecar bounds concurrent cold compiles itself).
REPREPARE_WORKERS = 4
# A request parked longer than this many sidecar start-up timeouts fails (an external sidecar that stays
# hung is never killed, so the supervisor's restart budget alone would not bound the wait).
PARK_LIMIT_STARTUPS = 2


@dataclass
class _Parked:
    request: Request
    close: object | None = None  # a closing._Close whose session close was lost
    future: "Future[PrepareInfo] | None" = None
    since: float = 0.0  # time.monotonic() when it was parked


class Supervision:
    """Park / re-prepare / replay; uses ``self.sidecar``, ``self.program``, ``self.metrics``, ``self._closing``,
    ``self._finish``, ``self._closed``, ``self._publish``."""

    _parked: dict[str, _Parked]
    _reprepare_pool: ThreadPoolExecutor | None
    replays: int

    def _init_supervision(self) -> None:
        self._parked = {}
        self._reprepare_pool = None
        self.replays = 0

    @property
    def num_parked(self) -> int:
        """Constrained requests waiting for the sidecar to come back (engine thread's view)."""
        return len(self._parked)

    def _sidecar_up(self) -> bool:
        """Supervised: the supervisor has it up. Unsupervised (an engine stepped without :meth:`start`):
        always — the re-prepare itself restarts it (``Sidecar.prepare``), on the pool's thread."""
        sup = getattr(self.sidecar, "supervisor", None)
        return sup is None or sup.usable()

    def _constrained_of(self, rows: list[Request]) -> tuple[list[Request], list]:
        """This step's constrained rows and pending closes, both of the sidecar's current generation (the
        others, whose sessions died with an older generation, are parked for a re-prepare)."""
        constrained = [r for r in rows if r.constraint is not None]
        if self.sidecar is None:
            return constrained, []
        gen = self.sidecar.generation
        closing = self._take_closing()
        if any(r.sidecar_generation != gen for r in constrained):
            self._park([r for r in constrained if r.sidecar_generation != gen], "the sidecar restarted")
            constrained = [r for r in constrained if not r.parked]
        if any(c.request.sidecar_generation != gen for c in closing):
            self._park_closes([c for c in closing if c.request.sidecar_generation != gen], "the sidecar restarted")
            closing = [c for c in closing if c.request.sidecar_generation == gen]
        self._step_gen = gen
        return constrained, closing

    def _sidecar_lost(self, rows: list[Request], why: str, closing: list = ()) -> None:
        """The Step failed: park its rows and closes (re-prepared and replayed after the restart)."""
        if self.sidecar is None:  # no sidecar at all: nothing to wait for
            for r in rows:
                self._finish(r, "error", error=RowError("ConstraintServiceUnavailable", why, status=Status.UNAVAILABLE))
            self._closed(list(closing), None, why)
            return
        self._park(rows, why)
        self._park_closes(list(closing), why)

    def _park(self, rows: list[Request], why: str) -> None:
        """Take ``rows`` out of the batch until a fresh sidecar has their session again."""
        if rows:
            log.warning("constraint sidecar lost (%s): parking %d constrained request(s)", why, len(rows))
        for r in rows:
            if r.finished or r.parked:
                continue
            r.parked = True
            if not r.output_ids and r.num_cached:  # prefilled in the failed step, never sampled
                self.program.release_lane(r.lane)
                r.num_cached = 0
            self._parked[r.request_id] = _Parked(r, since=time.monotonic())

    def _park_closes(self, closing: list, why: str) -> None:
        """Closes whose answer was lost: clean finishes are parked (closed again after a re-prepare and
        a replay); a cancelled or failed request is published now as it was."""
        for c in closing:
            if c.error is None and c.reason in (FinishReason.STOP, FinishReason.LENGTH):
                c.settled = True
                self._parked[c.request.request_id] = _Parked(c.request, close=c, since=time.monotonic())
            else:
                self._closed([c], None, why)

    def _revive(self) -> bool:
        """Engine thread, each step: settle parked requests (re-prepare, replay, or fail). True if any moved."""
        if not self._parked:
            return False
        sc = self.sidecar
        sup = getattr(sc, "supervisor", None)
        limit = PARK_LIMIT_STARTUPS * float(getattr(sc, "startup_timeout_s", 60.0))
        moved = False
        for rid, p in list(self._parked.items()):
            r = p.request
            if p.close is None and (r.finished or r.cancelled.is_set()):
                del self._parked[rid]
                if not r.finished:
                    self._finish(r, "cancelled")
                if p.future is not None:  # a session prepared for a request that is gone: end it
                    p.future.add_done_callback(lambda f, rid=rid: self._discard_session(f, rid))
                moved = True
                continue
            idle = p.future is None or p.future.done()
            if sup is not None and sup.state is SidecarState.FAILED and idle:
                self._fail_parked(p, sup.down_reason or "the constraint sidecar cannot be restarted")
                moved = True
                continue
            if p.future is None and time.monotonic() - p.since > limit:
                self._fail_parked(p, f"it was not back within {limit:g} s")
                moved = True
                continue
            if p.future is None:
                if self._sidecar_up():
                    p.future = self._pool().submit(self._reprepare, r)
                continue
            if not p.future.done():
                continue
            fut, p.future = p.future, None
            try:
                info = fut.result()
            except RequestError as e:
                if e.kind == "ConstraintServiceUnavailable" and not (sup is not None and
                                                                     sup.state is SidecarState.FAILED):
                    continue  # down again: retried when it is back
                self._fail_parked(p, e.message)
                moved = True
                continue
            if info.generation != sc.generation:
                continue  # restarted again meanwhile: prepare once more
            self._replay(p, info)
            moved = True
        return moved

    def _replay(self, p: _Parked, info: PrepareInfo) -> None:
        r = p.request
        del self._parked[r.request_id]
        r.sidecar_generation = info.generation
        self.replays += 1
        self.metrics.replayed(len(r.output_ids))
        log.info("request %s re-prepared in sidecar generation %d; replaying %d committed token(s)",
                 r.request_id, info.generation, len(r.output_ids))
        with _tracer.start_as_current_span("engine.replay") as span:  # the replay itself rides on the next Step
            span.set_attribute("gen_ai.request.id", r.request_id)
            span.set_attribute("ninfer.sidecar.generation", info.generation)
            span.set_attribute("ninfer.replayed_tokens", len(r.output_ids))
        if p.close is not None:
            p.close.final_tokens = list(r.output_ids)
            self._closing.append(p.close)
            return
        r.pending_commit = list(r.output_ids)  # the first Step row commits everything committed so far
        r.parked = False

    def _fail_parked(self, p: _Parked, why: str) -> None:
        r = p.request
        del self._parked[r.request_id]
        err = RowError("ConstraintServiceUnavailable", f"the constraint sidecar is unavailable: {why}",
                       status=Status.UNAVAILABLE)
        if p.close is not None:
            self._closed([p.close], None, why)
            return
        r.sidecar_generation = -1  # its session is gone: _finish publishes at once
        self._finish(r, "error", error=err)

    def _reprepare(self, r: Request) -> PrepareInfo:
        """Pool thread: a fresh session for ``r`` (same constraint, wrapper and prefix)."""
        c = r.constraint
        return self.sidecar.prepare(r.request_id, "" if c.kind is None else str(c.kind), c.source, list(c.choices),
                                    c.prefix, wrapper=c.wrapper, replace=True)

    def _discard_session(self, fut: "Future[PrepareInfo]", request_id: str) -> None:
        """Pool thread: close the fresh session of a request that ended while it was re-prepared."""
        try:
            self.sidecar.close(request_id, [], fut.result().generation)
        except Exception:  # noqa: BLE001 - a failed re-prepare or a sidecar gone again: no session to end
            pass

    def _pool(self) -> ThreadPoolExecutor:
        if self._reprepare_pool is None:
            self._reprepare_pool = ThreadPoolExecutor(REPREPARE_WORKERS, thread_name_prefix="ninfer-reprepare")
        return self._reprepare_pool

    def _stop_supervision(self, why: str) -> None:
        """Engine stopping: parked requests end (cancelled if they were running, closes as lost)."""
        for p in list(self._parked.values()):
            if p.close is not None:
                self._closed([p.close], None, why)
            elif not p.request.finished:
                p.request.sidecar_generation = -1
                self._finish(p.request, "cancelled")
        self._parked.clear()
        if self._reprepare_pool is not None:
            self._reprepare_pool.shutdown(wait=False, cancel_futures=True)
