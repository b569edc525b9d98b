"""Engine metrics (OpenTelemetry instruments; Prometheus scrape with ``--metrics-port``).

Labels are fixed enums only (finish reason, constraint kind, cache outcome,
error kind) — never grammar or schema content. Counts are recorded when a
request settles, including cancellations and length stops.
"""
from __future__ import annotations

from typing import Any

from ninfer_common.telemetry import get_meter


class EngineMetrics:
    """Holds the instruments; every method is a cheap no-op without OpenTelemetry."""

    def __init__(self) -> None:
        m = get_meter("ninfer.gpu_engine")
        self._on = m is not None
        if not self._on:
            return
        self.requests = m.create_counter("ninfer_requests", unit="1",
                                         description="Finished requests by finish reason and constraint kind")
        self.rejected = m.create_counter("ninfer_requests_rejected", unit="1",
                                         description="Requests rejected before queueing, by error kind")
        self.tokens = m.create_counter("ninfer_generated_tokens", unit="1", description="Generated tokens")
        self.cache = m.create_counter("ninfer_constraint_cache", unit="1",
                                      description="Compiled-grammar cache outcomes (hit / built / waited)")
        self.prepare = m.create_histogram("ninfer_constraint_prepare_seconds", unit="s",
                                          description="Constraint preparation time per request")
        self.wait = m.create_histogram("ninfer_sidecar_wait_seconds", unit="s",
                                       description="Exposed wait for the sidecar's masks per constrained step")
        self.step = m.create_histogram("ninfer_step_seconds", unit="s", description="Engine step wall time")
        self.drafts = m.create_counter("ninfer_draft_tokens", unit="1", description="Proposed draft tokens")
        self.accepted = m.create_counter("ninfer_accepted_draft_tokens", unit="1", description="Accepted draft tokens")
        self.compile = m.create_histogram("ninfer_constraint_compile_seconds", unit="s",
                                          description="Preparation time of constrained requests whose grammar was "
                                                      "compiled (cache outcome built)")
        self.ttft = m.create_histogram("ninfer_time_to_first_token_seconds", unit="s",
                                       description="Request arrival at the public API to its first streamed token")
        self.itl = m.create_histogram("ninfer_inter_token_latency_seconds", unit="s",
                                      description="Gap between streamed tokens of one request (per token)")
        self.replays = m.create_counter("ninfer_sidecar_replays", unit="1",
                                        description="Constrained requests re-prepared in a restarted sidecar with "
                                                    "their committed tokens replayed")
        self.replayed_tokens = m.create_counter("ninfer_sidecar_replayed_tokens", unit="1",
                                                description="Committed tokens replayed into fresh matchers")
        self.deferred = m.create_counter("ninfer_mask_wait_deferred", unit="1",
                                         description="Steps with constrained and unconstrained rows whose masks "
                                                     "missed the soft wait: unconstrained rows went on alone")
        self.step_messages = m.create_counter(
            "ninfer_step_messages", unit="1",
            description="Step messages of steps without drafts, by their order around the forward launch "
                        "(order=before|after; --step-send auto chooses from the measured Step work and forward time)")
        self.steps_ahead = m.create_counter(
            "ninfer_steps_ahead", unit="1",
            description="Forwards queued during the step before theirs (overlap scheduling), by result "
                        "(result=used|discarded: a row got tokens the queued forward did not foresee, or rows "
                        "joined or all ended)")
        for rare in (self.deferred, self.replays, self.replayed_tokens):
            rare.add(0)  # exported (as 0) from the start: rare by design, and dashboards query them
        for result in ("used", "discarded"):  # 0 on an engine that never queues ahead (CPU, or turned off)
            self.steps_ahead.add(0, {"result": result})
        self.queue_wait = m.create_histogram("ninfer_queue_wait_seconds", unit="s",
                                             description="Submission to the engine until the request got a lane")
        self._meter = m

    def observe_engine(self, queue_depth, running_lanes, sidecar_restarts, parked) -> None:
        """Register the gauges read at scrape time.

        Args:
            queue_depth: ``() -> int``, requests submitted and waiting for a lane.
            running_lanes: ``() -> int``, requests resident in lanes.
            sidecar_restarts: ``() -> int``, restarts of the constraint sidecar since start-up.
            parked: ``() -> int``, constrained requests waiting for a restarted sidecar.
        """
        if not self._on:
            return
        from opentelemetry.metrics import Observation

        m = self._meter
        m.create_observable_gauge("ninfer_queue_depth", callbacks=[lambda _o: [Observation(queue_depth())]],
                                  unit="1", description="Requests waiting for a lane")
        m.create_observable_gauge("ninfer_running_lanes", callbacks=[lambda _o: [Observation(running_lanes())]],
                                  unit="1", description="Requests resident in lanes")
        m.create_observable_counter("ninfer_sidecar_restarts", callbacks=[lambda _o: [Observation(sidecar_restarts())]],
                                    unit="1", description="Constraint sidecar restarts since start-up")
        m.create_observable_gauge("ninfer_parked_requests", callbacks=[lambda _o: [Observation(parked())]],
                                  unit="1", description="Constrained requests parked while the sidecar restarts")
        self._observe_gc(m, Observation)

    @staticmethod
    def _observe_gc(m, observation) -> None:
        """The engine process's garbage-collector pauses (:func:`ninfer_common.gc_heap.process_pauses`, timed
        from here on) by generation, and the objects frozen at start-up (``ninfer serve``)."""
        import gc

        from ninfer_common.gc_heap import process_pauses

        pauses = process_pauses()
        m.create_observable_counter(
            "ninfer_gc_pause_seconds", unit="s",
            description="Wall time of the engine process's garbage collections by generation (every thread waits)",
            callbacks=[lambda _o: [observation(s, {"generation": str(g)}) for g, s in enumerate(pauses.seconds)]])
        m.create_observable_counter(
            "ninfer_gc_collections", unit="1", description="Garbage collections of the engine process by generation",
            callbacks=[lambda _o: [observation(n, {"generation": str(g)}) for g, n in enumerate(pauses.collections)]])
        m.create_observable_gauge(
            "ninfer_gc_frozen_objects", unit="1",
            description="Objects of the engine's start-up heap frozen out of garbage collection (NINFER_GC_FREEZE)",
            callbacks=[lambda _o: [observation(gc.get_freeze_count())]])

    def request_finished(self, finish_reason: str, constraint_kind: str, completion_tokens: int,
                         draft_tokens: int, accepted_draft_tokens: int, constraint: Any | None) -> None:
        """Counts a finished request; ``constraint`` is its :class:`gpu_engine.core.request.ConstraintResult`."""
        if not self._on:
            return
        kind = constraint_kind or "none"
        self.requests.add(1, {"finish_reason": str(finish_reason), "constraint_kind": str(kind)})
        self.tokens.add(completion_tokens, {"constraint_kind": str(kind)})
        if draft_tokens:
            self.drafts.add(draft_tokens)
            self.accepted.add(accepted_draft_tokens)
        if constraint is not None and constraint.cache:
            self.cache.add(1, {"cache": str(constraint.cache)})
            self.prepare.record(float(constraint.prepare_seconds))
            if str(constraint.cache) == "built":
                self.compile.record(float(constraint.prepare_seconds))

    def request_rejected(self, kind: str) -> None:
        if self._on:
            self.rejected.add(1, {"kind": kind})

    def step_done(self, seconds: float) -> None:
        if self._on:
            self.step.record(seconds)

    def sidecar_wait(self, seconds: float) -> None:
        if self._on:
            self.wait.record(seconds)

    def first_token(self, seconds: float) -> None:
        if self._on:
            self.ttft.record(seconds)

    def inter_token(self, seconds_per_token: float) -> None:
        if self._on:
            self.itl.record(seconds_per_token)

    def replayed(self, tokens: int) -> None:
        """One request re-prepared after a sidecar restart, ``tokens`` committed tokens replayed."""
        if self._on:
            self.replays.add(1)
            self.replayed_tokens.add(tokens)

    def mask_wait_deferred(self) -> None:
        """One mixed step's mask wait passed the soft budget (its constrained rows now wait alone)."""
        if self._on:
            self.deferred.add(1)

    def step_ahead(self, used: bool) -> None:
        """One forward queued ahead was used by its step (``True``) or discarded."""
        if self._on:
            self.steps_ahead.add(1, {"result": "used" if used else "discarded"})

    def step_message(self, after: bool) -> None:
        """One plain step's Step message sent, after (``True``) or before its forward launch."""
        if self._on:
            self.step_messages.add(1, {"order": "after" if after else "before"})

    def queued(self, seconds: float) -> None:
        if self._on:
            self.queue_wait.record(seconds)
