"""Raw token bytes of a model vocabulary, read from a GGUF file.

The constraint sidecar must match tokens by their exact bytes (seed 000 §2
"token domain"): no display decode, no replacement of partial UTF-8, no
guessing of special tokens. This module produces exactly that from the
GGUF tokenizer metadata.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# GGUF token types (llama.cpp `llama_token_type`).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6


@lru_cache(maxsize=1)
def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (char -> byte value)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@dataclass(frozen=True)
class TokenVocabulary:
    """The token domain of a model, as the engine registers it with the sidecar.

    Attributes:
        vocab_size: V, the width of the model's logits (number of token ids the
            sampler may draw from). ``len(token_bytes) <= vocab_size``; ids in
            ``[len(token_bytes), vocab_size)`` exist in the logits but not in the
            tokenizer and are never allowed by a mask.
        token_bytes: raw bytes of each token id (index = id). Control tokens
            carry their literal spelling (e.g. ``b"<|im_end|>"``).
        special_ids: ids that are control/special tokens: never matched as
            ordinary text by a grammar.
        eos_ids: ids that end generation (subset of ``special_ids``); the
            first one is the model's primary EOS.
        bos_id: beginning-of-sequence id, or -1 when the model has none.
    """

    vocab_size: int
    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int] = field(default_factory=frozenset)
    eos_ids: tuple[int, ...] = ()
    bos_id: int = -1

    @property
    def vocab_id(self) -> str:
        """A content hash identifying this vocabulary (hex string)."""
        import hashlib

        h = hashlib.sha256()
        h.update(str(self.vocab_size).encode())
        for t in self.token_bytes:
            h.update(len(t).to_bytes(4, "little"))
            h.update(t)
        h.update(repr(sorted(self.special_ids)).encode())
        h.update(repr(self.eos_ids).encode())
        return h.hexdigest()[:16]


def token_bytes_from_gguf_fields(tokens: list[str], token_types: list[int], model: str) -> list[bytes]:
    """Convert GGUF token strings to raw bytes.

    Args:
        tokens: ``tokenizer.ggml.tokens`` strings, index = id.
        token_types: ``tokenizer.ggml.token_type`` values, same length.
        model: ``tokenizer.ggml.model`` (``"gpt2"`` byte-level BPE or
            ``"llama"`` SentencePiece).

    Raises:
        ValueError: unknown tokenizer model or a byte-level token containing a
            character outside GPT-2's byte alphabet.
    """
    out: list[bytes] = []
    if model == "gpt2":
        dec = _gpt2_byte_decoder()
        for tok, ty in zip(tokens, token_types):
            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_UNUSED):
                out.append(tok.encode("utf-8"))
                continue
            try:
                out.append(bytes(dec[c] for c in tok))
            except KeyError as e:
                raise ValueError(f"token {tok!r} has a character outside the GPT-2 byte alphabet: {e}") from None
    elif model == "llama":
        for tok, ty in zip(tokens, token_types):
            if ty == TOKEN_TYPE_BYTE and tok.startswith("<0x") and tok.endswith(">"):
                out.append(bytes([int(tok[3:-1], 16)]))
            elif ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_UNUSED):
                out.append(tok.encode("utf-8"))
            else:
                out.append(tok.replace("\u2581", " ").encode("utf-8"))
    else:
        raise ValueError(f"unsupported tokenizer model {model!r} (expected 'gpt2' or 'llama')")
    return out


def load_vocabulary_from_gguf(path: str | Path, vocab_size: int | None = None) -> TokenVocabulary:
    """Read a :class:`TokenVocabulary` from a GGUF file's tokenizer metadata.

    Args:
        path: GGUF file.
        vocab_size: logits width V; defaults to the number of tokens.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unsupported tokenizer model.
    """
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    f = r.fields
    tokens = list(f["tokenizer.ggml.tokens"].contents())
    types = list(f["tokenizer.ggml.token_type"].contents())
    model = f["tokenizer.ggml.model"].contents()
    tb = token_bytes_from_gguf_fields(tokens, types, model)
    special = frozenset(i for i, t in enumerate(types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_UNKNOWN))
    eos = [int(f["tokenizer.ggml.eos_token_id"].contents())] if "tokenizer.ggml.eos_token_id" in f else []
    # <|endoftext|>-style document end also terminates generation when present.
    for name in (b"<|endoftext|>", b"<|im_end|>", b"<|eot_id|>", b"<|end_of_text|>"):
        for i in special:
            if tb[i] == name and i not in eos:
                eos.append(i)
    bos = int(f["tokenizer.ggml.bos_token_id"].contents()) if "tokenizer.ggml.bos_token_id" in f else -1
    return TokenVocabulary(
        vocab_size=vocab_size if vocab_size is not None else len(tb),
        token_bytes=tuple(tb),
        special_ids=special,
        eos_ids=tuple(eos),
        bos_id=bos,
    )
