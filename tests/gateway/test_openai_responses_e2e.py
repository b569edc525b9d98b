"""``/v1/responses`` through the official ``openai`` SDK against the real stack."""
from __future__ import annotations

import json

import httpx2
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field


class City(BaseModel):
    city: str = Field(max_length=16)
    population: int = Field(ge=0, le=50_000_000)


def test_text_response_with_items_and_instructions(openai_client):
    r = openai_client.responses.create(
        model="default", instructions="Answer in one short sentence.", max_output_tokens=8,
        input=[{"role": "user", "content": "Name a color."},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
               {"role": "user", "content": [{"type": "input_text", "text": "Another one?"}]}])
    assert r.object == "response" and r.model == "SmolLM2-135M-Instruct"
    assert r.status in ("completed", "incomplete")
    assert (r.status == "incomplete") == (r.incomplete_details is not None)
    assert r.output[0].type == "message" and r.output_text == r.output[0].content[0].text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.instructions == "Answer in one short sentence."


def test_parse_with_pydantic_model(openai_client):
    r = openai_client.responses.parse(model="default", input="Give a city as JSON.", text_format=City,
                                      max_output_tokens=64, temperature=0)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City)
    jsonschema.validate(json.loads(r.output_text), City.model_json_schema())
    c = r.model_extra["ninfer"]["constraint"]
    assert c["kind"] == "json_schema" and c["terminated"]


def test_stream_event_types(openai_client):
    fmt = {"type": "json_schema", "name": "city", "schema": City.model_json_schema(), "strict": True}
    with openai_client.responses.stream(model="default", input="Give a city as JSON.", max_output_tokens=64,
                                        temperature=0, text={"format": fmt}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    jsonschema.validate(json.loads(deltas), City.model_json_schema())


def test_stream_final_event_carries_constraint(gateway):
    # greedy: the two runs below must produce the same events (sampled runs differ in length)
    body = {"model": "default", "input": "Pick one.", "max_output_tokens": 16, "stream": True, "temperature": 0,
            "text": {"format": {"type": "json_object"}}}
    with httpx2.stream("POST", gateway.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [line[7:] for line in r.iter_lines() if line.startswith("event:")]
        r.close()
    with httpx2.stream("POST", gateway.url + "/v1/responses", json=body, timeout=60) as r:
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert [d["type"] for d in data] == [e.strip() for e in events]
    assert data[-1]["type"] in ("response.completed", "response.incomplete")
    constraint = data[-1]["ninfer"]["constraint"]
    assert constraint["kind"] == "json_object"
    assert constraint["terminated"] == (data[-1]["type"] == "response.completed")


def test_stream_incomplete_at_limit(openai_client):
    with openai_client.responses.stream(model="default", input="Tell a story.", max_output_tokens=4) as stream:
        types = [e.type for e in stream]
    assert types[-1] == "response.incomplete"


def test_input_tokens_count(openai_client):
    short = openai_client.responses.input_tokens.count(model="default", input="hi").input_tokens
    long = openai_client.responses.input_tokens.count(model="default", input="hi " * 50,
                                                      instructions="Be brief.").input_tokens
    assert 0 < short < long


@pytest.mark.parametrize("kw,field", [
    (dict(text={"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "array", "contains": {"type": "string"}}}}}}),
     "text.format.schema.properties.a.contains"),
    (dict(tools=[{"type": "web_search"}]), "tools[0].type"),
    (dict(input=[{"type": "function_call_output", "call_id": "c"}]), "input[0].output"),
    (dict(reasoning={"effort": "low"}), "reasoning"),
    (dict(text={"format": {"type": "json_object"}}, extra_body={"structured_outputs": {"regex": "a"}}),
     "structured_outputs"),
], ids=["schema-pointer", "server-tool", "tool-output", "reasoning", "two-sources"])
def test_bad_requests(openai_client, kw, field):
    kw.setdefault("input", "hi")
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client.responses.create(model="default", max_output_tokens=4, **kw)
    assert field in exc.value.body["message"]
    assert exc.value.body["type"] == "invalid_request_error"
