"""Bitmask layout: word/bit order, bits >= V zero, padding ids, zero-copy fills (seed 000 §mask)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import EOS, SPECIAL, VOCAB, W, allowed_ids, make_session
from constraint_service.compiler import ConstraintCompiler
from constraint_service.session import OutputSession, _as_int32_tensor, fill_rows
from constraint_service.types import READY, ConstraintSpec, bitmask_words
from constraint_service.vocab import Vocabulary, encoded_vocab_for_xgrammar


def test_width_and_bit_order(compiler):
    assert W == bitmask_words(300) == 10
    s = make_session(compiler, "grammar", 'root ::= "a"')
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    expected = np.zeros(W, np.uint32)
    expected[97 // 32] = 1 << (97 % 32)  # LSB = smaller id
    assert (bm[0] == expected).all() and st[0] == READY


def test_bits_past_v_and_padding_ids_are_zero(compiler):
    # a negated class makes xgrammar 0.2.9 set bits >= V; they must be cleared
    s = make_session(compiler, "grammar", "root ::= [^a]*")
    for positions, drafts in ((1, []), (3, [ord("b"), ord("c")])):
        bm = np.zeros((positions, W), np.uint32)
        st = np.zeros(positions, np.uint8)
        s.fill_lookahead(drafts, bm, st)
        for row in bm:
            ids = allowed_ids(row)
            assert max(ids) < len(VOCAB.token_bytes)
            assert SPECIAL not in ids and EOS in ids and ord("a") not in ids
            assert int(row[-1]) >> (300 % 32) == 0
    many = np.zeros((3, 2, W), np.uint32)
    sts = np.zeros((3, 2), np.uint8)
    fill_rows([s, s.__class__(s.compiled), None], [[ord("b")], [], []], many, sts)
    assert sts[0].tolist() == [READY, READY] and sts[1, 0] == READY
    for row in (many[0, 0], many[0, 1], many[1, 0]):
        assert max(allowed_ids(row)) < len(VOCAB.token_bytes) and int(row[-1]) >> 12 == 0


def test_vocab_multiple_of_32_and_no_padding():
    toks = tuple(bytes([i]) for i in range(256)) + (b"<eos>",) * 0 + (b"",) * 0
    v = Vocabulary(vocab_size=256, token_bytes=toks, eos_ids=(0,))
    c = ConstraintCompiler(v)
    assert c.backend.tail_mask is None
    s = OutputSession(c.compile(ConstraintSpec("grammar", "root ::= [^a]+"))[0])
    bm = np.zeros((1, 8), np.uint32)
    st = np.zeros(1, np.uint8)
    s.fill_lookahead([], bm, st)
    ids = allowed_ids(bm[0])
    assert 0 not in ids and ord("a") not in ids and ord("A") in ids  # id 0 is EOS (not complete yet)


def test_zero_copy_view_into_ring_slot(compiler):
    ring = np.zeros((2, 4, 3, W), np.uint32)  # [slots, rows, positions, words]
    slot = ring[1]
    t = _as_int32_tensor(slot.reshape(-1, W))
    assert t.data_ptr() == slot.ctypes.data and t.dtype == torch.int32
    s = make_session(compiler, "grammar", 'root ::= "a"')
    s.fill_lookahead([], slot[2], np.zeros(3, np.uint8))
    assert ring[1, 2, 0, 3] == 2 and not ring[0].any()


def test_non_contiguous_view_is_integrity_error(compiler):
    from constraint_service.errors import IntegrityError

    s = make_session(compiler, "grammar", 'root ::= "a"')
    bm = np.zeros((2, W * 2), np.uint32)[:, ::2]
    with pytest.raises(IntegrityError):
        s.fill_lookahead([], bm, np.zeros(2, np.uint8))


def test_encoded_vocab_hides_eos_and_specials():
    enc = encoded_vocab_for_xgrammar(VOCAB)
    assert enc[EOS] == b"" and enc[SPECIAL] == b"" and enc[97] == b"a"


@pytest.mark.parametrize("kwargs", [
    dict(vocab_size=2, token_bytes=(b"a", b"b", b"c")),
    dict(vocab_size=4, token_bytes=(b"a",), eos_ids=(2,)),
    dict(vocab_size=4, token_bytes=(b"a",), special_ids=frozenset({9})),
])
def test_vocabulary_validation(kwargs):
    with pytest.raises(ValueError):
        Vocabulary(**kwargs)
