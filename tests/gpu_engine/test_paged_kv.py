"""Paged KV cache: block pool bookkeeping, and the attention implementations agree.

The Triton kernel runs under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter) in a
subprocess, so the CUDA decode kernel's indexing and online softmax are checked on CPU
against the gather + SDPA reference and against dense attention.
"""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from gpu_engine.model.kv_cache import KVCacheFull, PagedKVCache
from gpu_engine.model.paged_attention import lane_major_attention, paged_attention_reference, triton_available


def test_reserve_release_and_trash_block() -> None:
    kv = PagedKVCache(2, 2, 8, max_lanes=3, max_seq_len=40, block_size=16, num_blocks=5)
    assert kv.blocks_per_lane == 3 and kv.trash == 5
    assert kv.block_table.eq(5).all()                      # unreserved: every entry -> trash block
    kv.reserve(0, 17)                                       # 2 blocks
    kv.reserve(1, 1)
    assert kv.blocks_of(0) == [0, 1] and kv.blocks_of(1) == [2] and kv.free_blocks == 2
    assert kv.block_table[0].tolist() == [0, 1, 5]
    kv.reserve(0, 10)                                       # already owned: no-op
    assert kv.free_blocks == 2
    with pytest.raises(KVCacheFull, match="needs 3 more blocks"):
        kv.reserve(2, 1000)                                 # capped at max_seq_len: 3 blocks > 2 free
    assert kv.free_blocks == 2 and kv.blocks_of(2) == []    # nothing allocated on failure
    kv.release(0)
    assert kv.block_table[0].eq(5).all() and kv.free_blocks == 4
    kv.reserve(2, 40)
    assert kv.blocks_of(2) == [0, 1, 3]                     # freed blocks are reused
    with pytest.raises(ValueError):
        PagedKVCache(1, 1, 8, max_lanes=1, max_seq_len=8, block_size=12)


def _setup(seed: int = 0, B: int = 3, T: int = 1, nh: int = 6, nkv: int = 2, hd: int = 24, bs: int = 4):
    """A pool with scattered blocks for 3 lanes, and the same KV laid out densely per row."""
    g = torch.Generator().manual_seed(seed)
    S = 40
    kv = PagedKVCache(1, nkv, hd, max_lanes=4, max_seq_len=S, block_size=bs, lane_major=False)
    lens = [37, 9, 20][:B]
    lanes = torch.tensor([2, 0, 3][:B])
    for step in range(S // bs):                              # interleave: blocks of lanes are not contiguous
        for b in range(B):
            kv.reserve(int(lanes[b]), min(lens[b] + T, (step + 1) * bs))
    kv.k.normal_(generator=g)
    kv.v.normal_(generator=g)
    start = torch.tensor(lens) - T + 1                       # queries at start .. start + T - 1
    q = torch.randn(B, nh, T, hd, generator=g)
    return kv, q, lanes, start


def _dense(kv: PagedKVCache, q, lanes, start) -> torch.Tensor:
    B, nh, T, hd = q.shape
    out = torch.empty_like(q)
    for b in range(B):
        for t in range(T):
            n = int(start[b]) + t + 1
            k, v = kv.lane_view(0, int(lanes[b]), n)        # [nkv, n, hd]
            rep = nh // k.shape[0]
            out[b, :, t] = F.scaled_dot_product_attention(
                q[b, :, t: t + 1], k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0))[:, 0]
    return out


@pytest.mark.parametrize("T", [1, 3])
def test_reference_matches_dense(T: int) -> None:
    kv, q, lanes, start = _setup(T=T)
    pos = start[:, None] + torch.arange(T)
    got = paged_attention_reference(q, kv.k[0], kv.v[0], kv.block_table, lanes, pos, ctx=40)
    torch.testing.assert_close(got, _dense(kv, q, lanes, start), rtol=1e-5, atol=1e-5)


_KERNEL_CHECK = textwrap.dedent("""
    import os, sys, torch
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, {tests!r})
    from test_paged_kv import _setup, _dense
    from gpu_engine.model.paged_attention import paged_attention_triton
    for T, nh, nkv, hd, bs in ((1, 6, 2, 24, 4), (3, 4, 4, 16, 8), (2, 8, 1, 32, 16)):
        kv, q, lanes, start = _setup(T=T, nh=nh, nkv=nkv, hd=hd, bs=bs)
        got = paged_attention_triton(q.transpose(1, 2), kv.k[0], kv.v[0], kv.block_table, lanes, start, ctx=40)
        torch.testing.assert_close(got.transpose(1, 2), _dense(kv, q, lanes, start), rtol=1e-4, atol=1e-4)
    # the whole model: decode (T=1) and verify (T=3) rows through the kernel == the reference path
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model
    cfg = ModelConfig(arch="qwen3", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, max_position=64)
    ms = [build_model(cfg, "cpu", torch.float32, 3, 64, weights="random", seed=4, attention=a)
          for a in ("reference", "triton")]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 300, (2, 20), generator=g)
    lanes = torch.tensor([2, 0])
    outs = []
    for m in ms:
        for lane in (0, 2):
            m.reserve(lane, 64)
        o = [m(prompt, lanes, torch.tensor([0, 0]), max_context=32)[:, -1]]       # T=20: reference in both
        o.append(m(prompt[:, :1], lanes, torch.tensor([20, 20]), max_context=32)[:, 0])
        o.append(m(prompt[:, 1:4], lanes, torch.tensor([21, 17]), max_context=32).flatten(0, 1))
        outs.append(torch.cat(o))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    print("KERNEL-OK")
""")


@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_triton_kernel_matches_dense_in_interpreter(triton_interpreter) -> None:
    triton_interpreter(_KERNEL_CHECK, "KERNEL-OK")


def test_reserve_lanes_writes_every_new_entry_at_once_and_all_or_nothing() -> None:
    """Many lanes in one call: the same table as one reserve per lane, and a batch that does not fit
    allocates nothing (not the lanes before the one that failed)."""
    one = PagedKVCache(1, 1, 8, max_lanes=4, max_seq_len=64, block_size=4, num_blocks=40)
    many = PagedKVCache(1, 1, 8, max_lanes=4, max_seq_len=64, block_size=4, num_blocks=40)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        lanes = torch.randperm(4, generator=g)[:3].tolist()
        want = [int(x) for x in torch.randint(0, 30, (3,), generator=g)]
        for lane, n in zip(lanes, want):
            one.reserve(lane, n)
        many.reserve_lanes(lanes, want)
        assert torch.equal(one.block_table, many.block_table)
        assert [one.blocks_of(i) for i in range(4)] == [many.blocks_of(i) for i in range(4)]
    small = PagedKVCache(1, 1, 8, max_lanes=4, max_seq_len=64, block_size=4, num_blocks=20)
    small.reserve_lanes([2], [8])
    table = small.block_table.clone()
    with pytest.raises(KVCacheFull, match="2 lanes need 32 more blocks"):
        small.reserve_lanes([0, 1], [64, 64])  # 16 blocks each: either fits alone, not both
    assert small.free_blocks == 18 and torch.equal(small.block_table, table)
    assert small.blocks_of(0) == small.blocks_of(1) == []


def test_reserve_lanes_gives_a_lane_listed_twice_its_larger_size() -> None:
    kv = PagedKVCache(1, 1, 8, max_lanes=2, max_seq_len=64, block_size=4, num_blocks=20)
    kv.reserve_lanes([0, 0], [8, 12])
    assert kv.blocks_of(0) == [0, 1, 2] and kv.free_blocks == 17
    assert kv.block_table[0, :4].tolist() == [0, 1, 2, kv.trash]


def test_lane_major_pool_gives_each_lane_its_own_blocks() -> None:
    kv = PagedKVCache(2, 2, 8, max_lanes=3, max_seq_len=40, block_size=16)   # CPU, full pool: lane-major
    assert kv.lane_major and kv.blocks_per_lane == 3 and kv.free_blocks == 9
    kv.reserve_lanes([2, 0], [20, 33])
    assert kv.blocks_of(2) == [6, 7] and kv.blocks_of(0) == [0, 1, 2] and kv.free_blocks == 4
    kv.reserve(2, 40)
    assert kv.blocks_of(2) == [6, 7, 8] and kv.block_table[1].eq(kv.trash).all()
    kv.k.normal_()
    kl, vl = kv.lanes_view(1)
    k2, v2 = kv.lane_view(1, 2, 40)                                              # copies through the block table
    assert torch.equal(kl[:, 2, :40], k2) and torch.equal(vl[:, 2, :40], v2)
    assert kl.data_ptr() == kv.k[1].data_ptr()                                    # a view, not a copy
    kv.release(2)
    assert kv.free_blocks == 6 and kv.blocks_of(2) == []
    kv.reserve(1, 1)
    assert kv.blocks_of(1) == [3]
    assert not PagedKVCache(1, 1, 8, max_lanes=3, max_seq_len=40, block_size=16, num_blocks=9).lane_major
    with pytest.raises(ValueError):
        PagedKVCache(1, 1, 8, max_lanes=3, max_seq_len=40, block_size=16, num_blocks=5, lane_major=True)
    with pytest.raises(RuntimeError):
        PagedKVCache(1, 1, 8, max_lanes=3, max_seq_len=40, block_size=16, lane_major=False).lanes_view(0)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("lanes", [[0, 1, 2], [2, 0, 1], [0, 2, 3], [3, 0], [7, 0], [4], [1, 2, 1]],
                         ids=["consecutive", "unordered", "gap", "span-4-of-2", "sparse-gathered", "one",
                              "repeated"])
def test_lane_major_attention_matches_dense(T: int, lanes: list[int]) -> None:
    g = torch.Generator().manual_seed(len(lanes) * 10 + T)
    B, nh, nkv, hd, bs, S = len(lanes), 6, 2, 24, 4, 40
    kv = PagedKVCache(1, nkv, hd, max_lanes=8, max_seq_len=S, block_size=bs)
    assert kv.lane_major
    lens = [37, 9, 20][:B]  # a repeated lane (a padding row) has its own query at another position
    for lane, n in zip(lanes, lens):
        kv.reserve(lane, n)
    kv.k.normal_(generator=g)
    kv.v.normal_(generator=g)
    start = torch.tensor(lens) - T
    q = torch.randn(B, nh, T, hd, generator=g)
    lt = torch.tensor(lanes)
    pos = start[:, None] + torch.arange(T)
    kl, vl = kv.lanes_view(0)
    got = lane_major_attention(q, kl, vl, lanes, pos, ctx=40)
    torch.testing.assert_close(got, _dense(kv, q, lt, start), rtol=1e-5, atol=1e-5)
    ref = paged_attention_reference(q, kv.k[0], kv.v[0], kv.block_table, lt, pos, ctx=40)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_model_logits_equal_with_a_lane_major_pool() -> None:
    """The same random model on a lane-major pool (the CPU default) and on a free-list pool (num_blocks given):
    prefill, decode and 3-token verify rows in unordered, gapped lanes give the same logits."""
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model

    cfg = ModelConfig(arch="qwen3", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, max_position=64)
    ms = [build_model(cfg, "cpu", torch.float32, 4, 64, weights="random", seed=4, num_blocks=nb)
          for nb in (None, 16)]
    assert ms[0].kv.lane_major and not ms[1].kv.lane_major
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 300, (3, 20), generator=g)
    lanes = torch.tensor([3, 0, 1])
    outs = []
    for m in ms:
        for lane in (3, 1, 0):
            m.reserve(lane, 64)
        o = [m(prompt, lanes, torch.tensor([0, 0, 0]), max_context=32)[:, -1]]
        o.append(m(prompt[:, :1], lanes, torch.tensor([20, 20, 20]), max_context=32)[:, 0])
        o.append(m(prompt[:2, 1:4], lanes[:2], torch.tensor([21, 17]), max_context=32).flatten(0, 1))
        outs.append(torch.cat(o))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
