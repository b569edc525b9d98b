"""Supervision of the gateway process by ``ninfer serve --http-port PORT`` (like the sidecar).

The engine package must not import the gateway (they are sibling front doors under the
``ninfer`` dispatcher; see the import-linter layers), so the dispatcher wires it:

    from gateway.supervisor import run_serve_with_http
    SERVER_COMMANDS["serve"] = lambda argv: run_serve_with_http(serve_main, argv)
"""
from __future__ import annotations

import argparse
import os
import logging
import subprocess
import threading
import time
from typing import Callable

from . import spawn_gateway

log = logging.getLogger("ninfer.gateway.supervisor")


class GatewaySupervisor:
    """Keeps one ``python -m gateway`` child running; restarts it when it exits unexpectedly.

    Args:
        engine_target: the engine's gRPC ``host:port``.
        port: HTTP port.
        host: HTTP listen address.
        api_key: bearer token (None = no auth); the same key is sent to the engine, which
            ``ninfer serve --api-key`` protects with it too.
        model_name: served model name (None = the gateway's default).
        restart_delay_s: seconds between an exit and the restart (doubles per quick crash, max 30 s).
    """

    def __init__(self, engine_target: str, port: int, *, host: str = "127.0.0.1", api_key: str | None = None,
                 model_name: str | None = None, restart_delay_s: float = 1.0) -> None:
        self.engine_target, self.port, self.host = engine_target, port, host
        self.api_key, self.model_name = api_key, model_name
        self.restart_delay_s = restart_delay_s
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """PID of the current gateway process, or None."""
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def _spawn(self) -> None:
        with self._lock:
            self._proc = spawn_gateway(self.engine_target, self.port, host=self.host, api_key=self.api_key,
                                       engine_api_key=self.api_key,
                                       model_name=self.model_name, stdin=subprocess.DEVNULL,
                                       extra_args=["--parent-pid", str(os.getpid())],
                                       # its own session: a terminal's Ctrl-C (SIGINT to the foreground process
                                       # group) reaches only `ninfer serve`, which stops the gateway itself;
                                       # before, the gateway exited on it too and was restarted during shutdown
                                       start_new_session=True)

    def start(self) -> None:
        """Starts the gateway and the watcher thread."""
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="gateway-supervisor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        delay = self.restart_delay_s
        while not self._stop.is_set():
            proc = self._proc
            started = time.monotonic()
            code = proc.wait() if proc is not None else None
            if self._stop.is_set():
                return
            log.warning("HTTP gateway exited with code %s; restarting (restart #%d)", code, self.restarts + 1)
            delay = self.restart_delay_s if time.monotonic() - started > 30 else min(30.0, delay * 2)
            if self._stop.wait(delay):
                return
            self.restarts += 1
            self._spawn()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops the gateway (SIGTERM, then SIGKILL after ``timeout_s``) and the watcher."""
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread is not None:
            self._thread.join(timeout_s)


def run_serve_with_http(serve_main: Callable[[list[str]], int], argv: list[str] | None) -> int:
    """``ninfer serve`` with the optional HTTP gateway (off unless ``--http-port`` is given).

    Takes ``--http-port PORT`` and ``--http-host HOST`` (default: the serve ``--host``) out of
    ``argv``, runs ``serve_main`` with the rest and supervises the gateway, pointed at the serve
    ``--host``/``--port``, for as long as ``serve_main`` runs. ``--api-key`` (or ``$NINFER_API_KEY``)
    stays with the engine and also protects the gateway's ``/v1/*``, which sends it to the engine.

    Returns:
        ``serve_main``'s exit code.
    """
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--http-port", type=int, default=0)
    ap.add_argument("--http-host", default=None)
    ours, rest = ap.parse_known_args(list(argv or []))
    if not ours.http_port:
        return serve_main(rest)
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--host", default="127.0.0.1")
    peek.add_argument("--port", type=int, default=50051)
    peek.add_argument("--model", default=None)
    peek.add_argument("--api-key", default=os.environ.get("NINFER_API_KEY") or None)
    engine, _ = peek.parse_known_args(rest)
    engine_host = "127.0.0.1" if engine.host in ("0.0.0.0", "::", "") else engine.host
    model = None if engine.model is None else engine.model.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    sup = GatewaySupervisor(f"{engine_host}:{engine.port}", ours.http_port, host=ours.http_host or engine.host,
                            api_key=engine.api_key, model_name=model)
    sup.start()
    try:
        return serve_main(rest)
    finally:
        sup.stop()
