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

    def request_rejected(self, kind: str) -> None:
        if self._on:
            self.rejected.add(1, {"kind": kind})

    def step_done(self, seconds: float) -> None:
        if self._on:
            self.step.record(seconds)

    def sidecar_wait(self, seconds: float) -> None:
        if self._on:
            self.wait.record(seconds)
