"""The local Step transport (:mod:`ninfer_common.step_socket`): the engine's :class:`SocketStepStream` against the
sidecar's real :class:`StepSocketServer` on a unix socket, with a scripted Step handler (real framing, real
protobuf; the real sidecar process: ``test_sidecar_reconnect.py`` and the e2e suites, which use this transport
by default)."""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import tempfile
import threading
import time
from multiprocessing.connection import Listener

import pytest

from constraint_service.step_socket import StepSocketServer
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.sidecar.stream import SocketStepStream, StepSocketRefused, StreamBroken
from ninfer.constraint.v1 import constraint_pb2 as pb
from ninfer_common.step_socket import FRAME_MESSAGE, error_frame, parse_frame, step_socket_path


class Handler:
    """The sidecar side: answers each Step with its rows (OK), after ``gate`` is set when one is given."""

    def __init__(self) -> None:
        self.gate: threading.Event | None = None
        self.broken = ""
        self.fail: Exception | None = None
        self.seen: list[int] = []

    def __call__(self, req: pb.StepRequest) -> pb.StepResponse:
        self.seen.append(req.step_seq)
        if self.fail is not None:
            raise self.fail
        if self.gate is not None:
            self.gate.wait(30)
        resp = pb.StepResponse(step_seq=req.step_seq, slot=req.slot, work_seconds=0.001)
        for r in req.rows:
            resp.rows.add(request_id=r.request_id, row=r.row, status=pb.ROW_STATUS_OK)
        return resp


@pytest.fixture()
def served():
    d = tempfile.mkdtemp(prefix="ninfer-test-stepsock-")
    path = step_socket_path(os.path.join(d, "c.sock"))
    h = Handler()
    server = StepSocketServer(path, h, lambda: h.broken)
    streams = []

    def connect(deadline_s: float = 30.0, pid: int | None = os.getpid()) -> SocketStepStream:
        s = SocketStepStream(path, 1, deadline_s, pid)
        streams.append(s)
        return s

    try:
        yield h, connect, server
    finally:
        for s in streams:
            s.close()
        server.close()
        os.rmdir(d)


def _req(seq: int, rows: int = 3) -> pb.StepRequest:
    msg = pb.StepRequest(step_seq=seq, slot=seq % 2)
    for i in range(rows):
        msg.rows.add(request_id=f"r{i}", row=i, commit_tokens=[i + 1], draft_tokens=[7, 8])
    return msg


def test_frames_round_trip_and_reject_unknown_kinds():
    assert parse_frame(FRAME_MESSAGE + b"abc") == (True, b"abc")
    assert parse_frame(error_frame("UNAVAILABLE: gone \u2013 dead")) == (False, "UNAVAILABLE: gone \u2013 dead")
    for bad in (b"", b"\x07xyz"):
        with pytest.raises(ValueError):
            parse_frame(bad)


def test_messages_and_answers_cross_in_order_with_their_rows(served):
    h, connect, _ = served
    s = connect()
    assert s.transport == "socket"
    for seq in range(1, 6):
        s.send(_req(seq, rows=seq))
        r = s.recv()
        assert r.step_seq == seq and r.slot == seq % 2
        assert [(x.request_id, x.row, x.status) for x in r.rows] == [(f"r{i}", i, pb.ROW_STATUS_OK) for i in range(seq)]
    assert h.seen == [1, 2, 3, 4, 5]


def test_a_soft_wait_returns_none_and_the_answer_comes_on_a_later_poll(served):
    h, connect, _ = served
    h.gate = threading.Event()
    s = connect()
    s.send(_req(1))
    assert s.recv(0.01) is None  # the sidecar is still working: the answer stays outstanding
    assert s.recv(0.0) is None
    h.gate.set()
    assert s.recv(5.0).step_seq == 1
    h.gate = None
    s.send(_req(2))
    assert s.recv().step_seq == 2  # a blocking wait reads the next one


def test_the_hard_deadline_counts_across_polls_and_breaks_the_stream(served):
    h, connect, _ = served
    h.gate = threading.Event()
    s = connect(deadline_s=0.2)
    s.send(_req(1))
    t = time.monotonic()
    with pytest.raises(StreamBroken, match="no Step answer within 0.2 s"):
        for _ in range(10_000):  # polls only: the deadline counts from the first one
            assert s.recv(0.01) is None
    assert time.monotonic() - t < 5.0
    with pytest.raises(StreamBroken):
        s.recv(0.0)  # broken for good: a late answer could not be matched to its step any more
    with pytest.raises(StreamBroken):
        s.send(_req(2))
    h.gate.set()


def test_close_from_another_thread_ends_a_blocking_wait(served):
    h, connect, _ = served
    h.gate = threading.Event()
    s = connect()
    s.send(_req(1))
    threading.Timer(0.1, s.close).start()
    t = time.monotonic()
    with pytest.raises(StreamBroken, match="closed"):
        s.recv()
    assert time.monotonic() - t < 5.0
    h.gate.set()


def test_a_broken_sidecar_answers_with_an_error_frame_and_ends_the_stream(served):
    h, connect, _ = served
    s = connect()
    s.send(_req(1))
    assert s.recv().step_seq == 1
    h.broken = "shard worker 1 died"
    s.send(_req(2))
    with pytest.raises(StreamBroken, match="UNAVAILABLE: shard worker 1 died"):
        s.recv()
    assert h.seen == [1]  # the handler never ran for the refused message


def test_a_failing_handler_is_reported_as_internal(served):
    h, connect, _ = served
    h.fail = RuntimeError("boom")
    s = connect()
    s.send(_req(1))
    with pytest.raises(StreamBroken, match=r"INTERNAL: the sidecar's Step failed \(RuntimeError: boom\)"):
        s.recv()


def test_the_server_closing_breaks_open_streams_and_removes_the_socket(served):
    h, connect, server = served
    h.gate = threading.Event()
    s = connect()
    s.send(_req(1))
    threading.Timer(0.1, server.close).start()
    with pytest.raises(StreamBroken, match="ended the stream"):
        s.recv()
    h.gate.set()
    assert not os.path.exists(server.path)
    with pytest.raises(OSError):  # nothing to connect to: the engine falls back to gRPC
        connect()


def test_a_peer_that_is_not_the_expected_process_is_refused(served):
    _, connect, _ = served
    with pytest.raises(StepSocketRefused, match="expected pid 1 "):
        connect(pid=1)
    s = connect(pid=None)  # an external sidecar: only the uid is checked
    s.send(_req(1))
    assert s.recv().step_seq == 1


def test_the_step_trace_stamps_each_leg_in_order(served, monkeypatch):
    _, connect, _ = served
    assert connect().trace is None
    monkeypatch.setenv("NINFER_STEP_TRACE", "/nonexistent/trace")
    s = connect()
    for seq in (4, 5):
        s.send(_req(seq))
        assert s.recv(None if seq == 4 else 5.0).step_seq == seq
    assert [(e, q) for e, q, _ in s.trace] == [("put", 4), ("pull", 4), ("answer", 4),
                                                 ("put", 5), ("pull", 5), ("answer", 5)]
    times = [t for _, _, t in s.trace]
    assert times == sorted(times)


def test_a_sidecar_without_a_step_socket_is_used_over_grpc():
    """``--step-socket ''``: the real sidecar serves Steps on gRPC only; the engine's Sidecar falls back to it."""
    from gpu_engine.engine.stats import ring_geometry
    from gpu_engine.sidecar.client import RowStatus, Sidecar, StepRow
    from shared_memory.ring import MaskRing

    V = 64
    vocab = TokenVocabulary(V, tuple(bytes([65 + i % 26]) for i in range(V - 1)) + (b"",), frozenset({V - 1}), (V - 1,))
    geo = ring_geometry(2, 0, V)
    ring = MaskRing.create(f"ninfer-test-stepsock-{os.getpid()}", geo)
    sc = Sidecar(None, vocab, dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots,
                                   num_lanes=geo.num_lanes, num_positions=geo.num_positions, num_words=geo.num_words),
                 extra_args=["--step-socket", ""])
    try:
        sc.start()
        assert sc.step_stream_transport == "grpc"
        sc.prepare("a", "regex", "[A-C]+", [], b"")
        sc.send_step(1, 1, [StepRow("a", 0, [], [])])
        results, _ = sc.recv_step(1)
        assert [(r.request_id, r.status) for r in results] == [("a", RowStatus.OK)]
    finally:
        sc.stop()
        ring.close()
        ring.unlink()
    with pytest.raises(ValueError, match="step_transport"):
        Sidecar(None, vocab, {}, step_transport="carrier-pigeon")


@contextlib.contextmanager
def _scripted_peer(behave):
    """A peer on a step socket that plays ``behave(conn, release)`` on a thread for its one connection
    (``multiprocessing`` framing; ``release`` is set at the end); yields the socket path."""
    d = tempfile.mkdtemp(prefix="ninfer-test-stepsock-")
    listener = Listener(os.path.join(d, "peer.step"), family="AF_UNIX")
    release = threading.Event()
    t = threading.Thread(target=lambda: behave(listener.accept(), release), daemon=True)
    t.start()
    try:
        yield listener.address
    finally:
        release.set()
        listener.close()
        t.join(5)
        os.rmdir(d)


@contextlib.contextmanager
def _raw_listener():
    """A plain unix socket listening with a queue of one and never accepting by itself; yields ``(path, socket)``."""
    d = tempfile.mkdtemp(prefix="ninfer-test-stepsock-")
    path = os.path.join(d, "raw.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    try:
        yield path, srv
    finally:
        srv.close()
        os.unlink(path)
        os.rmdir(d)


@pytest.mark.parametrize("frame, why", [(b"\x07junk", "garbled"), (FRAME_MESSAGE + b"\xff\xff\xff", "garbled"),
                                        (b"", "garbled")])
def test_a_garbled_answer_breaks_the_stream_with_a_reason(frame, why):
    """A peer answering garbage (unknown frame kind, bad protobuf, empty frame): StreamBroken, not a crash."""
    def bad_sidecar(conn, _release):
        conn.recv_bytes()
        conn.send_bytes(frame)

    with _scripted_peer(bad_sidecar) as path:
        s = SocketStepStream(path, 1, 30.0, os.getpid())
        try:
            s.send(_req(1))
            with pytest.raises(StreamBroken, match=why):
                s.recv()
            with pytest.raises(StreamBroken, match=why):  # broken for good, with its first reason
                s.send(_req(2))
        finally:
            s.close()


def test_a_half_written_answer_breaks_the_stream_at_the_deadline_instead_of_hanging():
    """A sidecar stopped mid-write (a frame header and part of its body): the rest must come within the deadline
    (at least PARTIAL_FRAME_S), then StreamBroken; the engine thread is never blocked for good."""
    def stalled_sidecar(conn, release):
        conn.recv_bytes()
        os.write(conn.fileno(), struct.pack("!i", 100) + b"\x00" + b"x" * 9)  # 10 of 100 bytes, then nothing
        release.wait(30)
        conn.close()

    with _scripted_peer(stalled_sidecar) as path:
        s = SocketStepStream(path, 1, 0.3, os.getpid())
        try:
            s.send(_req(1))
            t0 = time.monotonic()
            with pytest.raises(StreamBroken, match="stopped mid-answer"):
                s.recv()
            assert time.monotonic() - t0 < 5.0  # the deadline plus the partial-frame grace, not forever
        finally:
            s.close()


def test_a_sidecar_that_stops_reading_breaks_a_send_at_the_deadline():
    """Writes to a sidecar that takes nothing (its socket buffer full) fail after the deadline: no blocked send."""
    with _raw_listener() as (path, srv):
        s = SocketStepStream(path, 1, 0.3, os.getpid())
        peer, _ = srv.accept()  # accepted, never read
        try:
            big = _req(1, rows=2000)  # ~50 KB a message: the buffer fills within a few
            t0 = time.monotonic()
            with pytest.raises(StreamBroken, match="did not take a Step within 0.3 s"):
                for _ in range(1000):
                    s.send(big)
            assert time.monotonic() - t0 < 5.0
        finally:
            s.close()
            peer.close()


def test_the_accept_loop_survives_a_failed_accept(monkeypatch):
    """An accept that fails (e.g. EMFILE: out of file descriptors) is retried, not the end of the socket."""
    import errno

    import constraint_service.step_socket as ss

    failures = []

    class Flaky(Listener):
        def accept(self):
            if not failures:
                failures.append(1)
                raise OSError(errno.EMFILE, "Too many open files")
            return super().accept()

    monkeypatch.setattr(ss, "Listener", Flaky)
    d = tempfile.mkdtemp(prefix="ninfer-test-stepsock-")
    path = step_socket_path(os.path.join(d, "c.sock"))
    server = StepSocketServer(path, Handler(), lambda: "")
    try:
        s = SocketStepStream(path, 1, 10.0, os.getpid())
        s.send(_req(1))
        assert s.recv().step_seq == 1 and failures == [1]
        s.close()
    finally:
        server.close()
        os.rmdir(d)


def test_connect_waits_while_the_listen_queue_is_full():
    """A unix socket answers a full listen queue with EAGAIN at once: the engine retries until its timeout."""
    from gpu_engine.sidecar.stream import _connect

    fill = []
    with _raw_listener() as (path, srv):
        try:
            while True:  # fill the queue
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.setblocking(False)
                try:
                    c.connect(path)
                except BlockingIOError:
                    c.close()
                    break
                fill.append(c)
            with pytest.raises(BlockingIOError):  # nobody accepts: still full at the timeout
                _connect(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path, 0.2)
            threading.Timer(0.2, lambda: [srv.accept() for _ in range(len(fill) + 1)]).start()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            _connect(s, path, 5.0)  # admitted once the queue drains
            s.close()
        finally:
            for c in fill:
                c.close()
