"""Errors of the constraint service (seed 000 §错误; DESIGN "Errors").

Two families, never mixed:

* :class:`ConstraintError` -- a *request* error: the constraint the caller sent
  is invalid, unsupported, unsatisfiable, times out while compiling, or the
  continuation prefix is outside the language.  The sidecar maps it to gRPC
  ``INVALID_ARGUMENT`` with a ``ConstraintErrorDetail{kind, message, location}``.
* :class:`IntegrityError` -- a runtime bug: a committed token the grammar
  rejects, preview/lookahead misuse, a matcher that cannot roll back.  Mapped
  to gRPC ``INTERNAL``; never reported as a user error.
"""

from __future__ import annotations

__all__ = ["CONSTRAINT_ERROR_KINDS", "ConstraintError", "IntegrityError"]

#: Every value :attr:`ConstraintError.kind` can take.
CONSTRAINT_ERROR_KINDS = frozenset(
    {
        "InvalidGrammar",
        "InvalidRegex",
        "InvalidChoice",
        "InvalidSchema",
        "UnsupportedSchema",
        "UnsatisfiableSchema",
        "ConstraintDeadEnd",
        "InvalidPrefix",
        "CompileTimeout",
        "InvalidTokenReference",
    }
)


class ConstraintError(Exception):
    """A request error raised while preparing a constraint.

    Attributes:
        kind: one of :data:`CONSTRAINT_ERROR_KINDS`.
        message: human readable, says expected vs actual.
        location: ``"line:col"`` (1-based, columns in Unicode characters) for
            grammars and regexes, a JSON Pointer (``"/properties/a"``) for
            schemas, ``""`` when there is no meaningful position.
    """

    def __init__(self, kind: str, message: str, location: str = "") -> None:
        if kind not in CONSTRAINT_ERROR_KINDS:
            raise ValueError(f"unknown ConstraintError kind {kind!r}")
        self.kind = kind
        self.message = message
        self.location = location
        where = f" at {location}" if location else ""
        super().__init__(f"{kind}{where}: {message}")

    def __reduce__(self):  # keep kind/message/location across pickling
        return (type(self), (self.kind, self.message, self.location))


class IntegrityError(Exception):
    """A runtime integrity failure (gRPC ``INTERNAL``), not a user error.

    Raised for: a committed/previewed token the grammar rejects, lookahead
    while a preview is pending (or the reverse), use of a terminated or closed
    session, malformed bitmask/status views.
    """
