"""The ``StepRequest`` of one step, serialized straight to protobuf wire bytes (the engine's hot path).

Built through the protobuf runtime, the engine's 64-row Step message cost ~64 µs of engine-thread time per step
on this project's 2-core box: ~17 µs of per-row :class:`~gpu_engine.sidecar.rows.StepRow` objects, ~45 µs of
``rows.add(...)`` and ~2 µs of ``SerializeToString``. :func:`encode_step_request` writes the same bytes from the
engine's requests (:class:`StepRows`, no per-row objects) in ~17 µs: each request's ``request_id`` and row
fields are encoded once and cached, and so are token ids' varints.

The bytes are exactly ``step_request(...).SerializeToString()`` (fields in number order, packed repeated
``int32``, proto3 defaults omitted: the same bytes as upb writes; ``tests/gpu_engine/test_step_wire.py``
compares them). The field numbers are checked against the generated descriptors at import, so a change of
``constraint.proto`` that this encoder does not follow fails loudly instead of writing a wrong message.
"""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

from ninfer.constraint.v1 import constraint_pb2 as pb

from gpu_engine.sidecar.rows import StepRow

__all__ = ["StepRows", "encode_step_request", "varint"]

# (message, field) -> number this encoder writes; checked against the generated descriptors below
_FIELDS = {("StepRequest", "step_seq"): 1, ("StepRequest", "slot"): 2, ("StepRequest", "rows"): 3,
           ("RowStep", "request_id"): 1, ("RowStep", "row"): 2, ("RowStep", "commit_tokens"): 3,
           ("RowStep", "draft_tokens"): 4, ("RowStep", "close"): 5}
for (_msg, _name), _num in _FIELDS.items():
    _f = getattr(pb, _msg).DESCRIPTOR.fields_by_name[_name]
    if _f.number != _num:  # pragma: no cover - only a changed .proto gets here
        raise ImportError(f"constraint.proto changed: {_msg}.{_name} is field {_f.number}, the Step encoder "
                          f"writes {_num} (update gpu_engine/sidecar/wire.py)")
if not pb.RowStep.DESCRIPTOR.fields_by_name["commit_tokens"].is_packed:  # pragma: no cover
    raise ImportError("constraint.proto changed: RowStep.commit_tokens is not packed any more")

_SMALL = [bytes((i,)) for i in range(128)]
_TAG_ROWS = b"\x1a"  # StepRequest.rows (3, length-delimited); RowStep.commit_tokens has the same tag byte
_TAG_COMMIT = b"\x1a"
_TAG_DRAFTS = b"\x22"  # RowStep.draft_tokens (4, length-delimited)
_CLOSE = b"\x28\x01"  # RowStep.close = true (5, varint)
_ROWS_LEN = [_TAG_ROWS + b for b in _SMALL]  # a rows tag and a one-byte length
_COMMIT_LEN = [_TAG_COMMIT + _SMALL[i] for i in range(11)]  # a commit_tokens tag and a one-byte length
#: token id -> its varint (filled as tokens occur; bounded by the vocabulary)
_TOKEN = {i: _SMALL[i] for i in range(128)}
#: request_id -> (row, its RowStep fields 1 and 2: tag, length and UTF-8 of the id, then the row); cleared
#: past _HEADS_MAX entries
_HEADS: dict[str, tuple[int, bytes]] = {}
_HEADS_MAX = 16384
#: row -> its RowStep field 2 (nothing for row 0, the proto3 default)
_ROW: list[bytes] = [b""] + [b"\x10" + _SMALL[i] for i in range(1, 128)]


def varint(v: int) -> bytes:
    """The protobuf varint of ``v`` (a negative int32 / int64 as its 64-bit two's complement, 10 bytes)."""
    if 0 <= v < 128:
        return _SMALL[v]
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    out.append(v)
    return bytes(out)


def _token(t: int) -> bytes:
    """The varint of token id ``t`` (an ``int32``; ValueError past its range, as protobuf raises)."""
    b = _TOKEN.get(t)
    if b is None:
        if not -(1 << 31) <= t < (1 << 31):
            raise ValueError(f"token id {t} is out of the int32 range")
        b = varint(t)
        if t >= 0:
            _TOKEN[t] = b
    return b


def _uint(v: int, bits: int, what: str) -> int:
    if not 0 <= v < (1 << bits):
        raise ValueError(f"{what} {v} is out of the uint{bits} range")
    return v


def _row_field(row: int) -> bytes:
    if 0 <= row < len(_ROW):
        return _ROW[row]
    return b"\x10" + varint(_uint(row, 32, "row"))


def _head(request_id: str, row: int) -> tuple[int, bytes]:
    """``(row, RowStep fields 1 and 2)`` of a row, cached by ``request_id``."""
    h = _HEADS.get(request_id)
    if h is None or h[0] != row:
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        raw = request_id.encode()
        h = _HEADS[request_id] = (row, ((b"\x0a" + varint(len(raw)) + raw) if raw else b"") + _row_field(row))
    return h


def _packed(tag: bytes, ids: Sequence[int]) -> bytes:
    """A packed repeated int32 field (nothing when ``ids`` is empty)."""
    if not ids:
        return b""
    if len(ids) == 1:
        p = _TOKEN.get(ids[0]) or _token(ids[0])
    else:
        p = b"".join([_TOKEN.get(t) or _token(t) for t in ids])
    return tag + varint(len(p)) + p


class StepRows(Sequence[StepRow]):
    """A step's rows without per-row objects: the resident constrained ``requests`` (anything with
    ``request_id``, ``lane`` and ``pending_commit``: :class:`gpu_engine.core.request.Request`), each with
    its drafts from ``drafts`` (lane -> ids), then the ``closes`` (:class:`StepRow` with ``close`` set).

    The commit lists are taken when it is made (the engine then gives each request a fresh list), so it
    keeps describing the message that was sent. :func:`encode_step_request` reads it directly; as a
    sequence it yields the equivalent :class:`StepRow` of each row (tools, test doubles)."""

    __slots__ = ("requests", "commits", "drafts", "closes")

    def __init__(self, requests: Sequence, drafts: Mapping[int, Sequence[int]], closes: Sequence[StepRow] = ()):
        self.requests = requests
        self.commits = [r.pending_commit for r in requests]
        self.drafts = drafts
        self.closes = closes

    def __len__(self) -> int:
        return len(self.requests) + len(self.closes)

    def __getitem__(self, i):  # noqa: ANN001 - int or slice, as a Sequence
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.requests)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i >= n:
            return self.closes[i - n]
        r = self.requests[i]
        return StepRow(r.request_id, r.lane, self.commits[i], list((self.drafts or {}).get(r.lane, [])))

    def __iter__(self) -> Iterator[StepRow]:
        return (self[i] for i in range(len(self)))


def encode_step_request(step_seq: int, slot: int, rows: Sequence[StepRow]) -> bytes:
    """``step_request(step_seq, slot, rows).SerializeToString()``, written directly; ``rows`` may be a
    :class:`StepRows` (read without making per-row objects) or any sequence of :class:`StepRow`."""
    parts = []
    if step_seq:
        parts.append(b"\x08" + varint(_uint(step_seq, 64, "step_seq")))
    if slot:
        parts.append(b"\x10" + varint(_uint(slot, 32, "slot")))
    add = parts.append
    heads, tok, token, small, commit1 = _HEADS, _TOKEN, _token, _ROWS_LEN, _COMMIT_LEN
    if isinstance(rows, StepRows):
        drafts, closes = rows.drafts, rows.closes
        for r, commit in zip(rows.requests, rows.commits):
            rid, lane = r.request_id, r.lane
            h = heads.get(rid)
            if h is None or h[0] != lane:
                h = _head(rid, lane)
            head = h[1]
            d = drafts.get(lane) if drafts else None
            if not d and len(commit) == 1:  # the common row: one committed token, no drafts
                t = tok.get(commit[0]) or token(commit[0])
                n = len(head) + 2 + len(t)
                if n < 128:
                    add(small[n])
                    add(head)
                    add(commit1[len(t)])
                    add(t)
                    continue
            body = head + _packed(_TAG_COMMIT, commit) + _packed(_TAG_DRAFTS, d or ())
            n = len(body)
            add(small[n] if n < 128 else _TAG_ROWS + varint(n))
            add(body)
    else:
        closes = rows
    for r in closes:  # as step_request: a row with drafts is never a close
        body = (_head(r.request_id, r.row)[1] + _packed(_TAG_COMMIT, r.commit_tokens)
                + _packed(_TAG_DRAFTS, r.draft_tokens) + (_CLOSE if r.close and not r.draft_tokens else b""))
        add(_TAG_ROWS + varint(len(body)))
        add(body)
    return b"".join(parts)
