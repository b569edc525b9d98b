"""Narrow fills (``constraint_service.backend.xgrammar_backend``): with many padding ids xgrammar is given the
tokenizer's own size, fills a contiguous scratch and the rows are copied into the V-wide bitmask with the
padding words zeroed. Every mask must equal the one xgrammar writes when it knows all V ids, on random walks
of several grammars, through every fill path (batch Step fill with lookahead, single-row lookahead, the start
check), over rows that held garbage."""
from __future__ import annotations

import random

import numpy as np
import pytest

import constraint_service.backend.xgrammar_backend as xb
from conftest import MULTI, allowed_ids
from constraint_service.compiler import ConstraintCompiler
from constraint_service.session import OutputSession, fill_rows
from constraint_service.types import DEAD_END, READY, ConstraintSpec, bitmask_words
from constraint_service.vocab import Vocabulary

GRAMMARS = [("grammar", "root ::= [^a]* \"a\""), ("regex", r"[a-c]{1,6}(, [0-9]+)*\."),
            ("json_schema", '{"type": "object", "properties": {"s": {"type": "string", "maxLength": 5}, '
                            '"n": {"type": "integer"}}, "required": ["s", "n"]}'),
            ("grammar", 'root ::= "ab" [0-9]+ | "ba" "\\u00e9"?')]


def _vocab(extra: int, pad: int) -> Vocabulary:
    toks = [bytes([i]) for i in range(256)] + MULTI + [b"x" * (i + 2) for i in range(extra)] + [b"<eos>", b"<sp>"]
    n = len(toks)
    return Vocabulary(vocab_size=n + pad, token_bytes=tuple(toks), special_ids=frozenset({n - 1}), eos_ids=(n - 2,))


def _compilers(vocab: Vocabulary, monkeypatch):
    narrow = ConstraintCompiler(vocab)
    narrow.backend  # noqa: B018 - built now (the compiler builds it lazily)
    monkeypatch.setattr(xb, "NARROW_FILL_MIN_PADDING", 10**9)
    wide = ConstraintCompiler(vocab)
    wide.backend  # noqa: B018
    monkeypatch.undo()
    assert narrow.backend.fill_words < narrow.backend.num_words == wide.backend.fill_words
    assert narrow.backend.xgr_vocab_size == vocab.num_tokenizer_tokens and wide.backend.xgr_vocab_size == vocab.vocab_size
    return narrow, wide


# tokenizer sizes: n % 32 != 0 (a tail word) and n % 32 == 0
@pytest.mark.parametrize("extra", [5, 32 - (256 + len(MULTI) + 2) % 32])
def test_narrow_masks_equal_wide_masks_on_random_walks(extra, monkeypatch):
    vocab = _vocab(extra, pad=3000)
    n, V = vocab.num_tokenizer_tokens, vocab.vocab_size
    W = bitmask_words(V)
    narrow, wide = _compilers(vocab, monkeypatch)
    rng = random.Random(extra)
    for kind, src in GRAMMARS:
        sess = {c: [OutputSession(c.compile(ConstraintSpec(kind, src))[0]) for _ in range(3)] for c in (narrow, wide)}
        for step in range(25):
            drafts = [[], [], []]
            out = {}
            for c in (narrow, wide):
                bm = np.full((3, 3, W), 0xFFFFFFFF, np.uint32)  # garbage the fill must overwrite
                st = np.zeros((3, 3), np.uint8)
                errs = fill_rows(sess[c], drafts, bm, st)
                assert errs == [None] * 3
                out[c] = (bm, st)
            (bn, sn), (bw, sw) = out[narrow], out[wide]
            assert (sn == sw).all()
            for r in range(3):
                if sn[r, 0] == READY:
                    assert (bn[r, 0] == bw[r, 0]).all(), (kind, step, r)
                    assert max(allowed_ids(bn[r, 0])) < n and not bn[r, 0, bitmask_words(n):].any()
            # single-row lookahead with a legal draft, both ways
            row0 = bw[0, 0]
            legal = sorted(i for i in allowed_ids(row0) if i not in vocab.eos_ids)
            if sn[0, 0] != READY or not legal:
                break
            d = rng.choice(legal)
            looks = {}
            for c in (narrow, wide):
                bm = np.full((3, W), 0xFFFFFFFF, np.uint32)
                st = np.zeros(3, np.uint8)
                sess[c][1].fill_lookahead([d], bm, st)
                looks[c] = (bm, st)
            assert (looks[narrow][1] == looks[wide][1]).all() and (looks[narrow][0] == looks[wide][0]).all()
            # the batch Step fill with drafts: a legal one, a padding id, EOS (rows 0-2)
            batch = {}
            for c in (narrow, wide):
                bm = np.full((3, 3, W), 0xFFFFFFFF, np.uint32)
                st = np.zeros((3, 3), np.uint8)
                assert fill_rows(sess[c], [[d, d], [n + 5], [vocab.eos_ids[0]]], bm, st) == [None] * 3
                batch[c] = (bm, st)
            assert (batch[narrow][1] == batch[wide][1]).all() and (batch[narrow][0] == batch[wide][0]).all()
            for c in (narrow, wide):  # every session walks the same token
                for s in sess[c]:
                    s.preview([d])
                    s.commit()
        for c in (narrow, wide):
            for s in sess[c]:
                s.close()


def test_start_check_and_padding_ids(monkeypatch, capfd):
    vocab = _vocab(5, pad=2000)
    n = vocab.num_tokenizer_tokens
    narrow, wide = _compilers(vocab, monkeypatch)
    a, b = (OutputSession(c.compile(ConstraintSpec("grammar", "root ::= [^a]+"))[0]) for c in (narrow, wide))
    assert (a._scratch == b._scratch).all() and allowed_ids(a._scratch[0]) == allowed_ids(b._scratch[0])
    m = a._matcher
    capfd.readouterr()
    for pad_id in (n, n + 7, vocab.vocab_size - 1):
        assert m.accept_token(pad_id) is False  # padding: refused, state unchanged
    assert "out of range" not in capfd.readouterr().err  # refused here, not by a warning from xgrammar
    assert m.accept_token(ord("b")) and not m.accept_token(ord("a"))
    with pytest.raises(Exception):
        a.preview([n + 1])  # an IntegrityError: a padding id is rejected by the grammar


def test_the_padding_threshold():
    below = ConstraintCompiler(_vocab(5, pad=xb.NARROW_FILL_MIN_PADDING - 1)).backend
    assert below.xgr_vocab_size == below.vocab_size and below.fill_words == below.num_words
    at = ConstraintCompiler(v := _vocab(5, pad=xb.NARROW_FILL_MIN_PADDING)).backend
    assert at.xgr_vocab_size == v.num_tokenizer_tokens and at.fill_words < at.num_words


def test_dead_end_status_survives_a_narrow_fill(monkeypatch):
    vocab = _vocab(5, pad=3000)
    narrow, _ = _compilers(vocab, monkeypatch)
    s = OutputSession(narrow.compile(ConstraintSpec("grammar", 'root ::= "ab"'))[0])
    W = narrow.backend.num_words
    bm = np.full((1, 2, W), 0xFFFFFFFF, np.uint32)
    st = np.zeros((1, 2), np.uint8)
    s.preview([ord("a")])
    s.commit()
    fill_rows([s], [[ord("b")]], bm, st)
    assert st[0, 0] == READY and allowed_ids(bm[0, 0]) == {ord("b")}
    assert st[0, 1] in (READY, DEAD_END) and not bm[0, 1, narrow.backend.fill_words:].any()
