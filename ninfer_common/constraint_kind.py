"""The body constraint kinds (seed 000 §正文约束), one enum for every package.

The public API carries them as a ``oneof`` (``json_object`` / ``json_schema`` /
``grammar`` / ``regex`` / ``choice``); everything behind a front door uses
:class:`ConstraintKind`. The constraint sidecar's registry
(``constraint_service/registry.py``) has exactly one entry per member.
"""
from __future__ import annotations

import enum

__all__ = ["ConstraintKind"]


class ConstraintKind(enum.StrEnum):
    """A body constraint kind.

    A ``StrEnum``: each member compares equal to (and formats as) its seed/wire
    name, e.g. ``ConstraintKind.JSON_SCHEMA == "json_schema"``.
    """

    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    GRAMMAR = "grammar"
    REGEX = "regex"
    CHOICE = "choice"

    @classmethod
    def parse(cls, name: "ConstraintKind | str") -> "ConstraintKind":
        """The member named ``name`` (its wire spelling, e.g. ``"regex"``).

        Raises:
            ValueError: ``name`` is not a constraint kind; the message lists the valid names.
        """
        try:
            return cls(name)
        except ValueError:
            raise ValueError(
                f"unknown constraint kind {name!r}; expected one of {sorted(k.value for k in cls)}"
            ) from None
