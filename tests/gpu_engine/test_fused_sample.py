"""The fused sampler (:func:`gpu_engine.sample.fused_sample.sample_fused`) draws the same tokens
and reports the same errors as the torch reference :func:`gpu_engine.sample.sampler.sample`.

On the CPU the kernel runs under ``TRITON_INTERPRET=1`` in a subprocess (the interpreter is chosen
when the kernel is built): rows built to break it — greedy ties inside a block and across blocks,
NaN / ``+inf`` / all-``-inf`` legal sets, empty masks on enabled and disabled rows, garbage bits past
``V`` in the last mask word, vocabularies that are not multiples of 32 or of the block, bf16 logits,
per-row RNG purposes — and the CUDA-graph executor's Finish phase with ``fused_sample`` on vs off.
On CUDA (``gpu`` marker) the same comparison runs at SmolLM2's and Qwen3's vocabulary sizes, in
and out of a captured graph (the executor's graph-level checks are in test_cuda_sampling.py).
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from gpu_engine.model.paged_attention import triton_available

_CASES = textwrap.dedent("""
    import torch
    from gpu_engine.sample.bitmask import pack_bitmask
    from gpu_engine.sample.fused_sample import BLOCK_V, sample_fused
    from gpu_engine.sample.rng import Purpose
    from gpu_engine.sample.sampler import SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SamplingTensors, sample

    def compare(logits, temp, seed, pos, words=None, enabled=None, purpose=Purpose.SAMPLE):
        st = SamplingTensors.make(logits.shape[0], temperature=temp.tolist(), seed=seed.tolist(),
                                  device=logits.device)
        st.use_filters = False
        want_tok, want_err = sample(logits, st, words, enabled, pos, purpose)
        tok, err = sample_fused(logits, temp, seed, pos, words, enabled, purpose)
        assert torch.equal(tok.cpu(), want_tok.cpu()), (tok, want_tok)
        assert torch.equal(err.cpu().long(), want_err.cpu().long()), (err, want_err)
        # split rows (runs of whole blocks: 1, 2, 3, ... a block each) give the same tokens and codes
        blocks = -(-logits.shape[1] // BLOCK_V)
        for splits in sorted(set([1, 2, 3, blocks])):
            t_s, e_s = sample_fused(logits, temp, seed, pos, words, enabled, purpose, splits=splits)
            assert torch.equal(t_s.cpu(), tok.cpu()) and torch.equal(e_s.cpu(), err.cpu()), (splits, t_s, tok)
        return tok.cpu(), err.cpu()

    def random_case(b, v, dev, gen, density):
        logits = (torch.randn(b, v, generator=gen) * 3).to(dev)
        allowed = torch.rand(b, v, generator=gen) < density
        allowed[:, 0] |= ~allowed.any(-1)               # every row legal somewhere (errors are built below)
        temp = torch.where(torch.rand(b, generator=gen) < 0.25, 0.0, torch.rand(b, generator=gen) * 1.8 + 0.05)
        seed = torch.randint(0, 2**62, (b,), generator=gen)
        pos = torch.randint(0, 5000, (b,), generator=gen)
        return logits, allowed, temp.to(dev), seed.to(dev), pos.to(dev)

    def run(dev, sizes, repeats):
        gen = torch.Generator().manual_seed(1234)
        drawn = 0
        for v in sizes:
            for rep in range(repeats):
                b = 7
                logits, allowed, temp, seed, pos = random_case(b, v, dev, gen, (0.003, 0.3, 0.9)[rep % 3])
                words = pack_bitmask(allowed).to(dev)
                enabled = (torch.arange(b) % 3 != 2).to(dev)
                t1, _ = compare(logits, temp, seed, pos, words, enabled)
                t2, _ = compare(logits, temp, seed, pos)                                  # unmasked
                compare(logits, temp, seed, pos, words)                                   # every row enabled
                compare(logits.bfloat16(), temp, seed, pos, words, enabled)               # bf16 logits
                compare(logits, temp, seed, pos, words, enabled,
                        torch.tensor([int(p) for p in Purpose][:b] + [0] * (b - len(Purpose))).to(dev))
                for r in range(b):
                    if bool(enabled[r]):
                        assert bool(allowed[r, t1[r]]), "an illegal token was drawn"
                drawn += 2 * b
        return drawn

    def edge_cases(dev):
        v = 2 * BLOCK_V + 77
        b = 8
        logits = torch.randn(b, v, generator=torch.Generator().manual_seed(7)).to(dev)
        allowed = torch.ones(b, v, dtype=torch.bool)
        logits[0, 5] = logits[0, BLOCK_V + 9] = 40.0                   # greedy tie across blocks -> 5
        logits[1, 100] = logits[1, 101] = 40.0                         # tie inside a block -> 100
        logits[2, v - 1] = float("nan")                                 # NaN in the last, partial block
        logits[3, 3] = float("inf")                                     # +inf: non-finite
        allowed[4] = False                                              # empty mask, enabled
        allowed[4, 6] = True
        logits[4, 6] = float("-inf")                                    # only legal token is -inf
        allowed[5] = False                                              # empty mask (wins over NaN)
        logits[5, 0] = float("nan")
        allowed[6] = False                                              # empty but disabled: unconstrained
        logits[7, :] = float("-inf")                                    # -inf on all but one illegal...
        logits[7, 11] = 1.0
        allowed[7, 11] = False                                          # ...so no finite legal token
        words = pack_bitmask(allowed)
        words[:, -1] |= torch.tensor(-1 << ((v % 32) or 32), dtype=torch.int32) if v % 32 else 0  # bits past V
        words = words.to(dev)
        enabled = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.bool).to(dev)
        temp = torch.tensor([0.0, 0.0, 0.7, 0.7, 0.7, 0.7, 0.9, 0.7]).to(dev)
        seed = torch.arange(b, dtype=torch.int64).to(dev)
        pos = torch.zeros(b, dtype=torch.int64).to(dev)
        tok, err = compare(logits, temp, seed, pos, words, enabled)
        assert tok[0] == 5 and tok[1] == 100, tok
        assert err.tolist() == [0, 0, SAMPLE_ERR_NONFINITE, SAMPLE_ERR_NONFINITE, SAMPLE_ERR_NONFINITE,
                                SAMPLE_ERR_EMPTY_MASK, 0, SAMPLE_ERR_NONFINITE], err
        assert (tok[2:6] == -1).all() and tok[7] == -1
        # all greedy (no second pass anywhere) and all sampled
        compare(logits, torch.zeros_like(temp), seed, pos, words, enabled)
        compare(logits, torch.ones_like(temp), seed, pos, words, enabled)
        # out= tensors (the executor writes into its int64 [2, L] buffer)
        out = torch.full((2, b), 99, dtype=torch.int64, device=dev)
        sample_fused(logits, temp, seed, pos, words, enabled, out=(out[0], out[1]))
        assert out[0].cpu().tolist() == tok.tolist() and out[1].cpu().tolist() == err.long().tolist()
        # an integer `enabled` is tested at full width (2**32 is enabled, not 0)
        wide = enabled.long() * (1 << 32)
        st = SamplingTensors.make(b, temperature=temp.tolist(), seed=seed.tolist(), device=logits.device)
        st.use_filters = False
        want = sample(logits, st, words, wide != 0, pos)
        got = sample_fused(logits, temp, seed, pos, words, wide)
        assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu().long(), want[1].cpu().long())
        # an empty batch launches nothing
        t0, e0 = sample_fused(logits[:0], temp[:0], seed[:0], pos[:0])
        assert t0.numel() == 0 and e0.numel() == 0
""")

_EXECUTOR = textwrap.dedent("""
    import os
    import torch
    from gpu_engine.executor.cuda_graph import _FIN_ENABLED, _FIN_LANES, _FIN_POS, CudaProgram
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model
    from gpu_engine.sample.bitmask import pack_bitmask
    from shared_memory.layout import RingGeometry
    from shared_memory.ring import MaskRing

    V, L = 70, 8
    cfg = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, name="tiny")
    model = build_model(cfg, "cpu", torch.float32, L, 32, weights="random")
    ring = MaskRing.create(f"ninfer-test-fusedsample-{{os.getpid()}}", RingGeometry(2, L, 1, V))
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(L, V, generator=gen) * 2
    allowed = torch.rand(L, V, generator=gen) < 0.3
    allowed[2] = False
    lanes = torch.tensor([5, 0, 7, 1, 2, 3, 6, 4])     # batch row -> lane: gathers by lane are exercised
    outs = []
    try:
        for fused in (True, False):
            p = CudaProgram(model, V, torch.device("cpu"), ring, use_graphs=False, fused_sample=fused)
            assert p.fused_sample is fused
            p.logits.copy_(logits)
            p.words[lanes, 0] = pack_bitmask(allowed)
            p._i64[_FIN_LANES] = lanes
            p._i64[_FIN_POS] = torch.arange(L) * 13
            p._i64[_FIN_ENABLED] = torch.tensor([1, 1, 1, 0, 1, 1, 1, 0])
            p._lane_f32[0, lanes] = torch.tensor([0.8, 0.0, 0.8, 1.2, 0.5, 0.0, 1.0, 0.9])
            p._lane_i64[1, lanes] = torch.arange(L) * 7919 + 11
            got = []
            for masked in (True, False):
                p._out.fill_(99)
                p._finish_phase(L, masked, False)
                got.append(p._out.clone())
            outs.append(got)
            p.close()
    finally:
        ring.close()
        ring.unlink()
    assert all(torch.equal(a, b) for a, b in zip(*outs)), outs
    assert outs[0][0][1].tolist() == [0, 0, 1, 0, 0, 0, 0, 0]       # the enabled row with an empty mask
    print("EXECUTOR-OK")
""")


pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def test_interpreted_kernel_matches_torch_sampler(triton_interpreter):
    triton_interpreter(_CASES + "\nedge_cases('cpu')\nassert run('cpu', [37, 70, 2048, 2049, 5000], 3) > 0\n"
                       "print('CASES-OK')\n", "CASES-OK")


def test_interpreted_executor_finish_matches_torch_path(triton_interpreter):
    triton_interpreter(_EXECUTOR, "EXECUTOR-OK")


def test_malformed_inputs_are_refused_before_launch():
    """Per-row tensors the kernel would read as contiguous ``[B]`` of the right dtype (a strided view, a
    0-dim purpose, int32 seeds, a short tensor) and degenerate shapes raise ValueError; nothing is launched."""
    from gpu_engine.sample.fused_sample import sample_fused

    b, v = 4, 100
    logits = torch.randn(b, v)
    temp, seed, pos = torch.ones(b), torch.arange(b), torch.zeros(b, dtype=torch.int64)
    wide = torch.ones(b, 2)
    bad = [
        dict(temperature=wide[:, 0]),                                  # strided view
        dict(temperature=temp.double()),
        dict(seed=seed.int()),                                         # int32 seeds
        dict(positions=pos[:3]),                                       # short
        dict(purpose=torch.tensor(0)),                                 # 0-dim purpose tensor
        dict(purpose=torch.zeros(2 * b, dtype=torch.int64)[::2]),      # strided purpose
        dict(enabled=torch.ones(b, dtype=torch.float32)),
        dict(words=torch.zeros(b, 3, dtype=torch.int32)),              # too few words for V
        dict(words=torch.zeros(b, 4, dtype=torch.int64)),
        dict(out=(torch.zeros(b, dtype=torch.int64), torch.zeros(2 * b, dtype=torch.int64)[::2])),
        dict(logits=torch.randn(b, 0)),                                # V = 0
        dict(logits=torch.randn(v, b).t()),                            # not unit stride along V
        dict(logits=torch.randn(b, 2, v)),
        dict(splits=0),
        dict(splits=2.5),                                              # not an int
        dict(splits=True),
    ]
    for kw in bad:
        args = dict(logits=logits, temperature=temp, seed=seed, positions=pos)
        args.update(kw)
        with pytest.raises(ValueError, match="sample_fused"):
            sample_fused(**args)


def test_split_count_fills_the_multiprocessors_with_whole_blocks(monkeypatch):
    """Runs per row: about SMs // B, whole blocks per run, at most one run per block, 1 off CUDA."""
    from gpu_engine.sample import fused_sample
    from gpu_engine.sample.fused_sample import BLOCK_V, split_count

    monkeypatch.setattr(fused_sample, "_multiprocessors", lambda index: 132)  # an H200
    cuda = torch.device("cuda", 0)
    assert BLOCK_V == 2048
    assert [split_count(b, 49152, cuda) for b in (1, 5, 32, 64, 66, 67, 128)] == [24, 24, 4, 2, 2, 1, 1]
    assert split_count(1, 151936, cuda) == 75                 # 75 blocks, the last one partial
    assert split_count(2, 151936, cuda) == 38                 # 66 wanted: 2 blocks per run, 38 runs
    assert split_count(1, 100, cuda) == 1 and split_count(0, 49152, cuda) == 1 and split_count(1, 0, cuda) == 1
    assert split_count(1, 49152, torch.device("cpu")) == 1


@pytest.mark.gpu
def test_cuda_kernel_matches_torch_sampler():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    ns: dict = {}
    exec(compile(_CASES, "fused_sample_cases", "exec"), ns)
    ns["edge_cases"]("cuda")
    assert ns["run"]("cuda", [37, 2049, 49152, 151936], 6) > 0


@pytest.mark.gpu
def test_cuda_fused_kernel_in_a_captured_graph():
    """Replaying a captured graph of the kernel gives the eager kernel's tokens (static buffers, new inputs)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    for b in (1, 64):  # 24 and 2 runs per row on an H200: partials allocated under capture
        _captured_graph_case(b, 49152)


def _captured_graph_case(b: int, v: int) -> None:
    from gpu_engine.sample.bitmask import pack_bitmask
    from gpu_engine.sample.fused_sample import sample_fused

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(b, v, generator=gen).cuda()
    words = pack_bitmask(torch.rand(b, v, generator=gen) < 0.2).cuda()
    enabled = torch.ones(b, dtype=torch.bool, device="cuda")
    temp = torch.full((b,), 0.8, device="cuda")
    seed = torch.arange(b, dtype=torch.int64, device="cuda")
    pos = torch.zeros(b, dtype=torch.int64, device="cuda")
    out = torch.zeros(2, b, dtype=torch.int64, device="cuda")
    sample_fused(logits, temp, seed, pos, words, enabled, out=(out[0], out[1]))  # compile outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sample_fused(logits, temp, seed, pos, words, enabled, out=(out[0], out[1]))
    for step in range(3):
        logits.copy_(torch.randn(b, v, generator=gen).cuda())
        pos.fill_(step)
        g.replay()
        torch.cuda.synchronize()
        want = sample_fused(logits, temp, seed, pos, words, enabled)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1].long())
        one = sample_fused(logits, temp, seed, pos, words, enabled, splits=1)  # one program per row
        assert torch.equal(one[0], want[0]) and torch.equal(one[1], want[1])
