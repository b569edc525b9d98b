"""The project's exception hierarchy (DESIGN "Errors"; seed 000 §错误).

Every error a request can meet has an :class:`ErrorKind` (the machine-readable
``ErrorDetail.kind`` clients see), a human-readable message that says expected
vs actual, and a location (``"line:col"`` for grammars and regexes, a JSON
Pointer for schemas, ``""`` when there is none). Each also has a transport-free
:class:`Status` (a google.rpc canonical code name); each front door maps that
to its own status — gRPC code + ``ErrorDetail`` in the servicer
(:mod:`ninfer_common.grpc_status`), an HTTP status in a gateway.

Two families, never mixed:

* :class:`RequestError` -- the request is refused before it is queued
  (``INVALID_ARGUMENT`` and friends).
* :class:`RowError` -- one running request fails (finish reason ``error``);
  its batch neighbours go on.
"""
from __future__ import annotations

import enum

__all__ = ["CONSTRAINT_ERROR_KINDS", "DEFAULT_STATUS", "ErrorKind", "RequestError", "RowError", "ServingError",
           "Status"]


class ErrorKind(enum.StrEnum):
    """Machine-readable error kinds (the ``kind`` of ``ninfer.v1.ErrorDetail``).

    A ``StrEnum``: members compare equal to their wire spelling
    (``ErrorKind.INVALID_GRAMMAR == "InvalidGrammar"``).
    """

    # request errors (rejected before queueing)
    INVALID_REQUEST = "InvalidRequest"
    INVALID_GRAMMAR = "InvalidGrammar"
    INVALID_REGEX = "InvalidRegex"
    INVALID_CHOICE = "InvalidChoice"
    INVALID_SCHEMA = "InvalidSchema"
    UNSUPPORTED_SCHEMA = "UnsupportedSchema"
    UNSATISFIABLE_SCHEMA = "UnsatisfiableSchema"
    CONSTRAINT_DEAD_END = "ConstraintDeadEnd"
    INVALID_PREFIX = "InvalidPrefix"
    COMPILE_TIMEOUT = "CompileTimeout"
    INVALID_TOKEN_REFERENCE = "InvalidTokenReference"
    GRAMMAR_TOO_EXPENSIVE = "GrammarTooExpensive"  # compiles, but one token mask costs more than the limit
    # the constraint sidecar
    CONSTRAINT_SERVICE_UNAVAILABLE = "ConstraintServiceUnavailable"
    CONSTRAINT_SERVICE_ERROR = "ConstraintServiceError"
    CONSTRAINT_ERROR = "ConstraintError"  # a sidecar rejection without a structured detail
    INVALID_VOCABULARY = "InvalidVocabulary"
    RING_ERROR = "RingError"
    # admission control
    SERVER_OVERLOADED = "ServerOverloaded"
    # runtime failures of one row
    INTEGRITY_ERROR = "IntegrityError"
    ENGINE_ERROR = "EngineError"
    NON_FINITE_LOGITS = "NonFiniteLogits"
    SAMPLING_ERROR = "SamplingError"


#: Kinds a constraint (compile, prefix, dead end) can fail with.
CONSTRAINT_ERROR_KINDS = frozenset({
    ErrorKind.INVALID_GRAMMAR, ErrorKind.INVALID_REGEX, ErrorKind.INVALID_CHOICE, ErrorKind.INVALID_SCHEMA,
    ErrorKind.UNSUPPORTED_SCHEMA, ErrorKind.UNSATISFIABLE_SCHEMA, ErrorKind.CONSTRAINT_DEAD_END,
    ErrorKind.INVALID_PREFIX, ErrorKind.COMPILE_TIMEOUT, ErrorKind.INVALID_TOKEN_REFERENCE,
    ErrorKind.GRAMMAR_TOO_EXPENSIVE,
})


class Status(enum.Enum):
    """Transport-free status classes: the google.rpc canonical code names.

    A front door maps them to its own codes (gRPC by name; HTTP 400/409/429/503/500).
    """

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"


#: Status of each kind when the raiser does not name one.
DEFAULT_STATUS: dict[ErrorKind, Status] = {
    **{k: Status.INVALID_ARGUMENT for k in CONSTRAINT_ERROR_KINDS},
    ErrorKind.INVALID_REQUEST: Status.INVALID_ARGUMENT,
    ErrorKind.INVALID_VOCABULARY: Status.INVALID_ARGUMENT,
    ErrorKind.CONSTRAINT_SERVICE_UNAVAILABLE: Status.UNAVAILABLE,
    ErrorKind.CONSTRAINT_SERVICE_ERROR: Status.INTERNAL,
    ErrorKind.CONSTRAINT_ERROR: Status.INVALID_ARGUMENT,
    ErrorKind.RING_ERROR: Status.FAILED_PRECONDITION,
    ErrorKind.SERVER_OVERLOADED: Status.RESOURCE_EXHAUSTED,
    ErrorKind.INTEGRITY_ERROR: Status.INTERNAL,
    ErrorKind.ENGINE_ERROR: Status.INTERNAL,
    ErrorKind.NON_FINITE_LOGITS: Status.INTERNAL,
    ErrorKind.SAMPLING_ERROR: Status.INTERNAL,
}


class ServingError(Exception):
    """Base of the project's errors.

    Attributes:
        kind: the :class:`ErrorKind` (compares equal to its wire string).
        message: human-readable text, expected vs actual.
        location: ``"line:col"`` (1-based, columns in Unicode characters), a JSON Pointer, or ``""``.
        status: the transport-free :class:`Status` (the kind's default unless given).

    Raises:
        ValueError: ``kind`` is not an :class:`ErrorKind` spelling.
    """

    def __init__(self, kind: ErrorKind | str, message: str, location: str = "", status: Status | None = None) -> None:
        self.kind = ErrorKind(kind)
        self.message = message
        self.location = location
        self.status = status if status is not None else DEFAULT_STATUS.get(self.kind, Status.INTERNAL)
        where = f" at {location}" if location else ""
        super().__init__(f"{self.kind}{where}: {message}")

    def __reduce__(self):  # keep the fields across pickling (compile worker processes)
        return (_rebuild, (type(self), str(self.kind), self.message, self.location, self.status))

    @property
    def code(self) -> str:
        """The canonical status name (``"INVALID_ARGUMENT"``), i.e. ``ErrorDetail.code``."""
        return self.status.value

    def to_dict(self) -> dict[str, str]:
        """``{"code", "kind", "message", "location"}`` with plain strings (the ``ErrorDetail`` fields)."""
        return {"code": self.status.value, "kind": str(self.kind), "message": self.message,
                "location": self.location}


def _rebuild(cls, kind, message, location, status):
    err = cls.__new__(cls)
    ServingError.__init__(err, kind, message, location, status)
    return err


class RequestError(ServingError):
    """A request refused before it was queued (no output was produced)."""


class RowError(ServingError):
    """A runtime failure of one running request (finish reason ``error``).

    Integrity and numeric errors are ``INTERNAL``; a lost sidecar is ``UNAVAILABLE``;
    a reached dead end is ``FAILED_PRECONDITION``.
    """
