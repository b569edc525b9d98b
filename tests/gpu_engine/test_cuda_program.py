"""CudaProgram (static buffers, two phases, batch buckets, ring staging) against Program.

On the CPU (CI) CudaProgram runs its phases eagerly with the same buffers and
bookkeeping; on CUDA (``gpu`` marker) it captures graphs, registers the ring and
uses cuda-python events. Both must give the tokens of the plain Program:
mixed prefill/decode steps, constrained/unconstrained/mixed batches, padding
rows in batch buckets, a row dropped between forward and sampling, V not a
multiple of 32.
"""
import os

import numpy as np
import pytest
import torch

from gpu_engine.core.batch import NO_SLOT, build_step_batch
from gpu_engine.executor import select_mask_rows
from gpu_engine.executor.cuda_graph import CudaProgram, RingMask
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.executor.eager import Program
from gpu_engine.core.request import ConstraintRef, Request, SamplingOptions
from shared_memory.layout import RingGeometry
from shared_memory.ring import MaskRing

V, LANES, SEQ = 70, 8, 64
CFG = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, name="tiny")


def _model(device):
    return build_model(CFG, device, torch.float32, LANES, SEQ, weights="random", seed=3)


def _requests(n, gen):
    out = []
    for i in range(n):
        sp = SamplingOptions(temperature=[0.0, 0.8, 1.0, 1.3][i % 4], top_k=[0, 0, 5, 0][i % 4],
                             top_p=[1.0, 1.0, 1.0, 0.9][i % 4], seed=100 + i)
        prompt = torch.randint(0, V, (3 + i,), generator=gen).tolist()
        out.append(Request(f"r{i}", prompt, 12, sp, constraint=ConstraintRef("regex", "x") if i % 2 else None))
    return out


def _clone(reqs):
    return [Request(r.request_id, list(r.prompt_ids), r.max_tokens, r.sampling, constraint=r.constraint)
            for r in reqs]


@pytest.fixture
def ring():
    r = MaskRing.create(f"ninfer-test-cudaprog-{os.getpid()}", RingGeometry(2, LANES, 1, V))
    yield r
    r.close()
    r.unlink()


def _write_masks(ring, slot, rows, gen):
    words = ring.bitmask(slot)
    for r in rows:
        allowed = torch.rand(V, generator=gen) < 0.4
        allowed[r.lane % V] = True
        bits = np.zeros(words.shape[-1] * 32, np.uint8)
        bits[:V] = allowed.numpy()
        words[r.lane, 0] = np.packbits(bits.reshape(-1, 32)[:, ::-1], axis=1).view(">u4").reshape(-1)
    return words


def _run(prog, reqs, ring, schedule, drop_at=None):
    """Drive ``prog`` like the engine: admissions per step, masks for constrained rows."""
    gen = torch.Generator().manual_seed(7)
    lanes, pending, outputs = [None] * LANES, list(reqs), {r.request_id: [] for r in reqs}
    for step, admit in enumerate(schedule):
        for _ in range(admit):
            if pending:
                lane = lanes.index(None)
                r = pending.pop(0)
                r.lane = lane
                lanes[lane] = r
        rows = [r for r in lanes if r is not None]
        if not rows:
            break
        cons = [r for r in rows if r.constraint is not None]
        batch = build_step_batch(rows, slot=step % 2 if cons else NO_SLOT)
        logits = prog.forward(batch)
        words = status = enabled = None
        if cons:
            _write_masks(ring, step % 2, cons, gen)
            words, status, _ = prog.stage_masks(ring, batch)
            enabled = torch.tensor([r.constraint is not None for r in rows])
        if drop_at == step and len(rows) > 2:  # the engine drops a row the sidecar failed
            keep = [i for i in range(len(rows)) if i != 1]
            lanes[rows[1].lane] = None
            prog.release_lane(rows[1].lane)
            sel = torch.tensor(keep)
            rows = [rows[i] for i in keep]
            batch = batch.select(keep)
            logits = logits.index_select(0, sel.to(logits.device))  # sel is CPU; logits may be CUDA
            if words is not None:
                words, status, enabled = select_mask_rows(words, status, enabled, sel)
        out = prog.sample(batch, logits, words, status, enabled)
        for r, (toks, err) in zip(rows, out):
            assert err is None, (r.request_id, err)
            assert words is None or not r.constraint or _allowed(ring, step % 2, r.lane, toks[0])
            r.output_ids += toks
            outputs[r.request_id] += toks
            if len(r.output_ids) >= r.max_tokens:
                lanes[r.lane] = None
                prog.release_lane(r.lane)
    return outputs


def _allowed(ring, slot, lane, tok):
    w = int(ring.bitmask(slot)[lane, 0, tok // 32])
    return (w >> (tok % 32)) & 1 == 1


SCHEDULES = {
    "all_at_once": [6] + [0] * 14,
    "staggered": [2, 1, 0, 3, 0, 1, 0, 0, 2] + [0] * 12,
}


def _compare(device, ring, schedule, drop_at=None, use_graphs=False):
    gen = torch.Generator().manual_seed(11)
    reqs = _requests(7, gen)
    ref = _run(Program(_model(device), V, torch.device(device)), _clone(reqs), ring, schedule, drop_at)
    prog = CudaProgram(_model(device), V, torch.device(device), ring, use_graphs=use_graphs)
    try:
        got = _run(prog, _clone(reqs), ring, schedule, drop_at)
        prog.registered_during_run = prog.ring_registered
    finally:
        prog.close()
    assert got == ref
    assert sum(map(len, got.values())) > 30
    return prog


@pytest.mark.parametrize("schedule", SCHEDULES, ids=list(SCHEDULES))
def test_cpu_phases_match_program(ring, schedule):
    _compare("cpu", ring, SCHEDULES[schedule])


def test_cpu_dropped_row_matches_program(ring):
    _compare("cpu", ring, SCHEDULES["staggered"], drop_at=4)


def test_ring_mask_marker_and_bytes(ring):
    prog = CudaProgram(_model("cpu"), V, torch.device("cpu"), ring, use_graphs=False)
    assert prog.max_seq_len == SEQ - 1  # last position is the padding scratch
    rows = _requests(3, torch.Generator().manual_seed(0))
    for lane, r in zip((0, 3, 5), rows):
        r.lane = lane
    batch = build_step_batch(rows, slot=0)
    prog.forward(batch)
    words, status, nbytes = prog.stage_masks(ring, batch)
    assert isinstance(words, RingMask) and status is None
    sel = torch.tensor([0])
    assert select_mask_rows(words, status, torch.ones(3, dtype=torch.bool), sel)[0] is words  # addressed by lane
    # constrained rows are r1 (lane 3): lanes 0..3 are copied
    assert nbytes == 4 * ring.geometry.num_words * 4


@pytest.mark.gpu
@pytest.mark.parametrize("use_graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=list(SCHEDULES))
def test_cuda_program_matches_program(ring, schedule, use_graphs):
    prog = _compare("cuda", ring, SCHEDULES[schedule], drop_at=4, use_graphs=use_graphs)
    assert prog.registered_during_run and not prog.ring_registered  # close() unregistered it
    assert prog.step_timings and all(t.forward_ms >= 0 and t.gap_ms >= 0 for t in prog.step_timings)


@pytest.mark.gpu
def test_stream_handle_is_the_current_stream(ring):
    """``_stream()`` (torch's raw-stream getter) names the stream torch calls current: the default one,
    and a side stream inside ``torch.cuda.stream``."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gpu_engine.executor.graph_capture import _RAW_STREAM

    prog = CudaProgram(_model("cuda"), V, torch.device("cuda"), ring, use_graphs=False)
    try:
        assert _RAW_STREAM is not None  # the CUDA build has it; else the slower path runs
        assert prog._stream() == torch.cuda.current_stream().cuda_stream
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            assert prog._stream() == side.cuda_stream != 0
        assert prog._stream() == torch.cuda.current_stream().cuda_stream
    finally:
        prog.close()
