"""Static (CUDA-graph) prefill of CudaProgram against the eager batched prefill of Program.

Prompts up to the largest prefill length bucket run through one static phase per
``(rows, padded length)`` bucket (a CUDA graph on the H200, the same buffers eagerly
on the CPU): grouping, right padding, duplicated padding rows and the in-forward
``logit_index`` gather must give the eager logits and KV. Longer prompts fall back to
the eager chunked prefill in the same call.
"""
import pytest
import torch

from gpu_engine.executor.cuda_graph import CudaProgram, prefill_graph_buckets
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.executor.eager import Program
from gpu_engine.core.request import Request, SamplingOptions

V, LANES, SEQ = 70, 16, 160
CFG = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, name="tiny")
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _model(device, dtype=torch.float32):
    return build_model(CFG, device, dtype, LANES, SEQ, weights="random", seed=5)


def _rows(lens, lanes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (n, lane) in enumerate(zip(lens, lanes)):
        r = Request(f"r{i}", torch.randint(0, V, (n,), generator=g).tolist(), 4, SamplingOptions())
        r.lane = lane
        out.append(r)
    return out


def test_bucket_spec():
    assert prefill_graph_buckets("off", 64, 512, 4096) == ([], [])
    assert prefill_graph_buckets("on", 64, 512, 4096) == ([1, 2, 4, 8], [32, 64, 128, 256, 512])
    assert prefill_graph_buckets("1,2,4x32,64", 64, 512, 4096) == ([1, 2, 4], [32, 64])
    # lengths capped by the model length and the token budget, rows by the lanes
    assert prefill_graph_buckets("1,2,4,8,16x32,64,128", 4, 100, 4096) == ([1, 2, 4], [32, 64])
    assert prefill_graph_buckets("8x64,128,512,1024", 64, 4096, 1024) == ([8], [64, 128])
    rows, lens = prefill_graph_buckets("1,2,3,4,5,6,7,8x8,16,32,64,128,256,512", 64, 512, 1 << 20)
    assert len(rows) * len(lens) <= 48


CASES = {
    "one": ([13], [3]),
    "three_padded_to_four": ([5, 29, 17], [0, 7, 2]),
    "one_group_unsorted": ([40, 3, 64, 22, 9, 31, 1, 50], list(range(8))),
    "two_groups": ([12, 90, 33, 7, 64, 65, 2, 18, 41, 30], [15, 0, 3, 9, 1, 2, 4, 5, 6, 8]),
    "with_long_eager": ([20, 150, 6], [1, 2, 3]),  # 150 > 128: eager chunked path
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_static_prefill_matches_eager(device, dtype, case):
    lens, lanes = CASES[case]
    dev = torch.device(device)
    ref_model, model = _model(dev, dtype), _model(dev, dtype)
    ref = Program(ref_model, V, dev)
    prog = CudaProgram(model, V, dev, ring=None, use_graphs=True, prefill_graphs="1,2,4,8x32,64,128")
    try:
        assert prog.prefill_len_buckets == [32, 64, 128]
        if dev.type == "cuda":
            assert len(prog._pf_graphs) == 12
        ra, rb = _rows(lens, lanes), _rows(lens, lanes)
        want = ref._prefill_rows(ra).float()
        got = prog._prefill_rows(rb).float()
        assert [r.num_cached for r in rb] == lens
        atol = 2e-4 if dtype == torch.float32 else 6e-2
        torch.testing.assert_close(got, want, atol=atol, rtol=atol)
        assert torch.equal(got.argmax(-1), want.argmax(-1)) or dtype == torch.bfloat16
        for r in rb:  # KV at the real prompt positions of each lane
            n = len(r.prompt_ids)
            for a, b in zip(model.kv.lane_view(slice(None), r.lane, n), ref_model.kv.lane_view(slice(None), r.lane, n)):
                torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=atol)
        # a second prefill on the same lanes (graph replay with new inputs) still matches
        ra, rb = _rows(lens, lanes, seed=1), _rows(lens, lanes, seed=1)
        torch.testing.assert_close(prog._prefill_rows(rb).float(), ref._prefill_rows(ra).float(), atol=atol, rtol=atol)
    finally:
        prog.close()


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_graphs_off_is_program(device):
    dev = torch.device(device)
    prog = CudaProgram(_model(dev), V, dev, ring=None, use_graphs=True, prefill_graphs="off")
    try:
        assert prog.prefill_rows_buckets == [] and not prog._pf_graphs
        rows = _rows([5, 9], [0, 1])
        want = Program(_model(dev), V, dev)._prefill_rows(_rows([5, 9], [0, 1]))
        torch.testing.assert_close(prog._prefill_rows(rows), want)
    finally:
        prog.close()
