"""gpu_engine.sample.bitmask against a NumPy reference packing (LSB = smaller id)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gpu_engine.sample.bitmask import apply_bitmask_, bitmask_words, pack_bitmask, unpack_bitmask, words_from_numpy


import ninfer_tests_gpu_engine_oracle as oracle  # loaded by conftest.py


@pytest.mark.parametrize("vocab_size", [1, 31, 32, 33, 37, 70, 1000], ids=lambda v: f"V{v}")
def test_unpack_matches_numpy_reference(vocab_size):
    rng = np.random.default_rng(vocab_size)
    allowed = rng.random((3, vocab_size)) < 0.4
    words_u32 = oracle.bits_from_allowed(allowed)
    assert words_u32.shape == (3, bitmask_words(vocab_size))
    words = words_from_numpy(words_u32)
    assert words.dtype == torch.int32
    assert torch.equal(unpack_bitmask(words, vocab_size), torch.from_numpy(allowed))
    assert np.array_equal(pack_bitmask(torch.from_numpy(allowed)).numpy().view(np.uint32), words_u32)


def test_bit_31_and_lsb_convention():
    allowed = torch.zeros(64, dtype=torch.bool)
    allowed[0] = allowed[31] = allowed[32] = True
    words = pack_bitmask(allowed)
    assert words.numpy().view(np.uint32).tolist() == [0x80000001, 0x1]
    assert torch.equal(unpack_bitmask(words, 64), allowed)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=130))
def test_pack_unpack_round_trip(bits):
    allowed = torch.tensor(bits)
    assert torch.equal(unpack_bitmask(pack_bitmask(allowed), len(bits)), allowed)


def test_apply_only_on_enabled_rows():
    v = 37
    logits = torch.randn(3, v, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    allowed = torch.zeros(3, v, dtype=torch.bool)
    allowed[:, [2, 36]] = True
    words = pack_bitmask(allowed)
    words[1] = 0  # garbage/zero words on a disabled row must be ignored
    apply_bitmask_(logits, words, torch.tensor([True, False, True]))
    assert torch.equal(logits[1], before[1])
    for r in (0, 2):
        assert torch.equal(logits[r, [2, 36]], before[r, [2, 36]])
        others = torch.ones(v, dtype=torch.bool)
        others[[2, 36]] = False
        assert torch.isneginf(logits[r, others]).all()
