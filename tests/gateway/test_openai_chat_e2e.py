"""``/v1/chat/completions`` through the official ``openai`` SDK against the real stack."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

USER = [{"role": "user", "content": "Describe a person as JSON."}]


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                 "required": ["name", "age"], "additionalProperties": False}


def test_plain_completion(openai_client):
    r = openai_client.chat.completions.create(model="default", messages=[{"role": "system", "content": "Be brief."},
                                                                         *USER], max_tokens=8)
    assert r.object == "chat.completion" and r.model == "SmolLM2-135M-Instruct"
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model_extra["ninfer"] == {"constraint": None}


def test_parse_with_pydantic_model(openai_client):
    r = openai_client.chat.completions.parse(model="SmolLM2-135M-Instruct", messages=USER, response_format=Person,
                                             max_completion_tokens=64, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())
    constraint = r.model_extra["ninfer"]["constraint"]
    assert constraint["kind"] == "json_schema" and constraint["complete"] and constraint["terminated"]
    assert constraint["cache"] in ("hit", "built", "waited")


def test_json_object(openai_client):
    r = openai_client.chat.completions.create(model="default", messages=USER, max_tokens=64, temperature=0,
                                              response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")
    assert r.model_extra["ninfer"]["constraint"]["kind"] == "json_object"


def test_stream_with_usage_and_schema(openai_client):
    stream = openai_client.chat.completions.create(
        model="default", messages=USER, max_tokens=64, temperature=0, stream=True,
        stream_options={"include_usage": True},
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA,
                                                                "strict": True}})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    assert finish[0].model_extra["ninfer"]["constraint"]["terminated"] is True
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens > 0
    assert all(ch.usage is None for ch in chunks[:-1])
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_length_stays_length(openai_client):
    r = openai_client.chat.completions.create(
        model="default", messages=USER, max_tokens=3, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA}})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert r.model_extra["ninfer"]["constraint"]["terminated"] is False


def test_seed_reproducible(openai_client):
    kw = dict(model="default", messages=USER, max_tokens=12, temperature=1.0, top_p=0.9, seed=1234,
              presence_penalty=0.5, frequency_penalty=0.5)
    a = openai_client.chat.completions.create(**kw).choices[0].message.content
    b = openai_client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


@pytest.mark.parametrize("so,check", [
    ({"choice": ["yes", "no", "maybe"]}, lambda t: t in ("yes", "no", "maybe")),
    ({"regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t) is not None),
    ({"grammar": 'root ::= "status=" ("ok" | "error")'}, lambda t: t in ("status=ok", "status=error")),
], ids=["choice", "regex", "grammar"])
def test_structured_outputs_extension(openai_client, so, check):
    r = openai_client.chat.completions.create(model="default", messages=USER, max_tokens=16,
                                              extra_body={"structured_outputs": so})
    assert r.choices[0].finish_reason == "stop"
    assert check(r.choices[0].message.content), r.choices[0].message.content
    assert r.model_extra["ninfer"]["constraint"]["kind"] == next(iter(so))


def _bad(openai_client, **kw) -> str:
    """The error message of a request that must fail with ``openai.BadRequestError``; checks the
    OpenAI error object (type, param = the field path the message starts with)."""
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client.chat.completions.create(model="default", messages=kw.pop("messages", USER), max_tokens=8,
                                              **kw)
    body = exc.value.body
    assert body["type"] == "invalid_request_error"
    assert body["message"] in exc.value.message
    if body["param"]:
        assert body["message"].startswith(body["param"]) or f" at {body['param']}" in body["message"]
    return body["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_unsupported_schema_keyword_maps_to_field_path(openai_client, stream):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                        "uniqueItems": True}}}
    msg = _bad(openai_client, stream=stream,
               response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}})
    assert "response_format.json_schema.schema.properties.tags.uniqueItems" in msg


def test_invalid_regex_and_grammar_name_the_extension_field(openai_client):
    assert "structured_outputs.regex" in _bad(openai_client, extra_body={"structured_outputs": {"regex": "(ab"}})
    assert "structured_outputs.grammar" in _bad(openai_client,
                                                extra_body={"structured_outputs": {"grammar": "root ::= ("}})


def test_extension_with_response_format_is_rejected(openai_client):
    msg = _bad(openai_client, response_format={"type": "json_object"},
               extra_body={"structured_outputs": {"choice": ["a"]}})
    assert "structured_outputs" in msg and "response_format" in msg


@pytest.mark.parametrize("kw,field", [
    (dict(temperature=5), "temperature"),
    (dict(logprobs=True), "logprobs"),
    (dict(stop=["\n"]), "stop"),
    (dict(n=2), "n"),
    (dict(reasoning_effort="low"), "reasoning_effort"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]),
     "messages[0].content[0].type"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format.json_schema.schema"),
], ids=["temperature", "logprobs", "stop", "n", "reasoning", "image", "schema-missing"])
def test_bad_fields_are_named(openai_client, kw, field):
    assert _bad(openai_client, **kw).startswith(field)


def test_models_and_unknown_model(openai_client):
    ids = [m.id for m in openai_client.models.list()]
    assert ids == ["SmolLM2-135M-Instruct"]
    assert openai_client.models.retrieve("default").id == "SmolLM2-135M-Instruct"
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError) as exc:
        openai_client.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=4)
    assert "gpt-4o" in exc.value.message


def test_stream_helper_parses_pydantic_model(openai_client):
    with openai_client.chat.completions.stream(model="default", messages=USER, response_format=Person,
                                               max_tokens=64, temperature=0) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)
    jsonschema.validate(json.loads(final.choices[0].message.content), Person.model_json_schema())
