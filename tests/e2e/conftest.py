"""End-to-end fixtures: the real stack (engine + sidecar processes, gRPC, shared-memory ring, real model)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the engine's device in these tests: cpu in CI; NINFER_E2E_DEVICE=cuda runs the same real-process tests on a GPU
E2E_DEVICE = os.environ.get("NINFER_E2E_DEVICE", "cpu")
MODEL = Path(os.environ.get("NINFER_CACHE_DIR", Path.home() / ".cache" / "ninfer" / "models")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_segments(port: int) -> list[str]:
    """Names of /dev/shm segments belonging to the stack on ``port``."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"ninfer-{port}*"))


class Stack:
    """A running ``python -m gpu_engine`` (which starts its sidecar)."""

    def __init__(self, port: int, extra: list[str] | None = None) -> None:
        self.port = port
        self.extra = list(extra or [])
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 600.0) -> None:
        # `make test` runs 2 pytest workers, each with its stacks, on CI's 2 cores: one decode thread per
        # CPU engine (its default is every core, whose OpenMP workers spin between regions)
        threads = ["--cpu-threads", "1"] if E2E_DEVICE == "cpu" and "--cpu-threads" not in self.extra else []
        cmd = [sys.executable, "-m", "gpu_engine", "--port", str(self.port), "--device", E2E_DEVICE,
               "--max-lanes", "8", "--max-seq-len", "1024", "--log-level", "WARNING", *threads, *self.extra]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                if "ninfer ready on" in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("stack did not become ready:\n" + "\n".join(self.lines[-40:]))

    def sidecar_pid(self) -> int:
        """PID of the sidecar child process."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f", "constraint_service"], capture_output=True,
                             text=True).stdout.split()
        assert out, "no sidecar child process found"
        return int(out[0])

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:  # a hung stop: every thread's stack into self.lines, then kill
                self.lines.append(f"--- no exit {timeout_s:g} s after signal {sig}; thread stacks (SIGUSR1):")
                self.proc.send_signal(signal.SIGUSR1)
                time.sleep(2.0)
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def metered_stack(extra: list[str] | None = None):
    """For fixtures (``yield from``): a started stack with a metrics port (``.metrics_port``; skips without
    the default model); at teardown it is stopped and must leave no shared-memory segment behind."""
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL}); run `make setup` first")
    s = Stack(free_port(), extra)
    s.metrics_port = free_port()
    s.extra += ["--metrics-port", str(s.metrics_port)]
    s.start()
    yield s
    rc = s.stop()
    assert not shm_segments(s.port), f"shared-memory segments left behind: {shm_segments(s.port)} (exit {rc}):\n" + \
        "\n".join(s.lines[-150:])


@pytest.fixture(scope="session")
def stack():
    yield from metered_stack()


@pytest.fixture()
def client(stack):
    from clients.client import NInferClient

    with NInferClient(stack.target) as c:
        yield c
