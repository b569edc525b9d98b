"""End-to-end: the engine on a sidecar it did not start (``--sidecar-socket``, the Kubernetes layout).

A real ``python -m constraint_service`` listens on a socket in a private directory, as the sidecar
container of deploy/k8s/deployment.yaml does; the engine connects to it, starts no child, and after
the sidecar crashes and is replaced (as the kubelet restarts a crashed container) reconnects, registers
again and replays the constrained streams that were in flight: none of them fails.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .conftest import MODEL, ROOT, Stack, free_port
from .test_supervision_e2e import Streams, check_all_valid

REGEX = r"[a-z]{3}-[0-9]{2}"


def start_sidecar(sock) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "constraint_service", "--socket", str(sock), "--log-level",
                             "WARNING"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "sidecar did not start"
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_engine_uses_an_external_sidecar_and_reconnects_after_it_is_replaced(tmp_path) -> None:
    from clients.client import NInferClient

    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    d = tmp_path / "ipc"
    d.mkdir(mode=0o700)
    sock = d / "constraint.sock"
    sidecar = start_sidecar(sock)
    s = Stack(free_port(), extra=["--sidecar-socket", str(sock)])
    try:
        s.start()
        children = subprocess.run(["pgrep", "-P", str(s.proc.pid), "-f", "constraint_service"],
                                  capture_output=True, text=True).stdout.split()
        assert children == [], f"the engine started its own sidecar: {children}"
        with NInferClient(s.target) as c:
            r = c.generate_text(prompt="Code:", constraint={"regex": REGEX}, max_tokens=16, seed=1)
            assert r.error is None and re.fullmatch(REGEX, r.text), r
            streams = Streams(c, 4)  # constrained streams in flight while the sidecar crashes
            streams.wait_started(1)
            sidecar.kill()  # the kubelet would now restart the container
            sidecar.wait()
            sock.unlink(missing_ok=True)
            sidecar = start_sidecar(sock)
            streams.join()
            check_all_valid(streams, 4)  # reconnected, re-registered, re-prepared and replayed: none failed
            r = c.generate_text(prompt="Code:", constraint={"regex": REGEX}, max_tokens=16, seed=2)
            assert r.error is None and re.fullmatch(REGEX, r.text), r
    finally:
        if s.proc is not None:
            s.stop()
        stop(sidecar)
