"""Wrapped constraints: the body constraint inside the model's output wrapper (thinking stage, tool calls).

The engine sends the wrapper as the canonical JSON of its output plan (``ConstraintSpec.wrapper``); the
compile cache keys on it and builds the grammar here (seed 000 §编译与缓存: "缓存键由约束类型及源内容、编译选项、
模型输出封装共同构成"). JSON bodies and tool calls become one EBNF (:func:`.grammar.build_from_spec`);
GBNF / regex / choice bodies (only beside ``tool_choice`` none or no tools) are joined after the reasoning
prefix by the backend.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ninfer_common.constraint_kind import ConstraintKind
from ninfer_common.frontends.rules import rules_for

from ..registry import kind_entry
from .grammar import build_from_spec, thinking_prefix_ebnf


@dataclass(frozen=True)
class Wrapped:
    """A wrapped constraint's compile input: the body's canonical value and text (None / "" without a
    body) and the wrapper JSON."""

    value: Any
    text: str
    wrapper: str


def wrapped_grammar(backend: Any, kind: ConstraintKind | None, w: Wrapped) -> Any:
    """The backend grammar of a wrapped constraint.

    Raises:
        ConstraintError: body or strict tool schema errors (tool errors located at ``/tools/i/...``).
        ValueError: a malformed wrapper (an engine bug).
    """
    spec = json.loads(w.wrapper)
    if kind in (None, ConstraintKind.JSON_OBJECT, ConstraintKind.JSON_SCHEMA):
        spec = {**spec, "body_kind": None if kind is None else str(kind)}
        ebnf = build_from_spec(spec, body_source=w.text if kind == ConstraintKind.JSON_SCHEMA else None)
        return backend.parse_ebnf(ebnf, kind="InvalidGrammar")
    if spec.get("tools") and spec.get("max_calls") != 0:
        raise ValueError(f"a {kind} body cannot stand beside callable tools")
    body = kind_entry(kind).to_grammar(backend, w.value)
    if not spec.get("thinking"):
        return body
    prefix = backend.parse_ebnf(thinking_prefix_ebnf(rules_for(spec["family"])), kind="InvalidGrammar")
    concat = getattr(backend, "concat", None)  # optional backend capability (xgrammar has it)
    if concat is None:
        raise ValueError(f"the {type(backend).__name__} backend cannot join a {kind} body after the reasoning")
    return concat([prefix, body])
