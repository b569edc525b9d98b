"""``python -m constraint_service``: run the constraint sidecar.

Listens on a unix socket by default (``--socket``), or on TCP with
``--listen HOST:PORT``. Beside a unix socket it serves the local Step transport on
``<socket>.step`` (:mod:`constraint_service.step_socket`; ``--step-socket ''`` turns it off). With ``--parent-pid`` the sidecar exits when that
process dies (Linux ``PR_SET_PDEATHSIG`` plus a watchdog), and unlinks the
mask ring the dead engine can no longer remove, so no ``/dev/shm`` segment
outlives a SIGKILLed engine.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ninfer.constraint.v1 import constraint_pb2_grpc as pb_grpc
from ninfer_common.gc_heap import freeze_heap
from ninfer_common.shutdown import ShutdownLatch
from ninfer_common.step_socket import step_socket_path
from ninfer_common.telemetry import server_interceptors, setup_tracing

from .server import ConstraintServicer, SidecarOptions
from .step_socket import StepSocketServer

log = logging.getLogger("ninfer.sidecar")
# Sent by the kernel when the engine dies (distinct from an orderly SIGTERM).
PARENT_DEATH_SIGNAL = signal.SIGUSR2


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, PARENT_DEATH_SIGNAL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


# After its engine died the sidecar removes the ring, then gets this long for an orderly shutdown before
# it exits whatever that shutdown waits on (a busy compile, a stuck stream): nobody is left to serve.
ORPHAN_EXIT_S = 3.0


class _OrphanRing:
    """Removes the ring of a dead engine once, from whichever thread gets there first: the watchdog, or
    the main thread's shutdown, which must not let the process exit with the ring still there."""

    def __init__(self, servicer: ConstraintServicer, parent_pid: int, latch: ShutdownLatch) -> None:
        self.servicer, self.parent_pid, self.latch = servicer, parent_pid, latch
        self._lock = threading.Lock()  # threads only (never taken in a signal handler)
        self._done = False

    def parent_dead(self) -> bool:
        return bool(self.parent_pid) and (self.latch.received(PARENT_DEATH_SIGNAL)
                                          or os.getppid() != self.parent_pid)

    def remove(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            ring_name = self.servicer.ring_name
            if ring_name:
                from shared_memory.ring import remove_segment

                try:
                    remove_segment(ring_name)
                except Exception:  # noqa: BLE001 - already gone or not ours: exit anyway
                    log.exception("removing ring %s after the engine died", ring_name)


def _parent_watchdog(orphan: _OrphanRing) -> None:
    """Daemon thread: notice the engine's death (``PR_SET_PDEATHSIG`` -> ``PARENT_DEATH_SIGNAL`` in
    the latch, or the parent pid changing; polled every 0.2 s), remove the ring the engine can no longer
    remove, ask the main thread to shut down and ``os._exit`` after ``ORPHAN_EXIT_S`` if it has not
    finished by then. Runs apart from the main thread, so a main thread that never returns to Python
    cannot keep an orphan sidecar alive."""
    while not orphan.parent_dead():
        time.sleep(0.2)
    orphan.remove()
    orphan.latch.handler(PARENT_DEATH_SIGNAL)
    time.sleep(ORPHAN_EXIT_S)
    os._exit(0)


def _start_step_socket(args, servicer: ConstraintServicer) -> StepSocketServer | None:
    """The local Step transport's socket (:mod:`ninfer_common.step_socket`), or None when it is off or cannot
    be made (the engine then uses the gRPC ``Step`` RPC)."""
    path = args.step_socket
    if path is None:
        path = "" if args.listen else step_socket_path(args.socket)
    if not path:
        return None
    try:
        return StepSocketServer(path, servicer._step, lambda: servicer.broken)
    except OSError as e:
        log.warning("no local Step socket at %s (%s); Steps come over gRPC only", path, e)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m constraint_service", description="NInfer constraint sidecar")
    ap.add_argument("--socket", default="/tmp/ninfer-constraint.sock", help="unix socket path to listen on")
    ap.add_argument("--listen", default="", help="HOST:PORT to listen on instead of a unix socket")
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process dies")
    ap.add_argument("--grammar-cache-bytes", type=int, default=256 << 20)
    ap.add_argument("--max-cold-compiles", type=int, default=2)
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="compile deadline in seconds")
    ap.add_argument("--fill-threads", type=int, default=0,
                    help="threads of xgrammar's batch mask fill on the Step path (0 = auto: min(8, CPUs), "
                         "1 on 2 CPUs)")
    ap.add_argument("--fill-rows-per-thread", type=int, default=-1,
                    help="rows each batch-fill thread must have: a Step filling fewer rows uses fewer threads, 1 "
                         "below twice this (-1 = the default, 16; 0 = always --fill-threads)")
    ap.add_argument("--compile-threads", type=int, default=0,
                    help="xgrammar threads per cold compile (0 = auto: a quarter of the CPUs, 1 to 8)")
    ap.add_argument("--fill-chunk-rows", type=int, default=0,
                    help="Steps with more rows fill them in chunks of this many on a background thread, "
                         "overlapping the next rows' commits (0 = default: commit all rows, then fill)")
    ap.add_argument("--step-shards", type=int, default=1,
                    help="processes sharing the Step work: this one and N-1 shard workers, each with its own "
                         "sessions and compile cache (default 1; 0 = auto: 1 below 8 CPUs, else CPUs/4, at most 4)")
    ap.add_argument("--step-socket", default=None,
                    help="unix socket of the local Step transport (default: the --socket path + '.step'; "
                         "'' turns it off: Steps then come only over gRPC)")
    ap.add_argument("--mask-probe-limit-ms", type=float, default=250.0,
                    help="refuse a constraint (GrammarTooExpensive) when one token mask of a short deterministic "
                         "walk after its compile takes longer than this, CPU ms (default 250; 0 = no probe): "
                         "some grammars compile but cost seconds per mask, e.g. ([a-z]+ \" \"?){0,200}, and "
                         "would stall every other constrained request at each step")
    ap.add_argument("--log-level", default=os.environ.get("NINFER_LOG_LEVEL", "WARNING"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s sidecar %(levelname)s %(message)s")
    setup_tracing("ninfer-constraint-service")
    if args.parent_pid:
        _set_pdeathsig()

    hs = health.HealthServicer()
    servicer = ConstraintServicer(SidecarOptions(args.grammar_cache_bytes, args.max_cold_compiles, args.compile_timeout,
                                                 fill_threads=max(0, args.fill_threads),
                                                 fill_chunk_rows=max(0, args.fill_chunk_rows),
                                                 fill_rows_per_thread=(None if args.fill_rows_per_thread < 0
                                                                       else args.fill_rows_per_thread),
                                                 compile_threads=max(0, args.compile_threads),
                                                 step_shards=max(0, args.step_shards),
                                                 mask_probe_limit_ms=max(0.0, args.mask_probe_limit_ms)),
                                  # a lost shard worker: NOT_SERVING, so the engine's heartbeat restarts us
                                  on_health=lambda ok: hs.set("", health_pb2.HealthCheckResponse.SERVING if ok
                                                              else health_pb2.HealthCheckResponse.NOT_SERVING))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), interceptors=server_interceptors(),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_ConstraintServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if args.listen:
        address = args.listen
    else:
        if os.path.exists(args.socket):
            os.unlink(args.socket)
        address = f"unix://{args.socket}"
    server.add_insecure_port(address)
    server.start()
    if not args.listen:
        os.chmod(args.socket, 0o600)
    step_server = _start_step_socket(args, servicer)  # before SERVING: the engine looks for it once healthy
    freeze_heap("constraint sidecar")  # modules, servicer, servers: out of every later collection (the Step path's)
    hs.set("", health_pb2.HealthCheckResponse.SERVING)
    latch = ShutdownLatch()  # handlers that take no lock (see ninfer_common.shutdown)
    latch.install((signal.SIGTERM, signal.SIGINT, PARENT_DEATH_SIGNAL))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    orphan = _OrphanRing(servicer, args.parent_pid, latch)
    if args.parent_pid:
        threading.Thread(target=_parent_watchdog, args=(orphan,), name="parent-watchdog", daemon=True).start()
    print(f"constraint sidecar ready on {address}", flush=True)
    latch.wait()
    if step_server is not None:
        step_server.close()
    server.stop(grace=0.5).wait()
    servicer.close()
    if not args.listen and os.path.exists(args.socket):
        os.unlink(args.socket)
    # the watchdog may not have run yet, and a SIGKILLed engine may finish dying after a SIGTERM woke us:
    # no exit with the dead engine's ring left
    if orphan.parent_dead():
        orphan.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
