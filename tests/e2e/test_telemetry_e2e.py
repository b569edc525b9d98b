"""Truthful traces (issue 14 (9)), recorded with the OpenTelemetry SDK's InMemorySpanExporter.

The stack runs in-process (``gpu_engine.api.serve.build_stack``: real SmolLM2 weights, CPU program, real
sidecar process and shared-memory ring) behind a real gRPC server, so the spans of the public servicer
and of the engine loop are captured here:

* every ``engine.step`` span is a root span with OpenTelemetry links to the request spans of its rows;
* request spans carry the GenAI semantic-convention attributes (operation, model, response id = request
  id, token usage, finish reasons);
* a rejected request's span (Generate and CountTokens, including undecodable bytes) has status ERROR;
* the sidecar's spans reach stderr in console mode (``NINFER_TRACE_CONSOLE=1``) although the engine
  discards the sidecar's stdout.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import pytest

from .conftest import MODEL, free_port

ROOT = Path(__file__).resolve().parents[2]
otel = pytest.importorskip("opentelemetry.sdk.trace")


def _exporter():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture(scope="module")
def traced_stack():
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL}); run `make setup` first")
    import grpc

    from gpu_engine.api.serve import build_parser, build_stack
    from gpu_engine.api.servicer import GenerationServicer, add_generation_servicer

    exporter = _exporter()
    args = build_parser().parse_args(["--port", str(free_port()), "--device", "cpu", "--max-lanes", "4",
                                      "--max-seq-len", "512", "--log-level", "WARNING"])
    engine, frontend, loaded = build_stack(args)
    engine.start()
    svc = GenerationServicer(engine, frontend, model_name="SmolLM2-135M-Instruct")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add_generation_servicer(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield exporter, f"127.0.0.1:{port}"
    finally:
        server.stop(0)
        engine.stop()


def _spans(exporter, name: str, n: int, timeout_s: float = 30.0):
    """The finished spans called ``name`` once at least ``n`` exist (a server span ends after its last answer)."""
    end = time.monotonic() + timeout_s
    while True:
        got = [s for s in exporter.get_finished_spans() if s.name == name]
        if len(got) >= n or time.monotonic() > end:
            return got
        time.sleep(0.05)


def test_step_spans_link_to_their_requests_and_requests_carry_genai_attributes(traced_stack):
    from clients.client import NInferClient

    exporter, target = traced_stack
    exporter.clear()
    results = {}
    with NInferClient(target) as client:
        def run(name, **kw):
            results[name] = client.generate_text(request_id=f"trace-{name}", max_tokens=6, temperature=0.0, **kw)

        threads = [threading.Thread(target=run, args=("chat",), kwargs=dict(
                       messages=[{"role": "user", "content": "Say yes or no."}], constraint={"regex": "(yes|no)!"})),
                   threading.Thread(target=run, args=("prompt",), kwargs=dict(prompt="Once upon a time"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert set(results) == {"chat", "prompt"} and all(r.error is None for r in results.values()), results

    reqs = {dict(s.attributes)["gen_ai.response.id"]: s for s in _spans(exporter, "ninfer.generate", 2)}
    assert set(reqs) == {"trace-chat", "trace-prompt"}, reqs.keys()
    for rid, span in reqs.items():
        a = dict(span.attributes)
        assert a["gen_ai.operation.name"] == ("chat" if rid == "trace-chat" else "text_completion"), a
        assert a["gen_ai.request.model"] == "SmolLM2-135M-Instruct" == a["gen_ai.response.model"], a
        assert a["gen_ai.request.max_tokens"] == 6 and a["gen_ai.request.temperature"] == 0.0, a
        r = results[rid.removeprefix("trace-")]
        assert a["gen_ai.usage.output_tokens"] == r.usage["completion_tokens"] > 0, (a, r)
        assert a["gen_ai.usage.input_tokens"] == r.usage["prompt_tokens"] > 0, (a, r)
        assert list(a["gen_ai.response.finish_reasons"]) == [r.finish_reason], (a, r)
        assert span.status.status_code.name != "ERROR", span.status

    steps = [s for s in exporter.get_finished_spans() if s.name == "engine.step"]
    assert steps, "no engine.step spans"
    request_ids = {(s.context.trace_id, s.context.span_id) for s in reqs.values()}
    linked = set()
    for st in steps:
        assert st.parent is None, "a step span must be a root span (it serves several requests)"
        assert st.links, f"step span without links: {st.attributes}"
        targets = {(ln.context.trace_id, ln.context.span_id) for ln in st.links}
        assert targets <= request_ids, "a step links to something that is not a request span"
        assert len(targets) <= dict(st.attributes)["ninfer.batch_size"]
        linked |= targets
    assert linked == request_ids, "some request has no step linked to it"


def test_rejected_requests_have_error_spans(traced_stack):
    import grpc

    from clients.client import NInferClient
    from clients.errors import RequestRejected

    exporter, target = traced_stack
    exporter.clear()
    with NInferClient(target) as client:
        with pytest.raises(RequestRejected) as ei:
            client.generate_text(prompt="x", constraint={"regex": "(unclosed"}, max_tokens=2)
    assert ei.value.kind == "InvalidRegex"
    with grpc.insecure_channel(target) as ch:
        for method in ("Generate", "CountTokens"):
            call = (ch.unary_stream if method == "Generate" else ch.unary_unary)(f"/ninfer.v1.Generation/{method}")
            with pytest.raises(grpc.RpcError) as ei2:
                out = call(b"\x0a\x02\xff\xfe")  # field 1 (string) holding invalid UTF-8
                list(out) if method == "Generate" else out
            assert ei2.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    gen = _spans(exporter, "ninfer.generate", 2)
    count = _spans(exporter, "ninfer.count_tokens", 1)
    kinds = sorted(dict(s.attributes).get("error.type") for s in gen + count)
    assert kinds == ["InvalidRegex", "InvalidRequest", "InvalidRequest"], kinds
    for s in gen + count:
        assert s.status.status_code.name == "ERROR" and s.status.description, (s.name, s.status)


def test_sidecar_spans_reach_stderr_in_console_mode():
    """The engine starts its sidecar with stdout discarded; console spans go to stderr, as they end."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    sock = os.path.join(tempfile.mkdtemp(prefix="ninfer-trace-"), "s.sock")
    env = {**os.environ, "NINFER_TRACE_CONSOLE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "constraint_service", "--socket", sock], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < end, "sidecar did not start"
            time.sleep(0.1)
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.send_signal(signal.SIGKILL)  # killed: nothing may still wait in a batch
        _, err = proc.communicate(timeout=60)
    start = err.find("{")
    assert start >= 0, f"no span on stderr: {err[-2000:]}"
    decoder, spans, i = json.JSONDecoder(), [], start
    while i < len(err):
        try:
            obj, j = decoder.raw_decode(err, i)
        except json.JSONDecodeError:
            i = err.find("{", i + 1)
            if i < 0:
                break
            continue
        if isinstance(obj, dict) and "name" in obj and "context" in obj:
            spans.append(obj)
        i = j
    names = [s["name"] for s in spans]
    assert any("Health/Check" in n for n in names), names
    assert all(s["resource"]["attributes"]["service.name"] == "ninfer-constraint-service" for s in spans)
