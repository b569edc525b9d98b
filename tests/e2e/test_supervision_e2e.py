"""End-to-end: nothing is lost when the constraint sidecar dies or hangs (issue 14 (3) and (4)).

Real engine and sidecar processes, real gRPC, real shared-memory ring, the default model. The
sidecar is SIGKILLed while 16 constrained streams run (8 in lanes, 8 queued), or SIGSTOPped (hung)
while constrained and unconstrained streams run; every constrained stream must still complete
in its language, unconstrained streams keep receiving tokens while the sidecar is down, and health
says NOT_SERVING while it is down and SERVING after.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request

import grpc
import jsonschema
import pytest

from .conftest import Stack, metered_stack

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"[A-Z]{2}-\d{3}( [a-z]{1,6}){3}"


def _job(i: int) -> dict:
    if i % 2:
        return dict(messages=[{"role": "user", "content": f"Give person number {i} as JSON"}],
                    constraint={"json_schema": json.dumps(SCHEMA)}, max_tokens=96, temperature=0.7, seed=i)
    return dict(messages=[{"role": "user", "content": "Give a product code and three words"}],
                constraint={"regex": REGEX}, max_tokens=96, temperature=0.7, seed=i)


def _valid(i: int, text: str) -> bool:
    if i % 2:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    return re.fullmatch(REGEX, text) is not None


def _metric(stack: Stack, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=30).read().decode()
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def _health(target: str) -> dict[str, str]:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        name = health_pb2.HealthCheckResponse.ServingStatus.Name
        return {s: name(stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=10).status)
                for s in ("", "ninfer.v1.Generation")}


class Streams:
    """Constrained streams in threads; ``started`` counts those that received a token; ``times[i]``: the
    arrival times (``time.monotonic()``) of stream ``i``'s token events."""

    def __init__(self, client, n: int) -> None:
        self.results: dict[int, object] = {}
        self.times: dict[int, list[float]] = {i: [] for i in range(n)}
        self.errors: dict[int, BaseException] = {}
        self.started = threading.Semaphore(0)
        self.threads = [threading.Thread(target=self._run, args=(client, i), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, client, i: int) -> None:
        try:
            stream = client.generate(**_job(i))
            first = True
            for ev in stream:
                if ev.token_ids:
                    self.times[i].append(time.monotonic())
                    if first:
                        self.started.release()
                        first = False
            self.results[i] = stream.result
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors[i] = e

    def first_after(self, t: float) -> list[float | None]:
        """Per stream, its first token event after ``t`` (None: none)."""
        return [next((x for x in ts if x > t), None) for ts in self.times.values()]

    def wait_started(self, k: int, timeout_s: float = 300) -> None:
        end = time.monotonic() + timeout_s
        for _ in range(k):
            assert self.started.acquire(timeout=max(0.0, end - time.monotonic())), "streams did not start"

    def join(self, timeout_s: float = 600) -> None:
        for t in self.threads:
            t.join(timeout_s)
        assert not any(t.is_alive() for t in self.threads), "a stream hung"


DEADLINE_S = 5.0  # --sidecar-deadline of this module's stack (default 20 s)


@pytest.fixture(scope="module")
def sup_stack():
    """One stack for both tests (a start-up is the slow part on 2 cores); each test measures its own deltas."""
    yield from metered_stack(["--sidecar-deadline", str(DEADLINE_S)])


def check_all_valid(streams: Streams, n: int) -> None:
    assert not streams.errors, {i: repr(e) for i, e in streams.errors.items()}
    for i in range(n):
        r = streams.results[i]
        assert r.error is None and r.finish_reason == "stop", (i, r)
        assert _valid(i, r.text), (i, r.text)


def test_sigkill_during_16_constrained_streams_loses_nothing(sup_stack) -> None:
    from clients.client import NInferClient

    s, n = sup_stack, 16
    restarts, replays = _metric(s, "ninfer_sidecar_restarts_total"), _metric(s, "ninfer_sidecar_replays_total")
    with NInferClient(s.target) as c:
        streams = Streams(c, n)
        streams.wait_started(2)  # two rows are decoding; the other rows are in lanes or queued
        pid = s.sidecar_pid()
        os.kill(pid, signal.SIGKILL)
        streams.join()
        check_all_valid(streams, n)
        assert s.sidecar_pid() != pid
        assert _metric(s, "ninfer_sidecar_restarts_total") - restarts == 1
        assert _metric(s, "ninfer_sidecar_replays_total") - replays >= 1
        assert _health(s.target) == {"": "SERVING", "ninfer.v1.Generation": "SERVING"}


def _sigcont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


class HealthWatch(threading.Thread):
    """Polls both health services; records ``(time, overall)`` on every change."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target, self.changes, self.stop = target, [], threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            try:
                h = _health(self.target)
                now = "SERVING" if set(h.values()) == {"SERVING"} else "NOT_SERVING"
            except grpc.RpcError:
                now = "ERROR"
            if now != last:
                self.changes.append((time.monotonic(), now))
                last = now
            self.stop.wait(0.1)


class Feeder(threading.Thread):
    """Keeps one unconstrained stream running; records the arrival time of every token event."""

    def __init__(self, client) -> None:
        super().__init__(daemon=True)
        self.client, self.arrivals, self.errors, self.stop = client, [], [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            stream = self.client.generate(prompt="Once upon a time, by the sea,", max_tokens=400, temperature=1.0)
            for ev in stream:
                if ev.token_ids:
                    self.arrivals.append(time.monotonic())
                if self.stop.is_set():
                    stream.cancel()
                    return
            if stream.result.error is not None:
                self.errors.append(stream.result.error)


def test_sigstop_hung_sidecar_is_replaced_health_flips_and_streams_finish(sup_stack) -> None:
    """Also: the unconstrained stream never waits on the hung sidecar (deferred mask wait): it receives
    tokens while the sidecar is stopped, before its deadline could even have passed."""
    from clients.client import NInferClient

    s = sup_stack
    restarts, replays = _metric(s, "ninfer_sidecar_restarts_total"), _metric(s, "ninfer_sidecar_replays_total")
    deferred = _metric(s, "ninfer_mask_wait_deferred_total")
    with NInferClient(s.target) as c:
        watch, feeder = HealthWatch(s.target), Feeder(c)
        watch.start()
        feeder.start()
        n = 6
        streams = Streams(c, n)
        streams.wait_started(2)
        end = time.monotonic() + 300
        while not feeder.arrivals:  # the unconstrained stream decodes next to the constrained ones
            assert time.monotonic() < end, "the unconstrained stream did not start"
            time.sleep(0.05)
        pid = s.sidecar_pid()
        t_stop = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(10.0, _sigcont, args=(pid,))  # a ~10 s hang, unless it was killed meanwhile
        resume.start()
        try:
            streams.join()
        finally:
            resume.join()
        check_all_valid(streams, n)  # the constrained streams resumed after re-prepare + replay
        end = time.monotonic() + 120
        while _health(s.target) != {"": "SERVING", "ninfer.v1.Generation": "SERVING"}:
            assert time.monotonic() < end, "health did not recover"
            time.sleep(0.2)
        feeder.stop.set()
        watch.stop.set()
        feeder.join(300)
        watch.join(30)
        states = [st for _, st in watch.changes]
        assert "NOT_SERVING" in states and states[-1] == "SERVING", watch.changes
        down = next(t for t, st in watch.changes if st == "NOT_SERVING" and t > t_stop)
        up = next(t for t, st in watch.changes if st == "SERVING" and t > down)
        during = [t for t in feeder.arrivals if down < t < up]
        # stopped, not yet detected: from 1 s after SIGSTOP (tokens of steps answered before it) until
        # 1 s before the deadline could pass (then the hung sidecar's rows are parked anyway)
        hung = [t for t in feeder.arrivals if t_stop + 1.0 < t < min(down, t_stop + DEADLINE_S - 1.0)]
        print(f"health NOT_SERVING {down - t_stop:.2f} s after SIGSTOP (deadline {DEADLINE_S} s), SERVING again "
              f"{up - down:.2f} s later; {len(hung)} unconstrained token events while stopped and undetected, "
              f"{len(during)} while down")
        assert hung, "the unconstrained stream waited on the hung sidecar (no token while it was stopped)"
        assert _metric(s, "ninfer_mask_wait_deferred_total") - deferred >= 1
        assert during, "the unconstrained stream received no token while the sidecar was down"
        assert not feeder.errors, feeder.errors
        assert s.sidecar_pid() != pid  # the hung one was killed and replaced
        assert _metric(s, "ninfer_sidecar_restarts_total") - restarts == 1
        assert _metric(s, "ninfer_sidecar_replays_total") - replays >= 1
        r = c.generate_text(**_job(1))
        assert r.error is None and _valid(1, r.text), r
