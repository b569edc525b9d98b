"""A Step shard worker process (``python -m constraint_service.shard_worker STEP_FD CONTROL_FD``).

See :mod:`constraint_service.shard` for why and :mod:`constraint_service.shard_pool` for the sidecar's
side. Two inherited sockets (``multiprocessing.connection`` framing):

* control: the sidecar sends the pickled ``(Vocabulary, options)`` once; the worker builds its vocabulary
  index and answers ``("ready",)``. Then ``(tag, op, args)`` calls, served on a small thread pool and
  answered ``(tag, "ok", value)``, ``(tag, "error", kind, message, location)`` (a ``ConstraintError``),
  ``(tag, "duplicate")`` or ``(tag, "fault", text)``:

  - ``("attach", (ring_name,))``: map the engine's mask ring;
  - ``("prepare", (request_id, key, kind, grammar_text, prefix))``: the compiled grammar of ``key`` (this
    shard's cache, or compiled from ``grammar_text``) and the request's session; value
    ``(built, complete)``;
  - ``("warm", (key, kind, grammar_text))``: compile ``key`` into this shard's cache without a session (the
    sidecar sends it in the background, so later sessions of the grammar can be placed here without
    waiting); value ``built``;
  - ``("close", (request_id, final_tokens))``: :meth:`StepShard.close`'s value.

* step: ``(slot, rows)`` per Step message, answered on the worker's main thread with
  :meth:`StepShard.step`'s list, or ``("fault", text)``.

The sidecar validates, converts and compiles every constraint itself (its cache, its killable compile
workers, its errors) and sends a shard only the *grammar* it compiled (xgrammar's JSON, no token masks). A
shard compiles that in C++ with the GIL released: no schema conversion (Python, GIL held) ever runs
beside a shard's Step thread. It exits on EOF on either socket and when its parent dies.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from ninfer_common.gc_heap import freeze_heap

from .compile_worker import _die_with_parent

log = logging.getLogger("ninfer.sidecar.shard")


class _GrammarCache:
    """Compiled grammars of one shard by cache key: compiled once per key (a second Prepare of a key being
    compiled waits for it), least recently used ones that no session holds dropped past ``cache_bytes``."""

    def __init__(self, backend, cache_bytes: int, threads: int) -> None:
        self.backend, self.cache_bytes, self.threads = backend, int(cache_bytes), max(1, int(threads))
        self._lock = threading.Lock()
        self._entries: "OrderedDict[tuple, object]" = OrderedDict()
        self._building: dict[tuple, threading.Lock] = {}
        self._bytes = 0

    def get(self, key: tuple, kind, text: str) -> tuple[object, bool]:
        """``(CompiledConstraint, built now)``.

        Raises:
            ConstraintError: xgrammar rejected the grammar (it compiled in the sidecar: not expected).
        """
        from .compile_build import BuildRunner

        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit, False
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None:
                    return hit, False
            grammar = self.backend.grammar_from_text(text)
            compiled = BuildRunner.compile_grammar(self.backend, kind, grammar, key, threads=self.threads)
            with self._lock:
                self._entries[key] = compiled
                self._bytes += compiled.memory_size_bytes
                self._building.pop(key, None)
                for k in list(self._entries):
                    if self._bytes <= self.cache_bytes:
                        break
                    e = self._entries[k]
                    if e.num_holders == 0 and k != key:
                        del self._entries[k]
                        self._bytes -= e.memory_size_bytes
        return compiled, True


def _serve_control(conn: Connection, grammars: _GrammarCache, shard, state: dict) -> None:
    from shared_memory.ring import MaskRing

    from .errors import ConstraintError
    from .shard import DuplicateSession

    send_lock = threading.Lock()

    def reply(msg: tuple) -> None:
        with send_lock:
            try:
                conn.send(msg)
            except OSError:
                pass

    def run(tag: int, op: str, args: tuple) -> None:
        try:
            if op == "attach":
                old, state["ring"] = state.get("ring"), MaskRing.attach(args[0])
                if old is not None:
                    old.close()
                reply((tag, "ok", None))
            elif op == "prepare":
                rid, key, kind, text, prefix = args
                compiled, built = grammars.get(key, kind, text)
                session = shard.open(rid, compiled, prefix, kind or "")
                reply((tag, "ok", (built, session.is_complete)))
            elif op == "warm":
                key, kind, text = args
                reply((tag, "ok", grammars.get(key, kind, text)[1]))
            elif op == "close":
                reply((tag, "ok", shard.close(args[0], args[1])))
            else:
                reply((tag, "fault", f"unknown operation {op!r}"))
        except ConstraintError as e:
            reply((tag, "error", str(e.kind), e.message, e.location))
        except DuplicateSession:
            reply((tag, "duplicate"))
        except Exception as e:  # noqa: BLE001 - reported to the sidecar, which answers a structured error
            log.exception("shard worker: %s failed", op)
            reply((tag, "fault", f"{type(e).__name__}: {e}"))

    pool = ThreadPoolExecutor(8, thread_name_prefix="ninfer-shard-ctl")
    while True:
        try:
            tag, op, args = conn.recv()
        except (EOFError, OSError):
            break
        pool.submit(run, tag, op, args)
    os._exit(0)  # the sidecar is gone: nothing left to serve


def main(step_fd: int, control_fd: int) -> int:
    # Ctrl-C reaches the whole process group: the sidecar owns this worker's life
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    step, control = Connection(step_fd), Connection(control_fd)
    try:
        vocab, opts = pickle.loads(control.recv_bytes())
    except (EOFError, OSError):
        return 0
    logging.basicConfig(level=opts.get("log_level", "WARNING"), format="%(asctime)s shard %(levelname)s %(message)s")
    from .backend import XGrammarBackend
    from .shard import StepShard

    backend = XGrammarBackend(vocab, fill_threads=opts["fill_threads"],  # the vocabulary index, before "ready"
                              fill_rows_per_thread=opts.get("fill_rows_per_thread"))
    grammars = _GrammarCache(backend, opts["cache_bytes"], opts["compile_threads"])
    shard = StepShard(opts.get("fill_chunk_rows", 0))
    state: dict = {}
    freeze_heap("shard worker")  # the vocabulary index and the modules: out of every later collection
    control.send(("ready",))
    threading.Thread(target=_serve_control, args=(control, grammars, shard, state), name="ninfer-shard-control",
                     daemon=True).start()
    while True:
        try:
            slot, rows = step.recv()
        except (EOFError, OSError):
            return 0
        ring = state.get("ring")
        try:
            if ring is None:
                raise RuntimeError("no ring attached")
            out = shard.step(ring.bitmask(slot), ring.status(slot), rows)
        except Exception as e:  # noqa: BLE001 - every row of this Step becomes an integrity error
            log.exception("shard worker: Step failed")
            out = ("fault", f"{type(e).__name__}: {e}")
        try:
            step.send(out)
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
