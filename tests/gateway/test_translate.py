"""Unit tests of the gateway's protocol translation (no engine: pure functions)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import grpc
import pytest

from gateway import anthropic_messages, openai_chat, openai_responses, tools
from gateway.errors import ApiError, engine_rejection, field_path
from ninfer.v1 import generation_pb2 as pb

M = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_field_path_arrays_and_odd_keys():
    doc = {"anyOf": [{"properties": {"a b": {"items": {}}}}]}
    assert field_path("text.format.schema", "/anyOf/0/properties/a b/items", doc) == \
        'text.format.schema.anyOf[0].properties["a b"].items'
    # a digit key of an object stays a (quoted) key, never an index
    assert field_path("x.schema", "/properties/0", {"properties": {"0": {}}}) == 'x.schema.properties["0"]'
    assert field_path("x.schema", "/a~1b/c~0d", None) == 'x.schema["a/b"]["c~d"]'
    assert field_path("x.schema", "", None) == "x.schema"


def test_engine_rejection_grammar_location():
    e = engine_rejection(grpc.StatusCode.INVALID_ARGUMENT, "InvalidGrammar", "expected rule", "1:7",
                         "structured_outputs.grammar")
    assert e.status == 400 and e.param == "structured_outputs.grammar"
    assert e.message == "InvalidGrammar at structured_outputs.grammar (1:7): expected rule"
    assert engine_rejection(grpc.StatusCode.UNAVAILABLE, "EngineUnavailable", "down", "").status == 503


def test_chat_translation():
    cr = openai_chat.parse({"model": "default", "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": -1, "presence_penalty": 1.0,
        "frequency_penalty": -1.0, "stream": True, "stream_options": {"include_usage": True},
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA,
                                                                   "strict": False}}}, M)
    r = cr.request
    assert [(m.role, m.content) for m in r.chat.messages] == [("system", "Be brief."), ("user", "ab")]
    assert r.max_tokens == 7 and r.sampling.seed == (1 << 64) - 1
    assert r.sampling.temperature == pytest.approx(0.5) and r.sampling.frequency_penalty == -1.0
    # strict=false does not loosen: the whole schema goes to the engine
    assert json.loads(r.constraint.json_schema) == SCHEMA
    assert cr.stream and cr.include_usage and cr.origin.field == "response_format.json_schema.schema"


def test_chat_defaults_leave_fields_unset():
    r = openai_chat.parse({"model": M, "messages": USER}, M).request
    assert r.max_tokens == 0 and not r.sampling.HasField("temperature") and not r.HasField("constraint")


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"guided_regex": "a"}}, "structured_outputs.guided_regex"),
    ({"guided_json": {}}, "guided_json"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"thinking_budget": 64}, "thinking_budget"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "on"}}, "thinking.type"),
    ({"chat_template_kwargs": {"enable_thinking": True}, "thinking": {"type": "disabled"}},
     "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs.add_generation_prompt"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
])
def test_chat_rejections_name_the_field(body, param):
    with pytest.raises(ApiError) as exc:
        openai_chat.parse({"model": M, "messages": USER, **body}, M)
    assert exc.value.status == 400 and exc.value.param == param
    assert exc.value.message.startswith(param)


def test_model_not_found():
    with pytest.raises(ApiError) as exc:
        openai_chat.parse({"model": "gpt-4o", "messages": USER}, M)
    assert exc.value.status == 404 and exc.value.openai_body()["error"]["param"] == "model"


def test_responses_translation():
    rr = openai_responses.parse({"model": M, "instructions": "sys", "max_output_tokens": 5, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "q"}]}],
        "text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}}, M)
    assert [(m.role, m.content) for m in rr.request.chat.messages] == [("system", "sys"), ("user", "q")]
    assert rr.request.max_tokens == 5 and rr.origin.field == "text.format.schema"
    with pytest.raises(ApiError) as exc:
        openai_responses.parse({"model": M, "input": "x", "store": True}, M)
    assert exc.value.param == "store"


def test_anthropic_translation():
    mr = anthropic_messages.parse({"model": M, "max_tokens": 9, "system": [{"type": "text", "text": "S"}],
                                   "messages": USER, "top_k": 5, "thinking": {"type": "disabled"},
                                   "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}, M)
    r = mr.request
    assert r.chat.messages[0].role == "system" and r.sampling.top_k == 5 and r.max_tokens == 9
    assert mr.origin.field == "output_config.format.schema"
    with pytest.raises(ApiError) as exc:
        anthropic_messages.parse({"model": M, "messages": USER}, M)
    assert exc.value.param == "max_tokens"
    assert exc.value.anthropic_body() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: is required"}}


def test_tool_policies_map_to_the_common_contract():
    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    p = tools.openai_chat_tools({"tools": [fn], "tool_choice": {"type": "function", "function": {"name": "f"}}})
    assert (p.choice, p.allowed_names, p.parallel) == ("required", ["f"], False)
    assert p.tools[0].strict and p.tools[0].schema_path == "tools[0].function.parameters"
    p = tools.responses_tools({"tools": [{"type": "function", "name": "g", "parameters": {}}],
                               "parallel_tool_calls": False})
    assert (p.choice, p.parallel) == ("auto", False)
    p = tools.anthropic_tools({"tools": [{"name": "h", "input_schema": {"type": "object"}}],
                               "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    assert (p.choice, p.parallel, p.tools[0].schema_path) == ("required", False, "tools[0].input_schema")
    with pytest.raises(ApiError) as exc:
        tools.openai_chat_tools({"tools": [fn, fn]})
    assert exc.value.param == "tools[1].name"



def test_tools_and_thinking_fill_the_engine_request():
    """Each protocol's tool fields land 1:1 in GenerateRequest.tools / tool_choice / thinking."""

    params = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cr = openai_chat.parse({"model": M, "messages": USER, "parallel_tool_calls": False,
                            "tools": [{"type": "function", "function": {"name": "f", "parameters": params,
                                                                        "strict": True}}],
                            "tool_choice": "required", "thinking": {"type": "enabled", "budget_tokens": 7}}, M)
    r = cr.request
    assert [(t.name, json.loads(t.parameters_json), t.strict) for t in r.tools] == [("f", params, True)]
    assert (r.tool_choice.mode, r.tool_choice.parallel) == (pb.TOOL_CHOICE_MODE_REQUIRED, False)
    assert (r.thinking.enabled, r.thinking.budget_tokens) == (True, 7)
    assert cr.origin.field is None and cr.origin.tools[0].schema_path == "tools[0].function.parameters"
    rr = openai_responses.parse({"model": M, "input": "x", "chat_template_kwargs": {"enable_thinking": False},
                                 "tools": [{"type": "function", "name": "g", "parameters": params}],
                                 "tool_choice": {"type": "function", "name": "g"}}, M)
    tc = rr.request.tool_choice
    assert (tc.mode, list(tc.allowed_names), tc.parallel) == (pb.TOOL_CHOICE_MODE_REQUIRED, ["g"], False)
    assert rr.request.tools[0].strict and rr.request.thinking.enabled is False
    mr = anthropic_messages.parse({"model": M, "max_tokens": 50, "messages": USER,
                                   "thinking": {"type": "enabled", "budget_tokens": 20},
                                   "tools": [{"name": "h", "input_schema": params}],
                                   "tool_choice": {"type": "none"}}, M)
    assert mr.request.tool_choice.mode == pb.TOOL_CHOICE_MODE_NONE and mr.request.thinking.budget_tokens == 20
    with pytest.raises(ApiError) as exc:
        anthropic_messages.parse({"model": M, "max_tokens": 10, "messages": USER,
                                  "thinking": {"type": "enabled", "budget_tokens": 20}}, M)
    assert exc.value.param == "thinking.budget_tokens"


def test_tool_history_in_each_protocol():
    """Assistant tool calls + tool results in the history reach ChatMessage.tool_calls / role tool."""
    chat = openai_chat.parse({"model": M, "messages": [
        *USER, {"role": "assistant", "content": None, "reasoning_content": "hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}, M).request.chat.messages
    resp = openai_responses.parse({"model": M, "input": [
        *USER, {"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}]}, M).request.chat.messages
    anth = anthropic_messages.parse({"model": M, "max_tokens": 5, "messages": [
        *USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                                 {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "42"}]}]},
        M).request.chat.messages
    for msgs in (chat, resp, anth):
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        a, t = msgs[1], msgs[2]
        assert [(c.id, c.name, json.loads(c.arguments_json)) for c in a.tool_calls] == [("c1", "f", {"a": 1})]
        assert a.reasoning == "hm" and (t.tool_call_id, t.name, t.content) == ("c1", "f", "42")


def test_engine_tool_locations_map_to_protocol_paths():
    from gateway.engine import ConstraintOrigin, tool_location

    for body, module, want in (
            ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}] * 1},
             openai_chat, "tools[0].function.parameters.properties.days"),
            ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}]},
             openai_responses, "tools[0].parameters.properties.days"),
            ({"messages": USER, "max_tokens": 3, "tools": [{"name": "f", "input_schema": {}}]},
             anthropic_messages, "tools[0].input_schema.properties.days")):
        origin = module.parse({"model": M, **body}, M).origin
        assert tool_location(origin, "/tools/0/function/parameters/properties/days") == want
        assert tool_location(origin, "/tools/3/function/parameters") is None
    assert tool_location(ConstraintOrigin("x"), "/tools/0/function/parameters") is None


def test_gateway_never_imports_the_servers():
    """The gateway is a client of the public gRPC API only (DESIGN.md)."""
    bad = []
    for path in (Path(__file__).resolve().parents[2] / "gateway").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{path.name}: {n}" for n in names
                    if n.split(".")[0] in ("gpu_engine", "constraint_service", "shared_memory", "torch", "xgrammar")]
    assert not bad


def test_supervisor_restarts_a_dead_gateway():
    """A real gateway child (no engine behind it: /health answers 503) is restarted after SIGKILL."""
    import os
    import signal
    import time

    import httpx2

    from e2e.conftest import free_port
    from gateway.supervisor import GatewaySupervisor

    port = free_port()
    sup = GatewaySupervisor(f"127.0.0.1:{free_port()}", port, restart_delay_s=0.2)

    def health_status() -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                return httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
            except httpx2.TransportError:
                time.sleep(0.2)
        raise AssertionError("gateway did not come up")

    sup.start()
    try:
        assert health_status() == 503
        first = sup.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (sup.pid == first or sup.restarts == 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sup.restarts == 1 and sup.pid != first
        assert health_status() == 503
    finally:
        sup.stop()
    assert sup._proc.poll() is not None


ODD_VALUES = [1, -1, 1e308, "x", "", [], [1], ["x"], {}, {"a": 1}, {"type": "x"}, True, [{}], [{"type": 1}],
              {"type": "function", "function": "f"}, {"type": "json_schema", "json_schema": "s"}]
BASES = {
    openai_chat: {"model": M, "messages": USER},
    openai_responses: {"model": M, "input": "hi"},
    anthropic_messages: {"model": M, "max_tokens": 4, "messages": USER},
}


@pytest.mark.parametrize("module", list(BASES), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_any_odd_value_is_an_api_error_never_a_crash(module):
    """Every field (top level, one message level down, one constraint level down) with values of
    the wrong type or shape: the translator accepts it or raises ApiError (-> 4xx), nothing else."""
    base = BASES[module]
    keys = set(module.ALLOWED) | {"unknown_field"}
    bodies = [{**base, k: v} for k in keys for v in ODD_VALUES]
    msg_key = "input" if module is openai_responses else "messages"
    for field in ("role", "content", "type", "tool_calls", "name"):
        bodies += [{**base, msg_key: [{"role": "user", "content": "x", field: v}]} for v in ODD_VALUES]
    for outer, inner in (("response_format", "json_schema"), ("text", "format"), ("output_config", "format"),
                         ("structured_outputs", "choice"), ("tool_choice", "function"), ("thinking", "type"),
                         ("stream_options", "include_usage")):
        bodies += [{**base, outer: {inner: v}} for v in ODD_VALUES]
    for body in bodies:
        try:
            module.parse(body, M)
        except ApiError as e:
            assert 400 <= e.status < 500, (body, e.status)


@pytest.mark.parametrize("parse,body,needle", [
    (openai_chat.parse, {"model": "m", "messages": [{"role": None, "content": "x"}]}, "got null"),
    (openai_chat.parse, {"model": "m", "messages": [{"role": ["u"], "content": "x"}]}, 'got ["u"]'),
    (openai_chat.parse, {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": None,
                         "temperature": True}, "got true"),
    (openai_responses.parse, {"model": "m", "input": [{"type": "message", "role": {"a": 1}, "content": "x"}]},
     'got {"a": 1}'),
    (openai_responses.parse, {"model": "m", "input": [{"type": 5, "role": "user", "content": "x"}]},
     "input item type 5 is"),
    (anthropic_messages.parse, {"model": "m", "max_tokens": 3, "messages": [{"role": None, "content": "x"}]},
     "got null"),
], ids=["chat-role-null", "chat-role-list", "chat-bool-number", "responses-role-object", "responses-type-int",
        "anthropic-role-null"])
def test_bad_values_are_shown_as_json_not_python_repr(parse, body, needle):
    with pytest.raises(ApiError) as ei:
        parse(body, "m")
    assert ei.value.status == 400 and needle in ei.value.message, ei.value.message
    assert "None" not in ei.value.message and "'" not in ei.value.message
