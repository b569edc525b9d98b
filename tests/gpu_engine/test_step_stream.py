"""``StepStream`` soft waits (the deferred mask wait's transport) against a fake gRPC call.

The fake call blocks in ``next()`` like gRPC's response iterator until the test releases an answer;
``cancel()`` makes the blocked ``next()`` raise ``CANCELLED`` as gRPC does. Real-process coverage:
``tests/e2e/test_supervision_e2e.py`` (SIGSTOP of the real sidecar).
"""
from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from gpu_engine.sidecar import stream as stream_mod
from gpu_engine.sidecar.stream import StepStream, StreamBroken
from ninfer.constraint.v1 import constraint_pb2 as pb


class _Cancelled(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self):
        return "Locally cancelled by application!"


class FakeCall:
    def __init__(self) -> None:
        self.answers: queue.Queue = queue.Queue()

    def __iter__(self):
        return self

    def __next__(self):
        x = self.answers.get()
        if x is None:
            raise _Cancelled()
        return x

    def cancel(self) -> None:
        self.answers.put(None)


class FakeStub:
    def __init__(self) -> None:
        self.call = FakeCall()

    def Step(self, requests):  # noqa: N802 - gRPC stub method name
        self.requests = requests  # what gRPC's sending thread iterates
        return self.call


def _stream(deadline_s: float = 30.0) -> tuple[StepStream, FakeCall]:
    stub = FakeStub()
    return StepStream(stub, 1, deadline_s), stub.call


def test_a_soft_wait_returns_none_and_the_answer_comes_on_a_later_poll():
    s, call = _stream()
    try:
        assert s.recv(0.01) is None  # nothing yet: the answer stays outstanding
        assert s.recv(0.0) is None
        call.answers.put(pb.StepResponse(step_seq=7))
        assert s.recv(5.0).step_seq == 7  # the same outstanding next() delivers it
        call.answers.put(pb.StepResponse(step_seq=8))
        assert s.recv().step_seq == 8  # a blocking wait reads on the caller's thread again
    finally:
        s.close()


def test_a_blocking_wait_after_a_soft_one_takes_the_outstanding_answer():
    s, call = _stream()
    try:
        assert s.recv(0.0) is None
        call.answers.put(pb.StepResponse(step_seq=3))
        assert s.recv(None).step_seq == 3
    finally:
        s.close()


def test_the_hard_deadline_counts_across_polls_and_breaks_the_stream():
    s, _call = _stream(deadline_s=0.2)
    try:
        with pytest.raises(StreamBroken, match="no Step answer within 0.2 s"):
            for _ in range(1000):  # polls only; the watchdog cancels the call past the deadline
                assert s.recv(0.01) is None
        with pytest.raises(StreamBroken):
            s.recv(0.0)  # broken for good
    finally:
        s.close()


def test_close_ends_an_outstanding_soft_wait():
    s, _call = _stream()
    assert s.recv(0.0) is None
    s.close()
    with pytest.raises(StreamBroken, match="closed"):
        s.recv(0.0)


def test_the_step_trace_stamps_queued_taken_and_answered_in_order(monkeypatch):
    """NINFER_STEP_TRACE (bench/engine_bench.py --step-trace): one (event, step_seq, time) per leg of each
    message, on the sidecar's clock (time.perf_counter); off by default (no list, no wrapper)."""
    assert StepStream(FakeStub(), 1, 30.0).trace is None
    monkeypatch.setenv("NINFER_STEP_TRACE", "/nonexistent/trace")
    stub = FakeStub()
    s = StepStream(stub, 1, 30.0)
    try:
        for seq in (4, 5):
            s.send(pb.StepRequest(step_seq=seq))
            assert next(stub.requests).step_seq == seq  # gRPC's sending thread takes it
            stub.call.answers.put(pb.StepResponse(step_seq=seq))
            assert s.recv(None if seq == 4 else 5.0).step_seq == seq  # engine thread / reader thread
        assert [(e, q) for e, q, _ in s.trace] == [("put", 4), ("pull", 4), ("answer", 4),
                                                     ("put", 5), ("pull", 5), ("answer", 5)]
        times = [t for _, _, t in s.trace]
        assert times == sorted(times)
    finally:
        s.close()


def test_send_hands_the_message_over_and_never_waits_past_the_handoff_budget(monkeypatch):
    """send() waits (GIL released) until gRPC's sending thread took the message (STEP_HANDOFF_S): at most the
    budget when nobody takes it, and no longer than the take when it is taken."""
    stub = FakeStub()
    s = StepStream(stub, 1, 30.0)
    try:
        monkeypatch.setattr(stream_mod, "STEP_HANDOFF_S", 0.2)
        t = time.perf_counter()
        s.send(pb.StepRequest(step_seq=1))  # nobody consumes: the wait ends at the budget
        assert 0.2 <= time.perf_counter() - t < 5.0
        assert next(stub.requests).step_seq == 1
        monkeypatch.setattr(stream_mod, "STEP_HANDOFF_S", 30.0)
        taker = threading.Thread(target=lambda: (time.sleep(0.05), next(stub.requests)))
        taker.start()
        t = time.perf_counter()
        s.send(pb.StepRequest(step_seq=2))  # taken after ~50 ms: send returns then, not after 30 s
        assert time.perf_counter() - t < 5.0
        taker.join()
        monkeypatch.setattr(stream_mod, "STEP_HANDOFF_S", 0.0)
        t = time.perf_counter()
        s.send(pb.StepRequest(step_seq=3))  # 0: no wait at all
        assert time.perf_counter() - t < 0.1
    finally:
        s.close()
