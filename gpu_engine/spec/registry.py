"""The one registry of speculative methods: name, drafter factory (seed 000 §推测解码).

Every other place (the ``--speculative`` flag, the public proto's
``SpeculativeMethod`` mapping in :mod:`gpu_engine.api.convert`, the engine's
drafter cache) reads this table. A new drafter adds one
:class:`~gpu_engine.core.request.SpecMethod` member, one :data:`DRAFTERS` entry, its class in :mod:`gpu_engine.spec.drafters`,
and the public enum value in ``generation.proto``.
"""
from __future__ import annotations

from typing import Callable

from gpu_engine.core.request import SpecMethod

__all__ = ["DRAFTERS", "SpecMethod", "make_drafter"]


def _ngram(program, draft_layers: int):
    from gpu_engine.spec.drafters import NgramDrafter

    return NgramDrafter()


def _early_exit(sampled: bool):
    def make(program, draft_layers: int):
        from gpu_engine.spec.drafters import EarlyExitDrafter

        return EarlyExitDrafter(program, draft_layers, sampled=sampled)

    return make


#: Drafter factory ``(program, draft_layers) -> Drafter`` of every method except NONE.
DRAFTERS: dict[SpecMethod, Callable] = {
    SpecMethod.NGRAM: _ngram,
    SpecMethod.EARLY_EXIT: _early_exit(False),
    SpecMethod.EARLY_EXIT_SAMPLED: _early_exit(True),
}


def make_drafter(method: SpecMethod | str, program, draft_layers: int = 0):
    """The drafter for a speculative method.

    Args:
        method: a :class:`SpecMethod` other than NONE (or its spelling).
        program: the engine's executor (early exit runs its first ``L`` layers).
        draft_layers: early-exit depth ``L``; ``0`` = ``layers // 4``.

    Raises:
        ValueError: unknown method or NONE, or ``draft_layers`` out of range.
    """
    try:
        factory = DRAFTERS[SpecMethod(method)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown speculative method {method!r}; expected one of "
                         f"{', '.join(m.value for m in DRAFTERS)}") from None
    return factory(program, draft_layers)
