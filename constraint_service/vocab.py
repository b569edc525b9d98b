"""The model vocabulary as the engine registers it (seed 000 §词表).

The engine sends raw token bytes (no display decoding, no UTF-8 repair, no
NFC), the explicit set of special/control ids and the EOS ids.  The
constraint side never guesses specials from spellings: xgrammar's own
special-token heuristic is overridden by :func:`encoded_vocab_for_xgrammar`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["Vocabulary", "encoded_vocab_for_xgrammar", "utf8_substring_possible"]


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


def _lead_length(c: int) -> int:
    """Bytes of the character that byte ``c`` starts (Unicode Table 3-7); 0 for a byte no well-formed
    character starts with (a continuation byte 80..BF, or C0, C1, F5..FF, which never occur at all)."""
    if c < 0x80:
        return 1
    if 0xC2 <= c <= 0xDF:
        return 2
    if 0xE0 <= c <= 0xEF:
        return 3
    if 0xF0 <= c <= 0xF4:
        return 4
    return 0


#: The range of the second byte after the lead bytes whose second byte is narrower than 80..BF
#: (Unicode Table 3-7: E0 A0..BF no overlong, ED 80..9F no surrogate, F0 90..BF no overlong,
#: F4 80..8F nothing above U+10FFFF).
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def utf8_substring_possible(b: bytes) -> bool:
    r"""True iff ``b`` occurs inside some well-formed UTF-8 byte string.

    The well-formed byte sequences are those of RFC 3629 §4 (the ``UTF8-char`` ABNF), the same as
    Unicode Table 3-7 ("Well-Formed UTF-8 Byte Sequences"): 00..7F; C2..DF 80..BF; E0 A0..BF 80..BF;
    E1..EC 80..BF 80..BF; ED 80..9F 80..BF; EE..EF 80..BF 80..BF; F0 90..BF 80..BF 80..BF;
    F1..F3 80..BF 80..BF 80..BF; F4 80..8F 80..BF 80..BF.  A substring of such a string is therefore:

    * at most 3 leading continuation bytes (80..BF), whatever their values: the tail of one character
      (C2, E1 or F1 accept any 80..BF after them, so 1, 2 or 3 of them always have a lead byte that fits);
      4 or more never (no character has more than 3 continuation bytes);
    * then well-formed UTF-8 (whole characters),
    * which may end with a valid but incomplete prefix of one character: a lead byte, its second byte in
      the table's range for that lead, and continuation bytes (``b"\xe0\xa4"`` yes; ``b"\xe0\x80"``
      overlong, ``b"\xed\xa0"`` surrogate, ``b"\xf4\x90"`` above U+10FFFF: never).

    So C0, C1 and F5..FF are never in it, anywhere.  The empty string is (True).  Checked (in the tests)
    against a brute-force oracle: ``p + b + s`` decodes strictly for some lead-byte prefix ``p`` and
    continuation-byte suffix ``s``.  Python's incremental decoder is not used for the incomplete tail: it
    buffers ``b"\xed\xa0"`` (a surrogate's first two bytes) without an error.
    """
    try:
        b.decode("utf-8")
        return True  # the common case: whole characters
    except UnicodeDecodeError:
        pass
    n = len(b)
    k = 0
    while k < n and 0x80 <= b[k] <= 0xBF:
        k += 1
    if k > 3:
        return False
    rest = b[k:]  # empty, or starts with a byte that is not a continuation byte
    if not rest:
        return True
    m = len(rest)
    head = rest
    for t in range(1, min(3, m) + 1):  # the last non-continuation byte among the last 3
        c = rest[m - t]
        if 0x80 <= c <= 0xBF:
            continue
        need = _lead_length(c)
        if need == 0:
            return False
        if t < need:  # an incomplete last character: its second byte must fit its lead
            if t >= 2:
                lo, hi = _SECOND_BYTE.get(c, (0x80, 0xBF))
                if not lo <= rest[m - t + 1] <= hi:
                    return False
            head = rest[: m - t]
        break
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def encoded_vocab_for_xgrammar(vocab: Vocabulary) -> list[bytes]:
    r"""Token list handed to ``xgrammar.TokenizerInfo`` (``VocabType.RAW``).

    xgrammar treats a token whose bytes are empty as special (never matched as
    text) and ids in ``[len(list), vocab_size)`` as padding.  It would
    otherwise match a control token by its spelling, and even a stop token by
    its spelling as ordinary text.  So EOS and special ids are passed as
    ``b""``; EOS ids still act as stop tokens through ``stop_token_ids``.

    A token whose bytes cannot occur in any well-formed UTF-8 string
    (:func:`utf8_substring_possible` False: e.g. the bytes C0, C1, F5..FF, or
    ``b"e\xc0"``, ``b"e\xe0\x80"``) is passed as ``b""`` too.  Every language
    compiled here is Unicode text encoded as UTF-8 (xgrammar grammars are over
    code points; surrogates are excluded by ``exclude_surrogates``), so no such
    token can ever be part of an output; and xgrammar 0.2.9 allowed some of
    them in masks that its matcher then rejects (``root ::= "x" "e"? [0-9]``
    after ``x`` allowed ``b"e\xc0"``, ``b"e\xe0\x80"``, ``b"e\xf0\x80"``
    where a digit is required: an unsound mask).  Hidden that way, no mask can
    allow them.  (SmolLM2, 49,152 tokens: 0 hidden, 6 ms; Qwen3, 151,669: the
    13 single bytes C0, C1, F5..FF, 21 ms; Qwen3.5, 248,077: the same 13, 34 ms;
    this 2-CPU box.)  Only this list changes: :meth:`Vocabulary.fingerprint`
    does not.
    """
    hidden = set(vocab.special_ids) | set(vocab.eos_ids)
    return [b"" if i in hidden or not utf8_substring_possible(b) else b
            for i, b in enumerate(vocab.token_bytes)]
