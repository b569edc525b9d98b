"""A Step shard worker process (``python -m constraint_service.shard_worker STEP_FD CONTROL_FD``).

See :mod:`constraint_service.shard` for why and :mod:`constraint_service.shard_pool` for the sidecar's
side. Two inherited sockets (``multiprocessing.connection`` framing):

* control: the sidecar sends the pickled ``(Vocabulary, options)`` once; the worker builds its compiler
  and vocabulary index and answers ``("ready",)``. Then ``(tag, op, args)`` calls, served on a small
  thread pool and answered ``(tag, "ok", value)``, ``(tag, "error", kind, message, location)`` (a
  ``ConstraintError``), ``(tag, "duplicate")`` or ``(tag, "fault", text)``:

  - ``("attach", (ring_name,))``: map the engine's mask ring;
  - ``("prepare", (request_id, ConstraintSpec, prefix))``: compile (this shard's cache) and open the
    session; value ``(cache status, complete)``;
  - ``("close", (request_id, final_tokens))``: :meth:`StepShard.close`'s value.

* step: ``(slot, rows)`` per Step message, answered on the worker's main thread with
  :meth:`StepShard.step`'s list, or ``("fault", text)``.

The sidecar proves every compile in its own killable compile worker before it sends ``prepare`` here, so
this process compiles in-process with the compile threads (a build shown to end in time). It exits on EOF
on either socket and when its parent dies.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from .compile_worker import _die_with_parent

log = logging.getLogger("ninfer.sidecar.shard")


def _serve_control(conn: Connection, compiler, shard, state: dict) -> None:
    from shared_memory.ring import MaskRing

    from .errors import ConstraintError
    from .shard import DuplicateSession, compile_error_tuple

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
                rid, spec, prefix = args
                compiled, info = compiler.compile(spec)
                session = shard.open(rid, compiled, prefix, spec.kind or "")
                reply((tag, "ok", (str(info.cache), session.is_complete)))
            elif op == "close":
                reply((tag, "ok", shard.close(args[0], args[1])))
            else:
                reply((tag, "fault", f"unknown operation {op!r}"))
        except ConstraintError as e:
            reply((tag, "error", *compile_error_tuple(e)))
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
    from .compiler import ConstraintCompiler
    from .shard import StepShard

    compiler = ConstraintCompiler(vocab, cache_bytes=opts["cache_bytes"], max_cold_compiles=opts["max_cold_compiles"],
                                  compile_timeout_s=opts["compile_timeout_s"], fill_threads=opts["fill_threads"],
                                  compile_threads=opts["compile_threads"], proven=True)
    compiler.backend  # the vocabulary index, built once before "ready"
    shard = StepShard(opts.get("fill_chunk_rows", 0))
    state: dict = {}
    control.send(("ready",))
    threading.Thread(target=_serve_control, args=(control, compiler, shard, state), name="ninfer-shard-control",
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
