"""End-to-end tests of issue 14's defects, each with real processes (engine, sidecar, gRPC, ring).

Every test here reproduced one numbered defect of issue 14 on the revision before its fix.
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from .conftest import ROOT, Stack, free_port, shm_segments

REGEX = r"[A-Z]{2}-[0-9]{3}"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ----------------------------------------------------------------------------------- (5) sampling
@pytest.mark.parametrize("temperature", [1e-38, 1.4e-45], ids=["1e-38", "subnormal"])
def test_tiny_temperature_keeps_constrained_output_in_its_language(client, temperature: float) -> None:
    r = client.generate_text(messages=[{"role": "user", "content": "Give a product code"}],
                             constraint={"regex": REGEX}, max_tokens=16, temperature=temperature, seed=7)
    assert r.error is None, r.error
    assert re.fullmatch(REGEX, r.text) and r.finish_reason == "stop", r


def test_tiny_temperature_unconstrained_is_the_greedy_limit(client) -> None:
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    greedy = client.generate_text(messages=msgs, max_tokens=16, temperature=0.0)
    tiny = client.generate_text(messages=msgs, max_tokens=16, temperature=1e-38, seed=3)
    assert greedy.text and tiny.text == greedy.text, (greedy.text, tiny.text)


# ------------------------------------------------------------------------------- (7) request size
def test_oversized_prompts_are_refused_before_tokenisation(stack, client) -> None:
    from clients.errors import RequestRejected

    huge = "lorem ipsum dolor sit amet " * (7 * 1024 * 1024 // 27)  # ~7 MB, under the 8 MB message limit
    before = rss_bytes(stack.proc.pid)

    def count(_: int) -> str:
        try:
            client.count_tokens(prompt=huge)
        except RequestRejected as e:
            return e.kind
        return "accepted"

    with ThreadPoolExecutor(4) as ex:
        kinds = list(ex.map(count, range(4)))
    grown = rss_bytes(stack.proc.pid) - before
    assert kinds == ["InvalidRequest"] * 4, kinds
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(prompt=huge, max_tokens=1)
    assert ei.value.kind == "InvalidRequest" and "bytes" in ei.value.message, ei.value
    assert grown < 256 << 20, f"engine RSS grew by {grown >> 20} MiB for 4 refused prompts"


# ---------------------------------------------------------------------------------------- (1) port
@pytest.fixture()
def own_stack():
    from tests.e2e.conftest import MODEL

    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    s = Stack(free_port())
    s.start()
    yield s
    s.stop()


def test_second_server_on_a_taken_port_is_refused_and_the_first_keeps_serving(own_stack) -> None:
    from clients.client import NInferClient

    segments = shm_segments(own_stack.port)
    second = subprocess.run([sys.executable, "-m", "gpu_engine", "--port", str(own_stack.port), "--device", "cpu",
                             "--max-lanes", "8", "--max-seq-len", "1024", "--log-level", "WARNING"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode != 0, "a second server started on a port that is in use"
    assert str(own_stack.port) in second.stdout + second.stderr
    assert shm_segments(own_stack.port) == segments, "the live server's ring was touched"
    with NInferClient(own_stack.target) as c:
        r = c.generate_text(prompt="Code:", constraint={"regex": REGEX}, max_tokens=16, seed=1)
    assert r.error is None and re.fullmatch(REGEX, r.text), r


# ---------------------------------------------------------------------------------------- (2) IPC
class Squatter:
    """A process-local listener on the engine's old predictable sidecar socket path; counts connections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conns = []
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conns.append(c)  # hold it open and never answer, as a wedging impostor would
        for c in conns:
            c.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        self.path.unlink(missing_ok=True)


def test_engine_never_talks_to_a_process_squatting_the_socket_path() -> None:
    from clients.client import NInferClient
    from tests.e2e.conftest import MODEL

    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    s = Stack(free_port())
    squatter = Squatter(Path(f"/tmp/ninfer-{s.port}-constraint.sock"))
    try:
        try:
            s.start(timeout_s=300)
            with NInferClient(s.target) as c:
                r = c.generate_text(prompt="Code:", constraint={"regex": REGEX}, max_tokens=16, seed=1)
            assert r.error is None and re.fullmatch(REGEX, r.text), r
        finally:
            if s.proc is not None:
                s.stop()
        assert squatter.accepted == 0, f"the engine connected to the squatter {squatter.accepted} times"
    finally:
        squatter.close()


# ---------------------------------------------------------------------------------- (9) telemetry
def _scrape(stack) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=30).read().decode()


def _rejected_total(text: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(r"^ninfer_requests_rejected_total\{[^}]*\} (\S+)$", text, re.M))


def test_seconds_histograms_have_sub_millisecond_to_minute_buckets(stack, client) -> None:
    client.generate_text(prompt="Code:", constraint={"regex": REGEX}, max_tokens=8, seed=1)
    text = _scrape(stack)
    for name in ("ninfer_step_seconds", "ninfer_sidecar_wait_seconds", "ninfer_constraint_prepare_seconds"):
        bounds = {float(b) for b in re.findall(rf'^{name}_bucket\{{[^}}]*le="([^"+]+)"', text, re.M)}
        assert bounds, f"{name} not exported"
        fine = [b for b in bounds if 0 < b <= 0.1]  # OpenTelemetry's defaults (ms-scaled) start at 5
        assert len(fine) >= 4 and min(fine) <= 0.001 and 30.0 <= max(bounds) <= 3600.0, (name, sorted(bounds))


def test_every_rejection_path_is_counted(stack, client) -> None:
    from clients.errors import RequestRejected

    before = _rejected_total(_scrape(stack))
    channel = grpc.insecure_channel(stack.target)
    try:
        raw = channel.unary_stream("/ninfer.v1.Generation/Generate", request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as ei:
            list(raw(b"\xff\xff\xff\xff", timeout=60))  # not a protobuf message
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
    with pytest.raises(RequestRejected):
        client.count_tokens(prompt="x" * (7 * 1024 * 1024))
    with pytest.raises(RequestRejected):
        client.generate_text(prompt="x", max_tokens=4, constraint={"regex": "(a"})
    assert _rejected_total(_scrape(stack)) - before == 3


# ------------------------------------------------------------------------------ (6) admission
def test_a_full_queue_answers_resource_exhausted_with_a_retry_hint_and_health_still_answers() -> None:
    from google.rpc import error_details_pb2, status_pb2
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from clients.client import NInferClient
    from tests.e2e.conftest import MODEL

    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    s = Stack(free_port(), extra=["--max-queued-requests", "1"])
    s.start()
    try:
        results: list[object] = []
        with NInferClient(s.target) as c:
            req = c.build_request(prompt="Count from one to fifty:", max_tokens=48, temperature=0.0)
        channel = grpc.insecure_channel(s.target)
        from ninfer.v1 import generation_pb2_grpc

        stub = generation_pb2_grpc.GenerationStub(channel)
        calls = [stub.Generate(req, timeout=600) for _ in range(16)]  # lanes 8 + queue 1 < 16
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        for call in calls:
            try:
                results.append(len(list(call)))
            except grpc.RpcError as e:
                results.append(e)
        channel.close()
        refused = [e for e in results if isinstance(e, grpc.RpcError)]
        assert refused and all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused), results
        assert len(refused) < len(results), "every request was refused"
        md = dict(refused[0].trailing_metadata() or ())
        st = status_pb2.Status.FromString(md["grpc-status-details-bin"])
        retry = [d for d in st.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
        assert retry, "no google.rpc.RetryInfo retry hint"
    finally:
        s.stop()
