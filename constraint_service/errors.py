"""Errors of the constraint service (seed 000 §错误; DESIGN "Errors").

Both are part of the project hierarchy (:mod:`ninfer_common.errors`); two
families, never mixed:

* :class:`ConstraintError` -- a *request* error (a
  :class:`~ninfer_common.errors.RequestError`, status ``INVALID_ARGUMENT``):
  the constraint the caller sent is invalid, unsupported, unsatisfiable, times
  out while compiling, makes token masks too slow to serve (``GrammarTooExpensive``,
  :mod:`~constraint_service.mask_probe`), or the continuation prefix is outside the language.
  The sidecar maps it to gRPC ``INVALID_ARGUMENT`` with an error detail
  ``{kind, message, location}``.
* :class:`IntegrityError` -- a runtime bug (a
  :class:`~ninfer_common.errors.RowError` of kind ``IntegrityError``, status
  ``INTERNAL``): a committed token the grammar rejects, preview/lookahead
  misuse, a matcher that cannot roll back.  Never reported as a user error.
"""

from __future__ import annotations

from ninfer_common.errors import CONSTRAINT_ERROR_KINDS, ErrorKind, RequestError, RowError, Status

__all__ = ["CONSTRAINT_ERROR_KINDS", "ConstraintError", "IntegrityError"]


class ConstraintError(RequestError):
    """A request error raised while preparing a constraint.

    Args:
        kind: one of :data:`CONSTRAINT_ERROR_KINDS` (an
            :class:`~ninfer_common.errors.ErrorKind` or its wire spelling).
        message: human readable, says expected vs actual.
        location: ``"line:col"`` (1-based, columns in Unicode characters) for
            grammars and regexes, a JSON Pointer (``"/properties/a"``) for
            schemas, ``""`` when there is no meaningful position.

    Attributes:
        kind: the :class:`~ninfer_common.errors.ErrorKind` (compares equal to its string).
        message, location: as given.
        status: ``Status.INVALID_ARGUMENT``.

    Raises:
        ValueError: ``kind`` is not a constraint error kind.
    """

    def __init__(self, kind: ErrorKind | str, message: str, location: str = "") -> None:
        if kind not in CONSTRAINT_ERROR_KINDS:
            raise ValueError(f"unknown ConstraintError kind {kind!r}")
        super().__init__(kind, message, location, Status.INVALID_ARGUMENT)


class IntegrityError(RowError):
    """A runtime integrity failure (gRPC ``INTERNAL``), not a user error.

    Raised for: a committed/previewed token the grammar rejects, lookahead
    while a preview is pending (or the reverse), use of a terminated or closed
    session, malformed bitmask/status views.

    Args:
        message: what went wrong; ``str(error)`` is exactly this text (it travels
            to the engine as the row's error message).
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(ErrorKind.INTEGRITY_ERROR, message, "", Status.INTERNAL)

    def __str__(self) -> str:
        return self.message
