"""The model vocabulary as the engine registers it (seed 000 §词表).

The engine sends raw token bytes (no display decoding, no UTF-8 repair, no
NFC), the explicit set of special/control ids and the EOS ids.  The
constraint side never guesses specials from spellings: xgrammar's own
special-token heuristic is overridden by :func:`encoded_vocab_for_xgrammar`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["Vocabulary", "encoded_vocab_for_xgrammar"]


@dataclass(frozen=True)
class Vocabulary:
    """Token domain of one model.

    Attributes:
        vocab_size: V, the logits width of the model (>= ``len(token_bytes)``).
            Ids in ``[len(token_bytes), V)`` (padding) are never allowed.
        token_bytes: raw bytes of each id ``0 .. len(token_bytes)-1``.
        special_ids: control/reserved ids (``< V``); never matched as text,
            whatever their spelling (``b"<|im_end|>"`` is not the text
            ``<|im_end|>``).
        eos_ids: ids that end generation (``< len(token_bytes)``); allowed by a
            mask exactly when the language allows ending.

    Raises:
        ValueError: on inconsistent fields (checked in ``__post_init__``).
    """

    vocab_size: int
    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int] = frozenset()
    eos_ids: tuple[int, ...] = ()
    _fingerprint: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.token_bytes)
        if self.vocab_size < n or self.vocab_size <= 0:
            raise ValueError(f"vocab_size {self.vocab_size} must be >= len(token_bytes) {n} and > 0")
        for i in self.eos_ids:
            if not 0 <= i < n:
                raise ValueError(f"EOS id {i} outside the tokenizer [0, {n})")
        for i in self.special_ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"special id {i} outside [0, {self.vocab_size})")

    @property
    def num_tokenizer_tokens(self) -> int:
        """``len(token_bytes)``: ids at or above this are padding."""
        return len(self.token_bytes)

    def is_text_token(self, token_id: int) -> bool:
        """True for an ordinary text token: inside the tokenizer, not EOS, not special."""
        return (
            0 <= token_id < len(self.token_bytes)
            and token_id not in self.special_ids
            and token_id not in self.eos_ids
        )

    def fingerprint(self) -> str:
        """Stable content hash (hex sha256) used as the vocabulary id in cache keys."""
        if not self._fingerprint:
            h = hashlib.sha256()
            h.update(f"V={self.vocab_size};n={len(self.token_bytes)};".encode())
            for b in self.token_bytes:
                h.update(len(b).to_bytes(4, "little"))
                h.update(b)
            h.update(repr(sorted(self.special_ids)).encode())
            h.update(repr(tuple(self.eos_ids)).encode())
            self._fingerprint.append(h.hexdigest())
        return self._fingerprint[0]

    @classmethod
    def from_any(cls, obj) -> "Vocabulary":
        """Convert any object with the same four fields (e.g. the engine's
        ``gpu_engine.model.vocab.TokenVocabulary``)."""
        if isinstance(obj, cls):
            return obj
        return cls(
            vocab_size=int(obj.vocab_size),
            token_bytes=tuple(bytes(b) for b in obj.token_bytes),
            special_ids=frozenset(int(i) for i in obj.special_ids),
            eos_ids=tuple(int(i) for i in obj.eos_ids),
        )


def encoded_vocab_for_xgrammar(vocab: Vocabulary) -> list[bytes]:
    """Token list handed to ``xgrammar.TokenizerInfo`` (``VocabType.RAW``).

    xgrammar treats a token whose bytes are empty as special (never matched as
    text) and ids in ``[len(list), vocab_size)`` as padding.  It would
    otherwise match a control token by its spelling, and even a stop token by
    its spelling as ordinary text.  So EOS and special ids are passed as
    ``b""``; EOS ids still act as stop tokens through ``stop_token_ids``.
    """
    hidden = set(vocab.special_ids) | set(vocab.eos_ids)
    return [b"" if i in hidden else b for i, b in enumerate(vocab.token_bytes)]
