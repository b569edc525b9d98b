"""Masked sampling on the H200: CudaProgram's Finish graph against the float64 oracle.

``gpu`` marker: skipped where CUDA is unavailable (CI covers the same functions on
the CPU in test_sampling.py / test_cuda_program.py). Checks

* ``target_probs`` on CUDA against ``oracle.sampling_probs`` (V = 37, 70, 32011:
  not multiples of 32), mixed enabled/disabled rows;
* the captured Finish graph: greedy rows = legal argmax (ties to the smaller id),
  sampled rows follow the oracle distribution (chi-square over many output
  positions), empty-mask and non-finite rows fail alone with distinct codes;
* graph replay gives exactly the tokens of the same phase run eagerly, and the
  eager phase issues no host synchronisation.
"""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_engine.sample.bitmask import pack_bitmask
from gpu_engine.executor.cuda_graph import _FIN_ENABLED, _FIN_LANES, _FIN_POS, CudaProgram
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.sample.sampler import SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SAMPLE_OK, SamplingTensors, target_probs
from shared_memory.layout import RingGeometry
from shared_memory.ring import MaskRing

pytestmark = pytest.mark.gpu


import ninfer_tests_gpu_engine_oracle as oracle  # loaded by conftest.py
CONFIGS = [
    ("plain", dict()),
    ("temp0.7", dict(temperature=0.7)),
    ("topk5", dict(temperature=1.6, top_k=5)),
    ("topp0.8", dict(top_p=0.8)),
    ("minp0.15", dict(min_p=0.15)),
    ("all", dict(temperature=0.8, top_k=12, min_p=0.02, top_p=0.9)),
    ("greedy", dict(temperature=0.0)),
]


@pytest.mark.parametrize("vocab_size", [37, 70, 32011], ids=lambda v: f"V{v}")
@pytest.mark.parametrize("name,params", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_cuda_probs_match_oracle(vocab_size, name, params):
    if vocab_size > 100 and name not in ("plain", "all"):
        pytest.skip("large V: two configs suffice")
    b = 6
    gen = torch.Generator().manual_seed(hash((vocab_size, name)) % 2**31)
    logits = torch.randn(b, vocab_size, generator=gen) * 3
    allowed = torch.rand(b, vocab_size, generator=gen) < 0.5
    allowed[:, 0] = True
    enabled = torch.tensor([True] * (b - 2) + [False] * 2)
    st = SamplingTensors.make(b, device="cuda", **params)
    probs, err = target_probs(logits.cuda(), st, pack_bitmask(allowed).cuda(), enabled.cuda())
    probs, err = probs.cpu(), err.cpu()
    for r in range(b):
        ref, ref_err = oracle.sampling_probs(logits[r].double().numpy(),
                                             allowed[r].numpy() if enabled[r] else None, **params)
        assert int(err[r]) == ref_err == SAMPLE_OK
        np.testing.assert_allclose(probs[r].double().numpy(), ref, atol=2e-6, rtol=1e-4)


# ---------------------------------------------------------------- the Finish graph
V, LANES = 70, 8


@pytest.fixture(scope="module")
def prog():
    cfg = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, name="tiny")
    model = build_model(cfg, "cuda", torch.float32, LANES, 64, weights="random")
    ring = MaskRing.create("ninfer-test-cudasampling", RingGeometry(2, LANES, 1, V))
    p = CudaProgram(model, V, torch.device("cuda"), ring, use_graphs=True)
    yield p
    p.close()
    ring.close()
    ring.unlink()


def _set_rows(p, logits, allowed, enabled, params, positions):
    """Fill the Finish phase's static inputs for ``len(logits)`` rows in lanes 0..B-1."""
    b = logits.shape[0]
    p.logits[:b].copy_(logits)
    p.words[:b, 0].copy_(pack_bitmask(allowed).cuda())
    i64 = p._i64
    i64[_FIN_LANES, :b] = torch.arange(b, device="cuda")
    i64[_FIN_POS, :b] = positions.cuda()
    i64[_FIN_ENABLED, :b] = enabled.cuda().long()
    p._lane_f32[0, :b] = params.get("temperature", 1.0)
    p._lane_f32[1, :b] = params.get("top_p", 1.0)
    p._lane_f32[2, :b] = params.get("min_p", 0.0)
    p._lane_i64[0, :b] = params.get("top_k", 0)
    p._lane_i64[1, :b] = torch.arange(b, device="cuda") * 7919 + 11


def _finish(p, b, masked, filters, graph=True):
    if graph:
        p._run(p._fin_graphs, (b, masked, filters), None)
    else:
        p._finish_phase(b, masked, filters)
    torch.cuda.synchronize()
    return p._out[0, :b].cpu().clone(), p._out[1, :b].cpu().clone()


@pytest.mark.parametrize("name,params", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_finish_graph_distribution_matches_oracle(prog, name, params):
    b, launches = 8, 500
    gen = torch.Generator().manual_seed(5)
    row = torch.randn(V, generator=gen) * 1.5
    allowed_row = torch.rand(V, generator=gen) < 0.6
    allowed_row[3] = True
    filters = any(k in params for k in ("top_k", "top_p", "min_p"))
    ref, _ = oracle.sampling_probs(row.double().numpy(), allowed_row.numpy(), **params)
    counts = np.zeros(V)
    for i in range(launches):
        _set_rows(prog, row.expand(b, V).cuda(), allowed_row.expand(b, V), torch.ones(b, dtype=torch.bool),
                  params, torch.arange(b) + i * b)
        tok, err = _finish(prog, b, True, filters)
        assert (err == SAMPLE_OK).all()
        counts += np.bincount(tok.numpy(), minlength=V)
    if params.get("temperature", 1.0) == 0.0:
        assert counts[int(np.argmax(ref))] == b * launches
    else:
        assert oracle.chisquare_pvalue(counts, ref) > 1e-3


def test_finish_graph_equals_eager_and_errors_fail_alone(prog):
    b = 8
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(b, V, generator=gen) * 2
    logits[1, 10] = float("nan")                    # non-finite row
    allowed = torch.rand(b, V, generator=gen) < 0.3
    allowed[2] = False                              # empty legal set (enabled row)
    allowed[5] = False                              # empty but disabled: unconstrained row
    logits[6, 17] = logits[6, 40] = 50.0            # greedy tie → smaller id (row 6 greedy below)
    allowed[6, 17] = allowed[6, 40] = True
    enabled = torch.tensor([True, True, True, True, False, False, True, True])
    params = dict(temperature=0.9, top_k=20)
    _set_rows(prog, logits.cuda(), allowed, enabled, params, torch.arange(b) * 3)
    prog._lane_f32[0, 6] = 0.0                      # row 6 greedy
    g_tok, g_err = _finish(prog, b, True, True, graph=True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        prog._finish_phase(b, True, True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    e_tok, e_err = _finish(prog, b, True, True, graph=False)
    assert torch.equal(g_tok, e_tok) and torch.equal(g_err, e_err)
    assert g_err.tolist() == [0, SAMPLE_ERR_NONFINITE, SAMPLE_ERR_EMPTY_MASK, 0, 0, 0, 0, 0]
    assert g_tok[1] == -1 and g_tok[2] == -1
    assert g_tok[6] == 17
    for r in (0, 3, 7):
        assert allowed[r, g_tok[r]]
    # unmasked variant: the same rows without words behave as all-disabled
    u_tok, u_err = _finish(prog, b, False, True)
    _set_rows(prog, logits.cuda(), allowed, torch.zeros(b, dtype=torch.bool), params, torch.arange(b) * 3)
    prog._lane_f32[0, 6] = 0.0
    d_tok, d_err = _finish(prog, b, True, True)
    assert torch.equal(u_tok, d_tok) and torch.equal(u_err, d_err)
