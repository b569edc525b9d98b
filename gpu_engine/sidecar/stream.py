"""The engine's ``Step`` stream to one sidecar generation, with a deadline on every answer.

Two transports carry the same protobuf messages: :class:`SocketStepStream` on the sidecar's local step
socket (the default: no thread hop, :mod:`ninfer_common.step_socket`) and :class:`StepStream` on the gRPC
``Step`` RPC (the fallback). The rest of this docstring is about the gRPC one.

gRPC's response iterator blocks in ``next()`` until an answer or an error arrives: a hung (e.g.
SIGSTOPped) sidecar would block the engine thread forever. The engine thread still reads the
answer itself (no extra thread hop on the hot path: the answer wakes it directly), while a
watchdog thread per stream cancels the call when one wait has lasted longer than the deadline;
the cancelled ``next()`` returns at once and :meth:`StepStream.recv` reports the missed deadline
(issue 14 (3)).

A *soft* wait (``recv(timeout=...)``, the engine's deferred mask wait: unconstrained rows must not
wait on a slow or hung sidecar) cannot interrupt a blocking ``next()``, so it runs ``next()`` on the
stream's one reader thread and waits on that future for at most ``timeout``; later calls poll the
same future. The hard deadline counts from the first wait for an answer, across polls.
"""
from __future__ import annotations

import os
import queue
import socket
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import NoReturn

import grpc
from google.protobuf.message import DecodeError

from ninfer.constraint.v1 import constraint_pb2 as pb
from ninfer_common.step_socket import FRAME_MESSAGE, MAX_FRAME_BYTES, parse_frame


# Seconds the engine thread waits, after queueing a Step message, for gRPC's sending thread to take it
# (0: no wait). The sending thread needs the GIL, which the engine thread, busy building the batch and
# launching the forward, would otherwise hold for up to the switch interval: the message then left
# ~0.3 ms after it was queued on the H200 (bench/results/engine_bench_h200_step_trace.json, queued_to_taken).
# Waiting on an Event hands the GIL over at once; the wait ends when the message is taken.
# NINFER_STEP_HANDOFF_S overrides it (bench A/B runs).
STEP_HANDOFF_S = float(os.environ.get("NINFER_STEP_HANDOFF_S", "0.0005"))


class StreamBroken(Exception):
    """The stream ended, failed, or did not answer within the deadline (``str``: why, no Python repr)."""


class StepStream:
    """One bidirectional ``Step`` call of one sidecar generation.

    Args:
        stub: a ``ConstraintServiceStub`` on the generation's channel.
        generation: the sidecar generation this stream belongs to (sessions live in one generation).
        deadline_s: the longest wait for one answer, seconds.
    """

    transport = "grpc"

    def __init__(self, stub, generation: int, deadline_s: float) -> None:
        self.generation = generation
        self.deadline_s = float(deadline_s)
        self._requests: "queue.Queue[pb.StepRequest | None]" = queue.Queue()
        self.broken: str = ""  # why the stream is unusable ("" while it is fine)
        self._waiting_since = 0.0  # time.monotonic() when the engine began waiting; 0 when not waiting
        self._closed = threading.Event()
        self._reader: ThreadPoolExecutor | None = None  # runs next() for soft waits (made on first use)
        self._next_answer: "Future[pb.StepResponse] | None" = None  # a next() in flight on the reader
        # NINFER_STEP_TRACE set (diagnostics, bench/engine_bench.py): (event, step_seq, time.perf_counter()) of
        # every message: "put" (queued by the engine), "pull" (taken by gRPC's sending thread), "answer" (in hand)
        self.trace: list | None = [] if os.environ.get("NINFER_STEP_TRACE") else None
        self._taken = threading.Event()  # set when gRPC's sending thread took the last queued message
        self._call = stub.Step(self._outgoing())
        threading.Thread(target=self._watch, name=f"ninfer-step-watchdog-{generation}", daemon=True).start()

    def _outgoing(self):
        """The request iterator gRPC's sending thread consumes."""
        for msg in iter(self._requests.get, None):
            if self.trace is not None:
                self.trace.append(("pull", msg.step_seq, time.perf_counter()))
            self._taken.set()
            yield msg

    def _watch(self) -> None:
        tick = min(0.25, self.deadline_s / 4)
        while not self._closed.wait(tick):
            since = self._waiting_since
            if since and time.monotonic() - since > self.deadline_s and not self.broken:
                self.broken = f"no Step answer within {self.deadline_s:g} s (the sidecar is hung or overloaded)"
                self._call.cancel()  # the engine's next() returns now
                return

    def send(self, msg: pb.StepRequest) -> None:
        """Queue ``msg`` for sending (non-blocking).

        Raises:
            StreamBroken: the stream is known to be broken.
        """
        if self.broken:
            raise StreamBroken(self.broken)
        if self.trace is not None:
            self.trace.append(("put", msg.step_seq, time.perf_counter()))
        self._taken.clear()
        self._requests.put(msg)
        if STEP_HANDOFF_S > 0:
            self._taken.wait(STEP_HANDOFF_S)  # see STEP_HANDOFF_S

    def recv(self, timeout: float | None = None) -> pb.StepResponse | None:
        """The next answer, waiting at most ``deadline_s`` seconds (plus the watchdog's tick) since the
        first wait for it.

        Args:
            timeout: ``None``: block until the answer (or the deadline). Else a soft budget in seconds
                (``0`` polls): when it passes first, returns ``None`` and the answer stays outstanding
                (call again for it; no new message may be sent meanwhile).

        Raises:
            StreamBroken: the stream broke, ended, or gave no answer within the deadline (the stream
                is then broken for good: a late answer could not be matched to its step any more).
        """
        if self.broken:
            raise StreamBroken(self.broken)
        if not self._waiting_since:
            self._waiting_since = time.monotonic()
        if timeout is None and self._next_answer is None:
            return self._next()  # the engine thread reads the answer itself: no thread hop
        if self._next_answer is None:
            if self._reader is None:
                self._reader = ThreadPoolExecutor(1, thread_name_prefix=f"ninfer-step-reader-{self.generation}")
            try:
                self._next_answer = self._reader.submit(self._next)
            except RuntimeError:  # closed (shut down) by a concurrent restart
                raise StreamBroken(self.broken or "the stream was closed") from None
        try:
            r = self._next_answer.result(timeout)
        except TimeoutError:  # concurrent.futures.TimeoutError is the builtin since Python 3.11
            return None  # (an answer landing right now stays in the future for the next call)
        except StreamBroken:
            self._next_answer = None
            raise
        self._next_answer = None
        return r

    def _next(self) -> pb.StepResponse:
        try:
            r = next(self._call)
            if self.trace is not None:
                self.trace.append(("answer", r.step_seq, time.perf_counter()))
            return r
        except grpc.RpcError as e:
            # str(RpcError) is the call object's repr (``<_MultiThreadedRendezvous ...>``): never shown to clients
            self.broken = self.broken or (f"{e.code().name}: {e.details()}" if hasattr(e, "code") else
                                          "the Step stream failed")
        except StopIteration:
            self.broken = self.broken or "the sidecar ended the stream"
        finally:
            self._waiting_since = 0.0
        raise StreamBroken(self.broken)

    def close(self) -> None:
        """End the stream (a wait in :meth:`recv` returns with :class:`StreamBroken`)."""
        self.broken = self.broken or "the stream was closed"
        self._closed.set()
        self._requests.put(None)
        self._call.cancel()
        if self._reader is not None:
            self._reader.shutdown(wait=False)


#: Seconds the engine waits for the sidecar to accept its step socket connection.
CONNECT_TIMEOUT_S = 5.0
#: Least time (seconds) the rest of an answer frame gets once it has begun (see SocketStepStream.recv).
PARTIAL_FRAME_S = 1.0


def _set_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """Set the kernel's ``SO_SNDTIMEO`` / ``SO_RCVTIMEO`` of a blocking socket (a timed-out call raises EAGAIN)."""
    sec = max(0.0, seconds)
    whole = int(sec)
    usec = int((sec - whole) * 1e6)
    if whole == 0 and usec == 0:
        usec = 1  # 0 would mean no timeout at all
    sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", whole, usec))


def _connect(sock: socket.socket, path: str, timeout_s: float) -> None:
    """Connect ``sock`` to ``path``, retrying while the listen queue is full (a unix socket answers a full queue
    with EAGAIN at once instead of waiting), for up to ``timeout_s``.

    Raises:
        OSError: no socket there, refused, or still full at the timeout.
    """
    deadline = time.monotonic() + timeout_s
    sock.settimeout(timeout_s)
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def peer_mismatch(sock: socket.socket, expected_pid: int | None) -> str:
    """Why the peer of the connected unix socket ``sock`` is not the sidecar we trust (``SO_PEERCRED``: it
    must run under our uid and, when ``expected_pid`` is given, be that process), or ``""`` when it is."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid == os.getuid() and (expected_pid is None or pid == expected_pid):
        return ""
    return (f"served by pid {pid} uid {uid}, expected pid {expected_pid if expected_pid is not None else 'any'} "
            f"uid {os.getuid()}")


class StepSocketRefused(Exception):
    """The step socket is served by another process or user than the sidecar we trust (``str``: why)."""


class SocketStepStream:
    """One ``Step`` stream of one sidecar generation on its local step socket (:mod:`ninfer_common.step_socket`).

    The same interface and deadlines as :class:`StepStream`, without its threads: the engine thread writes
    each message (:meth:`send`) and reads each answer (:meth:`recv`) on the socket itself, so soft waits
    need no reader thread and the hard deadline no watchdog: the waits are ``poll`` calls bounded by it, and
    kernel socket timeouts bound the rest (a write to a sidecar that reads nothing: the deadline; the rest of
    an answer frame once it has begun: what is left of the deadline, at least :data:`PARTIAL_FRAME_S`).

    Args:
        path: the sidecar's step socket.
        generation: the sidecar generation this stream belongs to.
        deadline_s: the longest wait for one answer, seconds.
        expected_pid: the sidecar's pid (our child), or None for an external sidecar (then only its uid
            is checked).

    Raises:
        OSError: nothing accepts on ``path`` (no step socket: the caller falls back to gRPC).
        StepSocketRefused: another process or user serves ``path``.
    """

    transport = "socket"

    def __init__(self, path: str, generation: int, deadline_s: float, expected_pid: int | None) -> None:
        self.generation = generation
        self.deadline_s = float(deadline_s)
        self.broken: str = ""
        self._waiting_since = 0.0
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect(sock, path, CONNECT_TIMEOUT_S)
            why = peer_mismatch(sock, expected_pid)
            if why:
                raise StepSocketRefused(f"the step socket {path} is {why}")
            sock.settimeout(None)
            # A stalled sidecar must not block a write past the deadline (kernel send timeout; a timed-out
            # write raises, which breaks the stream). Reads get a receive timeout per answer (recv).
            _set_timeout(sock, socket.SO_SNDTIMEO, self.deadline_s)
            self._shut = socket.socket(fileno=os.dup(sock.fileno()))  # for close(): shutdown wakes a blocked poll
            self._conn = Connection(sock.detach())
        except BaseException:
            sock.close()
            raise
        self.trace: list | None = [] if os.environ.get("NINFER_STEP_TRACE") else None

    def send(self, msg: pb.StepRequest) -> None:
        """Write ``msg`` to the socket (on the calling thread; the sidecar reads it at once).

        Raises:
            StreamBroken: the stream is broken, or the write failed (the sidecar is gone).
        """
        if self.broken:
            self._fail(self.broken)
        data = FRAME_MESSAGE + msg.SerializeToString()
        if self.trace is not None:
            self.trace.append(("put", msg.step_seq, time.perf_counter()))
        try:
            self._conn.send_bytes(data)
        except BlockingIOError:  # the send timeout: the sidecar has not read for the whole deadline
            self._fail(f"the sidecar did not take a Step within {self.deadline_s:g} s (hung or overloaded)")
        except (OSError, ValueError) as e:  # ValueError: closed by close()
            self._fail(f"the Step socket failed ({type(e).__name__}: {e})")
        if self.trace is not None:
            self.trace.append(("pull", msg.step_seq, time.perf_counter()))

    def recv(self, timeout: float | None = None) -> pb.StepResponse | None:
        """The next answer, waiting at most ``deadline_s`` seconds since the first wait for it.

        Args:
            timeout: ``None``: block until the answer (or the deadline). Else a soft budget in seconds
                (``0`` polls): when it passes first, returns ``None`` and the answer stays outstanding.

        Raises:
            StreamBroken: the stream broke, the sidecar sent an error frame or closed it, or no answer
                came within the deadline (broken for good).
        """
        if self.broken:
            self._fail(self.broken)
        now = time.monotonic()
        if not self._waiting_since:
            self._waiting_since = now
        hard = self._waiting_since + self.deadline_s
        soft = now + timeout if timeout is not None else hard
        try:
            while True:
                left = min(hard, soft) - time.monotonic()
                if self._conn.poll(max(0.0, left)):
                    # the frame has begun; the rest of it must come within the deadline (at least a
                    # PARTIAL_FRAME_S grace, so an answer arriving at the deadline is not cut): a sidecar
                    # stopped mid-write then breaks the stream instead of blocking this thread
                    _set_timeout(self._shut, socket.SO_RCVTIMEO,
                                 max(hard - time.monotonic(), min(PARTIAL_FRAME_S, self.deadline_s)))
                    frame = self._conn.recv_bytes(MAX_FRAME_BYTES)
                    break
                if self.broken:
                    self._fail(self.broken)
                if time.monotonic() >= hard:
                    self._fail(f"no Step answer within {self.deadline_s:g} s (the sidecar is hung or overloaded)")
                if timeout is not None and time.monotonic() >= soft:
                    return None
        except BlockingIOError:  # the receive timeout: a frame begun and not finished
            self._fail(f"no complete Step answer within {self.deadline_s:g} s (the sidecar stopped mid-answer)")
        except (EOFError, OSError, ValueError):  # closed by the sidecar (it died) or by close()
            self._fail("the sidecar ended the stream")
        try:
            ok, body = parse_frame(frame)
            r = pb.StepResponse.FromString(body) if ok else None
        except (ValueError, DecodeError) as e:  # DecodeError is a ValueError in some protobuf builds
            self._fail(f"the sidecar's Step answer is garbled ({type(e).__name__}: {e})")
        if r is None:
            self._fail(str(body))
        self._waiting_since = 0.0
        if self.trace is not None:
            self.trace.append(("answer", r.step_seq, time.perf_counter()))
        return r

    def _fail(self, why: str) -> NoReturn:
        """Break the stream for good (the first reason stays), release its socket, raise :class:`StreamBroken`.

        Called on the thread that sends and receives, so the connection is never closed under a wait."""
        self.broken = self.broken or why
        self._conn.close()  # idempotent
        raise StreamBroken(self.broken)

    def close(self) -> None:
        """End the stream (a wait in :meth:`recv` on another thread returns with :class:`StreamBroken`; the
        socket itself is released by that thread, or when the stream is dropped)."""
        self.broken = self.broken or "the stream was closed"
        try:
            self._shut.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._shut.close()
