"""End-to-end: tool calls with the real SmolLM2 model through the real processes (engine + sidecar, gRPC,
shared-memory ring), every tool_choice mode; finished calls validate with ``jsonschema``; channel deltas
add up to the final result (issue 10)."""
from __future__ import annotations

import json

import jsonschema
import pytest

LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Weather forecast for a city",
          "strict": True, "parameters": {"type": "object", "properties": {
              "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
              "required": ["city", "days"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Web search",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
TOOLS = [LOOKUP, SEARCH]
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def run(client, **kw):
    stream = client.generate(messages=ASK, tools=TOOLS, max_tokens=kw.pop("max_tokens", 60), temperature=0.8,
                             **kw)
    events = list(stream)
    return events, stream.result


def check_calls(result, allowed=("lookup", "search")):
    for c in result.tool_calls:
        assert c["name"] in allowed
        args = json.loads(c["arguments_json"])
        assert isinstance(args, dict)
        if c["name"] == "lookup":
            jsonschema.validate(args, LOOKUP["function"]["parameters"])


@pytest.mark.parametrize("seed", [1, 2])
def test_required_and_named(client, seed):
    events, r = run(client, tool_choice="required", seed=seed)
    assert r.finish_reason in ("tool_calls", "length"), r
    assert r.text == "" and r.reasoning is None
    assert r.finish_reason == "length" or r.tool_calls
    check_calls(r)
    assert all(e.channel == "tool_call" for e in events if e.text)
    events, r = run(client, tool_choice="lookup", seed=seed, max_tokens=80)
    check_calls(r, ("lookup",))
    if r.finish_reason == "tool_calls":
        assert len(r.tool_calls) == 1  # named = one call
        assert r.constraint["terminated"]


def test_auto_and_none(client):
    for seed in (3, 4, 5):
        events, r = run(client, tool_choice="auto", seed=seed)
        assert r.finish_reason in ("stop", "tool_calls", "length")
        check_calls(r)
        content = "".join(e.text for e in events if e.channel == "content")
        assert content == r.text and "<tool_call>" not in r.text
        calls = [e.tool_call for e in events if e.tool_call is not None]
        assert calls == r.tool_calls
    for seed in (6, 7):
        events, r = run(client, tool_choice="none", seed=seed)
        assert r.tool_calls == [] and "<tool_call>" not in r.text
        assert r.finish_reason in ("stop", "length")


def test_auto_with_json_body_is_one_language(client):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"],
              "additionalProperties": False}
    for seed in (8, 9, 10):
        _, r = run(client, tool_choice="auto", seed=seed, constraint={"json_schema": json.dumps(schema)})
        check_calls(r)
        if r.tool_calls:
            assert r.text == "" and r.constraint["branch"] == "tools"
        elif r.finish_reason == "stop":
            jsonschema.validate(json.loads(r.text), schema)


def test_rejections_are_located(client):
    from clients.errors import RequestRejected

    bad = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"days": {"type": "integer", "multipleOf": 2}}, "additionalProperties": False}}}
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(messages=ASK, tools=[SEARCH, bad], max_tokens=4)
    assert ei.value.location.startswith("/tools/1/function/parameters/properties/days")
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(messages=ASK, tools=TOOLS, constraint={"regex": "a+"}, max_tokens=4)
    assert ei.value.kind == "InvalidRequest" and ei.value.location == "/constraint"
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(messages=ASK, tools=[SEARCH, SEARCH], max_tokens=4)
    assert ei.value.location == "/tools/1/function/name"
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(messages=ASK, thinking=True, max_tokens=4)
    assert "SmolLM2" in ei.value.message
