"""The regex constraint's DFA form (``regex_to_ebnf``): minimal DFAs, the same language and masks as the
structural form, sound masks where xgrammar's counted repetition is not, and the structural fallback."""
from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import MULTI, allowed_ids, language_checker
from constraint_service.compiler import ConstraintCompiler
from constraint_service.regex import (REGEX_DFA_STATES, ast_to_expr, build_nfa, full_ast, minimize, nfa_matches,
                                      parse_regex, product_dfa, regex_to_ebnf)
from constraint_service.regex.automaton import DFA
from constraint_service.regex.ebnf import REPEAT_PIECE, repeat, repeat_chain
from constraint_service.session import OutputSession
from constraint_service.types import READY, ConstraintSpec, bitmask_words
from constraint_service.vocab import Vocabulary


def _run(dfa: DFA, text: str, state: int = 0) -> bool:
    for ch in text:
        cp = ord(ch)
        nxt = [t for ranges, t in dfa.trans[state] if any(lo <= cp <= hi for lo, hi in ranges)]
        assert len(nxt) <= 1, "a DFA state with overlapping transitions"
        if not nxt:
            return False
        state = nxt[0]
    return state in dfa.accept


def _step(dfa: DFA, state: int, ch: str):
    cp = ord(ch)
    return next((t for ranges, t in dfa.trans[state] if any(lo <= cp <= hi for lo, hi in ranges)), None)


def _distinguishable(dfa: DFA, s: int, t: int) -> bool:
    """Some word over _ALPHABET leads exactly one of s, t to acceptance (None: the dead state)."""
    seen = {(s, t)}
    todo = [(s, t)]
    while todo:
        a, b = todo.pop()
        if (a in dfa.accept) != (b in dfa.accept):
            return True
        for ch in _ALPHABET:
            pair = (None if a is None else _step(dfa, a, ch), None if b is None else _step(dfa, b, ch))
            if pair not in seen and pair != (None, None):
                seen.add(pair)
                todo.append(pair)
    return False


# random regexes over a small alphabet (plus "." and a negated class, so transitions carry wide ranges)
# "\\^", "[\\^a]", "[\\^-a]": classes whose first member is "^" (xgrammar 0.2.9 prints "[\\u005e\\u0061]" as
# "[^a]", and language_checker's compiler, cache on, compiles the printed text; class_text writes "^" last)
_ATOMS = st.sampled_from(["a", "b", "c", "[ab]", "[^a]", ".", "(?:ab)", "(?:a|bc)", "\\^", "[\\^a]", "[\\^-a]"])


def _regex():
    return st.recursive(
        _ATOMS,
        lambda inner: st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,3}"])).map(
                lambda t: f"(?:{t[0]}){t[1]}"),
        ),
        max_leaves=6,
    )


_ALPHABET = "abcz\n^_"  # z: only "." and "[^a]" take it; "\n": only "[^a]" (not "."); "_": inside [\\^-a]


@settings(max_examples=150, deadline=None)
@given(_regex())
def test_minimize_keeps_the_language_and_leaves_no_equivalent_states(pattern):
    nfa = build_nfa(full_ast(parse_regex(pattern)))
    dfa = product_dfa([nfa], 0, None, 10_000)
    small = minimize(dfa)
    assert len(small.trans) <= len(dfa.trans)
    words = ["".join(w) for n in range(6) for w in itertools.product(_ALPHABET, repeat=n)]
    for w in words:
        want = nfa_matches(nfa, w)
        assert _run(dfa, w) == want and _run(small, w) == want, (pattern, w)
    # minimal: every two states are told apart by some word (a search over state pairs, independent of the
    # refinement; _ALPHABET takes every transition class of these regexes, "z" standing for the rest)
    n = len(small.trans)
    for s in range(n):
        for t in range(s + 1, n):
            assert _distinguishable(small, s, t), (pattern, "states", s, t, "accept the same words")
    # a pure function of the transitions: minimizing again renumbers nothing
    again = minimize(small)
    assert again.trans == small.trans and again.accept == small.accept


@settings(max_examples=100, deadline=None)
@given(_regex())
def test_dfa_form_accepts_exactly_the_regex_language(pattern):
    text = regex_to_ebnf(pattern)
    acc = language_checker(text)
    py = re.compile(pattern)
    for n in range(5):
        for w in itertools.product(_ALPHABET, repeat=n):
            s = "".join(w)
            # "." is any character but line terminators in ECMAScript, "\n" the only one in the alphabet
            assert acc(s) == (py.fullmatch(s) is not None), (pattern, s, text)


def test_dfa_form_shape():
    text = regex_to_ebnf(r"[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\.")
    rules = dict(line.split(" ::= ", 1) for line in text.strip().split("\n"))
    assert len(rules) == 5  # the minimal DFA: start, first letter, in a word, after ",", after "."
    assert all(body.endswith("(= [])") for body in rules.values())  # nothing follows the language
    assert "{" not in text  # no counted repetition
    assert regex_to_ebnf("[]").strip() == "root ::= []"  # the empty language: no alternatives


def test_past_the_state_limit_the_structural_form_is_kept():
    # (a|b)*a(a|b){12}: the minimal DFA remembers the last 13 letters, 2**13 states
    pattern = "(a|b)*a(a|b){12}"
    text = regex_to_ebnf(pattern)
    assert "(= [])" not in text and text.startswith("root ::= ")
    assert text == "root ::= " + ast_to_expr(full_ast(parse_regex(pattern)), json_mode=False) + "\n"
    acc = language_checker(text)
    rng = random.Random(0)
    for _ in range(300):
        s = "".join(rng.choice("ab") for _ in range(rng.randint(10, 16)))
        assert acc(s) == (re.fullmatch(pattern, s) is not None), s
    assert 2 ** 13 > REGEX_DFA_STATES


def test_the_dfa_is_not_attempted_past_the_nfa_bound(monkeypatch):
    import constraint_service.regex as rx

    # (a?){3000}: 6,002 NFA states; each DFA state explored would be a closure of up to 3,000 of them
    assert len(build_nfa(full_ast(parse_regex("(a?){3000}"))).trans) > rx.REGEX_NFA_STATES
    calls = []
    monkeypatch.setattr(rx, "product_dfa", lambda *a, **k: calls.append(a) or product_dfa(*a, **k))
    for pattern in ("(a?){3000}", "(a?){99999}", "x" * 20_000):
        text = rx.regex_to_ebnf(pattern)
        assert text == "root ::= " + ast_to_expr(full_ast(parse_regex(pattern)), json_mode=False) + "\n"
    assert calls == []
    rx.regex_to_ebnf("(a?){20}")  # under the bound: attempted (and kept, 21 states)
    assert len(calls) == 1


def test_star_closed_repeats_collapse_before_the_dfa():
    # (a*){3000}: a one-state DFA whose Thompson NFA is past REGEX_NFA_STATES; its structural form matched 9
    # characters in 21 s. R{m,n} of a star-closed R is R (collapse_closed_repeats): the DFA form again.
    import constraint_service.regex as rx

    for pattern, words in (("(a*){3000}", ["", "a", "a" * 500]), ("((ab)*){2,900}c", ["c", "ababc"]),
                           ("((a*){20}b){3}", ["bbb", "abaab" + "a" * 50 + "b"])):
        text = rx.regex_to_ebnf(pattern)
        assert "(= [])" in text, (pattern, text)
        acc = language_checker(text)
        for w in words + ["x", "ba", "aab"]:
            assert acc(w) == (re.fullmatch(pattern, w) is not None), (pattern, w)
    # not star-closed: kept as counted ((a|b)? is not (a|b)?*)
    assert rx.collapse_closed_repeats(full_ast(parse_regex("(a|b?){3}"))) == full_ast(parse_regex("(a|b?){3}"))


def test_dfa_rules_past_the_text_bound_give_the_structural_form():
    import constraint_service.regex as rx

    # 1,024 single code points under {0,300}: 301 DFA states, each repeating the class (~2 MB of rules)
    cls = "[" + "".join("\\u%04x" % c for c in range(0x100, 0x900, 2)) + "]"
    text = rx.regex_to_ebnf(cls + "{0,300}")
    assert "(= [])" not in text and len(text) < rx.REGEX_DFA_TEXT
    assert text == "root ::= " + ast_to_expr(full_ast(parse_regex(cls + "{0,300}")), json_mode=False) + "\n"
    acc = language_checker(text)
    assert acc("\u0100" * 300) and acc("") and not acc("\u0101") and not acc("\u0100" * 301)
    small = rx.regex_to_ebnf(cls + "{0,3}")  # 4 states: the DFA form stays
    assert small.count("(= [])") == 4 and len(small) < rx.REGEX_DFA_TEXT


def test_structural_form_splits_every_repetition_over_128():
    # 1,001 states: the structural form; xgrammar 0.2.9 filled counted repetitions of classes over 128 wrong,
    # positive or negated (see ebnf.REPEAT_PIECE)
    for pattern in (r"[ 0-9A-Za-z\u4e00-\u9fff]{0,1000}", r"[^\n]{0,1000}", r"[\s\S]{0,1000}", r"(a|\u4e00){0,1000}"):
        text = regex_to_ebnf(pattern)
        # the chain: 7 levels "x{0,127} | x{128,128} (...)" and the last x{0,104}
        assert "(= [])" not in text and text.count("{0,127}") == 7 and text.count("{128,128}") == 7, (pattern, text)
        assert "{0,104}" in text and not re.search(r"\{\d*,?(129|1[3-9]\d|[2-9]\d\d|\d{4,})\}", text)


@pytest.mark.parametrize("lo,hi", [(0, 300), (0, 129), (5, 300), (200, 300), (300, 300), (0, 256), (129, None),
                                   (200, None), (0, 128), (3, 17), (256, 256), (128, 300), (127, 1000)])
def test_split_repetition_counts_the_same_lengths(lo, hi):
    text = repeat('"a"', lo, hi, split=True)
    counts = [tuple(int(x) if x else None for x in m.split(",")) for m in re.findall(r"\{([0-9,]*)\}", text)]
    assert all(c <= REPEAT_PIECE for lo_hi in counts for c in lo_hi if c is not None)
    q, levels = repeat_chain(lo, hi)
    # unambiguous: every length has one parse (the chain's levels take disjoint length ranges)
    lengths = [q * REPEAT_PIECE]
    parses: dict[int, int] = {}

    def walk(k: int, base: int) -> None:
        a, b = levels[k]
        if k == len(levels) - 1:
            top = (b if b is not None else a + 5)
            for n in range(a, top + 1):
                parses[base + n] = parses.get(base + n, 0) + 1
            return
        for n in range(a, b + 1):
            parses[base + n] = parses.get(base + n, 0) + 1
        walk(k + 1, base + REPEAT_PIECE)

    walk(0, lengths[0])
    assert set(parses.values()) == {1} and min(parses) == lo
    assert hi is None or max(parses) == hi
    acc = language_checker(f"root ::= {text}\n")
    top = (hi if hi is not None else lo) + 3
    for n in range(max(0, lo - 3), top + 1):
        assert acc("a" * n) == (n >= lo and (hi is None or n <= hi)), (lo, hi, n)


def test_past_the_nesting_limit_the_flat_pieces_are_written():
    from constraint_service.regex.ebnf import CHAIN_NEST_LIMIT

    hi = REPEAT_PIECE * (CHAIN_NEST_LIMIT + 2)  # CHAIN_NEST_LIMIT + 1 alternation levels
    assert len(repeat_chain(0, hi)[1]) - 1 > CHAIN_NEST_LIMIT
    text = repeat('"a"', 0, hi, split=True)
    assert "|" not in text and text.count("{0,128}") == CHAIN_NEST_LIMIT + 2
    acc = language_checker(f"root ::= {text}\n")
    for n in (0, 1, 127, 128, 129, 1000, hi - 1, hi):
        assert acc("a" * n), n
    assert not acc("a" * (hi + 1))
    nested = repeat('"a"', 0, hi - REPEAT_PIECE, split=True)  # at the limit: nested
    assert nested.count("|") == CHAIN_NEST_LIMIT


# a vocabulary with tokens that cross the regexes' character boundaries (and carry the newlines that
# xgrammar's counted repetition let through)
_TOKENS = [b"assertEqual", b" \xe5", b" \xe4\xb8", b" \r", b" the", b" a", "中文".encode(), "一".encode(), b"a\xe4\xb8\x80 ", b" \xe4\xb8", b"an", b", ", b",", b"ab.", b"The", b" \n", b"\r\n", b"a\n", b"\n", b"=1;", b"x=", b"42",
           b"-0", b".5", b"Yes", b"No:", b" no", b"abc", b"123", b"2024-", b"-01", b"(555) ", b"ok.", b"\xc3\xa9"]


def _vocab() -> Vocabulary:
    toks = list(dict.fromkeys([bytes([i]) for i in range(256)] + MULTI + _TOKENS)) + [b"<eos>"]
    return Vocabulary(vocab_size=len(toks) + 5, token_bytes=tuple(toks), eos_ids=(len(toks) - 1,))


PATTERNS = [r"[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\.", r"\w+( \w+)*", r"(\w+=\w+;)*",
            r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", r"(Yes|No): [a-z ,]{2,20}\.", r"-?\d+(\.\d+)?",
            r"[^,\n]+(,[^,\n]+){2}", r"(ab|a)(c|bc)*"]


@pytest.fixture(scope="module")
def compiler():
    return ConstraintCompiler(_vocab())


def _mask(session: OutputSession, W: int) -> np.ndarray:
    bm = np.zeros((1, W), np.uint32)
    stat = np.zeros(1, np.uint8)
    session.fill_lookahead([], bm, stat)
    return bm[0] if stat[0] == READY else np.zeros(W, np.uint32)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_form_masks_equal_the_structural_forms_on_random_walks(pattern, compiler):
    vocab = compiler.vocab
    W = bitmask_words(vocab.vocab_size)
    dfa_c = compiler.compile(ConstraintSpec("regex", pattern))[0]
    structural = "root ::= " + ast_to_expr(full_ast(parse_regex(pattern)), json_mode=False) + "\n"
    assert structural != regex_to_ebnf(pattern)
    be = compiler.backend
    struct_c = be.compile(be.parse_ebnf(structural), kind="regex", key=("structural", pattern))
    rng = random.Random(pattern)
    eos = vocab.eos_ids[0]
    for walk in range(12):
        a, b = OutputSession(dfa_c), OutputSession(struct_c)
        for step in range(40):
            ma, mb = _mask(a, W), _mask(b, W)
            assert (ma == mb).all(), (pattern, walk, step)
            assert a.is_complete == b.is_complete
            legal = [t for t in allowed_ids(ma) if t != eos]
            if not legal:
                break
            tok = rng.choice(legal)
            a.advance([tok])
            b.advance([tok])


@pytest.mark.parametrize("pattern", [r"[^\n]{0,300}", r"[^\n]{0,1000}", r"[^\n]{130,200}"])
def test_long_newline_free_lines_never_allow_a_newline(pattern, compiler):
    # xgrammar 0.2.9's counted repetition (count > 128) of this class allowed " \n" / "\r\n"; the DFA form
    # (300, 200) and the split structural form (1000: over REGEX_DFA_STATES) must not
    vocab = compiler.vocab
    W = bitmask_words(vocab.vocab_size)
    text = regex_to_ebnf(pattern)
    assert ("(= [])" in text) == (pattern != r"[^\n]{0,1000}")
    c = compiler.compile(ConstraintSpec("regex", pattern))[0]
    rng = random.Random(pattern)
    newline = [i for i, t in enumerate(vocab.token_bytes) if b"\n" in t]
    assert len(newline) >= 4
    s = OutputSession(c)
    for step in range(150):
        m = _mask(s, W)
        ids = set(allowed_ids(m))
        assert not ids & set(newline), (pattern, step, sorted(ids & set(newline)))
        legal = sorted(ids - set(vocab.eos_ids))
        if not legal:
            break
        # long tokens first: the walk must get past 128 characters
        s.advance([max(rng.sample(legal, min(8, len(legal))), key=lambda t: len(vocab.token_bytes[t]))])
    assert s.num_committed_tokens > 40


@pytest.mark.parametrize("pattern", [r"[ 0-9A-Za-z\u4e00-\u9fff]{0,200}", r"[ 0-9A-Za-z\u4e00-\u9fff]{0,1000}",
                                     r"[^\n]{0,1000}", r"[\s\S]{0,1000}", r"(ab|[^a]){3,150}c",
                                     r"[a-z\u4e00-\u9fff]{0,600}", r"[ -~\u00a0-\u00ff\u0400-\u04ff]{0,600}",
                                     r"[^\u4e00-\u9fff]{0,600}"])
def test_every_allowed_token_is_accepted(pattern, compiler):
    # soundness of the mask on walks through the DFA form and the structural fallback (pieces of at most 128
    # for a positive class, where xgrammar's own counted repetition allowed tokens its matcher rejects)
    _every_allowed_token_is_accepted(compiler, ConstraintSpec("regex", pattern))


@pytest.mark.parametrize("grammar", [r"root ::= [a-z\u4e00-\u9fff]{0,600}", r"root ::= [ 0-9A-Za-z\u4e00-\u9fff]{0,200}",
                                     r"root ::= [^\u4e00-\u9fff]{0,600}", r"root ::= [ -~\u00a0-\u00ff\u0400-\u04ff]{0,600}",
                                     'root ::= w{130,}\nw ::= [a-z\u4e00-\u9fff] | "\\n"'])
def test_gbnf_long_repetitions_every_allowed_token_is_accepted(grammar, compiler):
    # the same xgrammar bug through a user's GBNF {m,n} (written as given, these allowed 34-302 tokens its
    # matcher rejected on these walks); gbnf._split_long_repeats writes them in pieces of at most 128
    _every_allowed_token_is_accepted(compiler, ConstraintSpec("grammar", grammar))


@pytest.mark.parametrize("lo,hi", [(0, 300), (130, 130), (129, None), (0, 129), (5, 128)])
def test_gbnf_long_repetitions_keep_their_language(lo, hi):
    import xgrammar as xgr

    from constraint_service.gbnf import parse_gbnf

    src = f'root ::= "<" a{{{lo},{"" if hi is None else hi}}} ">"\na ::= "a" | "bc"\n'
    g = parse_gbnf(src, _vocab())
    counts = [tuple(int(x) for x in m.split(", ")) for m in re.findall(r"\{(-?[0-9]+, -?[0-9]+)\}", str(g))]
    assert counts and all(c <= REPEAT_PIECE for pair in counts for c in pair)
    assert (len(counts) > 1) == (max(lo, hi or 0) > REPEAT_PIECE)  # split only past REPEAT_PIECE
    comp = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False).compile_grammar(g)

    def acc(text: str) -> bool:
        m = xgr.GrammarMatcher(comp, terminate_without_stop_token=True)
        return m.accept_string(text.encode()) and m.is_completed()

    top = (hi if hi is not None else lo) + 3
    for n in sorted({0, 1, 2, max(0, lo - 1), lo, lo + 1, top - 3, top - 2, top - 1, top}):
        want = n >= lo and (hi is None or n <= hi)
        assert acc("<" + "a" * n + ">") == want, (lo, hi, n)
        assert acc("<" + "bc" * n + ">") == want, (lo, hi, n)
        if n:
            assert acc("<" + "bc" + "a" * (n - 1) + ">") == want, (lo, hi, n)


@pytest.mark.parametrize("pattern", [r"^[a-z\u4e00-\u9fff]{0,600}$", r"^[a-z\u4e00-\u9fff]{0,300}x{0,300}$"])
def test_json_pattern_long_repetitions_every_allowed_token_is_accepted(pattern, compiler):
    # a JSON Schema pattern over the DFA limit is written structurally (json_schema/emit.py); its counts over 128
    # went to xgrammar as given and allowed tokens its matcher rejected ("status=", "k\n" after the quote)
    import json

    _every_allowed_token_is_accepted(compiler, ConstraintSpec("json_schema", json.dumps({"type": "string",
                                                                                       "pattern": pattern})))


def _alternation_then_multibyte_class_grammars(n: int, seed: int) -> list[str]:
    """Random grammars of the shape xgrammar 0.2.9 filled wrong: a literal, an alternation (a rule that can
    end), a class with 3-byte characters, a tail."""
    rng = random.Random(seed)

    def lit() -> str:
        return '"' + "".join(rng.choice("abce") for _ in range(rng.randint(1, 4))) + '"'

    classes = [r"[\u4e00-\u9fff]", r"[\u4e00-\u9fffa]", r"[\u0800-\uffff]", r"[\u00e0-\u00ff\u4e00-\u9fff]"]
    out = []
    for _ in range(n):
        alts = " | ".join(lit() for _ in range(rng.randint(2, 3)))
        tail = rng.choice(['"x"', "[x]", '"xy" "z"', "[a-c]+", '("x" | "y")'])
        out.append(f"root ::= {lit()} ({alts}) {rng.choice(classes)} {tail}")
    return out


def test_a_multibyte_class_after_a_rule_gets_sound_masks(compiler):
    # xgrammar 0.2.9: root ::= "a" ("bce" | "ab") [\u4e00-\u9fff] "x" after "abc" allowed "er", which its matcher
    # rejects; the compile path gives such a class a rule of its own (isolate_multibyte_classes). Without it, 20 of
    # these 30 grammars had unsound masks on these walks.
    import xgrammar as xgr

    from constraint_service.backend.xgrammar_backend import isolate_multibyte_classes

    grammars = _alternation_then_multibyte_class_grammars(30, 0)
    raw = xgr.Grammar.from_ebnf(grammars[0])
    iso = isolate_multibyte_classes(raw)
    assert iso is not raw and str(iso).count("::=") == str(raw).count("::=") + 1
    for src in grammars:
        _every_allowed_token_is_accepted(compiler, ConstraintSpec("grammar", src), walks=3, steps=8)
    # the same language: the rewritten grammar accepts exactly what the original does
    for src in grammars[:10]:
        a = language_checker(src)
        b = language_checker(str(isolate_multibyte_classes(xgr.Grammar.from_ebnf(src))))
        rng = random.Random(src)
        for _ in range(200):
            w = "".join(rng.choice(["a", "b", "c", "e", "x", "y", "z", "\u4e00", "\u00e9", "\u0800"])
                        for _ in range(rng.randint(1, 9)))
            assert a(w) == b(w), (src, w)


@pytest.mark.parametrize("grammar", ['root ::= "a" r [\\u4e00-\\u9fff] "x"\nr ::= ("bce" | "ab") (= [\\u4e00-\\u9fff] "x")',
                                     'root ::= "a" r s\nr ::= ("bce" | "ab") (= [\\u00e0-\\u00ff] "x")\n'
                                     's ::= [\\u00e0-\\u00ff] "x"'])
def test_a_multibyte_class_in_a_lookahead_gets_sound_masks(grammar, compiler):
    # the same xgrammar bug through an explicit lookahead whose first element is the class: after "abc" the mask
    # allowed "er" (25 of 26 SmolLM2 tokens there); isolate_multibyte_classes also moves lookahead classes
    vocab = compiler.vocab
    W = bitmask_words(vocab.vocab_size)
    s = OutputSession(compiler.compile(ConstraintSpec("grammar", grammar))[0])
    s.advance([vocab.token_bytes.index(b"abc")])
    ids = [t for t in allowed_ids(_mask(s, W)) if t not in vocab.eos_ids]
    assert ids
    for t in ids:
        s.preview([t])  # IntegrityError if the matcher refuses a token its mask allowed
        s.discard()


def _every_allowed_token_is_accepted(compiler, spec, walks: int = 2, steps: int = 60):
    vocab = compiler.vocab
    W = bitmask_words(vocab.vocab_size)
    pattern = spec.source
    c = compiler.compile(spec)[0]
    rng = random.Random(pattern)
    for walk in range(walks):
        s = OutputSession(c)
        for step in range(steps):
            ids = [t for t in allowed_ids(_mask(s, W)) if t not in vocab.eos_ids]
            for t in ids:
                s.preview([t])  # IntegrityError if the matcher refuses a token its mask allowed
                s.discard()
            if not ids:
                break
            s.advance([max(rng.sample(ids, min(8, len(ids))), key=lambda t: len(vocab.token_bytes[t]))])
