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
from constraint_service.json_schema.emit import CHAIN_LIMIT

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
    ({"type": "string", "pattern": "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$"},
     ["ABCD", "ABCDAB==", "ABC="]),
    ({"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-c]{2,3}$"}}, "required": ["k"]},
     [{"k": "ab"}, {"k": "abc", "x": 1}]),
    ({"type": "string", "minLength": 2}, ["ab", "a\"\\"]),
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
