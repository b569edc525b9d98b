"""Unit tests of clients.client / clients.errors against a fake in-process server."""

from __future__ import annotations

import grpc
import pytest

from clients import (
    GenerationResult,
    NInferClient,
    RequestRejected,
    ServerError,
    ServerUnavailable,
    TokenCount,
    build_constraint,
)
from clients.errors import ErrorDetail
from ninfer.v1 import generation_pb2 as pb


def test_streaming_deltas_are_assembled(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        stream = c.generate("hello", max_tokens=8, temperature=0.0, seed=7)
        events = list(stream)
    assert [e.text for e in events[:-1]] == ["Hel", "lo", " wor", "ld"]
    assert events[-1].finish is not None and events[-1].finish is stream.result
    r = stream.result
    assert r.text == "Hello world"
    assert r.finish_reason == "stop"
    assert r.token_ids == [10, 11, 12, 13]
    assert r.usage == {"prompt_tokens": 5, "completion_tokens": 4, "draft_tokens": 6, "accepted_draft_tokens": 2}
    assert r.constraint is None and r.error is None


def test_request_fields_are_sent(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        r = c.generate_text(
            messages=[{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}],
            constraint={"regex": "[a-z]+"},
            max_tokens=12,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=3,
            speculative="early-exit-sampled",
            num_draft_tokens=4,
            request_id="rid-1",
        )
    req = fake_server.servicer.requests[-1]
    assert req.request_id == "rid-1"
    assert req.WhichOneof("input") == "chat"
    assert [(m.role, m.content) for m in req.chat.messages] == [("system", "be terse"), ("user", "hi")]
    assert req.max_tokens == 12
    s = req.sampling
    assert s.HasField("temperature") and s.temperature == pytest.approx(0.5)
    assert s.top_p == pytest.approx(0.9) and s.top_k == 40 and s.min_p == pytest.approx(0.05) and s.seed == 3
    assert not s.HasField("presence_penalty")
    assert req.constraint.regex == "[a-z]+"
    assert req.speculative.method == pb.SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED
    assert req.speculative.num_draft_tokens == 4
    assert r.constraint == {"kind": "regex", "complete": True, "terminated": True, "cache": "built", "prepare_seconds": 0.25}


def test_unset_sampling_fields_stay_unset(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        c.generate_text("hello")
    req = fake_server.servicer.requests[-1]
    assert req.prompt == "hello"
    for f in ("temperature", "top_p", "min_p", "top_k", "seed"):
        assert not req.sampling.HasField(f)
    assert not req.HasField("constraint") and not req.HasField("speculative")


@pytest.mark.parametrize(
    "spec, field, check",
    [
        ({"json_object": True}, "json_object", lambda oc: True),
        ({"json_schema": '{"type":"object"}'}, "json_schema", lambda oc: oc.json_schema == '{"type":"object"}'),
        ({"json_schema": {"type": "object"}}, "json_schema", lambda oc: '"type"' in oc.json_schema),
        ({"grammar": 'root ::= "a"'}, "grammar", lambda oc: oc.grammar == 'root ::= "a"'),
        ({"regex": "a+"}, "regex", lambda oc: oc.regex == "a+"),
        ({"choice": ["a", "b", ""]}, "choice", lambda oc: list(oc.choice.options) == ["a", "b", ""]),
        ({"choice": []}, "choice", lambda oc: list(oc.choice.options) == []),
    ],
)
def test_build_constraint(spec, field, check):
    oc = build_constraint(spec)
    assert oc.WhichOneof("kind") == field
    assert check(oc)


@pytest.mark.parametrize("spec", [{"regex": "a", "grammar": "b"}, {"bogus": 1}, {}, {"choice": "ab"}, "regex"])
def test_build_constraint_rejects_malformed(spec):
    with pytest.raises(RequestRejected) as ei:
        build_constraint(spec)
    assert ei.value.kind == "InvalidRequest" and ei.value.code == "INVALID_ARGUMENT"


def test_prompt_xor_messages():
    c = NInferClient("127.0.0.1:1")
    with pytest.raises(RequestRejected):
        c.generate()
    with pytest.raises(RequestRejected):
        c.generate("a", [{"role": "user", "content": "b"}])
    c.close()


def test_rejected_request_decodes_structured_detail(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        with pytest.raises(RequestRejected) as ei:
            c.generate_text("reject-grammar", constraint={"grammar": "root = x"})
    e = ei.value
    assert (e.code, e.kind, e.message, e.location) == ("INVALID_ARGUMENT", "InvalidGrammar", "expected '::='", "1:7")
    assert e.to_dict() == {"code": "INVALID_ARGUMENT", "kind": "InvalidGrammar", "message": "expected '::='", "location": "1:7"}
    assert str(e) == "InvalidGrammar at 1:7: expected '::='"


def test_empty_choice_rejected_by_server(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        with pytest.raises(RequestRejected) as ei:
            c.generate_text("hi", constraint={"choice": []})
    assert ei.value.kind == "InvalidChoice" and ei.value.location == ""


def test_unavailable_with_detail_is_server_unavailable(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        with pytest.raises(ServerUnavailable) as ei:
            c.generate_text("unavailable")
    assert ei.value.code == "UNAVAILABLE" and ei.value.kind == "ConstraintServiceUnavailable"


def test_internal_without_detail_is_server_error(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        with pytest.raises(ServerError) as ei:
            c.generate_text("internal")
    assert ei.value.code == "INTERNAL" and ei.value.message == "boom"


def test_unreachable_server(dead_target):
    with NInferClient(dead_target, timeout_s=5) as c:
        with pytest.raises(ServerUnavailable) as ei:
            c.generate_text("hello")
    assert ei.value.code == "UNAVAILABLE"


def test_runtime_error_is_returned_not_raised(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        r = c.generate_text("runtime-error")
    assert isinstance(r, GenerationResult)
    assert r.text == "par" and r.finish_reason == "error" and not r.ok
    assert r.error == {"code": "INTERNAL", "kind": "IntegrityError", "message": "row mismatch", "location": ""}


def test_length_finish(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        r = c.generate_text("length")
    assert r.finish_reason == "length" and r.ok


def test_stream_without_finish_is_server_error(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        stream = c.generate("no-finish")
        with pytest.raises(ServerError) as ei:
            list(stream)
    assert ei.value.kind == "IncompleteStream"
    assert stream.text == "Hello world"


def test_cancel_stream(fake_server):
    fake_server.servicer.cancelled.clear()
    with NInferClient(fake_server.target, timeout_s=10) as c:
        stream = c.generate("slow")
        first = next(stream)
        assert first.text == "x"
        r = stream.cancel()
        assert r.finish_reason == "cancelled" and r.text.startswith("x")
        assert list(stream) == []
        assert stream.result is r
    assert fake_server.servicer.cancelled.wait(5)


def test_count_tokens_and_health(fake_server):
    with NInferClient(fake_server.target, timeout_s=5) as c:
        assert c.count_tokens("a b c") == TokenCount(3, 2048)
        assert c.count_tokens(messages=[{"role": "user", "content": "a b"}]).num_tokens == 4
        assert c.health() == "SERVING"
        assert c.health("ninfer.v1.Generation") == "SERVING"
        assert c.health("no.such.Service") == "SERVICE_UNKNOWN"


def test_trace_context_is_propagated(fake_server):
    trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    ctx = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(ctx)):
        with NInferClient(fake_server.target, timeout_s=5) as c:
            c.generate_text("hello")
    md = fake_server.servicer.metadata[-1]
    assert md.get("traceparent", "").startswith("00-" + format(0x1234, "032x"))


# -- tools / thinking fields (issue 10) ----------------------------------------------------------

def test_build_request_tools_choice_thinking_and_tool_messages():
    from clients import NInferClient as C

    req = C.build_request(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"city":"Oslo"}'}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "lookup"},
        ],
        tools=[{"name": "lookup", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        tool_constraints="automatic",
        thinking="off",
        thinking_budget=0,
    )
    m = req.chat.messages
    assert m[1].tool_calls[0].name == "lookup" and m[1].tool_calls[0].arguments_json == '{"city":"Oslo"}'
    assert m[2].role == "tool" and m[2].tool_call_id == "c1" and m[2].name == "lookup"
    assert req.tools[0].name == "lookup" and req.tools[0].parameters_json == '{"type": "object"}'
    tc = req.tool_choice
    assert (tc.mode, list(tc.allowed_names), tc.parallel) == (pb.TOOL_CHOICE_MODE_REQUIRED, ["lookup"], False)
    assert tc.constraints == pb.TOOL_CONSTRAINT_MODE_AUTOMATIC
    assert req.thinking.HasField("enabled") and req.thinking.enabled is False


def test_build_request_bad_tool_args_rejected():
    from clients import NInferClient as C
    from clients.errors import RequestRejected

    for kwargs, loc in [
        ({"tools": [{"name": "a", "strict": "yes"}]}, "/tools/0/strict"),
        ({"tools": [{"type": "function", "function": {"name": "a", "parameters": 3}}]}, "/tools/0/function/parameters"),
        ({"tools": {"name": "a"}}, "/tools"),
    ]:
        with pytest.raises(RequestRejected) as ei:
            C.build_request(messages=[{"role": "user", "content": "x"}], **kwargs)
        assert ei.value.location == loc
    for kwargs in [{"thinking": "maybe"}, {"thinking_budget": -1}, {"tool_choice": ""}, {"tool_constraints": "x"}]:
        with pytest.raises(RequestRejected):
            C.build_request(messages=[{"role": "user", "content": "x"}], **kwargs)
