"""GBNF validation: root, syntax errors with line:col, constructors, token references."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import EOS, SPECIAL, VOCAB, W, allowed_ids, make_session, tok
from constraint_service.errors import ConstraintError
from constraint_service.gbnf import parse_gbnf
from constraint_service.types import ConstraintSpec

SYNTAX = [
    ("lone-bang", 'root ::= "a" !', "1:14", "Unexpected character"),
    ("dangling-alt-then-rule", 'root ::= "a" |\nx ::= "b"', "2:1", "Expect element"),
    ("unterminated-string", 'root ::= "abc', "1:14", "string literal"),
    ("third-line-paren", 'root ::= "a"\n  x ::= "b"\nroot2 ::= ( "c"', "3:16", "Expect )"),
    ("undefined-rule-after-unicode", 'root ::= "éé" x', "1:15", 'Rule "x" is not defined'),
    ("unterminated-class", "root ::= [b-", "1:13", "character class"),
    ("bad-repetition", 'root ::= "a"{3,1}', "1:16", "Lower bound"),
    ("single-quotes", "root ::= 'a'", "1:10", "Unexpected character"),
    ("bad-escape", 'root ::= "\\q"', "1:11", "escape"),
    ("duplicate-rule", 'root ::= "a"\nroot ::= "b"', "2:1", "defined multiple times"),
]


@pytest.mark.parametrize("src,loc,msg", [s[1:] for s in SYNTAX], ids=[s[0] for s in SYNTAX])
def test_syntax_errors_have_line_col(src, loc, msg):
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf(src, VOCAB)
    assert ei.value.kind == "InvalidGrammar"
    assert ei.value.location == loc and msg in ei.value.message


def test_missing_root():
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('start ::= "a"', VOCAB)
    assert ei.value.kind == "InvalidGrammar" and "root" in ei.value.message and ei.value.location == ""


FORBIDDEN = [
    ("TagDispatch", 'root ::= "a"\n# c\nx ::= TagDispatch(("x", x))', "3:7"),
    ("Regex", 'root ::= Regex("[a-z]")', "1:10"),
    ("Substring", 'root ::= "x" Substring("ab")', "1:14"),
    ("TokenTagDispatch", 'root ::= TokenTagDispatch((5, r))\nr ::= "a"', "1:10"),
]


@pytest.mark.parametrize("name,src,loc", FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_upstream_constructors_rejected(name, src, loc):
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf(src, VOCAB)
    assert ei.value.kind == "InvalidGrammar" and name in ei.value.message and ei.value.location == loc


def test_constructor_names_inside_literals_and_comments_are_text(compiler):
    s = make_session(compiler, "grammar", 'root ::= "Regex(" r # TagDispatch(\nr ::= "x"')
    assert s.preview(list(b"Regex(x")).complete


@pytest.mark.parametrize("src,loc", [
    ('root[temperature=0.5] ::= "a"', "1:1"),
    ('root ::= r\n  r[max_tokens=3] ::= "a"', "2:3"),
    ('root ::= r\nr[max_chars=3] ::= "a"+', "2:1"),
    ('root[capture] ::= "a"', "1:1"),
], ids=["temperature", "max_tokens", "max_chars", "capture"])
def test_rule_attributes_rejected(src, loc):
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf(src, VOCAB)
    assert ei.value.kind == "InvalidGrammar" and ei.value.location == loc


@pytest.mark.parametrize("src,loc,why", [
    (f'root ::= "a" Token({EOS})', "1:20", "EOS"),
    (f"root ::= ExcludeToken(1, {SPECIAL})", "1:26", "special"),
    (f"root ::= Token({VOCAB.vocab_size - 1})", "1:16", "outside the tokenizer"),
    ("root ::= Token(99999)", "1:16", "outside the tokenizer"),
    (f'root ::= "x"\nr ::= Token(97,\n  {EOS})', "3:3", "EOS"),
], ids=["eos", "special-exclude", "padding-id", "huge-id", "multiline"])
def test_bad_token_references(src, loc, why):
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf(src, VOCAB)
    assert ei.value.kind == "InvalidTokenReference" and ei.value.location == loc and why in ei.value.message


def test_token_and_exclude_token_masks(compiler):
    ab = tok(b"ab")
    s = make_session(compiler, "grammar", f'root ::= Token({ab}) "!"')
    bm = np.zeros((2, W), np.uint32)
    st = np.zeros(2, np.uint8)
    s.fill_lookahead([ab], bm, st)
    assert allowed_ids(bm[0]) == {ab} and allowed_ids(bm[1]) == {ord("!")}
    s = make_session(compiler, "grammar", f"root ::= ExcludeToken({ord('a')}, {ab})")
    s.fill_lookahead([], bm[:1], st[:1])
    allowed = allowed_ids(bm[0])
    assert ord("a") not in allowed and ab not in allowed and ord("b") in allowed
    assert EOS not in allowed and SPECIAL not in allowed and max(allowed) < len(VOCAB.token_bytes)


def test_nul_literal_rejected_and_class_works(compiler):
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('root ::= "a\\x00b"', VOCAB)
    assert ei.value.location == "1:10"
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('root ::= "a"\x00', VOCAB)
    assert ei.value.location == "1:13"
    s = make_session(compiler, "grammar", 'root ::= "a" [\\x00] "b"')
    assert s.preview([ord("a"), 0, ord("b")]).complete


def test_lookahead_annotation_keeps_upstream_meaning(compiler):
    s = make_session(compiler, "grammar", 'root ::= r "b"\nr ::= "a"+ (= "b")')
    assert s.preview(list(b"aab")).complete
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('root ::= "a" (= "b" | "c")', VOCAB)
    assert ei.value.kind == "InvalidGrammar"


def test_special_and_eos_spellings_are_not_text(compiler):
    # the grammar's literal "<eos>" / "<|im_end|>" must be spelled with ordinary tokens
    s = make_session(compiler, "grammar", 'root ::= "<eos>" | "<|im_end|>"')
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    assert allowed_ids(bm[0]) == {ord("<")}


def test_compile_path_reports_grammar_errors(compiler):
    with pytest.raises(ConstraintError) as ei:
        compiler.compile(ConstraintSpec("grammar", "root ::= (\n"))
    assert ei.value.kind == "InvalidGrammar" and ei.value.location == "2:1"


@pytest.mark.parametrize("src", ["root ::= ExcludeToken(97)", 'root ::= "x" ExcludeToken(97, 98)',
                                 "root ::= (ExcludeToken( 97 ))*"])
def test_exclude_token_never_matches_eos(compiler, src):
    """xgrammar 0.2.9 would let ExcludeToken match EOS as text; the rewrite prevents it."""
    s = make_session(compiler, "grammar", src)
    if '"x"' in src:
        s.preview([ord("x")])
        s.commit()
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    assert (EOS in allowed_ids(bm[0])) == s.is_complete
