"""Regex constraint: rejection classes with their column, and enumeration against an independent oracle."""
import itertools
import re

import pytest

from conftest import language_checker
from constraint_service.errors import ConstraintError
from constraint_service.regex import regex_fullmatch, regex_search, regex_to_ebnf


def strings(alphabet, max_len):
    for n in range(max_len + 1):
        for t in itertools.product(alphabet, repeat=n):
            yield "".join(t)


# (pattern, column of the error)
REJECTIONS = [
    ("(a)\\1", "1:4"),           # backreference
    ("ab\\k<n>", "1:3"),         # named backreference
    ("a(?=b)", "1:2"),           # lookahead
    ("a(?!b)", "1:2"),           # negative lookahead
    ("(?<=a)b", "1:1"),          # lookbehind
    ("(?<!a)b", "1:1"),          # negative lookbehind
    ("ab\\b", "1:3"),            # word boundary
    ("\\Ba", "1:1"),             # non-word boundary
    ("x\\p{L}", "1:2"),          # Unicode property class
    ("\\P{Lu}", "1:1"),          # negated property class
    ("(?i)abc", "1:1"),          # inline flags
    ("a(?m:b)", "1:2"),          # scoped flags
    ("\\uD83D", "1:1"),          # lone high surrogate escape
    ("a\\uD83Dx", "1:2"),        # high surrogate not followed by a low one
    ("\\u{D800}", "1:1"),        # surrogate code point escape
    ("\\u{110000}", "1:1"),      # beyond U+10FFFF
    ("\\u{}", "1:1"),            # empty code point escape
    ("ab\\udfff", "1:3"),        # low surrogate escape
    ("\\q", "1:1"),              # unknown escape
    ("ab\\e", "1:3"),            # unknown escape
    ("a^b", "1:2"),              # ^ in the middle
    ("(^a)", "1:2"),             # ^ inside a group
    ("a$b", "1:2"),              # $ in the middle
    ("(a$)", "1:3"),             # $ inside a group
    ("a|b$c", "1:4"),            # $ in the middle of a top-level alternative
    ("*a", "1:1"),               # nothing to repeat
    ("a**", "1:3"),              # quantifier after quantifier
    ("(ab", "1:1"),              # missing )
    ("ab)", "1:3"),              # unmatched )
    ("[ab", "1:1"),              # unterminated class
    ("a{3,2}", "1:2"),           # bad counts
    ("[z-a]", "1:3"),            # bad range
    ("\\x4", "1:1"),             # bad \x
    ("\\u12", "1:1"),            # bad \u
    ("abc\\", "1:4"),            # trailing backslash
    ("\\01", "1:1"),             # octal
    # ECMAScript with the u flag (issue 13): no Annex B literal braces or identity escapes
    ("[0-9]{,3}", "1:6"),        # incomplete quantifier (used to match the literal text "{,3}")
    ("a{", "1:2"),               # incomplete quantifier
    ("ab{2", "1:3"),             # incomplete quantifier
    ("a{2,", "1:2"),             # incomplete quantifier
    ("a{x}", "1:2"),             # not a quantifier
    ("{", "1:1"),                # lone brace
    ("ab}", "1:3"),              # lone closing brace
    ("a]", "1:2"),               # lone closing bracket
    ("[]]", "1:3"),              # empty class, then a lone ']'
    ("x{2}{3}", "1:5"),          # quantifier after quantifier
    ("ab\\-", "1:3"),            # identity escape of a non-syntax character
    ("\\:", "1:1"),              # identity escape of a non-syntax character
    ("[a\\@]", "1:3"),           # ... also inside a class
    ("\\_", "1:1"),              # ... underscore
]


@pytest.mark.parametrize("pattern,loc", REJECTIONS)
def test_rejections_have_kind_and_column(pattern, loc):
    with pytest.raises(ConstraintError) as ei:
        regex_to_ebnf(pattern)
    assert ei.value.kind == "InvalidRegex"
    assert ei.value.location == loc, (pattern, ei.value.location, ei.value.message)
    assert ei.value.message


def test_empty_regex_only_empty_output():
    acc = language_checker(regex_to_ebnf(""))
    assert acc("")
    assert not acc("a")


# Patterns whose ECMAScript and Python `re` semantics agree on the alphabet used.
ENUM_PATTERNS = [
    "a", "ab", "a|b", "a|", "|b", "(a|b)*", "a*b+", "(?:ab)?c", "a{2}", "a{1,3}", "a{2,}", "[ab]{0,2}c?",
    "[^a]", "[^a]*", "(a|bc)+", "a+?b*?", "^a|b$", "^(a|b)c$", "((a|b)(c|a)){1,2}", ".", ".*c",
    "[a-c]b", "\\x61", "\\u0062+", "(?<n>a)b", "[\\]a]", "\\.", "a{0}", "(ab|a)(c|bc)", "[ac-]",
    # classes whose first member is "^" (xgrammar 0.2.9 prints "[\\u005e\\u0061]" as "[^a]"; a compiler with its cache on compiles the print)
    "\\^|a", "[\\^a]+", "[\\^-a]b", "[\\^]", "[^\\^]", "(\\^|a)(\\^|b)*",
]
ALPHABET = ["a", "b", "c", ".", "^", "_"]


@pytest.mark.parametrize("pattern", ENUM_PATTERNS)
def test_enumeration_matches_oracle(pattern):
    acc = language_checker(regex_to_ebnf(pattern))
    for s in strings(ALPHABET, 4):
        py = pattern.replace("(?<", "(?P<")  # Python spelling of a named group
        want = re.fullmatch(py, s) is not None
        assert acc(s) == want, (pattern, s)
        assert regex_fullmatch(pattern, s) == want, (pattern, s)
        assert regex_search(pattern, s) == (re.search(py, s) is not None), (pattern, s)


def test_ecmascript_classes():
    acc = language_checker(regex_to_ebnf("\\d\\w\\s."))
    assert acc("1a b")
    assert acc("9_\u00a0x")            # NBSP is \s in ECMAScript
    assert acc("0Z\u2028\u00e9")       # LS is \s; '.' matches non-ASCII
    assert acc("0Z\ufeff\U0001F600")   # BOM is \s; '.' matches astral chars
    assert not acc("\u0661aa.")         # Arabic-Indic digit is not \d
    assert not acc("1\u00e9 a")         # \w is ASCII only
    for bad in ["\n", "\r", "\u2028", "\u2029"]:
        assert not acc("1a " + bad), repr(bad)
    acc2 = language_checker(regex_to_ebnf("[\\D][\\W][\\S]"))
    assert acc2("a-b")
    assert not acc2("1-b") and not acc2("aab") and not acc2("a- ")


def test_escapes_and_unicode():
    acc = language_checker(regex_to_ebnf("\\t\\n\\r\\f\\v\\0\\x41\\u00e9\\.\\*\\/[\\-]é😀"))
    assert acc("\t\n\r\f\v\0Aé.*/-é😀")
    assert not acc("\t\n\r\f\v\0Aé.*/-e😀")
    acc2 = language_checker(regex_to_ebnf("[\\b]\\cJ"))
    assert acc2("\b\n")


def test_braces_are_quantifiers_or_escaped():
    """u-mode: `{`/`}` are literal only when escaped or inside a class; `{n,m}` is a quantifier."""
    acc = language_checker(regex_to_ebnf("a\\{,2\\}[{}]"))
    assert acc("a{,2}}") and acc("a{,2}{") and not acc("aa")
    acc = language_checker(regex_to_ebnf("[0-9]{0,3}"))
    assert acc("") and acc("123") and not acc("1234") and not acc("{,3}")
    for p in ["\\{\\}", "[{]", "a{2}", "a{2,}", "a{2,3}?"]:
        regex_to_ebnf(p)


def test_unicode_code_point_escapes():
    """u-mode: \\u{...} and surrogate pairs denote one astral code point."""
    for p in ["\\u{1F600}", "\\uD83D\\uDE00", "\\u{1f600}", "[\\uD83D\\uDE00]", "\\u{0000041}"]:
        acc = language_checker(regex_to_ebnf(p))
        want = "A" if p.endswith("41}") else "😀"
        assert acc(want) and not acc("x"), p
        assert regex_fullmatch(p, want)
    acc = language_checker(regex_to_ebnf("[\\u{1F600}-\\u{1F64F}]+"))
    assert acc("😀🙏") and not acc("😀a")


def test_anchors_at_top_level_ends_are_noops_for_full_match():
    acc = language_checker(regex_to_ebnf("^ab$|^c$"))
    assert acc("ab") and acc("c") and not acc("abc")
    assert regex_search("^ab", "abz") and not regex_search("^ab", "zab")
    assert regex_search("ab$", "zab") and not regex_search("ab$", "abz")
    assert regex_search("b", "abc")


def test_search_semantics_examples():
    assert regex_search("[0-9]", "ab3c")
    assert not regex_search("^[0-9]+$", "12a")
    assert regex_search("", "anything")
