"""Plain value types of the constraint service (docs/INTERNALS.md).

Also names the per-position status bytes written next to every bitmask row
(seed 000 §mask 状态表; INTERNALS "Bitmask convention") and the bitmask width
helper.  ``shared_memory/layout.py`` owns both; they are re-exported from there
when that module exists so there is exactly one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "BITMASK_DTYPE",
    "CONSTRAINT_KINDS",
    "CompileInfo",
    "ConstraintSpec",
    "DEAD_END",
    "PreviewResult",
    "READY",
    "UNCONSTRAINED",
    "UNREACHABLE",
    "bitmask_words",
]

try:  # one helper, one dtype (STYLE "Shapes, dtypes, units")
    from shared_memory.layout import BITMASK_DTYPE, bitmask_words  # type: ignore
    from shared_memory.layout import STATUS_DEAD_END as DEAD_END  # type: ignore
    from shared_memory.layout import STATUS_READY as READY  # type: ignore
    from shared_memory.layout import STATUS_UNCONSTRAINED as UNCONSTRAINED  # type: ignore
    from shared_memory.layout import STATUS_UNREACHABLE as UNREACHABLE  # type: ignore
except ImportError:  # pragma: no cover - shared_memory/layout.py is the owner
    BITMASK_DTYPE = np.uint32

    def bitmask_words(vocab_size: int) -> int:
        """Number of 32-bit words per bitmask position: ``ceil(V / 32)``."""
        return (vocab_size + 31) // 32

    # Per-position status bytes (uint8), INTERNALS "Bitmask convention".
    UNCONSTRAINED = 0  #: row has no grammar (mask disabled, words not read)
    READY = 1  #: mask written for this position
    DEAD_END = 2  #: the hypothetical prefix has no legal next token (words zero)
    UNREACHABLE = 3  #: an earlier draft was illegal or EOS was accepted (words zero)

#: The five body constraint kinds (seed 000 §正文约束).
CONSTRAINT_KINDS = frozenset({"json_object", "json_schema", "grammar", "regex", "choice"})


@dataclass(frozen=True)
class ConstraintSpec:
    """What the request asked for.

    Attributes:
        kind: ``"json_object" | "json_schema" | "grammar" | "regex" | "choice"``.
        source: schema JSON text / GBNF text / ECMAScript regex; ``""`` for
            ``json_object`` and ``choice``.
        choices: the literal options of a ``choice`` constraint (``()`` otherwise).
    """

    kind: str
    source: str = ""
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompileInfo:
    """How a prepare obtained its compiled grammar.

    Attributes:
        cache: ``"hit"`` (retained grammar, no compile slot taken), ``"built"``
            (this request compiled it) or ``"waited"`` (another request was
            building the same key; this one waited for that build).
        seconds: wall-clock seconds spent in ``ConstraintCompiler.compile``
            (includes the lazy vocabulary index build and slot waiting).
    """

    cache: str
    seconds: float


@dataclass(frozen=True)
class PreviewResult:
    """State after a preview (seed 000 §事务).

    Attributes:
        complete: the language allows ending here ("allowed to end").
        terminated: an EOS token was accepted ("has ended").
    """

    complete: bool
    terminated: bool
