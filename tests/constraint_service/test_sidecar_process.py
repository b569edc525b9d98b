"""The real ``python -m constraint_service`` process under signals: it stops, whatever arrives and when.

A stand-in engine (a small Python process) starts the sidecar with ``--parent-pid`` as ``gpu_engine`` does,
then is SIGKILLed while the sidecar also receives a burst of SIGTERMs: the kernel's parent-death signal and
the burst land together, the case that hung a sidecar in CI on 2026-12-01 (its handler called
``Event.set()`` while its main thread held that Event's lock). The sidecar must exit in seconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENGINE = textwrap.dedent("""
    import os, subprocess, sys, time
    sock = sys.argv[1]
    p = subprocess.Popen([sys.executable, "-m", "constraint_service", "--socket", sock,
                          "--parent-pid", str(os.getpid())], stdout=subprocess.PIPE)
    line = p.stdout.readline()
    print(p.pid, line.decode().strip(), flush=True)
    time.sleep(600)
""")


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours? (it is not: the sidecar's parent is the stand-in engine, reparented to init)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_sidecar_exits_when_its_engine_is_killed_during_a_signal_burst(tmp_path):
    for trial in range(3):
        sock = tmp_path / f"s{trial}.sock"
        engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(sock)], cwd=ROOT, stdout=subprocess.PIPE,
                                  env={**os.environ, "PYTHONPATH": ROOT})
        try:
            pid_s, ready = engine.stdout.readline().decode().split(" ", 1)
            sidecar = int(pid_s)
            assert "ready" in ready, ready
            engine.kill()  # the kernel sends the sidecar PARENT_DEATH_SIGNAL ...
            for _ in range(100):  # ... while SIGTERMs arrive too
                try:
                    os.kill(sidecar, signal.SIGTERM)
                except ProcessLookupError:
                    break
            assert _gone(sidecar, 15), f"sidecar {sidecar} outlived its engine (trial {trial})"
        finally:
            engine.kill()
            engine.wait()
            engine.stdout.close()
