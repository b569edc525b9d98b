"""Engine-side errors.

A :class:`RequestError` is a user error found before queueing (gRPC
INVALID_ARGUMENT and friends, with a structured ``ErrorDetail``). A
:class:`RowError` fails one running request without touching its batch
neighbours. Integrity errors are never reported as user errors.
"""
from __future__ import annotations

import grpc


class RequestError(Exception):
    """A request rejected before it was queued.

    Attributes:
        code: gRPC status code to answer with.
        kind: machine-readable kind (``InvalidGrammar``, ``InvalidRequest``, …).
        message: human-readable text (expected vs actual).
        location: ``line:col`` or JSON Pointer, ``""`` if none.
    """

    def __init__(self, kind: str, message: str, location: str = "",
                 code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        super().__init__(f"{kind}: {message}" + (f" at {location}" if location else ""))
        self.code, self.kind, self.message, self.location = code, kind, message, location


class RowError(Exception):
    """A runtime failure of one request (finish_reason ``error``).

    ``code`` is the gRPC status name reported in ``ErrorDetail.code``:
    ``INTERNAL`` for integrity and numeric errors, ``UNAVAILABLE`` when the
    constraint sidecar died, ``FAILED_PRECONDITION`` for a reached dead end.
    """

    def __init__(self, kind: str, message: str, code: str = "INTERNAL") -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.code = kind, message, code
