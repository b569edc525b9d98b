"""Token masks of the JSON Schema grammars equal the language (issue 12, part 1).

The emitter writes xgrammar-friendly forms (string rules with a lookahead assertion, negated plain
classes, chains for maxLength, DFA rules for counted pattern repetitions, key-exclusion tries that fall
back to the string tail).  A lookahead assertion only acts on tokens that run past the end of a rule while
xgrammar precompiles masks, so a wrong one would drop valid tokens without changing what `accept_string`
accepts: these tests compare every mask bit with the language itself, on a small vocabulary rich in
tokens that cross string boundaries.
"""
import json

import pytest
import torch
import xgrammar as xgr

from constraint_service.json_schema import json_schema_to_ebnf
from constraint_service.json_schema.emit import CHAIN_LIMIT, FULL_CHAIN_LIMIT

VOCAB = ['"', '",', '"}', '"]', '":', '".', '" ', '"a', 'a"', 'a",', 'a"}', 'ab', 'b', 'a', 'c', 'x', 'é', '"é',
         '\\', '\\n', '\\"', '\\u00', '\\u001', '1f', '0', '1', '5', '9', '{', '}', '[', ']', ',', ':', '{"',
         '"}}', '"],"', ',"', '":"', '"]}', 'ab"', 'xx', 'xxxx', 'xxxxxxxxxxxxxxxx', '"x', '=', '==', '+/',
         'ABCD', 'AB==', '-', '.', 'e', '12', '</s>']
EOS = len(VOCAB) - 1
_INFO = xgr.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
_COMPILER = xgr.GrammarCompiler(_INFO, max_threads=1, cache_enabled=False)
_CHARS = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)


def _viable(compiled, text: str) -> bool:
    m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return m.accept_string(text.encode("utf-8"))


def _check(schema, instances):
    ebnf = json_schema_to_ebnf(json.dumps(schema))
    tok = _COMPILER.compile_grammar(ebnf)
    chars = _CHARS.compile_grammar(ebnf)
    bm = torch.zeros((1, (len(VOCAB) + 31) // 32), dtype=torch.int32)
    checked = 0
    for inst in instances:
        text = json.dumps(inst, ensure_ascii=False, separators=(",", ":"))
        assert _viable(chars, text), text
        for cut in range(len(text) + 1):
            prefix = text[:cut]
            m = xgr.GrammarMatcher(tok)
            assert m.accept_string(prefix.encode("utf-8")), prefix
            m.fill_next_token_bitmask(bm, 0)
            row = bm[0].tolist()
            for t, piece in enumerate(VOCAB[:-1]):
                allowed = bool((row[t >> 5] >> (t & 31)) & 1)
                assert allowed == _viable(chars, prefix + piece), (schema, prefix, piece, allowed)
                checked += 1
    return checked


CASES = [
    ({"type": "string"}, ["", "a", 'a"b', "é\n", "\u001f"]),
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
     [{"a": "xx", "b": 5}, {"ab": "a", "x": ["a", "b"]}, {"a\"": "é"}, {}]),
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3, "minLength": 1}},
      "additionalProperties": False}, [{"a": "a"}, {"a": "ab\n"}, {"a": "é"}]),
    ({"type": "array", "items": {"type": "string", "maxLength": CHAIN_LIMIT + 3}},
     [["x" * (CHAIN_LIMIT + 3), "a"], ["\"" * 3], []]),
    # bounds up to FULL_CHAIN_LIMIT are one chain (the first case: values at and near 2 * CHAIN_LIMIT);
    # longer ones count blocks of CHAIN_LIMIT characters (exact-count chains; the second case): values that
    # end on, just before and just after a block boundary, an escape straddling one
    ({"type": "array", "items": {"type": "string", "maxLength": 2 * CHAIN_LIMIT + 1}},
     [["x" * (2 * CHAIN_LIMIT + 1), "x" * CHAIN_LIMIT], ["a" * (CHAIN_LIMIT - 1) + "\n" + "é" * CHAIN_LIMIT]]),
    ({"type": "array", "items": {"type": "string", "maxLength": FULL_CHAIN_LIMIT + CHAIN_LIMIT + 1}},
     [["x" * (FULL_CHAIN_LIMIT + CHAIN_LIMIT + 1), "x" * (2 * CHAIN_LIMIT)],
      ["a" * (2 * CHAIN_LIMIT - 1) + "\n" + "é" * CHAIN_LIMIT]]),
    ({"type": "string", "minLength": CHAIN_LIMIT + 2, "maxLength": 2 * CHAIN_LIMIT + 3},
     ["x" * (CHAIN_LIMIT + 2), "xx\"" * (CHAIN_LIMIT // 2) + "abc"]),
    ({"type": "string", "pattern": "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$"},
     ["ABCD", "ABCDAB==", "ABC="]),
    ({"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-c]{2,3}$"}}, "required": ["k"]},
     [{"k": "ab"}, {"k": "abc", "x": 1}]),
    ({"type": "string", "minLength": 2}, ["ab", "a\"\\"]),
    # patternProperties keys and `not` patterns: DFA rules with the closing quote inside the accepting states
    ({"type": "object", "patternProperties": {"^[a-c]{1,2}$": {"type": "integer"}}, "additionalProperties": False},
     [{"ab": 1, "c": 5}, {"a": 12}, {}]),
    ({"type": "object", "properties": {"k": {"type": "string", "not": {"pattern": "^a"}}}, "required": ["k"]},
     [{"k": "ba"}, {"k": ""}, {"k": "b\"a"}]),
]


@pytest.mark.parametrize("schema,instances", CASES, ids=[json.dumps(c[0])[:60] for c in CASES])
def test_masks_equal_language(schema, instances):
    assert _check(schema, instances) > 0


def test_bounded_string_counts_escapes_as_one_character():
    ebnf = json_schema_to_ebnf(json.dumps({"type": "string", "maxLength": 2}))
    g = _CHARS.compile_grammar(ebnf)
    for text, ok in (('"\\n\\t"', True), ('"ab"', True), ('"abc"', False), ('"\\u001fa"', True),
                     ('"\\u001Fa"', False), ('"\\/"', False), ('"a\\n\\n"', False)):
        m = xgr.GrammarMatcher(g, terminate_without_stop_token=True)
        assert (m.accept_string(text.encode()) and m.is_completed()) is ok, text


@pytest.mark.parametrize("lo,hi,blocks", [(0, FULL_CHAIN_LIMIT, False), (CHAIN_LIMIT + 1, CHAIN_LIMIT + 1 + FULL_CHAIN_LIMIT, False),
                                          (0, FULL_CHAIN_LIMIT + 1, True), (10, FULL_CHAIN_LIMIT + 11, True)])
def test_bounds_up_to_the_full_chain_limit_have_no_blocks(lo, hi, blocks):
    """maxLength - minLength <= FULL_CHAIN_LIMIT: the quote-terminated chain alone, no block rules (whose ends
    xgrammar checks token by token at match time); one more character: the blocks."""
    ebnf = json_schema_to_ebnf(json.dumps({"type": "string", "minLength": lo, "maxLength": hi}))
    names = {line.split(" ::= ")[0] for line in ebnf.splitlines()}
    has_blocks = any(n.startswith(("j_sbt", "j_sf")) for n in names)
    assert has_blocks is blocks, sorted(names)
    assert f"j_sb{min(hi - lo, FULL_CHAIN_LIMIT) if not blocks else CHAIN_LIMIT - 1}" in names


@pytest.mark.parametrize("lo,hi", [(0, CHAIN_LIMIT + 1), (0, 2 * CHAIN_LIMIT), (0, 2 * CHAIN_LIMIT + 1),
                                   (0, FULL_CHAIN_LIMIT), (0, FULL_CHAIN_LIMIT + 1), (0, 5 * CHAIN_LIMIT + 17),
                                   (CHAIN_LIMIT + 1, 3 * CHAIN_LIMIT), (CHAIN_LIMIT + 1, FULL_CHAIN_LIMIT + CHAIN_LIMIT + 2),
                                   (2 * CHAIN_LIMIT, None)])
def test_long_bounds_accept_exactly_the_lengths_in_range(lo, hi):
    """Random values (escapes, quotes, control characters, non-ASCII) of every length near each block
    boundary and near the bounds: accepted iff minLength <= length <= maxLength, in decoded characters."""
    import random
    schema = {"type": "string", "minLength": lo} if hi is None else {"type": "string", "minLength": lo, "maxLength": hi}
    g = _CHARS.compile_grammar(json_schema_to_ebnf(json.dumps(schema)))
    rng = random.Random(hi or lo)
    pool = "ab x\"\\\n\té\u0001\u001f/"
    top = (hi if hi is not None else lo) + 2
    lengths = {n for b in range(0, top + CHAIN_LIMIT, CHAIN_LIMIT) for n in (b - 1, b, b + 1)} | \
        {lo - 1, lo, lo + 1, top - 3, top - 2, top - 1, top}
    tried = 0
    for n in sorted(x for x in lengths if 0 <= x <= top):
        for _ in range(2):
            value = "".join(rng.choice(pool) for _ in range(n))
            text = json.dumps(value, ensure_ascii=False)
            m = xgr.GrammarMatcher(g, terminate_without_stop_token=True)
            ok = m.accept_string(text.encode()) and m.is_completed()
            assert ok is (lo <= n and (hi is None or n <= hi)), (n, lo, hi, text)
            tried += 1
    assert tried > 10
