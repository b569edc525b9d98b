"""Weights from a GGUF file, dequantized and renamed to Hugging Face names.

llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` of *llama*
models (interleaved-pair RoPE); we undo that so the weights work with the
rotate-half RoPE in :mod:`gpu_engine.model.llama`, exactly as transformers'
GGUF loader does. Qwen2/Qwen3 files are stored unpermuted (NEOX RoPE).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from gpu_engine.model.config import ModelConfig

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str | None:
    """Hugging Face name of a GGUF tensor, or ``None`` for tensors we do not use (e.g. ``rope_freqs``)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of q/k projection rows.

    Args:
        w: ``[n_head * head_dim, ...]`` weight (or bias) rows.
        n_head: heads in this projection (``num_kv_heads`` for k).
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _dequant_torch(raw: np.ndarray, qtype: int) -> torch.Tensor | None:
    """Fast multithreaded torch dequantisation of the simple block formats.

    Args:
        raw: ``[..., n_bytes]`` uint8 blocks as stored.
    Returns:
        float32 ``[n_blocks * 32]`` or ``None`` for other formats.
    """
    from gguf import GGMLQuantizationType as Q

    b = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True).reshape(-1))  # own copy: the mmap is read-only
    if qtype == Q.Q8_0:                                        # d:f16, qs:int8[32]
        blk = b.view(-1, 34)
        d = blk[:, :2].contiguous().view(torch.float16).float()
        return (blk[:, 2:].contiguous().view(torch.int8).float() * d).reshape(-1)
    if qtype in (Q.Q4_0, Q.Q4_1):                              # d:f16, [m:f16], qs:u8[16] (low nibbles first)
        off = 2 if qtype == Q.Q4_0 else 4
        blk = b.view(-1, off + 16)
        d = blk[:, :2].contiguous().view(torch.float16).float()
        qs = blk[:, off:]
        q = torch.cat((qs & 0x0F, qs >> 4), dim=1).float()   # [n_blocks, 32]
        if qtype == Q.Q4_0:
            return ((q - 8.0) * d).reshape(-1)
        m = blk[:, 2:4].contiguous().view(torch.float16).float()
        return (q * d + m).reshape(-1)
    return None


def dequantize_tensor(t) -> np.ndarray:
    """A ``gguf.ReaderTensor`` as float32 numpy ``[rows, cols]`` (PyTorch layout, ne reversed)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(s) for s in reversed(t.shape))
    if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    fast = _dequant_torch(t.data, int(t.tensor_type))
    arr = fast.numpy() if fast is not None else dequantize(t.data, t.tensor_type)
    return arr.reshape(shape)


def load_gguf_weights(path: str | Path | object, config: ModelConfig | None = None,
                      dtype: torch.dtype = torch.float32) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read, dequantize and rename every weight of a GGUF file.

    Args:
        path: GGUF file, or an open :class:`~gpu_engine.model.gguf_file.GGUFFile` / ``gguf.GGUFReader``.

    Returns:
        ``(config, weights)``: weights are CPU tensors of ``dtype`` keyed by
        Hugging Face names; tied models have no ``lm_head.weight``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unsupported architecture.
    """
    from gpu_engine.model.gguf_file import GGUFFile

    if hasattr(path, "tensors"):
        reader = path
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        reader = GGUFFile(path)
    cfg = config or ModelConfig.from_gguf(reader)
    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        arr = dequantize_tensor(t)
        if cfg.arch == "llama":
            if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
                arr = unpermute_rope_rows(arr, cfg.num_heads)
            elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
                arr = unpermute_rope_rows(arr, cfg.num_kv_heads)
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.array(arr, dtype=np.float32, order="C")  # owns its memory, not the file mmap
        weights[name] = torch.from_numpy(arr).to(dtype)
    return cfg, weights
