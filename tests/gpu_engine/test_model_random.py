"""Tiny random-weight Llama / Qwen2 / Qwen3 vs transformers with the same weights.

Checks the architecture variants (qkv bias, per-head q/k norm, untied head,
GQA) without any model file.
"""
from __future__ import annotations

import pytest
import torch

from gpu_engine.model.config import PRESETS, ModelConfig
from gpu_engine.model.llama import build_model, context_bucket

transformers = pytest.importorskip("transformers")

V = 32011  # not a multiple of 32 on purpose


def tiny(arch: str, tie: bool) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=V, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie,
                       attention_bias=arch == "qwen2", qk_norm=arch == "qwen3", max_position=256)


def hf_model(cfg: ModelConfig):
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                  num_key_value_heads=cfg.num_kv_heads, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                  tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=cfg.max_position)
    if cfg.arch == "llama":
        hc = transformers.LlamaConfig(head_dim=cfg.head_dim, **common)
        model = transformers.LlamaForCausalLM(hc)
    elif cfg.arch == "qwen2":
        hc = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(hc)
    else:
        hc = transformers.Qwen3Config(head_dim=cfg.head_dim, **common)
        model = transformers.Qwen3ForCausalLM(hc)
    torch.manual_seed(0)
    with torch.no_grad():  # default init leaves norms at 1 and biases at 0: randomise them too
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" in name or "bias" in name else 0.05) + (1.0 if "norm" in name else 0.0))
    return model.eval()


@pytest.mark.parametrize("arch,tie", [("llama", False), ("qwen2", True), ("qwen3", True)], ids=["llama-untied", "qwen2-bias", "qwen3-qknorm"])
def test_random_weights_match_transformers(arch: str, tie: bool) -> None:
    torch.set_num_threads(2)
    cfg = tiny(arch, tie)
    ref_model = hf_model(cfg)
    weights = {k: v for k, v in ref_model.state_dict().items() if not (tie and k == "lm_head.weight")}
    ours = build_model(cfg, "cpu", torch.float32, max_lanes=3, max_seq_len=64, weights=weights)
    ours.kv.reserve_all()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, V, (n,), generator=g).tolist() for n in (7, 3, 12)]
    with torch.no_grad():
        refs = [ref_model(torch.tensor([s])).logits[0] for s in seqs]
    # prefill all but the last token, one lane each, then one batched decode step
    for lane, s in enumerate(seqs):
        got = ours(torch.tensor([s[:-1]]), torch.tensor([lane]), torch.tensor([0]))[0]
        assert (got - refs[lane][:-1]).abs().max().item() < 1e-4
    last = ours(torch.tensor([[s[-1]] for s in seqs]), torch.tensor([0, 1, 2]),
                torch.tensor([len(s) - 1 for s in seqs]), max_context=context_bucket(13, 64, 16))[:, 0]
    for b in range(3):
        assert (last[b] - refs[b][-1]).abs().max().item() < 1e-4


def test_context_bucket() -> None:
    assert [context_bucket(n, 2048) for n in (1, 128, 129, 1000, 5000)] == [128, 128, 256, 1024, 2048]


def test_presets_build_random() -> None:
    assert {"llama-1b-random", "qwen2-1.5b-random"} <= set(PRESETS)
    cfg = PRESETS["qwen3-0.6b-random"].replace(num_layers=1, vocab_size=1000)
    m = build_model(cfg, "cpu", torch.float32, max_lanes=2, max_seq_len=16, weights="random")
    m.kv.reserve_all()
    out = m(torch.tensor([[1, 2], [3, 4]]), torch.tensor([1, 0]), torch.tensor([0, 5]))
    assert out.shape == (2, 2, 1000) and out.dtype == torch.float32 and torch.isfinite(out).all()


def test_llama3_rope_scaling_matches_transformers() -> None:
    from gpu_engine.model.llama import rope_inv_freq

    cfg = PRESETS["llama-1b-random"]
    hc = transformers.LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads, head_dim=cfg.head_dim,
                                  rope_theta=cfg.rope_theta, rope_scaling={"rope_type": "llama3", **cfg.rope_scaling})
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hc, "cpu")
    assert torch.allclose(rope_inv_freq(cfg).float(), ref.float(), rtol=1e-5)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_small_batch_head_matches_the_batched_head(tie: bool) -> None:
    """CPU forwards of <= SMALL_HEAD_ROWS rows use the [H, V] copy of the LM head: same logits as F.linear
    over the [V, H] head, and the copy follows reloaded weights."""
    from gpu_engine.model.llama import SMALL_HEAD_ROWS

    cfg = tiny("llama", tie)
    m = build_model(cfg, "cpu", torch.float32, max_lanes=4, max_seq_len=32, weights="random", seed=3)
    assert m.lm_head_small is not None and m.lm_head_small.shape == (cfg.hidden_size, V)
    m.kv.reserve_all()
    ids = torch.tensor([[5, 9, 2, 7]] * 4)
    m(ids, torch.arange(4), torch.zeros(4, dtype=torch.int64))
    one = m(torch.tensor([[11]]), torch.tensor([2]), torch.tensor([4]))                      # 1 row: the copy
    m.lm_head_small, saved = None, m.lm_head_small
    ref = m(torch.tensor([[11]]), torch.tensor([2]), torch.tensor([4]))                      # F.linear
    m.lm_head_small = saved
    assert SMALL_HEAD_ROWS >= 1 and (one - ref).abs().max().item() < 1e-5
    weights = {k: v * 2 for k, v in hf_model(cfg).state_dict().items() if not (tie and k == "lm_head.weight")}
    m.load_weights(weights)
    assert torch.equal(m.lm_head_small, m.lm_head.t())
