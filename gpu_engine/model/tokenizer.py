"""Tokenizer built from GGUF metadata with the ``tokenizers`` library.

Byte-level BPE (``tokenizer.ggml.model == "gpt2"``) from
``tokenizer.ggml.tokens`` + ``merges``, with the pre-tokenizer that
``tokenizer.ggml.pre`` names (llama.cpp's table), and control tokens added as
special tokens. A Hugging Face ``tokenizer.json`` loads directly. The runtime
needs no ``transformers``.

Streaming output goes through :class:`IncrementalDetokenizer`, which works on
the raw token bytes of :class:`~gpu_engine.model.vocab.TokenVocabulary` and
emits text only for complete UTF-8 sequences.
"""
from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from gpu_engine.model.vocab import (
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_USER_DEFINED,
    TokenVocabulary,
    token_bytes_from_gguf_fields,
)

# Split regexes of llama.cpp pre-tokenizer types (``tokenizer.ggml.pre``), applied
# before the byte-level mapping.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# GPT-2 regex after splitting every digit apart (StarCoder family, incl. SmolLM).
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")


def pre_tokenizer_for(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value (GPT-2's for unknown ones)."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _SPLITS:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas for streaming.

    Emits text only for complete UTF-8 sequences (a partial multi-byte
    character is held back until its last byte arrives); control tokens (EOS,
    ``<|im_start|>``, …) produce no text. Invalid byte sequences become U+FFFD.
    Not thread-safe: one per request.
    """

    def __init__(self, token_bytes: Sequence[bytes], skip_ids: frozenset[int]) -> None:
        self._token_bytes = token_bytes
        self._skip = skip_ids
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # all text emitted so far

    def add(self, token_ids: Iterable[int]) -> str:
        """Feed tokens; returns the newly completed text (possibly ``""``)."""
        n = len(self._token_bytes)
        buf = b"".join(self._token_bytes[t] for t in token_ids if t not in self._skip and 0 <= t < n)
        delta = self._decoder.decode(buf) if buf else ""
        self.text += delta
        return delta

    def flush(self) -> str:
        """End of stream: returns any held-back bytes as U+FFFD replacement text."""
        delta = self._decoder.decode(b"", final=True)
        self.text += delta
        return delta


class NInferTokenizer:
    """Encode/decode for one model.

    Attributes:
        backend: the ``tokenizers.Tokenizer``.
        vocab: raw token bytes, specials and EOS ids.
        add_bos: whether ``encode(add_special=True)`` prepends BOS.
    """

    def __init__(self, backend: Tokenizer, vocab: TokenVocabulary, add_bos: bool = False) -> None:
        self.backend = backend
        self.vocab = vocab
        self.add_bos = add_bos and vocab.bos_id >= 0
        # A twin that encodes control-token spellings as plain text (user content must
        # never become a control token). Separate instance: the flag is not per call.
        self._plain = Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True

    # ------------------------------------------------------------ builders
    @classmethod
    def from_gguf(cls, path_or_reader: Any, vocab_size: int | None = None) -> "NInferTokenizer":
        """Build from a GGUF file (path, :class:`~gpu_engine.model.gguf_file.GGUFFile` or ``gguf.GGUFReader``).

        Raises:
            ValueError: tokenizer model other than byte-level BPE (``gpt2``).
        """
        from gpu_engine.model.gguf_file import GGUFFile

        r = path_or_reader if hasattr(path_or_reader, "fields") else GGUFFile(path_or_reader)
        f = r.fields

        def get(key: str, default: Any = None) -> Any:
            return f[key].contents() if key in f else default

        model = get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model {model!r} is not supported (only byte-level BPE 'gpt2')")
        tokens: list[str] = list(get("tokenizer.ggml.tokens"))
        types: list[int] = list(get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", [])]
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
        backend = Tokenizer(bpe)
        backend.pre_tokenizer = pre_tokenizer_for(get("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL])
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED]
        if user:
            backend.add_tokens(user)

        tb = token_bytes_from_gguf_fields(tokens, types, model)
        special = frozenset(i for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL)
        eos = [int(get("tokenizer.ggml.eos_token_id"))] if "tokenizer.ggml.eos_token_id" in f else []
        for name in (b"<|endoftext|>", b"<|im_end|>", b"<|eot_id|>", b"<|end_of_text|>"):
            eos += [i for i in sorted(special) if tb[i] == name and i not in eos]
        vocab = TokenVocabulary(
            vocab_size=vocab_size if vocab_size is not None else len(tb),
            token_bytes=tuple(tb), special_ids=special, eos_ids=tuple(eos),
            bos_id=int(get("tokenizer.ggml.bos_token_id", -1)),
        )
        return cls(backend, vocab, add_bos=bool(get("tokenizer.ggml.add_bos_token", False)))

    @classmethod
    def from_hf_dir(cls, directory: str | Path, vocab_size: int | None = None) -> "NInferTokenizer":
        """Build from a Hugging Face model directory (``tokenizer.json`` [+ ``tokenizer_config.json``]).

        Raises:
            FileNotFoundError: no ``tokenizer.json``.
        """
        import json

        d = Path(directory)
        backend = Tokenizer.from_file(str(d / "tokenizer.json"))
        cfg = json.loads((d / "tokenizer_config.json").read_text()) if (d / "tokenizer_config.json").exists() else {}
        gen = json.loads((d / "generation_config.json").read_text()) if (d / "generation_config.json").exists() else {}
        n = backend.get_vocab_size(with_added_tokens=True)
        id_to_tok = [backend.id_to_token(i) or "" for i in range(n)]
        special_ids = {a.content: i for i, a in backend.get_added_tokens_decoder().items() if a.special}
        byte_level = '"ByteLevel"' in backend.to_str()  # GPT-2 byte alphabet vs SentencePiece spelling
        types = [TOKEN_TYPE_CONTROL if i in special_ids.values() else 1 for i in range(n)]
        tb = token_bytes_from_gguf_fields(id_to_tok, types, "gpt2" if byte_level else "llama")

        def tok_id(v: Any) -> int:
            if isinstance(v, dict):
                v = v.get("content")
            return backend.token_to_id(v) if isinstance(v, str) and backend.token_to_id(v) is not None else -1

        eos_cfg = gen.get("eos_token_id")
        eos = [e for e in (eos_cfg if isinstance(eos_cfg, list) else [eos_cfg]) if isinstance(e, int)]
        if not eos and tok_id(cfg.get("eos_token")) >= 0:
            eos = [tok_id(cfg.get("eos_token"))]
        for name in ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>"):
            if name in special_ids and special_ids[name] not in eos:
                eos.append(special_ids[name])
        vocab = TokenVocabulary(vocab_size=vocab_size or n, token_bytes=tuple(tb),
                                special_ids=frozenset(special_ids.values()), eos_ids=tuple(eos),
                                bos_id=tok_id(cfg.get("bos_token")))
        return cls(backend, vocab, add_bos=bool(cfg.get("add_bos_token", False)))

    # ------------------------------------------------------------ encode/decode
    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``.

        Args:
            add_special: prepend BOS when the model wants one (``add_bos``).
            parse_special: map control-token spellings in the text (``<|im_end|>``) to their
                ids; ``False`` encodes them as ordinary text (for user-supplied content).
        """
        ids = (self.backend if parse_special else self._plain).encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and (not ids or ids[0] != self.vocab.bos_id):
            ids = [self.vocab.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD); control tokens omitted unless ``skip_special=False``."""
        tb = self.vocab.token_bytes
        skip = self.vocab.special_ids if skip_special else frozenset()
        return b"".join(tb[i] for i in ids if i not in skip and 0 <= i < len(tb)).decode("utf-8", errors="replace")

    def detokenizer(self) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer (skips every control token, EOS included)."""
        return IncrementalDetokenizer(self.vocab.token_bytes, self.vocab.special_ids | frozenset(self.vocab.eos_ids))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.vocab.eos_ids
