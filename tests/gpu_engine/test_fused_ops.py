"""The fused Triton kernels (norm, RoPE + KV write, SiLU, split-context paged attention) agree with
the eager torch reference.

On the CPU they run under ``TRITON_INTERPRET=1`` (Triton's interpreter) in a subprocess; on CUDA
(``-m gpu``) the whole bf16 model with ``attention="triton"`` is compared with ``"reference"``
for prefill, decode, verify rows and a long context that the attention splits.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from gpu_engine.model.paged_attention import num_splits, triton_available

_CHECK = textwrap.dedent("""
    import os, sys, torch
    import torch.nn.functional as F
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, {tests!r})
    from test_paged_kv import _dense
    from gpu_engine.model.fused_ops import add_rms_norm, rope_kv_write, silu_mul
    from gpu_engine.model.kv_cache import PagedKVCache
    from gpu_engine.model.llama import rms_norm, _rotate_half
    from gpu_engine.model.paged_attention import paged_attention_triton
    g = torch.Generator().manual_seed(0)

    # add + RMSNorm: x += delta in place, h = w * norm(x); without delta: norm only
    x = torch.randn(3, 5, 40, generator=g); d = torch.randn(3, 5, 40, generator=g); w = torch.randn(40, generator=g)
    want_x = x + d
    h = add_rms_norm(x, d, w, 1e-5)
    torch.testing.assert_close(x, want_x)
    torch.testing.assert_close(h, rms_norm(want_x, w, 1e-5), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(add_rms_norm(x, None, w, 1e-5), rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x, want_x)                               # no delta: x untouched

    # SiLU-and-multiply
    gu = torch.randn(4, 2, 2 * 37, generator=g)
    gate, up = gu.chunk(2, -1)
    torch.testing.assert_close(silu_mul(gu), F.silu(gate) * up, rtol=1e-5, atol=1e-5)

    # RoPE + KV write, with and without q/k-norm, rows at scattered slots
    nh, nkv, hd, bs, S = 4, 2, 12, 4, 32
    ang = torch.outer(torch.arange(S, dtype=torch.float64), 1.0 / (1e4 ** (torch.arange(0, hd, 2) / hd)))
    ang = torch.cat((ang, ang), -1)
    cos, sin = ang.cos().float(), ang.sin().float()
    for qk in (False, True):
        kv = PagedKVCache(1, nkv, hd, max_lanes=3, max_seq_len=S, block_size=bs)
        for lane in (2, 0, 1):
            kv.reserve(lane, S)
        M = 5
        qkv = torch.randn(M, (nh + 2 * nkv) * hd, generator=g)
        lanes = torch.tensor([2, 0, 1, 2, 0]); pos = torch.tensor([3, 17, 0, 31, 9])
        slots = kv.slots(lanes, pos[:, None])
        qn = torch.randn(hd, generator=g) if qk else None
        kn = torch.randn(hd, generator=g) if qk else None
        q_got = rope_kv_write(qkv, pos, slots, cos, sin, kv.k[0], kv.v[0], nh, qn, kn, 1e-6)
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], -1)
        q, k, v = q.view(M, nh, hd), k.view(M, nkv, hd), v.view(M, nkv, hd)
        if qk:
            q, k = rms_norm(q, qn, 1e-6), rms_norm(k, kn, 1e-6)
        c, s = cos[pos][:, None], sin[pos][:, None]
        torch.testing.assert_close(q_got, q * c + _rotate_half(q) * s, rtol=1e-5, atol=1e-5)
        for r in range(M):
            lane, p = int(lanes[r]), int(pos[r])
            kk, vv = kv.lane_view(0, lane, p + 1)
            torch.testing.assert_close(kk[:, p], (k * c + _rotate_half(k) * s)[r], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(vv[:, p], v[r])

    # split-context attention: 1..8 splits over a 200-key context give the dense result; a padding
    # row with an out-of-range lane and a negative position gives zeros (and reads only valid memory)
    nh, nkv, hd, bs, S = 6, 2, 24, 16, 224
    kv = PagedKVCache(1, nkv, hd, max_lanes=3, max_seq_len=S, block_size=bs)
    lens = [199, 70, 5]
    lanes = torch.tensor([1, 2, 0])
    for step in range(S // bs):
        for b in range(3):
            kv.reserve(int(lanes[b]), min(lens[b] + 1, (step + 1) * bs))
    kv.k.normal_(generator=g); kv.v.normal_(generator=g)
    for T in (1, 3):
        start = torch.tensor(lens) - T + 1
        q = torch.randn(3, nh, T, hd, generator=g)
        want = _dense(kv, q, lanes, start)
        for ns in (1, 2, 4, 8):
            got = paged_attention_triton(q.transpose(1, 2), kv.k[0], kv.v[0], kv.block_table, lanes, start, ctx=S,
                                         splits=ns)
            torch.testing.assert_close(got.transpose(1, 2), want, rtol=1e-4, atol=1e-4)
    # batch invariance: a row's output is bit-identical alone, in a batch, and under a larger context span
    start = torch.tensor(lens)
    q = torch.randn(3, 1, nh, hd, generator=g)
    full = paged_attention_triton(q, kv.k[0], kv.v[0], kv.block_table, lanes, start, ctx=S)
    for b in range(3):
        alone = paged_attention_triton(q[b:b + 1], kv.k[0], kv.v[0], kv.block_table, lanes[b:b + 1], start[b:b + 1],
                                       ctx=S)
        assert torch.equal(alone, full[b:b + 1]), b
    narrow = paged_attention_triton(q[1:], kv.k[0], kv.v[0], kv.block_table, lanes[1:], start[1:], ctx=80)
    assert torch.equal(narrow, full[1:])                                 # spans 80 and 224: 1 vs 2 splits
    q = torch.randn(2, 1, nh, hd, generator=g)
    out = paged_attention_triton(q, kv.k[0], kv.v[0], kv.block_table, torch.tensor([1, 99]),
                                 torch.tensor([50, -5]), ctx=S, splits=4)
    assert out[1].eq(0).all() and out[0].abs().sum() > 0
    print("FUSED-OK")
""")


@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_fused_kernels_match_reference_in_interpreter(triton_interpreter) -> None:
    triton_interpreter(_CHECK, "FUSED-OK")


def test_num_splits_depend_only_on_the_span() -> None:
    assert [num_splits(n) for n in (1, 40, 128, 129, 1024, 4096, 100_000)] == [1, 1, 1, 2, 8, 32, 32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cuda_fused_forward_matches_reference(arch: str) -> None:
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model

    cfg = ModelConfig(arch=arch, vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=3, num_heads=8,
                      num_kv_heads=2, head_dim=32, qk_norm=arch == "qwen3", max_position=1024)
    models = [build_model(cfg, "cuda", torch.bfloat16, 4, 1024, weights="random", seed=7, attention=a)
              for a in ("reference", "triton")]
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 512, (3, 600), generator=g).cuda()
    lanes = torch.tensor([3, 0, 2], device="cuda")
    outs = []
    for m in models:
        m.kv.reserve_all()
        o = [m(prompt, lanes, torch.zeros(3, dtype=torch.long, device="cuda"), max_context=1024, last_only=True)[:, 0]]
        nxt = prompt[:, :1]
        for i in range(4):                                              # decode, long context: split attention
            o.append(m(nxt, lanes, torch.full((3,), 600 + i, device="cuda"), max_context=1024)[:, 0])
        o.append(m(prompt[:, 1:4], lanes, torch.tensor([604, 300, 10], device="cuda"), max_context=1024).flatten(0, 1))
        outs.append(torch.cat(o).float())
    ref, fused = outs
    err = (ref - fused).abs().max().item()
    assert err < 0.05 * ref.abs().max().item(), err
    assert (ref.argmax(-1) == fused.argmax(-1)).float().mean() > 0.9
