"""Gateway fixtures: the real stack — ``python -m gpu_engine`` (which starts the real sidecar and
the shared-memory ring) with the default SmolLM2 model, and real ``python -m gateway`` processes —
driven by the official ``openai`` / ``anthropic`` SDKs. One engine for the whole directory."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from e2e.conftest import MODEL, Stack, free_port, shm_segments  # noqa: E402

MODEL_NAME = "SmolLM2-135M-Instruct"


class Gateway:
    """A running ``python -m gateway`` process."""

    def __init__(self, engine_target: str, extra: list[str] | None = None) -> None:
        from gateway import spawn_gateway

        self.port = free_port()
        self.lines: list[str] = []
        self.proc = spawn_gateway(engine_target, self.port, model_name=MODEL_NAME, extra_args=extra, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = threading.Event()

        def pump() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                if "ninfer gateway ready on" in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 60
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start:\n" + "\n".join(self.lines[-40:]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="session")
def engine_stack():
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL}); run `make setup` first")
    s = Stack(free_port())
    s.start()
    yield s
    s.stop()
    assert not shm_segments(s.port), f"shared-memory segments left behind: {shm_segments(s.port)}"


@pytest.fixture(scope="session")
def gateway(engine_stack):
    g = Gateway(engine_stack.target)
    yield g
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal (exit status -15)
    assert g.stop() in (0, -15), "\n".join(g.lines[-40:])
    assert not any("Traceback" in line for line in g.lines), "\n".join(g.lines[-60:])


@pytest.fixture(scope="session")
def openai_client(gateway):
    import openai

    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def anthropic_client(gateway):
    import anthropic

    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)
