"""Batched prefill (right-padded, token budget, chunked) vs one-by-one prefill.

Padding positions write KV past each prompt's end; those positions are
rewritten by the next decode token before anything attends to them, so the
logits of the prompt's last position, the KV of the real positions and the
following decode steps equal those of a one-by-one prefill.
"""
from __future__ import annotations

import pytest
import torch

import gpu_engine.executor.eager as program_mod
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.executor.eager import Program
from gpu_engine.core.batch import build_step_batch
from gpu_engine.core.request import Request, SamplingOptions

V = 301
S = 48  # lane length


def _model(lanes: int = 6, device: str = "cpu"):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="llama", vocab_size=V, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      attention_bias=False, qk_norm=False, max_position=S)
    return build_model(cfg, device, torch.float32, max_lanes=lanes, max_seq_len=S, weights="random", seed=3)


def _t(x, model):
    return torch.tensor(x, device=model.device)


def _one_by_one(model, lane: int, ids: list[int]) -> torch.Tensor:
    return model(_t([ids], model), _t([lane], model), _t([0], model), last_only=True)[0, 0]


def _decode(model, lanes: list[int], toks: list[int], pos: list[int]) -> torch.Tensor:
    return model(_t(toks, model)[:, None], _t(lanes, model), _t(pos, model))[:, 0]


DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk,budget", [(512, 4096), (5, 4096), (512, 24), (7, 20)],
                         ids=["one-forward", "chunked", "small-budget", "chunked-small-budget"])
def test_batched_prefill_matches_one_by_one(monkeypatch, chunk: int, budget: int, device: str) -> None:
    torch.set_num_threads(2)
    monkeypatch.setattr(program_mod, "PREFILL_CHUNK", chunk)
    g = torch.Generator().manual_seed(1)
    lens = [9, 3, 17, 1, 12, S - 2]  # the last one fills its lane: it may not be padded past it
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in lens]
    ref = _model(device=device)
    ref.kv.reserve_all()  # the reference drives forward directly
    want = torch.stack([_one_by_one(ref, lane, p) for lane, p in enumerate(prompts)])
    ours = _model(device=device)
    prog = Program(ours, V, torch.device(device))
    prog.prefill_token_budget = budget
    rows = [Request(f"r{i}", p, 4, SamplingOptions()) for i, p in enumerate(prompts)]
    order = [3, 0, 5, 2, 1, 4]  # lanes in another order than the rows
    for r, lane in zip(rows, order):
        r.lane = lane
    got = prog._prefill_rows(rows)  # the reference used lane == prompt index
    assert got.shape == (len(rows), V)
    tol = 2e-3 if device == "cuda" else 1e-4  # CUDA: other GEMM shapes, other reduction orders
    assert (got - want).abs().max().item() < tol
    assert [r.num_cached for r in rows] == lens
    for i, (r, n) in enumerate(zip(rows, lens)):
        for a, b in zip(ours.kv.lane_view(slice(None), r.lane, n), ref.kv.lane_view(slice(None), i, n)):
            assert (a - b).abs().max().item() < tol, (i, n)
    # two decode steps after the prefill (rows short enough): same logits
    live = [i for i, n in enumerate(lens) if n + 2 < S]
    toks = [int(want[i].argmax()) for i in live]
    for step in range(2):
        a = _decode(ours, [rows[i].lane for i in live], toks, [lens[i] + step for i in live])
        b = _decode(ref, live, toks, [lens[i] + step for i in live])
        assert (a - b).abs().max().item() < tol
        toks = [int(x) for x in b.argmax(-1)]


def test_forward_batches_prefill_with_decode_rows() -> None:
    """Program.forward: prefill rows of one step in one forward, decode rows beside them."""
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(2)
    ref, ours = _model(), _model()
    ref.kv.reserve_all()  # the reference drives forward directly
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 11, 2)]
    prog = Program(ours, V, torch.device("cpu"))
    calls = []
    fwd = ours.forward

    def counting(*a, **kw):
        calls.append(tuple(a[0].shape))
        return fwd(*a, **kw)

    ours.forward = counting
    rows = [Request(f"r{i}", p, 4, SamplingOptions()) for i, p in enumerate(prompts)]
    for lane, r in enumerate(rows):
        r.lane = lane
    # row 0 is already decoding: prefill it first
    out0 = prog.forward(build_step_batch(rows[:1]))
    rows[0].output_ids.append(int(out0[0, 0].argmax()))
    calls.clear()
    out = prog.forward(build_step_batch(rows))
    assert sorted(calls) == [(1, 1), (2, 11)]  # one decode forward, one batched prefill forward
    want0 = _one_by_one(ref, 0, prompts[0])
    assert (out0[0, 0] - want0).abs().max().item() < 1e-4
    dec = _decode(ref, [0], [rows[0].output_ids[-1]], [len(prompts[0])])[0]
    assert (out[0, 0] - dec).abs().max().item() < 1e-4
    for i in (1, 2):
        assert (out[i, 0] - _one_by_one(ref, i, prompts[i])).abs().max().item() < 1e-4


def test_logit_index_gathers_before_head() -> None:
    m = _model()
    ids = torch.randint(0, V, (2, 6))
    full = m(ids, torch.tensor([0, 1]), torch.tensor([0, 0]))
    m2 = _model()
    got = m2(ids, torch.tensor([0, 1]), torch.tensor([0, 0]), logit_index=torch.tensor([2, 5]))
    assert got.shape == (2, 1, V)
    assert torch.allclose(got[0, 0], full[0, 2], atol=1e-5) and torch.allclose(got[1, 0], full[1, 5], atol=1e-5)
