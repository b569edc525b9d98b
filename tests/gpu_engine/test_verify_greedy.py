"""verify_greedy (the speculative Finish graphs' all-greedy mode) gives verify's result at temperature 0.

Random steps built to reach every branch of verify: drafts that follow the legal argmax for a while and
then leave it, illegal drafts, EOS drafts, rows without drafts, READY / DEAD_END / UNREACHABLE /
UNCONSTRAINED positions, empty masks, NaN / +inf logits, exact ties (the smaller id wins), draft ids
outside the vocabulary, unmasked steps; the per-position greedy tokens come from the torch sampler at
temperature 0 (what the graph's CPU path uses) and, on CUDA, from the fused kernel.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_engine.sample.bitmask import pack_bitmask
from gpu_engine.sample.sampler import SamplingTensors, sample
from gpu_engine.spec.verify import (
    STATUS_DEAD_END,
    STATUS_READY,
    STATUS_UNCONSTRAINED,
    STATUS_UNREACHABLE,
    position_mask_inputs,
    verify,
    verify_greedy,
)

V = 70


def _step(seed: int, b: int = 6, k: int = 4, masked: bool = True, device: str = "cpu"):
    g = np.random.default_rng(seed)
    logits = torch.tensor(g.normal(size=(b, k + 1, V)) * 2, dtype=torch.float32)
    logits[:, :, :8] = torch.tensor(np.round(g.normal(size=(b, k + 1, 8))), dtype=torch.float32)  # ties
    allowed = g.random((b, k + 1, V)) < 0.5
    status = torch.tensor(g.choice([STATUS_READY] * 6 + [STATUS_DEAD_END, STATUS_UNREACHABLE, STATUS_UNCONSTRAINED],
                                   size=(b, k + 1)), dtype=torch.uint8)
    for i in range(b):
        if g.random() < 0.15:
            allowed[i, g.integers(k + 1)] = False  # an empty mask somewhere
        if g.random() < 0.1:
            logits[i, g.integers(k + 1), g.integers(V)] = float(g.choice([np.nan, np.inf]))
    eos_at = {i: int(g.integers(k)) for i in range(b) if g.random() < 0.3}  # an EOS draft, the legal argmax
    oov_at = {i: int(g.integers(k)) for i in range(b) if g.random() < 0.15}  # out of the vocabulary
    for i, j in eos_at.items():
        logits[i, j, 3], allowed[i, j, 3] = 40.0, True
    for i, j in oov_at.items():  # verify clamps the id to V - 1, here the legal argmax
        logits[i, j, V - 1], allowed[i, j, V - 1] = 50.0, True
    greedy = torch.where(torch.tensor(allowed), logits, float("-inf")).argmax(-1)
    drafts = torch.zeros(b, k, dtype=torch.int64)
    for i in range(b):
        follow = g.integers(k + 1)  # the first `follow` drafts are the legal argmax chain, then random
        for j in range(k):
            drafts[i, j] = int(greedy[i, j]) if j < follow else int(g.integers(V))
        if i in eos_at:
            drafts[i, eos_at[i]] = 3
        if i in oov_at:
            drafts[i, oov_at[i]] = V + 5
    words = pack_bitmask(torch.tensor(allowed).flatten(0, 1)).view(b, k + 1, -1)
    num_drafts = torch.tensor(g.integers(0, k + 1, size=b), dtype=torch.int32)
    eos = torch.tensor([3, -1], dtype=torch.int64)
    if not masked:
        words = status = None
    dev = torch.device(device)
    mv = (lambda t: None if t is None else t.to(dev))
    return (logits.to(dev), drafts.to(dev), mv(words), mv(status), num_drafts.to(dev), eos.to(dev),
            torch.tensor(g.integers(0, 50, size=b), dtype=torch.int64, device=dev))


def _greedy_tokens(logits, words, status, fused: bool):
    b, t, v = logits.shape
    flat_words, enabled, status = position_mask_inputs(words, status, b, t, logits.device)
    n = b * t
    zf = torch.zeros(n, dtype=torch.float32, device=logits.device)
    zi = torch.zeros(n, dtype=torch.int64, device=logits.device)
    if fused:
        from gpu_engine.sample.fused_sample import sample_fused

        tok, err = sample_fused(logits.flatten(0, 1), zf, zi, zi, flat_words, enabled)
    else:
        st = SamplingTensors.make(n, temperature=0.0, device=logits.device)
        tok, err = sample(logits.flatten(0, 1), st, flat_words, enabled, zi)
    return tok.view(b, t), err.view(b, t), status


def _check(seed, masked, device="cpu", fused=False):
    logits, drafts, words, status, nd, eos, positions = _step(seed, masked=masked, device=device)
    b = logits.shape[0]
    ref = verify(logits, drafts, SamplingTensors.make(b, temperature=0.0, seed=list(range(b)), device=device), words,
                 status, None, nd, eos, positions)
    tok, perr, st = _greedy_tokens(logits, words, status, fused)
    # verify_greedy reads no token of an error position: put the position's draft there (the worst value)
    tok = torch.where(perr != 0, torch.cat([drafts, drafts[:, :1]], 1).clamp(0, V - 1), tok)
    got = verify_greedy(tok, perr, drafts, st, nd, eos, V)
    for name in ("tokens", "num_tokens", "num_accepted_drafts", "err"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), (seed, name, getattr(got, name),
                                                                     getattr(ref, name))
    return ref


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_verify_greedy_equals_verify_at_temperature_zero(masked):
    seen = {"accepted": 0, "err": set(), "eos_end": 0}
    for seed in range(150):
        ref = _check(seed, masked)
        seen["accepted"] += int(ref.num_accepted_drafts.sum())
        seen["err"] |= set(ref.err.tolist())
        ok = ref.err == 0
        seen["eos_end"] += int((ok & (ref.num_tokens == ref.num_accepted_drafts) & (ref.num_tokens > 0)).sum())
    assert seen["accepted"] > 100 and seen["eos_end"] > 10  # the cases really reach acceptance, EOS ends ...
    if masked:  # ... and every error code (empty mask, non-finite, dead end, unreachable)
        assert {0, 1, 2, 3, 4} <= seen["err"], seen["err"]


def test_verify_greedy_detects_a_wrong_draw_column():
    """A mutation check: taking the bonus token from column 0 instead of the draw column differs."""
    logits, drafts, words, status, nd, eos, positions = _step(11)
    tok, perr, st = _greedy_tokens(logits, words, status, fused=False)
    good = verify_greedy(tok, perr, drafts, st, nd, eos, V)
    bad = verify_greedy(tok[:, :1].expand_as(tok).contiguous(), perr, drafts, st, nd, eos, V)
    assert not torch.equal(good.tokens, bad.tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_verify_greedy_from_the_fused_kernel_equals_verify_on_cuda(masked):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for seed in range(60):
        _check(seed, masked, device="cuda", fused=True)
