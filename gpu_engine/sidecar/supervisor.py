"""Supervision of the constraint sidecar: heartbeat, dead/hung detection, restarts off the engine thread.

A :class:`SidecarSupervisor` thread checks the sidecar every ``heartbeat_s`` seconds (process alive,
``grpc.health.v1`` answering within ``deadline_s``) and is woken at once when the engine or a
``Prepare`` reports a failure (a broken Step stream, a Step answer or a Prepare past its deadline:
:meth:`gpu_engine.sidecar.client.Sidecar.mark_lost`). A dead or hung sidecar is SIGKILLed (an external
one is only disconnected) and started again as a new generation, on this thread: the engine thread
never waits for a restart. While the sidecar is down the state is ``DOWN``; listeners (the public
health service) hear every change.

Restarts are bounded: after ``max_restarts`` failed or successful restarts within ``window_s``
seconds the state becomes ``FAILED`` (the engine then fails its parked constrained requests with
``ConstraintServiceUnavailable`` instead of holding them); the supervisor keeps trying every
``window_s / max_restarts`` seconds and returns to ``UP`` when a restart succeeds.
"""
from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from typing import Callable

from ninfer_common.telemetry import get_tracer

from gpu_engine.sidecar.client import Sidecar, SidecarUnavailable

log = logging.getLogger("ninfer.engine.sidecar")
_tracer = get_tracer("ninfer.gpu_engine")


class SidecarState(enum.StrEnum):
    """Supervisor state: ``UP`` (serving), ``DOWN`` (restarting), ``FAILED`` (restart limit reached)."""

    UP = "up"
    DOWN = "down"
    FAILED = "failed"


class SidecarSupervisor:
    """Watches and restarts one :class:`Sidecar` (attaches itself as ``sidecar.supervisor``).

    Args:
        sidecar: the sidecar, started before :meth:`start`.
        deadline_s: heartbeat deadline, seconds (a health check slower than this counts as hung).
        heartbeat_s: seconds between heartbeats (default ``min(1, deadline_s / 4)``).
        max_restarts: restarts allowed within ``window_s`` before the state becomes FAILED.
        window_s: the restart window, seconds.
    """

    def __init__(self, sidecar: Sidecar, deadline_s: float, heartbeat_s: float | None = None,
                 max_restarts: int = 5, window_s: float = 60.0) -> None:
        self.sidecar = sidecar
        self.deadline_s = float(deadline_s)
        self.heartbeat_s = float(heartbeat_s if heartbeat_s is not None else min(1.0, deadline_s / 4))
        self.max_restarts = max(1, int(max_restarts))
        self.window_s = float(window_s)
        self.state = SidecarState.UP
        self.down_reason = ""
        self._attempts: collections.deque[float] = collections.deque()
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._listeners: list[Callable[[SidecarState], None]] = []
        self._thread: threading.Thread | None = None
        sidecar.supervisor = self

    # ------------------------------------------------------------------- API
    def add_listener(self, fn: Callable[[SidecarState], None]) -> None:
        """Call ``fn(state)`` on every state change (on the supervisor thread) and once now."""
        self._listeners.append(fn)
        fn(self.state)

    def start(self) -> None:
        """Start the supervisor thread."""
        self._thread = threading.Thread(target=self._run, name="ninfer-sidecar-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (the sidecar itself is stopped by its owner)."""
        self._stop.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.deadline_s + 10)

    def wake(self) -> None:
        """Check the sidecar now (a failure was reported)."""
        self._wake.set()

    def usable(self) -> bool:
        """True while the sidecar is up and no failure is pending."""
        return self.state is SidecarState.UP and self.sidecar.alive()

    def wait_up(self, timeout_s: float) -> bool:
        """Wait until the sidecar is usable; False after ``timeout_s`` or when the state is FAILED."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not self.usable():
                left = end - time.monotonic()
                if self.state is SidecarState.FAILED or left <= 0 or self._stop.is_set():
                    return False
                self._wake.set()
                self._cond.wait(min(left, 0.5))
        return True

    # ---------------------------------------------------------------- thread
    def _set(self, state: SidecarState, why: str = "") -> None:
        with self._cond:
            changed = state is not self.state
            self.state, self.down_reason = state, why
            self._cond.notify_all()
        if changed:
            for fn in self._listeners:
                try:
                    fn(state)
                except Exception:  # noqa: BLE001 - a listener never stops supervision
                    log.exception("sidecar state listener failed")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.heartbeat_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            why = self.sidecar.check_health(self.deadline_s)
            if not why:
                if self.state is not SidecarState.UP:
                    self._set(SidecarState.UP)
                continue
            self._recover(why)

    def _recover(self, why: str) -> None:
        """Restart until it works, the restart budget is spent (FAILED, then slower retries) or stop."""
        log.error("constraint sidecar unusable: %s", why)
        self._set(SidecarState.DOWN if self.state is not SidecarState.FAILED else SidecarState.FAILED, why)
        while not self._stop.is_set():
            now = time.monotonic()
            while self._attempts and now - self._attempts[0] > self.window_s:
                self._attempts.popleft()
            if len(self._attempts) >= self.max_restarts:
                if self.state is not SidecarState.FAILED:
                    log.error("constraint sidecar: %d restarts within %g s; failing constrained requests until "
                              "a restart succeeds", len(self._attempts), self.window_s)
                    self._set(SidecarState.FAILED, f"the constraint sidecar failed {len(self._attempts)} restarts "
                                                   f"within {self.window_s:g} s ({why})")
                if self._stop.wait(self.window_s / self.max_restarts):
                    return
                self._attempts.popleft()
            self._attempts.append(time.monotonic())
            try:
                with _tracer.start_as_current_span("sidecar.restart") as span:
                    span.set_attribute("ninfer.sidecar.reason", why)
                    span.set_attribute("ninfer.sidecar.external", self.sidecar.external)
                    self.sidecar.restart(why)
                    span.set_attribute("ninfer.sidecar.generation", self.sidecar.generation)
            except (SidecarUnavailable, OSError) as e:
                why = str(e)
                log.error("constraint sidecar restart failed: %s", why)
                if self.state is not SidecarState.FAILED:
                    self._set(SidecarState.DOWN, why)
                self._stop.wait(min(2.0, self.window_s / self.max_restarts))
                continue
            self._set(SidecarState.UP)
            return
