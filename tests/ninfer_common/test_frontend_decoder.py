"""Unit tests of the frontend rules, the ToolChoice contract and the output decoder (seed 000 §OutputSession,
§thinking, §工具). Pure Python: every output is fed at every byte split, so a framing string that straddles
tokens (or shares a token with content) is decoded the same way."""
from __future__ import annotations

import json

import pytest

from ninfer_common.frontends import (
    CANONICAL_THINK_CLOSE, QWEN3, QWEN3_5, SMOLLM2, DecodeIntegrityError, FrontendError, OutputDecoder, ToolChoice,
    parse_tools, resolve_policy, rules_for,
)
from ninfer_common.frontends.tools import JSON, RAW, ambiguous_params, param_encodings

LOOKUP = {"name": "lookup", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
          "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": False}, "strict": True}
SEARCH = {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
TOOLS = parse_tools([LOOKUP, SEARCH])


def decode_all_splits(rules, policy, text: str, **kw):
    """Decodes ``text`` whole, byte by byte and at every 2-way split; all must agree. Returns the result
    and the concatenated channel texts of the byte-by-byte run."""
    data = text.encode()
    results = []
    splits = [[data], [data[i:i + 1] for i in range(len(data))]] + [[data[:k], data[k:]] for k in range(1, len(data))]
    for parts in splits:
        d = OutputDecoder(rules, policy, **kw)
        deltas = []
        for p in parts:
            deltas += d.feed(p)
        tail, res = d.finish()
        deltas += tail
        chans = {"reasoning": "", "content": "", "tool_call": ""}
        for x in deltas:
            chans[x.channel] += x.text
        results.append((res, chans, [x.call for x in deltas if x.call is not None]))
    first = results[0]
    for r in results[1:]:
        assert r[0] == first[0] and r[1] == first[1] and r[2] == first[2]
    return first


def json_call(name, args, spaced=True):
    a = json.dumps(args, separators=(",", ":"))
    return f'<tool_call>\n{{"name": "{name}", "arguments": {a}}}\n</tool_call>'


def xml_call(name, params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_rules_data():
    assert CANONICAL_THINK_CLOSE == "\n</think>\n\n"
    assert SMOLLM2.thinking is None and not SMOLLM2.tools_in_template
    assert QWEN3.tools.wire == "json" and QWEN3_5.tools.wire == "xml"
    assert rules_for("Qwen3.6") is QWEN3_5
    assert QWEN3_5.tools.raw_terminator == "\n</parameter>"
    assert QWEN3.tools.call_tag == "<tool_call>"


def test_reasoning_then_content_leading_space_kept():
    # seed scenario: the content grammar needs a leading space; the close framing is no one's text
    res, chans, _ = decode_all_splits(QWEN3, resolve_policy((), None, None), "plan it" + CANONICAL_THINK_CLOSE + " yes",
                                      thinking=True)
    assert res.reasoning == "plan it" and res.content == " yes" and res.reasoning_closed
    assert chans["reasoning"] == "plan it" and chans["content"] == " yes"


def test_reasoning_may_end_with_newlines_and_hold_partial_close():
    text = "a\n\n</thin" 
    d = OutputDecoder(QWEN3, None, thinking=True)
    out = d.feed(text.encode())
    assert "".join(x.text for x in out) == "a\n"  # "\n</thin" may still be the close: held back
    out = d.feed(b"k>\n\n{}")
    assert [(x.channel, x.text) for x in out] == [("content", "{}")]
    assert d.finish()[1].reasoning == "a\n"


def test_truncated_reasoning_flushes_as_reasoning():
    res, chans, _ = decode_all_splits(QWEN3, None, "thinking about \n</thi", thinking=True)
    assert res.reasoning == "thinking about \n</thi" and res.content == "" and not res.reasoning_closed


def test_auto_content_then_calls_json_wire():
    pol = resolve_policy(TOOLS, ToolChoice("auto"), None)
    text = "Let me check.\n" + json_call("lookup", {"city": "Oslo", "days": 3}) + "\n" + json_call("search", {"q": "x"})
    res, chans, calls = decode_all_splits(QWEN3, pol, text)
    assert res.content == "Let me check.\n" and res.branch == "tools"
    assert [(c.id, c.name, json.loads(c.arguments_json)) for c in res.tool_calls] == [
        ("call_0", "lookup", {"city": "Oslo", "days": 3}), ("call_1", "search", {"q": "x"})]
    assert calls == res.tool_calls
    assert chans["tool_call"] == text[len("Let me check.\n"):].replace("</tool_call>\n<tool_call>", "</tool_call><tool_call>")


def test_truncated_call_is_not_a_call():
    pol = resolve_policy(TOOLS, ToolChoice("required"), None)
    text = json_call("lookup", {"city": "Oslo", "days": 3}) + "\n" + json_call("search", {"q": "x"})[:-5]
    res, _, _ = decode_all_splits(QWEN3, pol, text)
    assert [c.name for c in res.tool_calls] == ["lookup"] and res.pending_call.startswith("<tool_call>")


def test_json_body_union_tool_tag_inside_string_stays_content():
    pol = resolve_policy(TOOLS, ToolChoice("auto"), "json_schema")
    body = '{"note":"<tool_call> is text"}'
    res, chans, _ = decode_all_splits(QWEN3, pol, "r" + CANONICAL_THINK_CLOSE + body, thinking=True, body_constrained=True)
    assert res.content == body and res.tool_calls == [] and res.branch == "content" and res.reasoning == "r"
    res, _, _ = decode_all_splits(QWEN3, pol, json_call("search", {"q": "{"}), body_constrained=True)
    assert res.branch == "tools" and res.content == "" and res.tool_calls[0].name == "search"


def test_constrained_json_never_lands_in_reasoning():
    # peer bug: constrained JSON routed into the reasoning channel
    res, chans, _ = decode_all_splits(QWEN3, None, "x" + CANONICAL_THINK_CLOSE + '{"a":1}', thinking=True,
                                      body_constrained=True)
    assert chans["reasoning"] == "x" and chans["content"] == '{"a":1}'


def test_xml_wire_raw_strings_and_json_values():
    pol = resolve_policy(TOOLS, ToolChoice("auto"), None)
    city = "  New\nYork </tool_call> </parameter "  # raw: spaces/newlines kept, framing newlines stripped once
    text = xml_call("lookup", [("city", city), ("days", "3")])
    res, _, _ = decode_all_splits(QWEN3_5, pol, text)
    assert json.loads(res.tool_calls[0].arguments_json) == {"city": city, "days": 3}


def test_xml_non_strict_duplicates_last_wins_first_position():
    pol = resolve_policy(TOOLS, ToolChoice("auto"), None)
    res, _, _ = decode_all_splits(QWEN3_5, pol, xml_call("search", [("q", "a"), ("n", "5"), ("q", "b"), ("x", "not json")]))
    assert res.tool_calls[0].arguments_json == '{"q":"b","n":5,"x":"not json"}'


def test_undecodable_constrained_call_is_integrity_error():
    pol = resolve_policy(TOOLS, ToolChoice("required", ("search",)), None)
    with pytest.raises(DecodeIntegrityError):
        decode_all_splits(QWEN3, pol, json_call("lookup", {"city": "a", "days": 1}))
    d = OutputDecoder(QWEN3, pol, constrained=False)  # free route: malformed text stays content
    d.feed(json_call("lookup", {"city": "a", "days": 1}).encode())
    _, res = d.finish()
    assert res.tool_calls == [] and "lookup" in res.content


def test_none_mode_publishes_tag_as_content():
    pol = resolve_policy(TOOLS, ToolChoice("none"), None)
    res, _, _ = decode_all_splits(QWEN3, pol, "see <tool_call> here")
    assert res.content == "see <tool_call> here" and res.tool_calls == []


def test_smollm2_has_no_thinking():
    with pytest.raises(ValueError):
        OutputDecoder(SMOLLM2, None, thinking=True)


# ---- ToolChoice contract -----------------------------------------------------------------------

def test_policy_modes():
    auto = resolve_policy(TOOLS, None, None)
    assert auto.min_calls == 0 and auto.max_calls is None and auto.content_allowed and auto.constrained
    req = resolve_policy(TOOLS, ToolChoice("required"), None)
    assert req.min_calls == 1 and not req.content_allowed
    named = resolve_policy(TOOLS, ToolChoice("required", ("lookup",), parallel=False), None)
    assert [t.name for t in named.callable] == ["lookup"] and named.max_calls == 1
    none = resolve_policy(TOOLS, ToolChoice("none"), None)
    assert not none.calls_possible and len(none.tools) == 2  # declarations stay
    free = resolve_policy(parse_tools([SEARCH]), ToolChoice("auto", constraints="automatic"), None)
    assert not free.constrained
    assert resolve_policy(TOOLS, ToolChoice("auto", constraints="automatic"), None).constrained  # lookup is strict


@pytest.mark.parametrize("tools,choice,body,loc", [
    ([LOOKUP, {**SEARCH, "name": "lookup"}], None, None, "/tools/1/function/name"),
    ([{"name": "bad name"}], None, None, "/tools/0/function/name"),
    ([LOOKUP], ToolChoice("required", ("nope",)), None, "/tool_choice/allowed_names/0"),
    ([LOOKUP], ToolChoice("auto"), "grammar", "/constraint"),
    ([LOOKUP], ToolChoice("required"), "regex", "/constraint"),
    ([], ToolChoice("required"), None, "/tool_choice"),
    ([("t", "", "{", False)], None, None, "/tools/0/function/parameters"),
    ([("t", "", "[1]", False)], None, None, "/tools/0/function/parameters"),
])
def test_contract_errors_are_located(tools, choice, body, loc):
    with pytest.raises(FrontendError) as ei:
        resolve_policy(parse_tools(tools), choice, body)
    assert ei.value.location == loc


def test_grammar_body_with_tool_choice_none_is_allowed():
    pol = resolve_policy(TOOLS, ToolChoice("none"), "grammar")
    assert not pol.calls_possible and not pol.constrained


def test_param_encodings():
    t = parse_tools([{"name": "f", "strict": True, "parameters": {"type": "object", "$defs": {"s": {"type": "string"}},
                      "properties": {"a": {"$ref": "#/$defs/s"}, "b": {"enum": ["x", "y"]}, "c": {"type": "integer"},
                                     "d": {"type": ["string", "null"]}, "e": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}}])[0]
    assert param_encodings(t) == {"a": RAW, "b": RAW, "c": JSON, "d": JSON, "e": JSON}
    assert ambiguous_params(t) == ["d"]


# ---- output plan -------------------------------------------------------------------------------

from ninfer_common.frontends.plan import ReasoningBudget, ThinkingRequest, plan_output  # noqa: E402


@pytest.mark.parametrize("kwargs,loc", [
    (dict(rules=SMOLLM2, thinking=ThinkingRequest(True)), "/thinking"),
    (dict(rules=SMOLLM2, thinking=ThinkingRequest(None, 10)), "/thinking"),
    (dict(rules=QWEN3, thinking=ThinkingRequest(False, 10)), "/thinking/budget_tokens"),
    (dict(rules=QWEN3, thinking=ThinkingRequest(True), continue_final=True), "/thinking/enabled"),
    (dict(rules=QWEN3, tools=TOOLS, is_chat=False), "/tools"),
    (dict(rules=QWEN3, thinking=ThinkingRequest(True), is_chat=False), "/thinking"),
])
def test_plan_rejections(kwargs, loc):
    args = dict(tools=(), choice=None, thinking=None)
    args.update(kwargs)
    rules = args.pop("rules")
    with pytest.raises(FrontendError) as ei:
        plan_output(rules, args.pop("tools"), args.pop("choice"), args.pop("thinking"), **args)
    assert ei.value.location == loc and ei.value.kind == "InvalidRequest"
    if rules is SMOLLM2:
        assert "SmolLM2" in ei.value.message


def test_plan_defaults_and_decoder():
    p = plan_output(QWEN3, TOOLS, None, None)
    assert p.thinking and p.wrapped and p.constrained
    assert plan_output(QWEN3, (), None, None, continue_final=True).thinking is False  # continuation: closed
    s = plan_output(SMOLLM2, (), None, None)
    assert not s.thinking and not s.constrained
    d = p.new_decoder()
    d.feed(("r" + CANONICAL_THINK_CLOSE + json_call("search", {"q": "a"})).encode())
    assert d.finish()[1].tool_calls[0].name == "search"
    key = json.loads(p.grammar_key())
    assert key["tools"][0]["parameters"]["required"] == ["city", "days"] and key["tools"][1]["parameters"] is None


def test_reasoning_budget():
    b = ReasoningBudget(3)
    b.on_commit(2, True)
    assert not b.must_close() and b.remaining() == 1
    b.on_commit(2, True)
    assert b.must_close() and b.remaining() == 0
    b.closed()
    assert not b.must_close()
    b2 = ReasoningBudget(5)
    b2.on_commit(1, False)  # natural close before the budget ran out
    assert not b2.must_close() and b2.remaining() == 0
