"""The engine's Step message written straight to wire bytes (:mod:`gpu_engine.sidecar.wire`): the bytes are
exactly those of the protobuf runtime's message (``step_request(...).SerializeToString()``) for every row shape,
:class:`StepRows` reads as the :class:`StepRow` list the engine built before, and the socket stream sends them."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from gpu_engine.sidecar import wire
from gpu_engine.sidecar.rows import StepRow, step_request
from gpu_engine.sidecar.wire import StepRows, encode_step_request, varint
from ninfer.constraint.v1 import constraint_pb2 as pb

IDS = ["", "a", "json_schema-17-1234567890", "é-ü-∑-" * 3, "x" * 127, "y" * 200]  # 1- and 2-byte lengths
LANES = [0, 1, 127, 128, 300, 70000]
TOKENS = [0, 1, 127, 128, 16383, 16384, 151935, 2**31 - 1, -1, -(2**31)]


def _req(rid: str, lane: int, commit: list[int]) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, lane=lane, pending_commit=commit)


def _random_rows(rng: random.Random, n: int) -> tuple[list, dict, list[StepRow]]:
    reqs = [_req(rng.choice(IDS) + str(rng.randrange(3)), rng.choice(LANES),
                 [rng.choice(TOKENS) for _ in range(rng.choice([0, 1, 1, 1, 2, 5]))]) for _ in range(n)]
    drafts = {lane: [rng.choice(TOKENS) for _ in range(rng.choice([0, 1, 4]))] for lane in rng.sample(LANES, 3)}
    closes = [StepRow(rng.choice(IDS), rng.choice(LANES), [rng.choice(TOKENS) for _ in range(rng.choice([0, 1, 3]))],
                      rng.choice([[], [], [5]]), close=rng.choice([True, False])) for _ in range(rng.choice([0, 1, 3]))]
    return reqs, drafts, closes


def test_bytes_match_the_protobuf_runtime():
    rng = random.Random(0)
    for trial in range(300):
        reqs, drafts, closes = _random_rows(rng, rng.choice([0, 1, 7, 64]))
        rows = StepRows(reqs, drafts, closes)
        seq, slot = rng.choice([0, 1, 127, 128, 2**40]), rng.choice([0, 1, 3, 200])
        want = step_request(seq, slot, list(rows)).SerializeToString()
        assert encode_step_request(seq, slot, rows) == want, trial
        assert encode_step_request(seq, slot, list(rows)) == want, trial  # plain StepRow lists too
        assert pb.StepRequest.FromString(want) == step_request(seq, slot, list(rows))


def test_step_rows_read_as_the_engines_step_row_list():
    """As the engine built them before: (id, lane, a copy of pending_commit, drafts of the lane or []), then
    the closes; the commit lists stay those that were sent after the engine gives each request a new one."""
    a, b = _req("a", 3, [5]), _req("b", 0, [6, 7])
    close = StepRow("c", 1, [8], [], close=True)
    rows = StepRows([a, b], {0: [9, 10]}, [close])
    a.pending_commit, b.pending_commit = [], []  # the engine after a sent Step
    assert list(rows) == [StepRow("a", 3, [5], []), StepRow("b", 0, [6, 7], [9, 10]), close]
    assert len(rows) == 3 and rows[-1] is close and rows[1:] == [StepRow("b", 0, [6, 7], [9, 10]), close]
    with pytest.raises(IndexError):
        rows[3]
    assert StepRows([a], None)[0] == StepRow("a", 3, [], [])  # no drafts at all


def test_out_of_range_values_raise_like_protobuf():
    for bad in (2**31, -(2**31) - 1):
        with pytest.raises(ValueError):
            step_request(1, 0, [StepRow("a", 0, [bad], [])])
        with pytest.raises(ValueError):
            encode_step_request(1, 0, StepRows([_req("a", 0, [bad])], {}))
    with pytest.raises(ValueError):
        encode_step_request(1, 0, [StepRow("a", -1, [], [])])
    with pytest.raises(ValueError):
        encode_step_request(-1, 0, [])
    with pytest.raises(ValueError):
        encode_step_request(1, 2**32, [])


def test_cached_heads_follow_the_row_and_stay_bounded(monkeypatch):
    r = _req("moving", 5, [1])
    first = encode_step_request(1, 0, StepRows([r], {}))
    r.lane = 6  # a cached (row, bytes) of another row is not reused
    assert encode_step_request(1, 0, StepRows([r], {})) == step_request(1, 0, [StepRow("moving", 6, [1], [])]
                                                                       ).SerializeToString() != first
    monkeypatch.setattr(wire, "_HEADS_MAX", 4)
    wire._HEADS.clear()
    for i in range(10):
        encode_step_request(1, 0, StepRows([_req(f"r{i}", 1, [2])], {}))
        assert len(wire._HEADS) <= 4


def test_varint():
    for v in (0, 1, 127, 128, 300, 2**31 - 1, 2**63):
        m = pb.StepRequest(step_seq=v)
        assert (b"\x08" + varint(v) if v else b"") == m.SerializeToString()
    assert varint(-1) == b"\xff" * 9 + b"\x01"


def test_step_results_read_the_same_values_as_every_field_read_at_once():
    """``step_results`` reads ``row``, ``complete``, ``terminated`` and ``error`` only when used: the results
    equal (and print as) those of every field read up front; an unknown status is an integrity error."""
    import copy
    import dataclasses
    import gc

    from gpu_engine.sidecar.rows import RowStatus, StepRowResult, step_results

    rng = random.Random(1)
    resp = pb.StepResponse(step_seq=3, slot=1, work_seconds=0.5)
    for i in range(50):
        resp.rows.add(request_id=rng.choice(IDS) + str(i), row=rng.choice(LANES),
                      status=rng.choice([pb.ROW_STATUS_OK, pb.ROW_STATUS_INTEGRITY_ERROR, 0, 77]),
                      complete=rng.random() < 0.5, terminated=rng.random() < 0.5,
                      error=rng.choice(["", "rejected token 5"]), mask_positions=rng.choice([0, 1, 300]))
    want = [StepRowResult(x.request_id, x.row, {1: RowStatus.OK}.get(x.status, RowStatus.INTEGRITY_ERROR),
                          x.complete, x.terminated, x.error, x.mask_positions) for x in resp.rows]
    got = step_results(resp)
    assert [repr(x) for x in got] == [repr(x) for x in want]  # before any lazy field was read
    assert got == want and [dataclasses.asdict(x) for x in got] == [dataclasses.asdict(x) for x in want]
    assert [copy.copy(x) for x in step_results(resp)] == want
    one = step_results(resp)[0]
    assert "error" not in vars(one) and one.error == want[0].error and "error" in vars(one)
    late = step_results(pb.StepResponse.FromString(resp.SerializeToString()))  # the answer itself is dropped
    gc.collect()
    assert late == want
    with pytest.raises(AttributeError):
        one.nonexistent  # noqa: B018
    with pytest.raises(AttributeError):
        StepRowResult("a", 0, RowStatus.OK, True, False, "").nonexistent  # noqa: B018
