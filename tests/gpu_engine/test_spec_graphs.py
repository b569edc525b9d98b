"""CudaProgram(spec_graphs=True): the speculative target forward on the static [L, K_ring + 1] buffers
(graph_capture.py) gives the logits of the eager Program.forward — on the CPU the same phase runs
without capture, so this checks its buffer bookkeeping (host and deferred drafts, fewer drafts than
K_ring, padding rows, prefill rows in the step) and the fallbacks (tight rows, more drafts than K_ring)."""
from __future__ import annotations

import os
import uuid

import pytest
import torch

from gpu_engine.core.batch import build_step_batch
from gpu_engine.core.request import Request, SamplingOptions
from gpu_engine.executor.cuda_graph import CudaProgram
from gpu_engine.executor.eager import Program
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.spec.drafters import EarlyExitDrafter
from shared_memory.layout import RingGeometry
from shared_memory.ring import MaskRing

V, LANES, SEQ, KR = 70, 8, 64, 3
CFG = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                  num_kv_heads=2, head_dim=8, name="tiny")


class _Ring:  # CudaProgram reads only the geometry of the ring on the CPU
    geometry = RingGeometry(2, LANES, KR + 1, V)


@pytest.fixture
def ring():
    r = MaskRing.create(f"ninfer-test-specgraphs-{os.getpid()}-{uuid.uuid4().hex[:8]}", _Ring.geometry)
    yield r
    r.close()
    r.unlink()


def _model(device="cpu"):
    dtype = torch.float64 if device == "cpu" else torch.float32
    return build_model(CFG, device, dtype, LANES, SEQ, weights="random", seed=5)


def _rows(prompts):
    rows = []
    for lane, p in enumerate(prompts):
        r = Request(f"r{lane}", list(p), 32, SamplingOptions())
        r.lane = lane
        rows.append(r)
    return rows


def _advance(rows, logits):
    """What sampling would do with every draft rejected: commit the argmax of column 0."""
    for i, r in enumerate(rows):
        if r.output_ids:
            r.num_cached += 1
        r.output_ids.append(int(logits[i, 0].argmax()))


def _check(got, ref, batch):
    assert got.shape[0] == ref.shape[0] == batch.size
    tol = 1e-9 if got.device.type == "cpu" else 1e-4
    for i in range(batch.size):
        n = 1 if bool(batch.prefill[i]) else 1 + int(batch.num_drafts[i])
        torch.testing.assert_close(got[i, :n], ref[i, :n], rtol=tol, atol=tol)


def test_spec_forward_phase_matches_eager_program():
    _compare("cpu", _Ring(), use_graphs=False)


@pytest.mark.gpu
def test_spec_graphs_on_cuda_match_eager_program(ring):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    prog = _compare("cuda", ring, use_graphs=True)
    assert prog._spec_graphs  # captured at start-up


def _compare(device, ring, use_graphs):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 9, 4, 7, 6)]
    dev = torch.device(device)
    ref_prog = Program(_model(device), V, dev)
    prog = CudaProgram(_model(device), V, dev, ring, use_graphs=use_graphs, spec_graphs=True)
    assert prog.spec_t == KR + 1
    ref_rows, rows = _rows(prompts[:4]), _rows(prompts[:4])
    # step 1: prefill
    ref = ref_prog.forward(build_step_batch(ref_rows))
    got = prog.forward(build_step_batch(rows))
    _check(got, ref, build_step_batch(rows))
    _advance(ref_rows, ref)
    _advance(rows, ref)
    # step 2: host drafts (3, 1, none, 2) and a new prefill row (lane 4) in the same step
    ref_rows += _rows([[]] * 4 + [prompts[4]])[4:]
    rows += _rows([[]] * 4 + [prompts[4]])[4:]
    drafts = {0: [1, 2, 3], 1: [4], 3: [5, 6]}
    ref = ref_prog.forward(build_step_batch(ref_rows, drafts))
    batch = build_step_batch(rows, drafts)
    got = prog.forward(batch)
    assert got.shape == (5, KR + 1, V)  # the static width: the speculative phase ran
    _check(got, ref, batch)
    _advance(ref_rows, ref)
    _advance(rows, ref)
    # step 3: deferred (device-side) early-exit drafts beside a host-drafted row
    dref = EarlyExitDrafter(ref_prog, num_layers=1).propose_batch_device(ref_rows[:3], [2, 3, 1])
    dgot = EarlyExitDrafter(prog, num_layers=1).propose_batch_device(rows[:3], [2, 3, 1])
    ref = ref_prog.forward(build_step_batch(ref_rows, {4: [9, 9]}, deferred=[dref]))
    batch = build_step_batch(rows, {4: [9, 9]}, deferred=[dgot])
    got = prog.forward(batch)
    assert got.shape == (5, KR + 1, V)
    _check(got, ref, batch)
    prog.close()
    return prog


def test_tight_rows_and_long_drafts_take_the_eager_forward():
    prog = CudaProgram(_model(), V, torch.device("cpu"), _Ring(), use_graphs=False, spec_graphs=True)
    rows = _rows([[1, 2, 3], [4, 5]])
    prog.forward(build_step_batch(rows))
    for r in rows:
        r.output_ids.append(7)
    assert prog.forward(build_step_batch(rows, {0: [1, 2, 3, 4]})).shape[1] == 5  # 4 drafts > K_ring
    rows[1].num_cached = prog.max_seq_len - 2  # num_cached + K_ring + 1 > max_seq_len
    assert prog.forward(build_step_batch(rows, {0: [1]})).shape[1] == 2
    off = CudaProgram(_model(), V, torch.device("cpu"), _Ring(), use_graphs=False)
    assert off.spec_t == 0
