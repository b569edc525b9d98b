"""Sampling at the edges of the float range against the float64 oracle (issue 14, defect 5).

Property test (hypothesis): any float32 temperature from the smallest subnormal to 1e4, top-p down
to the smallest subnormal, min-p, top-k and penalties at the limits of their public ranges
([-2, 2], seed 000 "采样" / server validation), with or without a bitmask. ``target_probs`` must
equal the float64 oracle's distribution, draw only legal tokens, and never report an error on a
row that has a legal finite logit.

Inputs are chosen exactly representable in float32 (logits in 1/64 steps, penalties in 1/8 steps,
repetition factors powers of two), so both sides see the same penalised logits; cases whose
top-p / min-p cut lies within float32 rounding of a boundary are skipped (either answer is right).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpu_engine.sample.bitmask import pack_bitmask
from gpu_engine.sample.sampler import SAMPLE_OK, SamplingTensors, sample, target_probs

import ninfer_tests_gpu_engine_oracle as oracle  # loaded by conftest.py

F32_TINY = float(np.float32(1.4e-45))  # smallest positive float32 (subnormal)


def f32(x: float) -> float:
    """``x`` rounded to float32 (hypothesis wants float32-exact bounds for width=32)."""
    return float(np.float32(x))


@st.composite
def rows(draw):
    v = draw(st.integers(2, 48))
    logits = np.array(draw(st.lists(st.integers(-64 * 40, 64 * 40), min_size=v, max_size=v)), np.float64) / 64
    allowed = None
    if draw(st.booleans()):
        allowed = np.array(draw(st.lists(st.booleans(), min_size=v, max_size=v)))
        allowed[draw(st.integers(0, v - 1))] = True  # never empty (empty masks have their own test)
    temperature = draw(st.one_of(
        st.just(0.0),
        st.floats(F32_TINY, f32(1e-30), width=32),       # far below any logit gap: the greedy limit
        st.floats(f32(1e-30), f32(1e4), width=32),
    ))
    top_p = draw(st.one_of(st.just(1.0), st.floats(F32_TINY, f32(1e-6), width=32), st.floats(f32(0.05), 1.0, width=32)))
    min_p = draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0, width=32)))
    top_k = draw(st.integers(0, v))
    params = dict(temperature=float(temperature), top_p=float(top_p), min_p=float(min_p), top_k=top_k)
    counts = None
    if draw(st.booleans()):
        counts = np.array(draw(st.lists(st.integers(0, 3), min_size=v, max_size=v)), np.int32)
        params.update(presence=draw(st.integers(-16, 16)) / 8, frequency=draw(st.integers(-16, 16)) / 8,
                      repetition=draw(st.sampled_from([0.5, 1.0, 2.0])))
    return logits, allowed, counts, params


def _near_a_cut(ref: np.ndarray, params: dict) -> bool:
    """True when the top-p or min-p cut of the oracle lies within float32 rounding of a kept token."""
    p = np.sort(ref[ref > 0])[::-1]
    if p.size == 0:
        return False
    eps = 1e-5
    near_min_p = params["min_p"] > 0 and np.any(np.abs(p - params["min_p"] * p[0]) <= eps * p[0])
    csum = np.cumsum(p) - p
    near_top_p = params["top_p"] < 1 and np.any(np.abs(csum - params["top_p"]) <= eps)
    return bool(near_min_p or near_top_p)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(rows())
def test_extreme_parameters_match_the_float64_oracle(row) -> None:
    logits, allowed, counts, params = row
    v = logits.size
    kw = {{"presence": "presence_penalty", "frequency": "frequency_penalty",
           "repetition": "repetition_penalty"}.get(k, k): val for k, val in params.items()}
    c = None if counts is None else torch.from_numpy(counts).unsqueeze(0)
    tensors = SamplingTensors.make(1, seed=11, output_counts=c, **kw)
    words = None if allowed is None else pack_bitmask(torch.from_numpy(allowed).unsqueeze(0))
    oracle_params = {k: val for k, val in params.items()}
    oracle_params["temperature"] = float(np.float32(params["temperature"]))
    ref, ref_err = oracle.sampling_probs(logits, allowed, counts=counts, **oracle_params)
    assume(not _near_a_cut(ref, params))
    probs, err = target_probs(torch.from_numpy(logits).float().unsqueeze(0), tensors, words)
    assert int(err[0]) == ref_err == SAMPLE_OK
    got = probs[0].double().numpy()
    assert np.isfinite(got).all() and abs(got.sum() - 1) < 1e-5, got
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-4)
    tok, err = sample(torch.from_numpy(logits).float().unsqueeze(0), tensors, words, None,
                      torch.zeros(1, dtype=torch.int64))
    assert int(err[0]) == SAMPLE_OK and 0 <= int(tok[0]) < v and ref[int(tok[0])] > 0, (int(tok[0]), ref)


@pytest.mark.parametrize("temperature", [1e-38, F32_TINY], ids=["1e-38", "subnormal"])
def test_tiny_temperature_is_the_legal_argmax(temperature: float) -> None:
    """The reported bug: T = 1e-38 with a mask drew token 0 outside the mask (NaN weights)."""
    v = 70
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, v, generator=gen) * 8
    allowed = torch.rand(4, v, generator=gen) < 0.3
    allowed[:, 0] = False
    allowed[:, 5] = True
    st_ = SamplingTensors.make(4, temperature=temperature, seed=3)
    tok, err = sample(logits, st_, pack_bitmask(allowed), None, torch.arange(4))
    legal_argmax = logits.masked_fill(~allowed, float("-inf")).argmax(-1)
    assert (err == SAMPLE_OK).all() and torch.equal(tok, legal_argmax), (tok, legal_argmax)
    tok, err = sample(logits, st_, None, None, torch.arange(4))  # unconstrained rows too
    assert (err == SAMPLE_OK).all() and torch.equal(tok, logits.argmax(-1))
