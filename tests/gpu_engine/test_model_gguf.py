"""GGUF weight loading: dequantisation fast paths, name mapping, rope row un-permutation."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_engine.model.gguf_loader import _dequant_torch, hf_name, unpermute_rope_rows


@pytest.mark.parametrize("qname", ["Q4_0", "Q4_1", "Q8_0"])
def test_fast_dequant_equals_gguf_reference(qname: str) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q = GGMLQuantizationType[qname]
    x = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    raw = quantize(x, q)
    ref = dequantize(raw, q).reshape(-1)
    got = _dequant_torch(raw, int(q)).numpy()
    np.testing.assert_array_equal(got, ref)


def test_unpermute_inverts_llama_cpp_permute() -> None:
    n_head, head_dim, cols = 3, 8, 5
    w = np.arange(n_head * head_dim * cols, dtype=np.float32).reshape(n_head * head_dim, cols)
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    permuted = w.reshape(n_head, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_rope_rows(permuted, n_head), w)


def test_names() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert hf_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_name("blk.3.attn_k_norm.weight") == "model.layers.3.self_attn.k_norm.weight"
    assert hf_name("rope_freqs.weight") is None


def test_fast_reader_agrees_with_gguf_reader() -> None:
    from gpu_engine.hub.fetch import cached_model_path
    from gpu_engine.model.gguf_file import GGUFFile

    path = cached_model_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF not in cache: run `python -m gpu_engine.hub.fetch` first")
    from gguf import GGUFReader

    ref, ours = GGUFReader(str(path)), GGUFFile(path)
    assert set(ref.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"} == set(ours.fields)
    for k, f in ours.fields.items():
        assert f.contents() == ref.fields[k].contents(), k
    assert len(ref.tensors) == len(ours.tensors)
    for a, b in zip(ref.tensors, ours.tensors):
        assert (a.name, tuple(int(x) for x in a.shape), a.tensor_type) == (b.name, b.shape, b.tensor_type)
        np.testing.assert_array_equal(np.asarray(a.data).reshape(-1), b.data.reshape(-1))
