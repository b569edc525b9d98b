"""gpu_engine.sample.sampler against the float64 oracle (tests/gpu_engine/oracle.py)."""
import numpy as np
import pytest
import torch

import gpu_engine.sample.sampler as sampling
from gpu_engine.sample.bitmask import pack_bitmask
from gpu_engine.sample.rng import Purpose
from gpu_engine.sample.sampler import (
    SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SAMPLE_OK, SamplingTensors, sample, target_probs,
)


import ninfer_tests_gpu_engine_oracle as oracle  # loaded by conftest.py

# (name, params) — every row of a batch gets its own random logits and mask.
CONFIGS = [
    ("plain", dict()),
    ("temp0.7", dict(temperature=0.7)),
    ("temp1.6_topk5", dict(temperature=1.6, top_k=5)),
    ("topp0.8", dict(top_p=0.8)),
    ("minp0.15", dict(min_p=0.15)),
    ("all", dict(temperature=0.8, top_k=12, min_p=0.02, top_p=0.9)),
    ("greedy", dict(temperature=0.0, top_k=3)),
    ("penalties", dict(presence=0.5, frequency=0.3, repetition=1.3)),
    ("penalties_topk", dict(temperature=0.9, top_k=8, presence=-0.2, frequency=0.7, repetition=0.8)),
]
_KW = {"presence": "presence_penalty", "frequency": "frequency_penalty", "repetition": "repetition_penalty"}


def _st(b, params, counts=None, seed=0):
    kw = {_KW.get(k, k): v for k, v in params.items()}
    return SamplingTensors.make(b, seed=seed, output_counts=counts, **kw)


def _counts(b, v, gen):
    c = torch.zeros(b, v, dtype=torch.int32)
    idx = torch.randint(0, v, (b, 6), generator=gen)
    return c.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.int32))


@pytest.mark.parametrize("vocab_size", [37, 70], ids=lambda v: f"V{v}")
@pytest.mark.parametrize("name,params", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_probs_match_oracle(vocab_size, name, params):
    b = 8
    gen = torch.Generator().manual_seed(hash((vocab_size, name)) % 2**31)
    logits = torch.randn(b, vocab_size, generator=gen) * 3
    allowed = torch.rand(b, vocab_size, generator=gen) < 0.5
    allowed[:, 0] = True  # never empty
    enabled = torch.tensor([True] * (b - 2) + [False] * 2)  # mixed batch: 2 unconstrained rows
    penal = any(k in params for k in _KW)
    counts = _counts(b, vocab_size, gen) if penal else None
    st = _st(b, params, counts)
    probs, err = target_probs(logits, st, pack_bitmask(allowed), enabled)
    assert probs.dtype == torch.float32 and err.dtype == torch.int32
    for r in range(b):
        ref, ref_err = oracle.sampling_probs(
            logits[r].double().numpy(), allowed[r].numpy() if enabled[r] else None,
            counts=None if counts is None else counts[r].numpy(), **params)
        assert err[r] == ref_err == SAMPLE_OK
        np.testing.assert_allclose(probs[r].double().numpy(), ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
def test_sort_free_fast_path_equals_filter_path(temperature):
    """``use_filters=False`` (no top-k/top-p/min-p anywhere) must give the same ``p``."""
    v, b = 70, 6
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(b, v, generator=gen) * 2
    logits[:, [3, 50]] = 4.0                      # a tie for greedy
    allowed = torch.rand(b, v, generator=gen) < 0.5
    allowed[:, [3, 50]] = True
    counts = _counts(b, v, gen)
    st = _st(b, dict(temperature=temperature, presence=0.3, repetition=1.2), counts)
    assert st.use_filters is False
    fast, err_fast = target_probs(logits, st, pack_bitmask(allowed), None)
    st.use_filters = True
    slow, err_slow = target_probs(logits, st, pack_bitmask(allowed), None)
    assert torch.equal(err_fast, err_slow)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    if temperature == 0:
        assert torch.equal(fast, slow)


def test_unconstrained_batch_does_no_mask_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("mask work on a pure unconstrained batch")

    monkeypatch.setattr(sampling, "unpack_bitmask", boom)
    logits = torch.randn(3, 37)
    tok, err = sample(logits, _st(3, {}), None, None, torch.zeros(3, dtype=torch.int64))
    assert (err == SAMPLE_OK).all() and (tok >= 0).all()


def _draw_many(logits_row, allowed_row, params, n, positions=None):
    """Sample ``n`` times from one row by giving each lane a different seed."""
    v = logits_row.numel()
    logits = logits_row.expand(n, v).contiguous()
    words = None if allowed_row is None else pack_bitmask(allowed_row).expand(n, -1).contiguous()
    st = _st(n, params, seed=torch.arange(n, dtype=torch.int64) * 7919 + 11)
    pos = torch.zeros(n, dtype=torch.int64) if positions is None else positions
    tok, err = sample(logits, st, words, None, pos)
    assert (err == SAMPLE_OK).all()
    return tok.numpy()


@pytest.mark.parametrize("name,params", [CONFIGS[0], CONFIGS[2], CONFIGS[5]], ids=["plain", "topk", "all"])
def test_empirical_distribution_chi_square(name, params):
    v, n = 37, 6000
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(v, generator=gen) * 1.5
    allowed = torch.rand(v, generator=gen) < 0.6
    ref, _ = oracle.sampling_probs(logits.double().numpy(), allowed.numpy(), **params)
    tok = _draw_many(logits, allowed, params, n)
    obs = np.bincount(tok, minlength=v)
    assert oracle.chisquare_pvalue(obs, ref) > 1e-3
    # mutation check: the unmasked distribution must be rejected by the same test
    wrong, _ = oracle.sampling_probs(logits.double().numpy(), None, **params)
    wrong_tok = _draw_many(logits, None, params, n)
    assert oracle.chisquare_pvalue(np.bincount(wrong_tok, minlength=v), ref) < 1e-6


def test_legal_token_outside_unconstrained_top20_is_reachable():
    v = 70
    logits = torch.linspace(10, 0, v)  # token i has rank i
    allowed = torch.zeros(v, dtype=torch.bool)
    allowed[[30, 45, 69]] = True       # all legal tokens rank >= 30
    params = dict(top_k=20)
    probs, err = target_probs(logits[None], _st(1, params), pack_bitmask(allowed)[None], None)
    ref, _ = oracle.sampling_probs(logits.double().numpy(), allowed.numpy(), **params)
    np.testing.assert_allclose(probs[0].double().numpy(), ref, atol=1e-6)
    assert probs[0, 30] > 0.5 and probs[0, 69] > 0
    tok = _draw_many(logits, allowed, params, 3000)
    assert set(np.unique(tok)) == {30, 45, 69}
    # greedy picks the best legal token, not the unconstrained argmax 0
    tok, _ = sample(logits[None], _st(1, dict(temperature=0.0)), pack_bitmask(allowed)[None], None,
                    torch.zeros(1, dtype=torch.int64))
    assert tok.item() == 30


def test_fewer_legal_tokens_than_top_k():
    v = 37
    logits = torch.randn(v, generator=torch.Generator().manual_seed(1))
    logits[7] = float("-inf")          # legal but impossible: not part of the support
    allowed = torch.zeros(v, dtype=torch.bool)
    allowed[[3, 7, 20]] = True
    params = dict(top_k=10, temperature=1.3)
    probs, err = target_probs(logits[None], _st(1, params), pack_bitmask(allowed)[None], None)
    assert err.item() == SAMPLE_OK
    support = set(torch.nonzero(probs[0]).flatten().tolist())
    assert support == {3, 20}
    ref, _ = oracle.sampling_probs(logits.double().numpy(), allowed.numpy(), **params)
    np.testing.assert_allclose(probs[0].double().numpy(), ref, atol=1e-6)
    tok = _draw_many(logits, allowed, params, 2000)
    assert set(np.unique(tok)) == {3, 20}


def test_greedy_ties_to_smaller_id():
    v = 70
    logits = torch.zeros(v)
    logits[[9, 40, 65]] = 5.0
    logits[2] = 9.0                     # unconstrained argmax, illegal below
    allowed = torch.ones(v, dtype=torch.bool)
    allowed[2] = False
    st = _st(1, dict(temperature=0.0))
    pos = torch.zeros(1, dtype=torch.int64)
    tok, _ = sample(logits[None], st, pack_bitmask(allowed)[None], None, pos)
    assert tok.item() == 9
    allowed[9] = False
    tok, _ = sample(logits[None], st, pack_bitmask(allowed)[None], None, pos)
    assert tok.item() == 40
    probs, _ = target_probs(logits[None], st, pack_bitmask(allowed)[None], None)
    assert probs[0, 40] == 1 and probs.sum() == 1
    # unmasked greedy: argmax 2
    tok, _ = sample(logits[None], st, None, None, pos)
    assert tok.item() == 2


def test_errors_fail_only_their_rows():
    v = 37
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(7, v, generator=gen)
    allowed = torch.rand(7, v, generator=gen) < 0.5
    allowed[:, 1] = True
    allowed[1] = False                  # empty mask
    logits[2, 4] = float("nan")         # NaN (even on an illegal token)
    logits[3, 5] = float("inf")
    logits[4] = float("-inf")           # every legal logit -inf
    allowed[5] = False                  # empty words, but row disabled: fine
    logits[6, 0] = float("nan")         # empty mask + NaN: empty mask wins
    allowed[6] = False
    enabled = torch.tensor([True, True, True, True, True, False, True])
    st = _st(7, dict(temperature=0.9, top_k=5))
    pos = torch.arange(7, dtype=torch.int64)
    words = pack_bitmask(allowed)
    tok, err = sample(logits, st, words, enabled, pos)
    assert err.tolist() == [SAMPLE_OK, SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SAMPLE_ERR_NONFINITE,
                            SAMPLE_ERR_NONFINITE, SAMPLE_OK, SAMPLE_ERR_EMPTY_MASK]
    assert tok[[1, 2, 3, 4, 6]].tolist() == [-1] * 5
    probs, _ = target_probs(logits, st, words, enabled)
    assert torch.isfinite(probs).all()
    assert (probs[[1, 2, 3, 4, 6]] == 0).all()
    # the good rows are exactly what they would be alone
    for r in (0, 5):
        t1, _ = sample(logits[r:r + 1], _st(1, dict(temperature=0.9, top_k=5)), words[r:r + 1],
                       enabled[r:r + 1], pos[r:r + 1])
        assert t1.item() == tok[r].item() and allowed[0, tok[0]]


def test_batch_invariance():
    v = 70
    gen = torch.Generator().manual_seed(9)
    row = torch.randn(v, generator=gen)
    allowed = torch.rand(v, generator=gen) < 0.7
    params = dict(temperature=1.1, top_p=0.95)
    results = []
    for b, lane in ((1, 0), (4, 3), (13, 6)):
        logits = torch.randn(b, v, generator=gen)
        logits[lane] = row
        al = torch.rand(b, v, generator=gen) < 0.5
        al[lane] = allowed
        seeds = torch.randint(0, 2**40, (b,), generator=gen)
        seeds[lane] = 1234
        pos = torch.randint(0, 100, (b,), generator=gen)
        pos[lane] = 17
        st = SamplingTensors.make(b, seed=seeds, temperature=1.1, top_p=0.95)
        enabled = torch.ones(b, dtype=torch.bool)
        tok, _ = sample(logits, st, pack_bitmask(al), enabled, pos)
        results.append(tok[lane].item())
    assert len(set(results)) == 1


def test_distinct_positions_are_independent_draws():
    v, n = 37, 6000
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(v, generator=gen)
    allowed = torch.zeros(v, dtype=torch.bool)
    allowed[[1, 4, 9, 33]] = True
    ref, _ = oracle.sampling_probs(logits.double().numpy(), allowed.numpy())
    seeds = torch.arange(n, dtype=torch.int64)
    words = pack_bitmask(allowed).expand(n, -1).contiguous()
    lg = logits.expand(n, v).contiguous()
    st = SamplingTensors.make(n, seed=seeds)
    t0, _ = sample(lg, st, words, None, torch.full((n,), 5, dtype=torch.int64))
    t1, _ = sample(lg, st, words, None, torch.full((n,), 6, dtype=torch.int64))
    t0b, _ = sample(lg, st, words, None, torch.full((n,), 5, dtype=torch.int64), purpose=Purpose.BONUS)
    for a, b in ((t0, t1), (t0, t0b)):
        pair = (a * v + b).numpy()
        obs = np.bincount(pair, minlength=v * v)
        assert oracle.chisquare_pvalue(obs, np.outer(ref, ref).flatten()) > 1e-3
    assert (t0 != t1).any()
