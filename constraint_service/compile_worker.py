"""A compile worker process (``python -m constraint_service.compile_worker FD``); see ``compile_pool``.

Protocol on the inherited socket ``FD`` (``multiprocessing.connection`` framing): the sidecar sends the
pickled ``(Vocabulary, compile threads, {"mask_probe_limit_s": s, "mask_probe_steps": n})`` once; the
worker builds the vocabulary index and answers ``("ready",)``.  Then, per
:class:`~constraint_service.types.ConstraintSpec` received, it converts and compiles it (the same code as
the in-process compile), runs the mask-cost probe on the result (:mod:`~constraint_service.mask_probe`;
``GrammarTooExpensive`` when one token mask is slower than the limit) and answers
``("ok", grammar JSON text, compile seconds)``, ``("error", kind, message, location)`` for a rejected
constraint, or ``("fault", text)``.  It exits on EOF and when its parent dies.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    """Exit when the sidecar dies, even mid-compile (xgrammar releases the GIL while compiling).

    ``PR_SET_PDEATHSIG`` cannot be used: it fires when the parent *thread* that started this process
    ends, and the pool starts workers from short-lived threads.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(fd: int) -> int:
    # Ctrl-C reaches the whole process group: the sidecar owns this worker's life (it kills it at a deadline
    # and at its own exit, and _die_with_parent covers its death), so the worker ignores SIGINT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    conn = Connection(fd)
    try:
        vocab, threads, probe = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return 0
    from .compiler import ConstraintCompiler
    from .errors import ConstraintError
    from .registry import user_input_error

    compiler = ConstraintCompiler(vocab, **probe)  # the sidecar's mask-cost probe settings
    backend = compiler.backend  # the vocabulary index, built once
    conn.send(("ready",))
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):
            return 0
        t0 = time.perf_counter()
        try:
            key, canon, _ = compiler._canonicalise(spec)  # cold specs only: nothing for a memo to keep
            grammar = compiler.grammar_of(backend, spec.kind, canon)
            compiled = compiler.compile_grammar(backend, spec.kind, grammar, key, threads=threads)  # the proof
            compiler.probe_mask_cost(compiled)  # killed with the worker at the deadline
            msg = ("ok", backend.grammar_to_text(grammar), time.perf_counter() - t0)
        except ConstraintError as e:
            msg = ("error", e.kind, e.message, e.location)
        except Exception as e:  # noqa: BLE001 - user input we failed to convert
            err = user_input_error(spec.kind, e)
            msg = ("error", err.kind, err.message, err.location)
        except BaseException as e:  # noqa: BLE001 - reported to the sidecar
            msg = ("fault", f"{type(e).__name__}: {e}")
        try:
            conn.send(msg)
        except (EOFError, OSError):
            return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
