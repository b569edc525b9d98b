"""Drafters (gpu_engine/drafters.py): prompt lookup, early exit (greedy / sampled) and the early-exit KV reasoning."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_engine.spec.drafters import EarlyExitDrafter, NgramDrafter, ngram_propose
from gpu_engine.spec.registry import make_drafter
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.core.batch import build_step_batch
from gpu_engine.core.request import Request, SamplingOptions


# ----------------------------------------------------------------------- n-gram
@pytest.mark.parametrize("context,k,expected", [
    pytest.param([1, 2, 3, 4, 5, 1, 2, 3], 3, [4, 5, 1], id="trigram-continuation"),
    pytest.param([1, 2, 3, 4, 5, 1, 2, 3], 1, [4], id="truncated-to-k"),
    pytest.param([7, 2, 3, 9, 8, 2, 3, 5, 1, 2, 3], 2, [5, 1], id="most-recent-occurrence"),
    pytest.param([1, 2, 3, 4, 9, 3, 4, 6, 2, 3, 4], 2, [9, 3], id="longest-n-wins"),  # 3-gram 2,3,4 over 2-gram 3,4
    pytest.param([5, 6, 7], 2, [], id="no-match"),
    pytest.param([7, 8, 7], 4, [8, 7], id="unigram-overlapping-suffix"),
    pytest.param([4, 4, 4, 4], 3, [4], id="repeat-run"),  # match at j=0, continuation runs into the suffix
    pytest.param([1], 3, [], id="too-short"),
    pytest.param([1, 2, 1], 0, [], id="k-zero"),
])
def test_ngram_propose(context, k, expected):
    assert ngram_propose(context, k) == expected


def _ngram_reference(context, k, max_n=3, min_n=1):
    """The definition, by brute force: the most recent earlier occurrence of the longest suffix n-gram."""
    n_ctx = len(context)
    if k <= 0 or n_ctx < 2:
        return []
    for n in range(min(max_n, n_ctx - 1), min_n - 1, -1):
        hits = [j for j in range(n_ctx - n) if context[j:j + n] == context[n_ctx - n:]]
        if hits:
            return context[hits[-1] + n: hits[-1] + n + k]
    return []


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.integers(0, 6), st.integers(1, 4), st.integers(1, 4))
def test_ngram_propose_matches_its_definition(context, k, max_n, min_n):
    """Random contexts over a small alphabet (many repeats, overlapping runs): the vectorised search
    returns what the brute-force definition returns."""
    assert ngram_propose(context, k, max_n, min_n) == _ngram_reference(context, k, max_n, min_n)


def test_ngram_drafter_uses_prompt_and_output():
    r = Request("r", prompt_ids=[10, 11, 12, 13, 14], max_tokens=8, sampling=SamplingOptions())
    r.output_ids = [11, 12]
    assert NgramDrafter().propose(r, 3) == [13, 14, 11]
    assert NgramDrafter().propose_batch([r, r], [1, 2]) == [[13], [13, 14]]


def test_make_drafter_errors():
    with pytest.raises(ValueError, match="unknown speculative method"):
        make_drafter("medusa", None)


# ------------------------------------------------------------------- early exit
V = 101  # not a multiple of 32
NUM_LAYERS = 4


class _Prog:
    """The part of a Program the drafter reads: model, device, context buckets."""

    def __init__(self, model):
        self.model, self.device = model, model.device
        self.max_seq_len = model.max_seq_len

    def _bucket(self, n):
        from gpu_engine.model.llama import context_bucket

        return context_bucket(n, self.max_seq_len, granularity=16)


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=NUM_LAYERS,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position=64)
    # float64 so that a T=1 pass and a T=K+1 pass agree to ~1e-15 (the ids comparisons below are exact).
    m = build_model(cfg, "cpu", torch.float64, max_lanes=8, max_seq_len=64, weights="random", seed=3)
    m.kv.reserve_all()  # _prefill drives forward directly
    return m


def _prefill(model, lane, ids):
    model.forward(torch.tensor([ids]), torch.tensor([lane]), torch.tensor([0]))


def _row(lane, prompt, out, temperature=0.0, seed=0):
    r = Request(f"r{lane}", prompt_ids=list(prompt), max_tokens=32,
                sampling=SamplingOptions(temperature=temperature, seed=seed))
    r.lane, r.output_ids = lane, list(out)
    r.num_cached = len(prompt) + len(out) - 1  # the last output token is this step's input
    return r


def _reference_greedy(model, lane, context, k, layers):
    """Drafts by re-running the whole context through the first ``layers`` layers each time (no reuse)."""
    ctx = list(context)
    out = []
    for _ in range(k):
        lg = model.forward(torch.tensor([ctx]), torch.tensor([lane]), torch.tensor([0]), num_layers=layers)
        out.append(int(lg[0, -1].argmax()))
        ctx.append(out[-1])
    return out


def test_early_exit_greedy_matches_reference_and_is_batch_invariant(model):
    prompts = {0: [5, 9, 2, 7], 1: [3, 3, 8], 2: [1, 4, 1, 5, 9, 2, 6]}
    rows = []
    for lane, p in prompts.items():
        _prefill(model, lane, p[:-1])
        rows.append(_row(lane, p[:-1], [p[-1]]))
    d = EarlyExitDrafter(_Prog(model), num_layers=2)
    ks = [3, 1, 4]
    batched = d.propose_batch(rows, ks)
    for r, k, got in zip(rows, ks, batched):
        assert got == _reference_greedy(model, 7, prompts[r.lane], k, 2)
        assert d.propose(r, k) == got  # alone == in a batch
    assert EarlyExitDrafter(_Prog(model)).num_layers == NUM_LAYERS // 4
    with pytest.raises(ValueError, match="draft layers"):
        EarlyExitDrafter(_Prog(model), num_layers=NUM_LAYERS + 1)


def test_early_exit_kv_writes_never_change_the_verify_pass(model):
    """The claim in drafters.py: draft-pass KV writes are overwritten before any read.

    Lane 0 drafts (writing layer < L KV at c .. c+k-1), lane 1 instead holds garbage at
    those positions; the verify forward ([last] + drafts at c .. c+k, all layers) gives
    bit-identical logits and leaves bit-identical KV in both lanes. The draft KV itself
    equals the full model's KV for those positions (up to rounding). After accepting
    only one draft, the next step (which starts at c + 2, leaving stale KV of rejected
    drafts at c + 2 .. c + k) matches a lane that never saw those drafts.
    """
    prompt, last, k, layers = [5, 9, 2, 7, 4, 4], 11, 3, 2
    c = len(prompt)
    for lane in (0, 1, 2):
        _prefill(model, lane, prompt)
    drafts = EarlyExitDrafter(_Prog(model), num_layers=layers).propose(_row(0, prompt, [last]), k)
    draft_k = model.kv.lane_view(slice(0, layers), 0, c + k)[0][..., c:, :]
    g = torch.Generator().manual_seed(0)
    model.kv.reserve(1, c + k + 1)  # lane 1: garbage where lane 0's draft pass wrote
    shape = model.kv.lane_view(slice(None), 1, k + 1)[0].shape
    model.kv.write_lane(slice(None), 1, c, torch.randn(shape, generator=g, dtype=model.dtype),
                        torch.randn(shape, generator=g, dtype=model.dtype))
    seq = torch.tensor([[last] + drafts])
    out = [model.forward(seq, torch.tensor([lane]), torch.tensor([c])) for lane in (0, 1)]
    assert torch.equal(out[0], out[1])
    for a, b in zip(model.kv.lane_view(slice(None), 0, c + k + 1), model.kv.lane_view(slice(None), 1, c + k + 1)):
        assert torch.equal(a, b)
    torch.testing.assert_close(draft_k, model.kv.lane_view(slice(0, layers), 0, c + k)[0][..., c:, :],
                               rtol=1e-12, atol=1e-12)
    # Accept drafts[0] only, correction x: next step input x at c + 2; lane 2 never saw the rejected tail.
    x = (drafts[1] + 1) % V
    model.forward(torch.tensor([[last, drafts[0]]]), torch.tensor([2]), torch.tensor([c]))
    nxt = [model.forward(torch.tensor([[x, 3, 1]]), torch.tensor([lane]), torch.tensor([c + 2])) for lane in (0, 2)]
    torch.testing.assert_close(nxt[0], nxt[1], rtol=1e-12, atol=1e-12)


def _oracle():
    import ninfer_tests_gpu_engine_oracle  # loaded by conftest.py

    return ninfer_tests_gpu_engine_oracle


def test_early_exit_sampled_q_matches_drafter_and_draws_follow_q(model):
    prompt, last = [5, 9, 2, 7], 11
    lanes = list(range(8))
    for lane in lanes:
        _prefill(model, lane, prompt)
    d = EarlyExitDrafter(_Prog(model), num_layers=2, sampled=True)
    temp = 1.7
    firsts = []
    for rnd in range(40):
        rows = [_row(lane, prompt, [last], temperature=temp, seed=1000 * rnd + lane) for lane in lanes]
        for r, (ids, (q_ids, q_probs)) in zip(rows, d.propose_batch(rows, [2] * len(rows))):
            assert len(ids) == 2 and q_ids.shape == (2, 16) and q_probs.dtype == torch.float32
            torch.testing.assert_close(q_probs.sum(-1), torch.ones(2, dtype=torch.float32))
            for j in range(2):
                assert ids[j] in q_ids[j].tolist() and float(q_probs[j][q_ids[j] == ids[j]].sum()) > 0
            firsts.append(ids[0])
    # q of the first draft: softmax(top16(logits) / T) of the L-layer network
    lg = model.forward(torch.tensor([prompt + [last]]), torch.tensor([7]), torch.tensor([0]), num_layers=2)[0, -1]
    vals, ids = torch.topk(lg.double(), 16)
    q = torch.softmax(vals / temp, -1).numpy()
    obs = np.array([sum(f == int(t) for f in firsts) for t in ids])
    assert obs.sum() == len(firsts)
    assert _oracle().chisquare_pvalue(obs, q) > 1e-3
    # q reported for the first draft equals that distribution
    r = _row(0, prompt, [last], temperature=temp, seed=5)
    _, (q_ids, q_probs) = d.propose(r, 1)
    assert q_ids[0].tolist() == ids.tolist()
    torch.testing.assert_close(q_probs[0].double(), torch.tensor(q), rtol=1e-5, atol=1e-6)


def test_early_exit_sampled_greedy_rows_get_one_hot_q(model):
    prompt, last = [3, 1, 4], 1
    _prefill(model, 0, prompt)
    greedy = EarlyExitDrafter(_Prog(model), num_layers=2).propose(_row(0, prompt, [last]), 3)
    ids, (q_ids, q_probs) = EarlyExitDrafter(_Prog(model), num_layers=2, sampled=True).propose(
        _row(0, prompt, [last], temperature=0.0), 3)
    assert ids == greedy
    assert q_ids[:, 0].tolist() == greedy and (q_ids[:, 1:] == -1).all()
    assert q_probs[:, 0].tolist() == [1.0] * 3 and (q_probs[:, 1:] == 0).all()


# ------------------------------------------------ device-side drafts (draft-ready overlap)
def test_propose_batch_device_on_cpu_is_trivially_ready_and_matches_propose_batch(model):
    from gpu_engine.spec.drafters import DeviceDrafts

    prompts = {0: [5, 9, 2, 7], 1: [3, 3, 8]}
    rows = []
    for lane, p in prompts.items():
        _prefill(model, lane, p[:-1])
        rows.append(_row(lane, p[:-1], [p[-1]], temperature=0.9, seed=lane))
    for sampled in (False, True):
        d = EarlyExitDrafter(_Prog(model), num_layers=2, sampled=sampled)
        dd = d.propose_batch_device(rows, [3, 1])
        assert isinstance(dd, DeviceDrafts) and dd.event is None and dd.ready() and dd.wait() == 0.0
        assert dd.ids.shape == (2, 3) and dd.ids[1, 1:].tolist() == [-1, -1]  # padding past ks
        assert dd.lanes == [0, 1] and (dd.q is not None) == sampled
        got, ref = dd.proposals(), d.propose_batch(rows, [3, 1])
        for g, r in zip(got, ref):
            if sampled:
                assert g[0] == r[0] and torch.equal(g[1][0], r[1][0]) and torch.equal(g[1][1], r[1][1])
            else:
                assert g == r


def test_forward_with_deferred_drafts_equals_forward_with_host_drafts(model):
    """Device-side draft ids scattered into [last] + drafts give the very logits of the host path:
    mixed deferred (two k) / host-drafted / draft-less / prefill / near-max_seq_len rows."""
    from gpu_engine.executor.eager import Program

    prog = Program(model, V, torch.device("cpu"))
    seq = model.max_seq_len  # 64
    g = torch.Generator().manual_seed(1)
    prompts = {lane: torch.randint(0, V, (n,), generator=g).tolist() for lane, n in
               [(0, 6), (1, 5), (2, 9), (3, 4), (5, seq - 3)]}
    rows = {}
    for lane, p in prompts.items():
        _prefill(model, lane, p[:-1])
        rows[lane] = _row(lane, p[:-1], [p[-1]])
    pre = Request("pre", prompt_ids=[4, 8, 15, 16], max_tokens=8, sampling=SamplingOptions())
    pre.lane = 4
    d = EarlyExitDrafter(_Prog(model), num_layers=2)
    dd = d.propose_batch_device([rows[0], rows[2], rows[5]], [3, 1, 2])  # lane 5: 61 cached + T=4 > 64
    host = {1: [7, 3]}
    order = [rows[1], rows[0], pre, rows[3], rows[2], rows[5]]
    ref_drafts = dict(host)
    for r, p in zip(dd.rows, dd.proposals()):
        ref_drafts[r.lane] = p
    ref = prog.forward(build_step_batch(order, ref_drafts))
    pre.num_cached = 0  # run the prefill row again
    got = prog.forward(build_step_batch(order, host, deferred=[dd]))
    assert got.shape == ref.shape == (6, 4, V)
    for i, r in enumerate(order):
        n = 1 if r is pre else 1 + len(ref_drafts.get(r.lane, []))
        assert torch.equal(got[i, :n], ref[i, :n]), (i, r.lane)
    # the common case (all rows decode, one forward, in order) returns the forward's logits directly
    dd2 = d.propose_batch_device([rows[0], rows[2]], [2, 2])
    got2 = prog.forward(build_step_batch([rows[0], rows[2]], deferred=[dd2]))
    assert got2.shape == (2, 3, V)
