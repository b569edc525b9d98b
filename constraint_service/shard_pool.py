"""The sidecar's side of its Step shard worker processes (see :mod:`constraint_service.shard`).

A :class:`RemoteShard` is one ``python -m constraint_service.shard_worker`` child with two socketpairs:
the *step* socket carries one ``(slot, rows)`` message and its answer per Step, sent and read by the
sidecar's Step thread itself (no thread hop on the hot path); the *control* socket carries tagged calls
(attach, prepare, close) from any gRPC thread, answered through one reader thread. A worker that dies or
stops answering makes its :class:`RemoteShard` *broken*: the sidecar then reports ``NOT_SERVING`` and the
engine restarts the whole sidecar (its sessions are one generation: README "Operating it").
"""
from __future__ import annotations

import itertools
import pickle
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

from .compile_pool import kill_process, spawn_module
from .errors import ConstraintError
from .vocab import Vocabulary

__all__ = ["RemoteShard", "ShardBroken"]


class ShardBroken(RuntimeError):
    """A shard worker died, answered garbage or missed a deadline (``str``: why)."""


class RemoteShard:
    """One shard worker process (start it with the constructor, then :meth:`wait_ready`).

    Args:
        index: the shard's index (1..N-1; shard 0 lives in the sidecar process).
        vocab: the vocabulary (pickled to the worker once).
        options: the worker's compiler and fill settings (``cache_bytes``, ``max_cold_compiles``,
            ``compile_timeout_s``, ``fill_threads``, ``fill_rows_per_thread``, ``compile_threads``, ``fill_chunk_rows``).
        on_broken: called once with why when the worker is lost (not after :meth:`kill`), from whichever
            thread notices first.
    """

    def __init__(self, index: int, vocab: Vocabulary, options: dict,
                 on_broken: Optional[Callable[[str], None]] = None) -> None:
        self.index = index
        self.broken = ""
        self._on_broken = on_broken
        self._stopping = False
        self.proc, (self._step, self._ctl) = spawn_module("constraint_service.shard_worker", 2)
        self._ctl.send_bytes(pickle.dumps((Vocabulary.from_any(vocab), dict(options)),
                                          protocol=pickle.HIGHEST_PROTOCOL))
        self._ready = False
        self._send_lock = threading.Lock()
        self._calls: dict[int, Future] = {}
        self._calls_lock = threading.Lock()
        self._tags = itertools.count(1)
        self._reader: Optional[threading.Thread] = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the worker's index to be built; False (and broken) if it is not."""
        if self._ready:
            return True
        try:
            if self._ctl.poll(timeout):
                self._ready = self._ctl.recv() == ("ready",)
        except (EOFError, OSError):
            pass
        if not self._ready:
            self._stopping = True  # the sidecar serves without this one: not a loss to report
            self._break(f"shard worker {self.index} did not start (exit code {self.proc.poll()})")
            return False
        self._reader = threading.Thread(target=self._read_control, name=f"ninfer-shard-{self.index}-reader",
                                        daemon=True)
        self._reader.start()
        return True

    # -- control calls (any thread) -------------------------------------------------
    def call(self, op: str, args: tuple, timeout: float) -> Any:
        """Run ``op`` in the worker and return its value.

        Raises:
            ConstraintError: the worker rejected the constraint (its kind, message, location).
            KeyError: ``prepare`` of a request id that already has a session there.
            ShardBroken: the worker is gone, failed, or gave no answer within ``timeout`` seconds.
        """
        if self.broken:
            raise ShardBroken(self.broken)
        tag = next(self._tags)
        fut: Future = Future()
        with self._calls_lock:
            self._calls[tag] = fut
        try:
            with self._send_lock:
                self._ctl.send((tag, op, args))
            msg = fut.result(timeout)
        except TimeoutError:
            self._break(f"shard worker {self.index} gave no answer to {op} within {timeout:g} s")
            raise ShardBroken(self.broken) from None
        except OSError as e:
            self._break(f"shard worker {self.index}: {e}")
            raise ShardBroken(self.broken) from None
        finally:
            with self._calls_lock:
                self._calls.pop(tag, None)
        if msg[1] == "ok":
            return msg[2]
        if msg[1] == "error":
            raise ConstraintError(msg[2], msg[3], msg[4])
        if msg[1] == "duplicate":
            raise KeyError(args[0] if args else "")
        raise ShardBroken(f"shard worker {self.index}: {op} failed: {msg[2]}")

    def _read_control(self) -> None:
        while True:
            try:
                msg = self._ctl.recv()
            except (EOFError, OSError, pickle.UnpicklingError):
                self._break(f"shard worker {self.index} exited (code {self.proc.poll()})")
                return
            with self._calls_lock:
                fut = self._calls.get(msg[0])
            if fut is not None and not fut.done():
                fut.set_result(msg)

    # -- the Step path (the sidecar's Step thread only) -----------------------------
    def send_step(self, slot: int, rows: list) -> None:
        """Send this shard's rows of one Step (non-blocking for small messages).

        Raises:
            ShardBroken: the worker is gone.
        """
        if self.broken:
            raise ShardBroken(self.broken)
        try:
            self._step.send((slot, rows))
        except OSError as e:
            self._break(f"shard worker {self.index}: {e}")
            raise ShardBroken(self.broken) from None

    def recv_step(self, timeout: float) -> list:
        """The worker's answer to the last :meth:`send_step` (``StepShard.step``'s list).

        Raises:
            ShardBroken: the worker died, failed the Step, or gave no answer within ``timeout`` seconds.
        """
        try:
            if not self._step.poll(timeout):
                self._break(f"shard worker {self.index} gave no Step answer within {timeout:g} s")
                raise ShardBroken(self.broken)
            out = self._step.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            self._break(f"shard worker {self.index} exited during a Step (code {self.proc.poll()})")
            raise ShardBroken(self.broken) from None
        if isinstance(out, tuple):  # ("fault", text)
            self._break(f"shard worker {self.index}: Step failed: {out[1]}")
            raise ShardBroken(self.broken)
        return out

    # -- life ------------------------------------------------------------------------
    def _break(self, why: str) -> None:
        first = not self.broken
        if first:
            self.broken = why
            if self._on_broken is not None and not self._stopping:
                self._on_broken(why)
        with self._calls_lock:
            calls = list(self._calls.values())
        for fut in calls:
            if not fut.done():
                fut.set_result((0, "fault", self.broken))

    def kill(self) -> None:
        """Kill the worker (idempotent)."""
        self._stopping = True
        self._break(f"shard worker {self.index} was stopped")
        kill_process(self.proc, [self._step, self._ctl])


def wait_all(shards: list[RemoteShard], timeout: float) -> list[RemoteShard]:
    """Wait (``timeout`` seconds in all) for every worker's start; returns those that are ready."""
    end = time.monotonic() + timeout
    return [s for s in shards if s.wait_ready(max(0.0, end - time.monotonic()))]
