"""Killable compile workers: a warm pool of processes that prove a cold compile finishes in time.

Issue 14 defect 8: xgrammar cannot cancel a compile, so a timed-out compile on a thread kept a core busy
for minutes (a 90,000-string enum).  A compile now first runs in a worker *process* under the
request's deadline; on ``CompileTimeout`` that process is killed (SIGKILL) and a fresh one is started
in the background, so nothing keeps burning CPU.

Why the sidecar then compiles again in-process instead of receiving the compiled grammar: xgrammar 0.2.9
moves a ``CompiledGrammar`` between processes only as JSON (``serialize_json``/``deserialize_json``), and
that is slower than compiling (measured on the 49k-token SmolLM2 vocabulary, loaded 2-core box:
compile 0.017 / 0.086 / 2.76 s, serialize 0.064 / 0.167 / 7.0 s, deserialize 0.031 / 0.072 / 2.9 s; a
16.5 MB grammar's JSON did not fit in 6 GB).  So a worker returns the *grammar* (converted, surrogates
removed; xgrammar's ``Grammar.serialize_json``, small: no token masks) after compiling it once as a
proof, and the sidecar compiles that grammar eagerly, a deterministic build the worker just showed ends
within the deadline (its time is bounded by the worker's; the cost is a second compile of each *cold*
key, cache hits never reach the pool).  Results: ``bench/results/compile_bench_cpu.json``.

A worker also runs the mask-cost probe (:mod:`~constraint_service.mask_probe`) after its proof compile, under
the same deadline: a grammar whose token masks are too slow comes back as ``GrammarTooExpensive``.

Workers are ``python -m constraint_service.compile_worker`` children (the vocabulary index is built once
at start: "warm"), one per compile slot, connected by a socketpair; each dies with the sidecar
(it watches its parent process id, and exits on EOF on its socket).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional

from .errors import ConstraintError
from .types import ConstraintSpec
from .vocab import Vocabulary

__all__ = ["CompilePool", "WorkerCrashed", "kill_process", "spawn_module"]

#: The directory holding ``constraint_service`` (the worker imports the same code as the sidecar).
_ROOT = str(Path(__file__).resolve().parent.parent)


def spawn_module(module: str, channels: int) -> tuple[subprocess.Popen, list[Connection]]:
    """Start ``python -m module FD...`` (the sidecar's own code on its ``PYTHONPATH``) with ``channels``
    socketpairs; returns the process and our ends of the sockets (``multiprocessing`` framing).
    Used for compile workers and Step shard workers."""
    pairs = [socket.socketpair() for _ in range(channels)]
    children = [child for _, child in pairs]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *(str(c.fileno()) for c in children)],
            pass_fds=tuple(c.fileno() for c in children), stdin=subprocess.DEVNULL, close_fds=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)},
        )
    finally:
        for c in children:
            c.close()
    return proc, [Connection(parent.detach()) for parent, _ in pairs]


def kill_process(proc: subprocess.Popen, conns: list[Connection]) -> None:
    """SIGKILL ``proc``, reap it (at most 5 s) and close our ends of its sockets; idempotent."""
    try:
        proc.kill()
    except OSError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    for c in conns:
        try:
            c.close()
        except OSError:
            pass


class WorkerCrashed(RuntimeError):
    """A compile worker died while compiling (exit code in ``returncode``)."""

    def __init__(self, returncode: Optional[int]) -> None:
        super().__init__(f"the compile worker died (exit code {returncode})")
        self.returncode = returncode


class _Worker:
    """One worker process and its end of the socketpair."""

    def __init__(self, vocab_blob: bytes) -> None:
        self.proc, (self.conn,) = spawn_module("constraint_service.compile_worker", 1)
        self.conn.send_bytes(vocab_blob)
        self.ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: Optional[float]) -> bool:
        """Wait for the worker's "ready" message (vocabulary index built)."""
        if self.ready:
            return True
        if self.conn.poll(timeout):
            msg = self.conn.recv()
            self.ready = msg == ("ready",)
            if not self.ready:
                raise WorkerCrashed(self.proc.poll())
        return self.ready

    def kill(self) -> None:
        kill_process(self.proc, [self.conn])


class CompilePool:
    """``size`` warm compile worker processes for one vocabulary (thread-safe).

    Args:
        vocab: the vocabulary the workers index (sent to each worker once, pickled).
        size: worker processes (the compiler's ``max_cold_compiles``: one per compile slot).
        compile_threads: xgrammar threads of each worker's compile (the worker is killed at the
            deadline with all of them).
        mask_probe_limit_s, mask_probe_steps: the workers' mask-cost probe (``ConstraintCompiler``'s
            arguments of those names; limit 0 = no probe).

    Workers start in the background; :meth:`prove` waits (within its deadline) for a ready one.
    """

    def __init__(self, vocab: Vocabulary, size: int, compile_threads: int = 1, *,
                 mask_probe_limit_s: float = 0.0, mask_probe_steps: int = 0) -> None:
        probe = {"mask_probe_limit_s": max(0.0, float(mask_probe_limit_s)),
                 "mask_probe_steps": max(0, int(mask_probe_steps))}
        self._blob = pickle.dumps((Vocabulary.from_any(vocab), max(1, int(compile_threads)), probe),
                                  protocol=pickle.HIGHEST_PROTOCOL)
        self._cv = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._closed = False
        self.kills = 0  # workers killed at a deadline (monotonic)
        for _ in range(max(1, int(size))):
            self._spawn_async()

    # -- public -------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (idle and busy)."""
        with self._cv:
            return [w.pid for w in (*self._idle, *self._busy)]

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until at least one worker is ready; True if one is."""
        end = time.perf_counter() + timeout
        with self._cv:
            while not (self._idle or self._busy) and not self._closed:
                left = end - time.perf_counter()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return bool(self._idle or self._busy)

    def prove(self, spec: ConstraintSpec, deadline: float) -> tuple[str, float]:
        """Convert and compile ``spec`` in a worker before ``deadline`` (``time.perf_counter()`` seconds).

        Returns:
            (the grammar as xgrammar's ``Grammar.serialize_json`` text, the worker's compile seconds).

        Raises:
            ConstraintError: the kind's error from the worker (syntax, unsupported, ``GrammarTooExpensive``
                from its mask-cost probe ...), or ``CompileTimeout``
                when no worker was free or the compile did not end before ``deadline`` (that worker is
                killed and replaced).
            WorkerCrashed: the worker died while compiling (it is replaced).
        """
        worker = self._take(deadline)
        try:
            worker.conn.send(spec)
            if not worker.conn.poll(max(0.0, deadline - time.perf_counter())):
                self._discard(worker, killed=True)
                worker = None
                raise _timeout()
            msg = worker.conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            code = worker.proc.poll() if worker is not None else None
            if worker is not None:
                self._discard(worker)
                worker = None
            raise WorkerCrashed(code) from None
        finally:
            if worker is not None:
                self._give_back(worker)
        if msg[0] == "ok":
            return msg[1], msg[2]
        if msg[0] == "error":
            raise ConstraintError(msg[1], msg[2], msg[3])
        raise RuntimeError(f"compile worker fault: {msg[1]}")

    def close(self) -> None:
        """Kill every worker (idempotent)."""
        with self._cv:
            self._closed = True
            workers = [*self._idle, *self._busy]
            self._idle.clear()
            self._busy.clear()
            self._cv.notify_all()
        for w in workers:
            w.kill()

    # -- internals ----------------------------------------------------------
    def _spawn_async(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._starting += 1
        threading.Thread(target=self._spawn, name="ninfer-compile-spawn", daemon=True).start()

    def _spawn(self) -> None:
        worker = None
        try:
            worker = _Worker(self._blob)
            ok = worker.wait_ready(None)
        except Exception:  # noqa: BLE001 - retried below
            ok = False
        with self._cv:
            self._starting -= 1
            if ok and not self._closed:
                self._idle.append(worker)
                self._cv.notify_all()
                return
        if worker is not None:
            worker.kill()
        if not ok:
            time.sleep(1.0)  # a worker that cannot start: retry, slowly
            self._spawn_async()

    def _take(self, deadline: float) -> _Worker:
        with self._cv:
            while not self._idle:
                left = deadline - time.perf_counter()
                if self._closed or left <= 0:
                    raise _timeout("no compile worker became ready before the compile deadline")
                self._cv.wait(left)
            w = self._idle.pop()
            self._busy.add(w)
            return w

    def _give_back(self, worker: _Worker) -> None:
        with self._cv:
            self._busy.discard(worker)
            if self._closed:
                worker.kill()
                return
            self._idle.append(worker)
            self._cv.notify_all()

    def _discard(self, worker: _Worker, killed: bool = False) -> None:
        worker.kill()
        with self._cv:
            self._busy.discard(worker)
            if killed:
                self.kills += 1
        self._spawn_async()


def _timeout(message: str = "") -> ConstraintError:
    # the compiler rewrites the message with the kind and the deadline
    return ConstraintError("CompileTimeout", message or "compile deadline passed", "")
