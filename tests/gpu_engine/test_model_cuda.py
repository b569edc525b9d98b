"""The Llama forward on CUDA: agrees with CPU, runs in bf16, and is CUDA-graph capturable."""
from __future__ import annotations

import pytest
import torch

from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CFG = ModelConfig(arch="qwen2", vocab_size=1001, hidden_size=128, intermediate_size=256, num_layers=3, num_heads=4,
                  num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  attention_bias=True, max_position=512)


def pair(dtype: torch.dtype):
    cpu = build_model(CFG, "cpu", torch.float32, max_lanes=4, max_seq_len=128, weights="random", seed=3)
    weights = {}
    for i, layer in enumerate(cpu.layers):   # rebuild HF-named weights from the fused CPU model
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        q, k, v = layer.qkv.split([cpu.q_size, cpu.kv_size, cpu.kv_size])
        qb, kb, vb = layer.qkv_bias.split([cpu.q_size, cpu.kv_size, cpu.kv_size])
        g, u = layer.gate_up.chunk(2)
        weights.update({p + "input_layernorm.weight": layer.attn_norm, p + "post_attention_layernorm.weight": layer.mlp_norm,
                        a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v,
                        a + "q_proj.bias": qb, a + "k_proj.bias": kb, a + "v_proj.bias": vb, a + "o_proj.weight": layer.o,
                        m + "gate_proj.weight": g, m + "up_proj.weight": u, m + "down_proj.weight": layer.down})
    weights.update({"model.embed_tokens.weight": cpu.embed, "model.norm.weight": cpu.norm, "lm_head.weight": cpu.lm_head})
    gpu = build_model(CFG, "cuda", dtype, max_lanes=4, max_seq_len=128, weights=weights)
    cpu.kv.reserve_all()  # these tests drive forward directly
    gpu.kv.reserve_all()
    return cpu, gpu


def run_both(cpu, gpu):
    g = torch.Generator().manual_seed(0)
    outs = []
    for m, dev in ((cpu, "cpu"), (gpu, "cuda")):
        res = []
        prompt = torch.randint(0, CFG.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
        for lane in range(3):
            res.append(m(prompt[lane:lane + 1, : 5 + lane].to(dev), torch.tensor([lane], device=dev),
                         torch.tensor([0], device=dev)).cpu())
        step = m(prompt[:, :1].to(dev), torch.tensor([2, 0, 1], device=dev), torch.tensor([7, 5, 6], device=dev),
                 max_context=32)
        res.append(step.cpu())
        outs.append(res)
    del g
    return outs


def test_cuda_fp32_matches_cpu() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = run_both(*pair(torch.float32))
    for x, y in zip(a, b):
        assert (x - y).abs().max().item() < 1e-3


def test_cuda_bf16_close_to_cpu() -> None:
    a, b = run_both(*pair(torch.bfloat16))
    for x, y in zip(a, b):
        assert y.dtype == torch.float32 and torch.isfinite(y).all()
        rel = (x - y).abs().max() / x.abs().max()
        assert rel.item() < 0.1


def test_decode_is_cuda_graph_capturable() -> None:
    _, m = pair(torch.bfloat16)
    B = 3
    ids = torch.zeros(B, 2, dtype=torch.long, device="cuda")          # T = 2: a K=1 verify block
    lanes = torch.tensor([0, 1, 2], device="cuda")
    start = torch.zeros(B, dtype=torch.long, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            m(ids, lanes, start, max_context=64)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m(ids, lanes, start, max_context=64)
    for step in range(4):
        new_ids = torch.randint(0, CFG.vocab_size, (B, 2), device="cuda")
        new_start = torch.tensor([step * 2, step * 2 + 1, 10 + step * 2], device="cuda")
        ids.copy_(new_ids)
        start.copy_(new_start)
        graph.replay()
        got = out.clone()
        ref = m(new_ids, lanes, new_start, max_context=64)   # eager rewrite of the same KV
        assert torch.equal(got, ref) or (got - ref).abs().max().item() < 1e-2
