"""Choice constraints: validation, exact bytes, shared prefixes (seed 000 §Choice)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import EOS, W, allowed_ids, make_session
from constraint_service.choice import choice_to_ebnf, ebnf_literal, normalize_choices
from constraint_service.errors import ConstraintError
from constraint_service.types import ConstraintSpec


@pytest.mark.parametrize("bad", [[], (), "ok", ["ok", 3], ["\ud800"]], ids=["empty-list", "empty-tuple", "str", "non-str", "surrogate"])
def test_invalid_choice(compiler, bad):
    with pytest.raises(ConstraintError) as ei:
        normalize_choices(bad)
    assert ei.value.kind == "InvalidChoice"


def test_empty_list_through_compile(compiler):
    with pytest.raises(ConstraintError) as ei:
        compiler.compile(ConstraintSpec("choice", choices=()))
    assert ei.value.kind == "InvalidChoice"


def test_dedup_and_order_independent():
    assert normalize_choices(["b", "a", "b", ""]) == ("", "a", "b")


OPTIONS = ['say "hi"', "back\\slash", "line\nbreak\r\ttab", "\x01\x7f", "nul\x00byte", "中文 ✓ 😀", "", "Ok", "ok", " ok "]


@pytest.mark.parametrize("option", OPTIONS, ids=[repr(o)[:12] for o in OPTIONS])
def test_exact_bytes(compiler, option):
    s = make_session(compiler, "choice", choices=[option, "zzz-other"])
    r = s.preview(list(option.encode("utf-8")) + [EOS])
    assert r.complete and r.terminated


def test_case_and_whitespace_are_exact(compiler):
    s = make_session(compiler, "choice", choices=["Ok"])
    with pytest.raises(Exception):
        s.preview([ord("o")])


def test_short_option_prefix_of_long_allows_eos_and_continuation(compiler):
    s = make_session(compiler, "choice", choices=["ok", "okay"])
    s.preview([ord("o"), ord("k")])
    s.commit()
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    assert allowed_ids(bm[0]) == {EOS, ord("a")}
    assert s.is_complete and not s.is_terminated


def test_only_empty_option_allows_only_eos(compiler):
    s = make_session(compiler, "choice", choices=[""])
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    assert allowed_ids(bm[0]) == {EOS}


def test_literal_escaping():
    assert ebnf_literal("") == '""'
    assert ebnf_literal('a"b\\') == '"a\\"b\\\\"'
    assert ebnf_literal("\x00") == "[\\x00]"
    assert ebnf_literal("a\x00") == '"a" [\\x00]'
    assert choice_to_ebnf(("a", "")).startswith("root ::= ")
