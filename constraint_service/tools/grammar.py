"""Tool / thinking grammar builder (seed 000 §thinking, §工具与 ToolChoice).

:func:`build_output_ebnf` turns a family's :class:`OutputRules`, the resolved :class:`ToolPolicy`
and an optional JSON body into one xgrammar EBNF (rule ``root``):

    root      ::= [reasoning "\\n</think>\\n\\n"] body
    reasoning ::= text without "</think>"                  (EOS is never allowed inside)
    body      ::= required:  calls
                | auto+JSON: json_body | calls             (one grammar, one matcher)
                | auto:      content_without_call_tag calls?
                | none:      content_without_call_tag | json_body | free text
    calls     ::= call (separator call){min-1, max-1}      (after the first call: only calls, EOS)

Strict arguments come from the JSON Schema contract (:mod:`constraint_service.tools.contract`);
non-strict arguments use the basic language (any JSON object for the JSON wire; any
``<parameter=NAME>`` list with raw values for the XML wire). Bodies that are GBNF / regex / choice
are joined after the reasoning prefix with :func:`thinking_prefix_ebnf` at the grammar level.
"""
from __future__ import annotations

from ninfer_common.frontends.rules import OutputRules
from ninfer_common.frontends.tools import RAW, ToolDef, ToolPolicy

from ..errors import ConstraintError
from ..json_schema import parse_schema, reduce_schema
from ..json_schema.emit import BASE_RULES, Emitter
from ..json_schema.ir import Const, String, resolve
from ..regex import ebnf_string
from .contract import reduce_tool

#: Any Unicode scalar value (no surrogates).
ANY_CHAR = "[\\0-\\uD7FF\\uE000-\\U0010FFFF]"
#: JSON-ish object for json_object bodies and non-strict JSON arguments.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


def _class_without(chars: str) -> str:
    esc = "".join({"\n": "\\n", "\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-"}.get(c, c) for c in dict.fromkeys(chars))
    return f"[^{esc}\\uD800-\\uDFFF]"


def excluding(em: Emitter, pattern: str, hint: str) -> str:
    """Adds rules for "any text that does not contain ``pattern``" and returns the entry rule name.

    ``pattern`` must be borderless with a first character that occurs nowhere else in it (true for
    ``</think>``, ``<tool_call>`` and ``\\n</parameter>``); then the KMP automaton falls back to
    state 0 or 1 only and the rules below are exact.
    """
    d = pattern
    assert d and d[0] not in d[1:], pattern
    names = [em.fresh(hint) for _ in d]
    # state i = the last i characters are d[:i]
    em.add(names[0], f'{_class_without(d[0])}* ({ebnf_string(d[0])} {names[1]})?' if len(d) > 1 else
           f"{_class_without(d[0])}*")
    for i in range(1, len(d)):
        alts = ['""', f"{ebnf_string(d[0])} {names[1]}", f"{_class_without(d[i] + d[0])} {names[0]}"]
        if i + 1 < len(d):
            alts.insert(1, f"{ebnf_string(d[i])} {names[i + 1]}")
        em.add(names[i], " | ".join(alts))
    return names[0]


def thinking_prefix_ebnf(rules: OutputRules) -> str:
    """EBNF (rule ``root``) of free reasoning + the canonical close, for joining before a GBNF / regex /
    choice body (``xgrammar.Grammar.concat``)."""
    assert rules.thinking is not None
    em = Emitter()
    r = excluding(em, rules.thinking.close_tag, "think")
    return "\n".join([f"root ::= {r} {ebnf_string(rules.thinking.close)}", *em.rules]) + "\n"


def _strict_args_json(em: Emitter, tool: ToolDef, rules: OutputRules) -> str:
    st = reduce_tool(tool, rules.tools)
    return em.expr(st.root, "")


def _xml_params(em: Emitter, tool: ToolDef, rules: OutputRules, raw_value: str) -> str:
    fmt = rules.tools
    if not tool.strict:
        pname = em.fresh("pname")
        em.add(pname, f"{_class_without('<>' + chr(10))}+")
        return f'({ebnf_string(fmt.param_open)} {pname} {ebnf_string(fmt.param_open_end)} {raw_value} ' \
               f'{ebnf_string(fmt.param_close)})*'
    st = reduce_tool(tool, rules.tools)
    parts = []
    for name, node in st.root.props:
        n = resolve(node)
        if st.encodings.get(name) == RAW:
            if isinstance(n, Const):
                value = " | ".join(ebnf_string(v) for v in n.values)
                value = f"({value})"
            else:
                assert isinstance(n, String)
                value = raw_value
        else:
            value = em.expr(node, "")
        item = f"{ebnf_string(fmt.param_open + name + fmt.param_open_end)} {value} {ebnf_string(fmt.param_close)}"
        parts.append(item if name in st.root.required else f"({item})?")
    return " ".join(parts) if parts else '""'


def _call_rule(em: Emitter, tool: ToolDef, rules: OutputRules, raw_value: str | None) -> str:
    fmt = rules.tools
    rule = em.fresh("call")
    if fmt.wire == "json":
        args = _strict_args_json(em, tool, rules) if tool.strict else "j_object"
        em.add(rule, f"{ebnf_string(fmt.call_open + fmt.json_name_prefix + tool.name + fmt.json_args_infix)} "
                     f"{args} {ebnf_string(fmt.json_suffix + fmt.call_close)}")
    else:
        assert raw_value is not None
        params = _xml_params(em, tool, rules, raw_value)
        em.add(rule, f"{ebnf_string(fmt.call_open + fmt.function_open + tool.name + fmt.function_open_end)} "
                     f"{params} {ebnf_string(fmt.function_close + fmt.call_close)}")
    return rule


def _calls_rule(em: Emitter, policy: ToolPolicy, rules: OutputRules) -> str:
    raw_value = excluding(em, rules.tools.raw_terminator, "raw") if rules.tools.wire == "xml" else None
    one = em.fresh("anycall")
    em.add(one, " | ".join(_call_rule(em, t, rules, raw_value) for t in policy.callable))
    sep = ebnf_string(rules.tools.separator)
    seq = em.fresh("calls")
    lo, hi = max(policy.min_calls, 1), policy.max_calls
    if hi == 1:
        em.add(seq, one)
    elif hi is None:
        em.add(seq, f"{one} ({sep} {one})*")
    else:
        em.add(seq, f"{one} ({sep} {one}){{0,{hi - 1}}}")
    assert lo == 1
    return seq


def _json_body(em: Emitter, body_kind: str, body_source: str | None) -> str:
    source = JSON_OBJECT_SCHEMA if body_kind == "json_object" else body_source
    if source is None:
        raise ValueError("json_schema body needs its source")
    node = reduce_schema(parse_schema(source))
    return em.expr(node, "")


def build_output_ebnf(rules: OutputRules, policy: ToolPolicy, *, thinking: bool,
                      body_source: str | None = None) -> str:
    """The output grammar of one chat turn with tools and/or thinking.

    Args:
        rules: the family's output rules.
        policy: the resolved policy (``policy.body_kind`` is None, ``json_object`` or ``json_schema``).
        thinking: the output starts inside the reasoning (the prompt ended with the open string).
        body_source: the JSON Schema text when ``policy.body_kind == "json_schema"``.
    Returns:
        xgrammar EBNF text with entry rule ``root``.
    Raises:
        ConstraintError: schema errors of the body (pointer into the body schema) or of a strict tool
            (pointer ``/tools/i/function/parameters/...``).
        ValueError: a GBNF / regex / choice body (join those with :func:`thinking_prefix_ebnf`), or
            thinking on a family without a thinking stage.
    """
    if policy.body_kind not in (None, "json_object", "json_schema"):
        raise ValueError(f"{policy.body_kind} bodies are joined at the grammar level, not here")
    if thinking and rules.thinking is None:
        raise ValueError(f"{rules.display_name} has no thinking stage")
    em = Emitter()
    tag = rules.tools.call_tag
    json_body = _json_body(em, policy.body_kind, body_source) if policy.body_kind else None
    if policy.calls_possible:
        calls = _calls_rule(em, policy, rules)
        if not policy.content_allowed:
            body = calls
        elif json_body is not None:
            body = f"{json_body} | {calls}"
        else:
            body = f"{excluding(em, tag, 'text')} ({calls})?"
    elif json_body is not None:
        body = json_body
    elif policy.tools and policy.constrained:  # tool_choice none: declarations stay, the call tag is banned
        body = excluding(em, tag, "text")
    else:
        body = f"{ANY_CHAR}*"
    top = f"({body})"
    if thinking:
        assert rules.thinking is not None
        top = f"{excluding(em, rules.thinking.close_tag, 'think')} {ebnf_string(rules.thinking.close)} {top}"
    return "\n".join([f"root ::= {top}", *em.rules]) + "\n" + BASE_RULES


def policy_from_spec(spec: dict) -> ToolPolicy:
    """Rebuilds the :class:`ToolPolicy` of :meth:`ninfer_common.frontends.plan.OutputPlan.grammar_spec`
    (the wrapper facts the engine sends with Prepare)."""
    callable_ = tuple(ToolDef(name=t["name"], parameters=t.get("parameters"), strict=bool(t["strict"]),
                              index=int(t.get("index", i))) for i, t in enumerate(spec.get("tools", ())))
    declared = int(spec.get("declared", len(callable_)))
    tools = callable_ + tuple(ToolDef(name=f"_declared_{i}", index=i) for i in range(len(callable_), declared))
    return ToolPolicy(tools=tools, callable=callable_, min_calls=int(spec.get("min_calls", 0)),
                      max_calls=spec.get("max_calls"), content_allowed=bool(spec.get("content_allowed", True)),
                      constrained=bool(spec.get("constrained", True)), body_kind=spec.get("body_kind"))


def build_from_spec(spec: dict, body_source: str | None = None) -> str:
    """:func:`build_output_ebnf` from a plan's ``grammar_spec()`` dict.

    Raises:
        ConstraintError, ValueError: as :func:`build_output_ebnf`; KeyError for an unknown family.
    """
    from ninfer_common.frontends.rules import rules_for

    return build_output_ebnf(rules_for(spec["family"]), policy_from_spec(spec), thinking=bool(spec.get("thinking")),
                             body_source=body_source)


__all__ = ["build_from_spec", "build_output_ebnf", "excluding", "policy_from_spec", "thinking_prefix_ebnf",
           "ConstraintError"]
