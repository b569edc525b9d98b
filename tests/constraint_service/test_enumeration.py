"""The strings reachable through the masks equal the language (seed 000 §验证).

BFS over token sequences with a tiny byte-level vocabulary (V = 300, not a
multiple of 32, ids 292..299 outside the tokenizer, multi-byte tokens that
cross punctuation, rule and UTF-8 boundaries).  A string is *reachable* if
some token path leads to it and EOS is then allowed.  Compared with an
independent enumeration (Python ``re.fullmatch`` / the choice set / json.loads)
of all strings over a small alphabet up to ``N`` bytes.
"""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest

from conftest import EOS, VOCAB, W, allowed_ids, make_session
from constraint_service.types import DEAD_END, READY


def reachable(session, alphabet: bytes, max_len: int) -> tuple[set[bytes], set[bytes]]:
    """(strings at which EOS is allowed, all visited prefixes) up to ``max_len`` bytes,
    following only tokens whose bytes are all in ``alphabet``."""
    toks = {i: b for i, b in enumerate(VOCAB.token_bytes) if b and set(b) <= set(alphabet)}
    ends, seen = set(), set()
    matcher = session._matcher
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)

    def walk(prefix: bytes) -> None:
        if prefix in seen:
            return
        seen.add(prefix)
        session.fill_lookahead([], bm, st)
        assert st[0] == READY, f"dead end reached after {prefix!r}"
        allowed = allowed_ids(bm[0])
        assert max(allowed) < VOCAB.vocab_size and all(i < len(VOCAB.token_bytes) for i in allowed)
        if EOS in allowed:
            ends.add(prefix)
        for i in sorted(allowed & toks.keys()):
            nxt = prefix + toks[i]
            if len(nxt) <= max_len and nxt not in seen:
                assert matcher.accept_token(i)
                walk(nxt)
                matcher.rollback(1)

    walk(b"")
    return ends, seen


def language(pred, alphabet: bytes, max_len: int) -> set[bytes]:
    out = set()
    for n in range(max_len + 1):
        for tup in itertools.product(alphabet, repeat=n):
            s = bytes(tup)
            if pred(s):
                out.add(s)
    return out


def check(session, pred, alphabet: bytes, max_len: int, extra: int = 2) -> None:
    ends, seen = reachable(session, alphabet, max_len)
    lang = language(pred, alphabet, max_len)
    assert ends == lang
    if extra is None:  # soundness rests on "no visited prefix is a dead end" (walk asserts it)
        return
    # every visited prefix extends to a word (within a few more bytes here)
    long_lang = language(pred, alphabet, max_len + extra)
    for p in seen:
        assert any(w.startswith(p) for w in long_lang), p


def re_pred(pattern: str):
    rx = re.compile(pattern, re.S)

    def pred(s: bytes) -> bool:
        try:
            return rx.fullmatch(s.decode("utf-8")) is not None
        except UnicodeDecodeError:
            return False

    return pred


GRAMMARS = [
    ("digits", 'root ::= [0-9]+', r"[0-9]+", b"019a", 4),
    ("alt-seq", 'root ::= ("ab" | "a") "c"?', r"(ab|a)c?", b"abc", 4),
    ("recursion", 'root ::= "a" root "b" | ""', None, b"ab", 6),
    ("status", 'root ::= "status=" ("ok" | "error") "\\n"', r"status=(ok|error)\n", b"", 0),
    ("utf8", 'root ::= ("\u00e9" | "x")+ "!"?', r"[éx]+!?", b"\xc3\xa9x!", 5),
    ("bounded", 'root ::= "a"{1,3} "b"', r"a{1,3}b", b"ab", 5),
    ("lookahead", 'root ::= r "b"\nr ::= "a"+ (= "b")', r"a+b", b"ab", 5),
]


def _balanced(s: bytes) -> bool:
    depth = 0
    for c in s:
        depth += 1 if c == ord("a") else -1
        if depth < 0:
            return False
    return depth == 0 and s == b"a" * (len(s) // 2) + b"b" * (len(s) // 2)


@pytest.mark.parametrize("name,src,pattern,alphabet,n", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_gbnf_language(compiler, name, src, pattern, alphabet, n):
    s = make_session(compiler, "grammar", src)
    if name == "status":  # long literal: enumerate by hand over its own bytes
        ends, _ = reachable(s, b"status=okerr\n", 14)
        assert ends == {b"status=ok\n", b"status=error\n"}
        return
    pred = _balanced if pattern is None else re_pred(pattern)
    check(s, pred, alphabet, n, extra=6 if pattern is None else 2)


REGEXES = [
    ("class-plus", r"[a-c]+", b"abcd", 4),
    ("optional-group", r"(ab)?c|ba", b"abc", 4),
    ("counted", r"a{2,3}|b", b"ab", 4),
    ("digits-sep", r"\d{1,2}(\.\d)?", b"19.", 5),
    ("utf8-class", r"[é中]x?", b"\xc3\xa9\xe4\xb8\xadx", 4),
    ("empty", r"", b"ab", 2),
]


@pytest.mark.parametrize("name,pattern,alphabet,n", REGEXES, ids=[r[0] for r in REGEXES])
def test_regex_language(compiler, name, pattern, alphabet, n):
    s = make_session(compiler, "regex", pattern)
    check(s, re_pred(pattern), alphabet, n)


CHOICES = [
    ("shared-prefix", ["a", "ab", "abc", "b"], b"abc", 4),
    ("empty-option", ["", "ba", "aa"], b"ab", 3),
    ("unicode", ["é", "éx", "中!"], b"\xc3\xa9\xe4\xb8\xadx!", 5),
    ("whitespace-case", ["Yes", "yes", " yes", "yes "], b"Yy es", 4),
    ("quotes", ['"a"', "a\\", 'x"\n'], b'"a\\x\n', 3),
]


@pytest.mark.parametrize("name,options,alphabet,n", CHOICES, ids=[c[0] for c in CHOICES])
def test_choice_language(compiler, name, options, alphabet, n):
    s = make_session(compiler, "choice", choices=options)
    words = {o.encode() for o in options}
    check(s, lambda b: b in words, alphabet, n)


def test_json_object_language(compiler):
    s = make_session(compiler, "json_object")

    def pred(b: bytes) -> bool:
        try:
            text = b.decode("utf-8")
            value = json.loads(text)
        except ValueError:
            return False
        return isinstance(value, dict) and text == text.strip()

    check(s, pred, b'{}":a1 ', 5, extra=None)


def test_json_object_nested_and_bounded_whitespace(compiler):
    s = make_session(compiler, "json_object")
    text = b'{"a": [1, -2.5e3, true, null, {"b": "\\u00e9\xc3\xa9"}], "c": {}}'
    assert s.preview([b for b in text]).complete
    s.commit()
    s2 = make_session(compiler, "json_object")
    assert s2.preview([ord("{")] + [ord(" ")] * 32)  # 32 blanks allowed
    s2.commit()
    with pytest.raises(Exception):
        s2.preview([ord(" ")])  # the 33rd is not
    for bad in [b"[]", b'"x"', b"1", b" {}"]:
        s3 = make_session(compiler, "json_object")
        with pytest.raises(Exception):
            s3.preview(list(bad))


def test_allowed_to_end_is_not_must_end(compiler):
    s = make_session(compiler, "grammar", "root ::= [0-9]+")
    s.preview([ord("1")])
    s.commit()
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    allowed = allowed_ids(bm[0])
    assert EOS in allowed and set(range(ord("0"), ord("9") + 1)) <= allowed
    assert s.is_complete and not s.is_terminated


def test_dead_end_status_value(compiler):
    assert DEAD_END == 2


def test_json_object_language_arrays_and_numbers(compiler):
    s = make_session(compiler, "json_object")

    def pred(b: bytes) -> bool:
        try:
            value = json.loads(b.decode("utf-8"))
        except ValueError:
            return False
        return isinstance(value, dict) and not b[:1].isspace() and not b[-1:].isspace()

    check(s, pred, b'{}[]":1,', 5, extra=None)


def _json_accepts(compiler, text: bytes) -> bool:
    s = make_session(compiler, "json_object")
    try:
        return s.preview(list(text)).complete
    except Exception:  # IntegrityError: a byte left the language
        return False


def test_json_object_differential_random(compiler):
    rng = np.random.default_rng(5)
    frags = ['{', '}', '[', ']', '"k"', '"\\u00e9"', '"\\n"', '"\\x"', ':', ',', ' ', '\n', '1', '-0', '2.5',
             '1e-3', '01', 'true', 'null', 'nul', '"é"', '\t', '.5', '-']
    samples = [json.dumps({"a": [1, {"b": None}], "c": "x"}, indent=2).encode(),
               json.dumps({"a": 1.5e10, "b": [True, False, "\u2028"]}, separators=(",", ":")).encode(),
               b"{" + b" " * 33 + b"}"]
    for _ in range(300):
        n = int(rng.integers(1, 9))
        body = "".join(frags[int(i)] for i in rng.integers(0, len(frags), n))
        samples.append(('{"k":' + body + "}" if rng.random() < 0.6 else body).encode())
    for b in samples:
        try:
            value = json.loads(b.decode("utf-8"))
            expect = isinstance(value, dict) and b == b.strip() and not re.search(rb"[ \t\n\r]{33}", b)
        except ValueError:
            expect = False
        assert _json_accepts(compiler, b) == expect, b
