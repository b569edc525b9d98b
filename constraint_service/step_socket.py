"""The sidecar's end of the local ``Step`` transport (:mod:`ninfer_common.step_socket`).

A :class:`StepSocketServer` listens on ``<gRPC socket>.step``; each engine connection gets a thread that
reads one ``StepRequest`` at a time, runs the servicer's Step handler on it and writes the
``StepResponse`` back, exactly as the gRPC ``Step`` RPC does with the same handler
(:meth:`constraint_service.server.ConstraintServicer.Step`).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from multiprocessing.connection import Connection, Listener
from typing import Callable

from ninfer.constraint.v1 import constraint_pb2 as pb
from ninfer_common.step_socket import FRAME_MESSAGE, MAX_FRAME_BYTES, error_frame, parse_frame

log = logging.getLogger("ninfer.constraint.step_socket")

#: Pending connections the socket queues (multiprocessing's default is 1: a second pending connect fails at once).
LISTEN_BACKLOG = 16
#: Seconds between accept attempts after a failed one (e.g. the process is out of file descriptors).
ACCEPT_RETRY_S = 0.05

__all__ = ["StepSocketServer"]


class StepSocketServer:
    """Serve the Step stream on a unix socket (started by the constructor; stop with :meth:`close`).

    Args:
        path: the socket path (an existing file there is replaced; the socket is made mode 0600).
        step: the Step handler, ``StepRequest -> StepResponse`` (the servicer's ``_step``).
        broken: why the sidecar cannot serve Steps any more, or ``""``: checked before each message, as
            the gRPC ``Step`` RPC does; a reason is sent as an error frame and the stream is closed.

    Raises:
        OSError: the socket could not be created (e.g. a path longer than the unix limit).
    """

    def __init__(self, path: str, step: Callable[[pb.StepRequest], pb.StepResponse],
                 broken: Callable[[], str]) -> None:
        self.path = path
        self._step = step
        self._broken = broken
        if os.path.lexists(path):
            os.unlink(path)
        self._listener = Listener(path, family="AF_UNIX", backlog=LISTEN_BACKLOG)
        os.chmod(path, 0o600)
        self._closed = False
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="ninfer-step-socket", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError as e:
                if self._closed:
                    return
                # e.g. EMFILE: a passing shortage must not end the accept loop (every later engine connection
                # would wait in the queue unanswered); try again shortly
                log.warning("accepting on the step socket failed (%s); retrying", e)
                time.sleep(ACCEPT_RETRY_S)
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="ninfer-step-stream", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            while True:
                try:
                    data = conn.recv_bytes(MAX_FRAME_BYTES)
                except (EOFError, OSError):  # the engine closed the stream (or it is too large: dropped)
                    return
                why = self._broken()
                if why:
                    self._send_error(conn, f"UNAVAILABLE: {why}")
                    return
                try:
                    ok, body = parse_frame(data)
                    if not ok:  # the engine gave up on the stream
                        return
                    resp = self._step(pb.StepRequest.FromString(body))
                except Exception as e:  # noqa: BLE001 - reported on the stream, as gRPC reports a failed RPC
                    log.exception("Step failed")
                    self._send_error(conn, f"INTERNAL: the sidecar's Step failed ({type(e).__name__}: {e})")
                    return
                try:
                    conn.send_bytes(FRAME_MESSAGE + resp.SerializeToString())
                except OSError:
                    return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _send_error(conn: Connection, why: str) -> None:
        try:
            conn.send_bytes(error_frame(why))
        except OSError:
            pass

    def close(self) -> None:
        """Stop accepting, end every open stream (its engine sees a broken stream) and remove the socket."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        try:
            self._listener.close()
        except OSError:
            pass
        for c in conns:
            try:  # shutdown wakes the stream's thread blocked in recv_bytes (close alone would not)
                with socket.socket(fileno=os.dup(c.fileno())) as s:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if os.path.lexists(self.path):
            try:
                os.unlink(self.path)
            except OSError:
                pass
