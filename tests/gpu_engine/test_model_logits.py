"""Our Llama forward on the real SmolLM2-135M GGUF vs transformers' GGUF model.

Needs the cached GGUF (CI fetches it with ``python -m gpu_engine.hub.fetch``
before the tests) and transformers + accelerate (test extras).
"""
from __future__ import annotations

import pytest
import torch

from gpu_engine.hub.fetch import cached_model_path

GGUF = cached_model_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GGUF is None, reason="SmolLM2 GGUF not in cache: run `python -m gpu_engine.hub.fetch` first"),
]
# Logit scale is ~30; fp32 reductions in a different order differ by ~1e-5.
ATOL = 2e-3

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    '<|im_start|>user\nGive me JSON: {"a": 1}<|im_end|>\n<|im_start|>assistant\n',
]


@pytest.fixture(scope="module")
def ours():
    from gpu_engine.model.loader import load_model

    torch.set_num_threads(2)
    loaded = load_model(str(GGUF), device="cpu", dtype=torch.float32, max_lanes=4, max_seq_len=128)
    loaded.model.kv.reserve_all()  # these tests drive forward directly (no executor reserving blocks)
    return loaded


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32).eval()


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()   # [T, V]


def encode_all(ours) -> list[list[int]]:
    return [ours.tokenizer.encode(p) for p in PROMPTS]


def test_config_and_vocab(ours) -> None:
    c = ours.config
    assert (c.arch, c.vocab_size, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == ("llama", 49152, 30, 576, 9, 3)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert ours.vocab.vocab_size == c.vocab_size == len(ours.vocab.token_bytes)
    assert 2 in ours.vocab.eos_ids


def test_prefill_matches_transformers(ours, hf_model) -> None:
    m = ours.model
    for lane, ids in enumerate(encode_all(ours)):
        got = m(torch.tensor([ids]), torch.tensor([lane]), torch.tensor([0]))[0]
        ref = hf_logits(hf_model, ids)
        diff = (got - ref).abs().max().item()
        print(f"prefill lane {lane} T={len(ids)} max|diff|={diff:.2e} (|logit| max {ref.abs().max():.1f})")
        assert got.shape == ref.shape and got.dtype == torch.float32
        assert diff < ATOL
        # last_only + max_context bucket give the same last row
        last = m(torch.tensor([ids]), torch.tensor([lane]), torch.tensor([0]), max_context=64, last_only=True)[0, 0]
        assert (last - ref[-1]).abs().max().item() < ATOL


def test_batched_decode_matches_single_lane_and_transformers(ours, hf_model) -> None:
    m = ours.model
    lanes = [3, 1, 0]                                   # not in order, lane 2 unused
    seqs = [list(p) for p in encode_all(ours)]
    nxt, step_logits = [], []
    for lane, ids in zip(lanes, seqs):
        nxt.append(int(m(torch.tensor([ids]), torch.tensor([lane]), torch.tensor([0]), last_only=True)[0, 0].argmax()))
    for _ in range(4):                                  # batched greedy decode, lanes at different lengths
        start = torch.tensor([len(s) for s in seqs])
        batched = m(torch.tensor([[t] for t in nxt]), torch.tensor(lanes), start, max_context=64)[:, 0]   # [B, V]
        for b, s in enumerate(seqs):
            s.append(nxt[b])
        step_logits.append(batched)
        nxt = [int(x) for x in batched.argmax(-1)]
    for b, s in enumerate(seqs):                        # causal: one full-sequence reference pass per lane
        ref = hf_logits(hf_model, s)[-4:]
        got = torch.stack([step[b] for step in step_logits])
        diff = (got - ref).abs().max().item()
        print(f"decode lane {lanes[b]} positions {len(s) - 4}..{len(s) - 1}: max|diff|={diff:.2e}")
        assert diff < ATOL
    # single-lane decode of the same tokens into a fresh lane gives the same logits as the batch
    s = seqs[1]
    m(torch.tensor([s[:-2]]), torch.tensor([2]), torch.tensor([0]))
    single = m(torch.tensor([[s[-2]], [s[-1]]]), torch.tensor([2, 1]), torch.tensor([len(s) - 2, len(s) - 1]))[0, 0]
    assert (single - step_logits[-2][1]).abs().max().item() < 1e-4


def test_verify_block_equals_sequential_decode(ours) -> None:
    """T=K+1 (speculative verification) == K+1 single-token steps."""
    m = ours.model
    ids = ours.tokenizer.encode(PROMPTS[0])
    drafts = ours.tokenizer.encode(" Paris, and the")
    m(torch.tensor([ids]), torch.tensor([0]), torch.tensor([0]))
    block = m(torch.tensor([drafts]), torch.tensor([0]), torch.tensor([len(ids)]))[0]
    m(torch.tensor([ids]), torch.tensor([1]), torch.tensor([0]))
    for i, t in enumerate(drafts):
        step = m(torch.tensor([[t]]), torch.tensor([1]), torch.tensor([len(ids) + i]))[0, 0]
        assert (step - block[i]).abs().max().item() < 1e-3
    # re-verifying from an earlier position overwrites stale KV correctly (rollback = rewrite)
    again = m(torch.tensor([drafts]), torch.tensor([1]), torch.tensor([len(ids)]))[0]
    assert (again - block).abs().max().item() < 1e-3


def test_early_exit_writes_same_kv(ours) -> None:
    m = ours.model
    ids = ours.tokenizer.encode(PROMPTS[1])
    L = 10
    full = m(torch.tensor([ids]), torch.tensor([0]), torch.tensor([0]))
    early = m(torch.tensor([ids]), torch.tensor([1]), torch.tensor([0]), num_layers=L)
    T = len(ids)
    assert early.shape == full.shape
    for a, b in zip(m.kv.lane_view(slice(0, L), 0, T), m.kv.lane_view(slice(0, L), 1, T)):
        assert torch.equal(a, b)
    assert not torch.allclose(early, full)
