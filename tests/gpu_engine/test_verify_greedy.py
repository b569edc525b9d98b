"""verify_greedy (the speculative Finish graphs' all-greedy mode) gives verify's result at temperature 0.

Random steps built to reach every branch of verify: drafts that follow the legal argmax for a while and
then leave it, illegal drafts, EOS drafts, rows without drafts, READY / DEAD_END / UNREACHABLE /
UNCONSTRAINED positions, empty masks, NaN / +inf logits, exact ties (the smaller id wins), draft ids
outside the vocabulary, unmasked steps; the per-position greedy tokens come from the torch sampler at
temperature 0 (what the graph's CPU path uses) and, on CUDA, from the fused kernel.
"""
from __future__ import annotations

import os

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


def test_columns_past_num_drafts_whose_argmax_is_token_0():
    """Ignored draft columns hold token 0 in verify: where token 0 is also the legal argmax, the columns past
    num_drafts must still not count as accepted."""
    b, k, v = 3, 3, 16
    logits = torch.zeros(b, k + 1, v)
    logits[:, :, 0] = 5.0  # token 0 is the argmax everywhere
    drafts = torch.zeros(b, k, dtype=torch.int64)  # every draft (and every ignored column) is token 0
    nd = torch.tensor([0, 1, 2], dtype=torch.int32)
    eos = torch.tensor([v - 1])
    ref = verify(logits, drafts, SamplingTensors.make(b, temperature=0.0), None, None, None, nd, eos,
                 torch.zeros(b, dtype=torch.int64))
    flat_words, enabled, st = position_mask_inputs(None, None, b, k + 1, logits.device)
    n = b * (k + 1)
    tok, perr = sample(logits.flatten(0, 1), SamplingTensors.make(n, temperature=0.0), flat_words, enabled,
                       torch.zeros(n, dtype=torch.int64))
    got = verify_greedy(tok.view(b, k + 1), perr.view(b, k + 1), drafts, st, nd, eos, v)
    assert ref.num_accepted_drafts.tolist() == [0, 1, 2]
    for name in ("tokens", "num_tokens", "num_accepted_drafts", "err"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name


def _program(max_lanes=8, k=3):
    import uuid

    from test_spec_step_engine import V, BigramModel
    from gpu_engine.engine.loop import ring_geometry
    from gpu_engine.executor.cuda_graph import CudaProgram
    from shared_memory.ring import MaskRing

    ring = MaskRing.create(f"ninfer-test-greedy-{os.getpid()}-{uuid.uuid4().hex[:8]}", ring_geometry(max_lanes, k, V))
    table = torch.randn(V, V)
    prog = CudaProgram(BigramModel(table, max_lanes), V, torch.device("cpu"), ring, use_graphs=False,
                       prefill_graphs="off", spec_graphs=True)
    return prog, ring, V


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_finish_phase_greedy_mode_equals_verify_modes(masked):
    """The speculative Finish phase itself (CudaProgram on the CPU, uncaptured): with every lane at temperature
    0 the greedy mode writes the same _spec_out as the plain and filters modes (verify) for random static
    buffers: garbage words at DEAD_END / UNREACHABLE / UNCONSTRAINED positions and in disabled rows, lanes with
    top-k / top-p / min-p set (ignored at T = 0), drafts past the vocabulary, ties."""
    from gpu_engine.executor.graph_capture import _SPEC_ENABLED, _SPEC_LANES, _SPEC_NDRAFTS, _SPEC_POS

    prog, ring, v = _program()
    try:
        L, T = prog.max_lanes, prog.spec_t
        g = np.random.default_rng(0)
        for trial in range(60):
            b = int(g.integers(1, L + 1))
            lanes = g.permutation(L)[:b]
            logits = torch.tensor(g.normal(size=(L, T, v)) * 2, dtype=torch.float32)
            logits[:, :, :6] = torch.tensor(np.round(g.normal(size=(L, T, 6))), dtype=torch.float32)  # ties
            greedy = logits.argmax(-1)
            prog.spec_logits.copy_(logits)
            ids = torch.tensor(g.integers(-2, v + 3, size=(L, T)), dtype=torch.int64)
            follow = torch.tensor(g.random((L, T)) < 0.6)  # many drafts = the unconstrained argmax
            ids[:, 1:] = torch.where(follow[:, 1:], greedy[:, :-1], ids[:, 1:])
            prog._spec_ids.copy_(ids.clamp_min(0))
            prog.words.copy_(torch.tensor(g.integers(-2**31, 2**31 - 1, size=prog.words.shape), dtype=torch.int32))
            prog.words[..., :] |= torch.tensor(g.random(prog.words.shape) < 0.3, dtype=torch.int32)  # bit 0 often
            st = g.choice([STATUS_READY] * 5 + [STATUS_DEAD_END, STATUS_UNREACHABLE, STATUS_UNCONSTRAINED],
                          size=(L, T))
            prog.status.copy_(torch.tensor(st, dtype=torch.uint8))
            x = torch.zeros_like(prog._spec_in)
            x[_SPEC_LANES, :b] = torch.tensor(lanes)
            x[_SPEC_POS, :b] = torch.tensor(g.integers(0, 100, size=b))
            x[_SPEC_NDRAFTS, :b] = torch.tensor(g.integers(0, T, size=b))
            x[_SPEC_ENABLED, :b] = torch.tensor(g.random(b) < 0.7)
            prog._spec_in.copy_(x)
            prog._eos.fill_(-1)
            prog._eos[0] = int(g.integers(v))
            prog._lane_f32[0].zero_()  # temperature 0 on every lane
            prog._lane_f32[1].copy_(torch.tensor(np.where(g.random(L) < 0.5, 1.0, g.uniform(0.05, 1, L)), dtype=torch.float32))
            prog._lane_f32[2].copy_(torch.tensor(np.where(g.random(L) < 0.5, 0.0, g.uniform(0, 1, L)), dtype=torch.float32))
            prog._lane_i64[0].copy_(torch.tensor(np.where(g.random(L) < 0.5, 0, g.integers(1, 5, L))))  # filters (ignored at T=0)
            prog._lane_i64[1].copy_(torch.tensor(g.integers(0, 1000, size=L)))
            outs = {}
            for mode in ("greedy", "plain", "filters"):
                prog._spec_out.fill_(-7)
                prog._spec_finish_phase(b, masked, mode)
                outs[mode] = prog._spec_out[:b].clone()
            assert torch.equal(outs["greedy"], outs["plain"]), (trial, outs["greedy"], outs["plain"])
            assert torch.equal(outs["greedy"], outs["filters"]), trial
    finally:
        ring.close()
        ring.unlink()
