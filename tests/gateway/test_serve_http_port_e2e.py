"""`ninfer serve --http-port --api-key`: one command starts engine, sidecar and the HTTP gateway, one key guards
both ports (the gateway forwards it to the engine); Ctrl-C stops all three.

Real processes: the `ninfer` dispatcher (`python -m ninfer_cli serve`), its sidecar child, the gateway child,
driven by the official `openai` SDK."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from e2e.conftest import MODEL, ROOT, free_port, shm_segments

openai = pytest.importorskip("openai")
KEY = "serve-test-key"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = open(f"/proc/{pid}/stat").read().split()[2] if os.path.exists(f"/proc/{pid}/stat") else "X"
    return stat != "Z"


@pytest.mark.slow
def test_serve_with_http_port_and_api_key_answers_openai_and_stops_cleanly():
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_cli", "serve", "--port", str(port), "--device", "cpu", "--max-lanes", "2",
         "--max-seq-len", "512", "--http-port", str(http_port), "--api-key", KEY, "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)  # its own group: a "terminal"
    lines: list[str] = []
    engine_ready, gateway_ready = threading.Event(), threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "ninfer ready on" in line:
                engine_ready.set()
            if "ninfer gateway ready on" in line:
                gateway_ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + 600
        while not (engine_ready.is_set() and gateway_ready.is_set()):
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-40:])
            time.sleep(0.2)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="wrong", timeout=60).models.list()
        import grpc

        from ninfer.v1 import generation_pb2 as pb
        from ninfer.v1 import generation_pb2_grpc as pb_grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:  # the engine itself wants the key too
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.GenerationStub(ch).CountTokens(pb.CountTokensRequest(prompt="hi"), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key=KEY, timeout=120)
        resp = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=8,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert resp.choices[0].message.content in ("yes", "no")
        assert resp.choices[0].finish_reason == "stop"
        children = _children(proc.pid)
        assert len(children) >= 2, f"expected sidecar + gateway children, got {children}"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: SIGINT to the whole foreground process group
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    assert code == 0, "\n".join(lines[-40:])
    # the sidecar and the gateway are not in that group: `ninfer serve` stops them; none exits by itself and is
    # restarted mid-shutdown
    assert not [x for x in lines if "restarting" in x or "lost" in x], "\n".join(lines[-40:])
    time.sleep(0.5)
    assert not [c for c in children if _alive(c)], "a child outlived `ninfer serve`"
    assert not shm_segments(port)


@pytest.mark.slow
def test_sigkilled_serve_leaves_no_gateway_behind():
    """SIGKILL of `ninfer serve` (no chance to stop its children): the sidecar and the gateway exit by
    themselves (parent-death signal), so nothing keeps the HTTP port or the ring."""
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_cli", "serve", "--port", str(port), "--device", "cpu", "--max-lanes", "2",
         "--max-seq-len", "512", "--http-port", str(http_port), "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "ninfer gateway ready on" in line and any("ninfer ready on" in x for x in lines):
                ready.set()
            if "ninfer ready on" in line and any("ninfer gateway ready on" in x for x in lines):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(600), "\n".join(lines[-40:])
        children = _children(proc.pid)
        assert len(children) >= 2, f"expected sidecar + gateway children, got {children}"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while [c for c in children if _alive(c)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [c for c in children if _alive(c)], "a child outlived its SIGKILLed `ninfer serve`"
        while shm_segments(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not shm_segments(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
