"""The grammar-backend seam: a :class:`Backend` / :class:`Matcher` pair of Protocols.

STYLE "A narrow interface, one class per backend"; the same split as vLLM's
``StructuredOutputBackend`` / ``StructuredOutputGrammar`` and SGLang's
``BaseGrammarBackend`` / ``BaseGrammarObject``:

* a :class:`Backend` is bound to one vocabulary; it parses EBNF text into
  its own opaque grammar object (and concatenates such grammars), compiles that into a :class:`CompiledConstraint`
  (immutable, shared by every request with the same cache key), makes fresh
  matchers and fills many matchers' bitmasks at once;
* a :class:`Matcher` is one request's mutable grammar state (never shared).

xgrammar (``xgrammar_backend.py``) is the one implementation; nothing outside
``constraint_service/backend/`` sees a backend's own types.  The compile cache
(``compiler.py``) and the kind registry (``registry.py``) only use this module.

Bitmask convention (seed 000 §7 位图布局, INTERNALS "Bitmask convention"):
row ``r`` of a ``[rows, W]`` int32 tensor (a view of uint32 words,
``W = ceil(V / 32)``) has bit ``t & 31`` of word ``t >> 5`` set when token id
``t`` is allowed next.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from ninfer_common.constraint_kind import ConstraintKind

from ..vocab import Vocabulary

__all__ = ["Backend", "CompiledConstraint", "Grammar", "Matcher"]

#: A backend's parsed (not yet compiled) grammar; opaque outside the backend.
Grammar = Any


@runtime_checkable
class Matcher(Protocol):
    """One request's grammar state over token ids (never shared between requests)."""

    def accept_token(self, token_id: int) -> bool:
        """Accept one token id; False (state unchanged) if the grammar rejects it."""
        ...

    def accept_bytes(self, data: bytes) -> bool:
        """Accept raw bytes (may split a UTF-8 character) as one rollback step; False if rejected."""
        ...

    def rollback(self, num_steps: int) -> None:
        """Undo the last ``num_steps`` accepted steps (no-op for 0)."""
        ...

    def fill_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the allowed next-token set into ``bitmask[index]``.

        Args:
            bitmask: ``[rows, W]`` int32 CPU tensor.
            index: row to fill.  Bits >= V may be set; clear them with ``Backend.tail_mask``.
        """
        ...

    def is_terminated(self) -> bool:
        """An EOS token was accepted ("has ended")."""
        ...

    def is_completed(self) -> bool:
        """The input so far is a complete sentence ("allowed to end")."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A grammar library bound to one vocabulary.

    Attributes:
        vocab_size: V, the logits width.
        num_words: W = ``ceil(V / 32)`` uint32 words per bitmask row.
        tail_mask: AND-mask (uint32) for the last word of a row that clears bits >= V;
            ``None`` when ``V % 32 == 0``.
        eos_ids: the vocabulary's EOS token ids.
        vocab: the :class:`~constraint_service.vocab.Vocabulary` it is bound to.
    """

    vocab: Vocabulary
    vocab_size: int
    num_words: int
    tail_mask: Optional[np.uint32]
    eos_ids: frozenset[int]

    def parse_ebnf(self, source: str, *, kind: str = "InvalidGrammar") -> Grammar:
        """Parse EBNF text (entry rule ``root``, the xgrammar dialect the converters emit).

        Raises:
            ConstraintError: ``kind`` with ``"line:col"`` (character columns) for syntax errors.
        """
        ...

    def concat(self, grammars: Sequence[Grammar]) -> Grammar:
        """A grammar whose language is the concatenation of ``grammars``' languages, in order
        (used to put a thinking/tool wrapper around a body)."""
        ...

    def grammar_to_text(self, grammar: Grammar) -> str:
        """The grammar as text (to move it between processes; no compiled masks)."""
        ...

    def grammar_from_text(self, text: str) -> Grammar:
        """The grammar :meth:`grammar_to_text` wrote."""
        ...

    def compile(self, grammar: Grammar, *, kind: ConstraintKind | str, key: tuple,
                error_kind: str = "InvalidGrammar", threads: int = 1) -> "CompiledConstraint":
        """Compile ``grammar`` against the vocabulary (blocking; may take seconds).

        ``threads`` > 1 lets the library build the token masks on that many threads of its own; 1 runs
        the whole compile on the calling thread (so it can be re-niced if abandoned).

        Raises:
            ConstraintError: ``error_kind`` when the library rejects the grammar at compile time.
        """
        ...

    def new_matcher(self, compiled: Any) -> Matcher:
        """A fresh matcher at the start of the language of ``compiled`` (a backend-compiled grammar)."""
        ...

    def batch_accept(self, matchers: Sequence[Matcher], tokens: Sequence[int]) -> list[bool]:
        """``matchers[j].accept_token(tokens[j])`` for every ``j``, in one library call where it has one.

        Args:
            matchers: matchers made by this backend, none terminated, each at most once.
            tokens: ``[len(matchers)]`` token ids in ``[0, V)``.

        Returns:
            per matcher whether its token was accepted (a rejected token leaves that matcher unchanged).
        """
        ...

    def batch_fill(self, matchers: Sequence[Matcher], bitmask: torch.Tensor, indices: list[int]) -> None:
        """Fill ``bitmask[indices[j]]`` for ``matchers[j]`` (none terminated).

        Args:
            matchers: matchers made by this backend.
            bitmask: ``[rows, W]`` int32 CPU tensor.
            indices: row index per matcher.

        Bits >= V are *not* cleared here; see :attr:`tail_mask`.
        """
        ...


class CompiledConstraint:
    """An immutable compiled grammar shared by every request with the same key.

    Attributes:
        kind: the :class:`ConstraintKind` it was compiled from (None: tool calls / thinking without a body).
        key: the cache key (kind, canonical source, options, wrapper, vocabulary).
        grammar: the backend grammar it was compiled from (None if not kept).
        memory_size_bytes: the backend's estimate of the compiled grammar's size, bytes.
        backend: the :class:`Backend` that compiled it.

    Sessions call :meth:`acquire` / :meth:`release`; the cache never evicts a
    held entry, and an evicted grammar stays alive while referenced.
    """

    __slots__ = ("kind", "key", "backend", "_compiled", "memory_size_bytes", "_holders",
                 "_lock", "_on_idle", "grammar", "__weakref__")

    def __init__(self, kind: ConstraintKind | str | None, key: tuple, backend: Backend, compiled: Any,
                 memory_size_bytes: int, grammar: Grammar = None) -> None:
        self.kind = None if kind is None else ConstraintKind.parse(kind)  # None: a wrapper without a body
        self.key = key
        self.backend = backend
        self._compiled = compiled
        self.memory_size_bytes = int(memory_size_bytes)
        # the backend grammar it was compiled from (small: no token masks); the sidecar's Step shard
        # workers compile it again (Backend.grammar_to_text), never the library's compiled form, whose
        # serialisation is up to 1,000x larger and slower to compile (measured: 147 MB vs 188 KB)
        self.grammar = grammar
        self._holders = 0
        self._lock = threading.Lock()
        self._on_idle: Optional[Callable[["CompiledConstraint"], None]] = None

    @property
    def num_holders(self) -> int:
        """Number of live sessions holding this grammar."""
        return self._holders

    def acquire(self) -> None:
        """Mark one more session as holding this grammar."""
        with self._lock:
            self._holders += 1

    def release(self) -> None:
        """Drop one holder; when none remain the cache may evict it."""
        with self._lock:
            self._holders -= 1
            idle = self._holders == 0
        hook = self._on_idle
        if idle and hook is not None:
            hook(self)

    def new_matcher(self) -> Matcher:
        """A fresh matcher at the start of the language."""
        return self.backend.new_matcher(self._compiled)
