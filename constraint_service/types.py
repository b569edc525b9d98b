"""Plain value types of the constraint service (docs/INTERNALS.md).

Also names the per-position status bytes written next to every bitmask row
(seed 000 §mask 状态表; INTERNALS "Bitmask convention") and the bitmask width
helper.  ``shared_memory/layout.py`` owns both; they are re-exported from there
when that module exists so there is exactly one definition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ninfer_common.constraint_kind import ConstraintKind

__all__ = [
    "BITMASK_DTYPE",
    "CONSTRAINT_KINDS",
    "CacheStatus",
    "CompileInfo",
    "ConstraintKind",
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

#: The five body constraint kinds (seed 000 §正文约束); one registry entry each
#: (``constraint_service/registry.py``).
CONSTRAINT_KINDS = frozenset(ConstraintKind)


@dataclass(frozen=True)
class ConstraintSpec:
    """What the request asked for.

    Attributes:
        kind: the :class:`ConstraintKind` (a wire spelling such as ``"regex"`` is
            converted on construction); None only with a ``wrapper`` and no body.
        source: schema JSON text / GBNF text / ECMAScript regex; ``""`` for
            ``json_object`` and ``choice``.
        choices: the literal options of a ``choice`` constraint (``()`` otherwise).
        wrapper: the model output wrapper (thinking stage, tool calls) as the canonical
            JSON text of ``ninfer_common.frontends.plan.OutputPlan.grammar_key()``;
            ``""`` = the plain body (seed 000 §编译与缓存: the wrapper is part of the key).

    Raises:
        ValueError: ``kind`` is not a constraint kind (or None without a wrapper).
    """

    kind: ConstraintKind | None
    source: str = ""
    choices: tuple[str, ...] = ()
    wrapper: str = ""

    def __post_init__(self) -> None:
        if self.kind is None or self.kind == "":
            if not self.wrapper:
                raise ValueError(f"unknown constraint kind {self.kind!r}; expected one of "
                                 f"{sorted(k.value for k in ConstraintKind)} (no kind needs a wrapper)")
            object.__setattr__(self, "kind", None)
        elif not isinstance(self.kind, ConstraintKind):
            object.__setattr__(self, "kind", ConstraintKind.parse(self.kind))


class CacheStatus(enum.StrEnum):
    """How a prepare obtained its compiled grammar (``PrepareResponse.cache``).

    A ``StrEnum``: members compare equal to ``"hit"`` / ``"built"`` / ``"waited"``.
    """

    HIT = "hit"  #: retained grammar, no compile slot taken
    BUILT = "built"  #: this request compiled it
    WAITED = "waited"  #: another request was building the same key; this one waited for it


@dataclass(frozen=True)
class CompileInfo:
    """How a prepare obtained its compiled grammar.

    Attributes:
        cache: the :class:`CacheStatus`.
        seconds: wall-clock seconds spent in ``ConstraintCompiler.compile``
            (includes the lazy vocabulary index build and slot waiting).
    """

    cache: CacheStatus
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
