"""``/v1/messages`` and ``/v1/messages/count_tokens`` through the official ``anthropic`` SDK."""
from __future__ import annotations

import json

import anthropic
import httpx2
import jsonschema
import pytest

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
MSGS = [{"role": "user", "content": "Describe a person as JSON."}]
GREEDY = {"temperature": 0}  # not a create() argument in this SDK version


def test_output_config_format(anthropic_client):
    m = anthropic_client.messages.create(model="default", max_tokens=64, messages=MSGS, system="You output JSON.",
                                         output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
                                         extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == "SmolLM2-135M-Instruct"
    assert m.stop_reason == "end_turn" and m.content[0].type == "text"
    jsonschema.validate(json.loads(m.content[0].text), SCHEMA)
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    assert m.model_extra["ninfer"]["constraint"]["terminated"] is True


def test_max_tokens_stop_reason_and_blocks(anthropic_client):
    m = anthropic_client.messages.create(model="SmolLM2-135M-Instruct", max_tokens=3, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Tell a long story.", "cache_control":
                                      {"type": "ephemeral"}}]}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_stream_events(anthropic_client):
    with anthropic_client.messages.stream(model="default", max_tokens=64, messages=MSGS, extra_body=GREEDY,
                                          output_config={"format": {"type": "json_schema", "schema": SCHEMA}}) as s:
        events = list(s)
        final = s.get_final_message()
    types = [e.type for e in events if not e.type.startswith("text")]
    assert types[0] == "message_start" and types[1] == "content_block_start"
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == final.content[0].text and final.stop_reason == "end_turn"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_stream_final_event_carries_constraint(gateway):
    body = {"model": "default", "max_tokens": 16, "messages": MSGS, "stream": True,
            "structured_outputs": {"choice": ["alpha", "beta"]}}
    with httpx2.stream("POST", gateway.url + "/v1/messages", json=body, timeout=60) as r:
        assert r.status_code == 200
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert data[-1]["type"] == "message_stop"
    assert data[-1]["ninfer"]["constraint"]["kind"] == "choice"
    assert data[-1]["ninfer"]["constraint"]["terminated"] is True


def test_count_tokens(anthropic_client):
    # (SmolLM2's template adds its own system prompt when none is given, so compare two given ones)
    a = anthropic_client.messages.count_tokens(model="default", messages=MSGS, system="Be brief.").input_tokens
    b = anthropic_client.messages.count_tokens(model="default", messages=MSGS, system="Be brief. " * 5).input_tokens
    assert 0 < a < b


@pytest.mark.parametrize("kw,field", [
    (dict(output_config={"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"a": {"type": "array", "contains": {"type": "string"}}}}}}),
     "output_config.format.schema.properties.a.contains"),
    (dict(tools=[{"name": "f", "input_schema": {"type": "object"}, "type": "web_search_20250305"}]),
     "tools[0].type"),
    (dict(tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "tool", "name": "g"}),
     "tool_choice.name"),
    (dict(thinking={"type": "enabled", "budget_tokens": 2}), "thinking"),
    (dict(stop_sequences=["\n"]), "stop_sequences"),
    (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]),
     "messages[0].content[0].type"),
], ids=["schema-pointer", "server-tool", "tool-choice-name", "thinking-on-smollm2", "stop", "image"])
def test_bad_requests(anthropic_client, kw, field):
    kw.setdefault("messages", MSGS)
    with pytest.raises(anthropic.BadRequestError) as exc:
        anthropic_client.messages.create(model="default", max_tokens=4, **kw)
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert field in exc.value.body["error"]["message"]


def test_unknown_model_is_not_found(anthropic_client):
    with pytest.raises(anthropic.NotFoundError):
        anthropic_client.messages.create(model="claude-opus-4", max_tokens=4, messages=MSGS)
    assert [m.id for m in anthropic_client.models.list()] == ["SmolLM2-135M-Instruct"]


def test_messages_parse_with_pydantic_model(anthropic_client):
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    m = anthropic_client.messages.parse(model="default", max_tokens=64, messages=MSGS, output_format=Person,
                                        extra_body=GREEDY)
    assert m.stop_reason == "end_turn" and isinstance(m.parsed_output, Person)
    jsonschema.validate(json.loads(m.content[0].text), Person.model_json_schema())
