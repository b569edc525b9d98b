"""Plain-value rows of the engine <-> sidecar ``Step`` stream, converted to and from protobuf at the edge."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ninfer.constraint.v1 import constraint_pb2 as pb

from gpu_engine.core.request import CacheStatus


@dataclass
class PrepareInfo:
    """Result of preparing a constrained request.

    Attributes:
        cache: the compile-cache outcome.
        prepare_seconds: seconds spent in the sidecar's Prepare.
        generation: sidecar generation the session lives in (bumped on restart).
    """

    cache: CacheStatus
    prepare_seconds: float
    generation: int


@dataclass
class StepRow:
    """One constrained row of a step (plain values; converted at the edge)."""

    request_id: str
    row: int
    commit_tokens: list[int]
    draft_tokens: list[int]
    close: bool = False  # commit ``commit_tokens``, then end the session (no masks are written)


class RowStatus(enum.Enum):
    """Per-row outcome of a Step. A dead end is not one: the ring's status byte reports it."""

    OK = "ok"
    INTEGRITY_ERROR = "integrity"


@dataclass
class StepRowResult:
    """Per-row answer of a Step (``status``: :class:`RowStatus`; ``error`` set when not OK)."""

    request_id: str
    row: int
    status: RowStatus
    complete: bool
    terminated: bool
    error: str
    mask_positions: int = 0  # closing rows: bitmask positions computed over the request's life


_ROW_STATUS = {pb.ROW_STATUS_OK: RowStatus.OK, pb.ROW_STATUS_INTEGRITY_ERROR: RowStatus.INTEGRITY_ERROR}


def step_request(step_seq: int, slot: int, rows: list[StepRow]) -> pb.StepRequest:
    """The ``StepRequest`` of ``rows`` for ring slot ``slot``."""
    msg = pb.StepRequest(step_seq=step_seq, slot=slot)
    add = msg.rows.add  # in place: ~2.5x faster than building RowStep messages and copying them
    for r in rows:
        if r.draft_tokens:
            add(request_id=r.request_id, row=r.row, commit_tokens=r.commit_tokens, draft_tokens=r.draft_tokens)
        elif r.close:
            add(request_id=r.request_id, row=r.row, commit_tokens=r.commit_tokens, close=True)
        else:
            add(request_id=r.request_id, row=r.row, commit_tokens=r.commit_tokens)
    return msg


def step_results(resp: pb.StepResponse) -> list[StepRowResult]:
    """Per-row results of a ``StepResponse`` (an unknown status counts as an integrity error)."""
    return [StepRowResult(x.request_id, x.row, _ROW_STATUS.get(x.status, RowStatus.INTEGRITY_ERROR), x.complete,
                          x.terminated, x.error, x.mask_positions) for x in resp.rows]
