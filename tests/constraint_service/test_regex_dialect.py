"""One regex dialect everywhere (issue 13): ECMAScript with the `u` flag for the regex constraint and
for JSON Schema `pattern`, through the real compile path on the small test vocabulary."""
from __future__ import annotations

import json

import pytest

from conftest import EOS, make_session, session_mask
from constraint_service.errors import ConstraintError
from constraint_service.types import ConstraintSpec

# (pattern, column of the error inside the pattern, words the message must contain)
BAD = [
    ("[0-9]{,3}", 6, "incomplete quantifier"),
    ("ab{", 3, "incomplete quantifier"),
    ("{", 1, "lone '{'"),
    ("a}", 2, "lone '}'"),
    ("a]", 2, "lone ']'"),
    ("\\q", 1, "unknown escape"),
    ("x\\-y", 2, "u flag"),
]


@pytest.mark.parametrize("pattern,col,words", BAD, ids=[b[0] for b in BAD])
def test_regex_constraint_rejects_with_column(compiler, pattern, col, words):
    with pytest.raises(ConstraintError) as ei:
        compiler.compile(ConstraintSpec("regex", pattern))
    assert ei.value.kind == "InvalidRegex"
    assert ei.value.location == f"1:{col}" and words in ei.value.message


@pytest.mark.parametrize("pattern,col,words", BAD, ids=[b[0] for b in BAD])
def test_schema_pattern_uses_the_same_rules(compiler, pattern, col, words):
    schema = {"type": "object", "properties": {"k": {"type": "string", "pattern": pattern}}}
    with pytest.raises(ConstraintError) as ei:
        compiler.compile(ConstraintSpec("json_schema", json.dumps(schema)))
    assert ei.value.kind == "InvalidSchema" and ei.value.location == "/properties/k/pattern"  # malformed
    assert f"at column {col}" in ei.value.message and words in ei.value.message


# valid ECMAScript outside the supported subset: the schema is unsupported, not invalid; the regex
# constraint keeps one kind (InvalidRegex) for both, as before
UNSUPPORTED = [("(?=a)a", "lookahead"), ("(?<!a)b", "lookbehind"), ("(a)\\1", "backreferences"),
               ("\\bword", "word boundary"), ("\\p{L}", "Unicode property"), ("a{200000}", "repetition count")]


@pytest.mark.parametrize("pattern,words", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_pattern_features_are_unsupported_not_invalid(compiler, pattern, words):
    for where, schema in (("/properties/k/pattern", {"properties": {"k": {"type": "string", "pattern": pattern}}}),
                          (f"/patternProperties/{pattern.replace('~', '~0').replace('/', '~1')}",
                           {"type": "object", "patternProperties": {pattern: {"type": "integer"}}})):
        with pytest.raises(ConstraintError) as ei:
            compiler.compile(ConstraintSpec("json_schema", json.dumps(schema)))
        assert (ei.value.kind, ei.value.location) == ("UnsupportedSchema", where) and words in ei.value.message
    with pytest.raises(ConstraintError) as ei:
        compiler.compile(ConstraintSpec("regex", pattern))
    assert ei.value.kind == "InvalidRegex" and words in ei.value.message


def _accepts(session, text: bytes) -> bool:
    """Whether the byte tokens of ``text`` are accepted and EOS is then allowed (fresh state each call)."""
    m = session._matcher
    n = 0
    for b in text:
        if not m.accept_token(b):
            break
        n += 1
    ok = n == len(text) and EOS in session_mask(session)
    m.rollback(n)
    return ok


def test_counted_repetition_is_a_quantifier_in_both(compiler):
    s = make_session(compiler, "regex", "[0-9]{0,3}")
    assert _accepts(s, b"123") and not _accepts(s, b"{,3}")
    s = make_session(compiler, "json_schema", json.dumps({"type": "string", "pattern": "^[0-9]{0,3}$"}))
    assert _accepts(s, b'"12"') and not _accepts(s, b'"{,3}"')
    s = make_session(compiler, "regex", "a\\{,3\\}")
    assert _accepts(s, b"a{,3}") and not _accepts(s, b"aaa")
