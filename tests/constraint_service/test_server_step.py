"""The sidecar servicer's Step: close rows end sessions on the stream; a dead end is only the ring status byte."""
from __future__ import annotations

import os
import uuid

import grpc
import pytest
from conftest import EOS, VOCAB

from constraint_service.server import ConstraintServicer, SidecarOptions
from ninfer.constraint.v1 import constraint_pb2 as pb
from shared_memory.layout import RingGeometry
from shared_memory.ring import MaskRing

YES = VOCAB.token_bytes.index(b"yes")


class Aborted(Exception):
    pass


class Ctx:
    status = None

    def abort_with_status(self, status):
        self.status = status
        raise Aborted


def _registered(ring: MaskRing) -> ConstraintServicer:
    """A servicer with the test vocabulary registered and ``ring`` attached."""
    sv = ConstraintServicer(SidecarOptions(isolate_compiles=False))  # compile workers: test_compile_pool.py
    sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
        vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes), special_ids=list(VOCAB.special_ids),
        eos_ids=list(VOCAB.eos_ids)), Ctx())
    g = ring.geometry
    sv.AttachRing(pb.AttachRingRequest(name=ring.name, byte_size=ring.nbytes, num_slots=g.num_slots,
                                       num_lanes=g.num_lanes, num_positions=g.num_positions,
                                       num_words=g.num_words), Ctx())
    return sv


@pytest.fixture()
def servicer():
    geo = RingGeometry(num_slots=2, num_lanes=4, num_positions=2, vocab_size=VOCAB.vocab_size)
    ring = MaskRing.create(f"ninfer-test-step-{os.getpid()}-{uuid.uuid4().hex[:8]}", geo)
    sv = _registered(ring)
    yield sv, ring
    sv.close()
    ring.close()
    ring.unlink()


def _prepare(sv, rid, options):
    sv.Prepare(pb.PrepareRequest(request_id=rid, constraint=pb.Constraint(kind="choice", choices=options)), Ctx())


def test_close_row_commits_final_tokens_and_ends_the_session(servicer):
    sv, ring = servicer
    _prepare(sv, "a", ["yes", "no"])
    _prepare(sv, "b", ["yes"])
    _prepare(sv, "c", ["no"])
    resp = sv._step(pb.StepRequest(step_seq=1, slot=1, rows=[
        pb.RowStep(request_id="a", row=0, commit_tokens=[YES, EOS], close=True),
        pb.RowStep(request_id="b", row=0, commit_tokens=[], draft_tokens=[]),  # same row number: a close owns none
        pb.RowStep(request_id="c", row=1, commit_tokens=[YES], close=True),  # illegal final token
    ]))
    a, b, c = resp.rows
    assert (a.status, a.complete, a.terminated, a.error) == (pb.ROW_STATUS_OK, True, True, "")
    assert b.status == pb.ROW_STATUS_OK and not b.complete
    assert c.status == pb.ROW_STATUS_INTEGRITY_ERROR and c.error
    assert "a" not in sv._owner and "c" not in sv._owner and "b" in sv._owner and len(sv._local) == 1
    assert b.request_id == "b" and ring.status(1)[0, 0] == 1  # b's mask was written into row 0
    again = sv._step(pb.StepRequest(step_seq=2, slot=0, rows=[pb.RowStep(request_id="a", row=0, close=True)]))
    assert again.rows[0].status == pb.ROW_STATUS_INTEGRITY_ERROR and "no session" in again.rows[0].error


def test_row_statuses_are_ok_or_integrity_and_unknown_kinds_are_request_errors(servicer):
    sv, ring = servicer
    _prepare(sv, "d", ["yes"])
    resp = sv._step(pb.StepRequest(step_seq=1, slot=1, rows=[
        pb.RowStep(request_id="d", row=2, commit_tokens=[YES])]))  # "yes" complete: only EOS is legal
    assert resp.rows[0].status == pb.ROW_STATUS_OK and resp.rows[0].complete
    resp = sv._step(pb.StepRequest(step_seq=2, slot=0, rows=[
        pb.RowStep(request_id="d", row=2, commit_tokens=[EOS])]))
    assert resp.rows[0].status == pb.ROW_STATUS_OK and resp.rows[0].terminated
    assert "ROW_STATUS_DEAD_END" not in pb.RowStatus.keys()
    with pytest.raises(Aborted):
        sv.Prepare(pb.PrepareRequest(request_id="d2", constraint=pb.Constraint(kind="nope")), ctx := Ctx())
    assert ctx.status.code == grpc.StatusCode.INVALID_ARGUMENT


def test_the_step_trace_file_has_one_line_per_step(servicer, monkeypatch, tmp_path):
    """NINFER_STEP_TRACE=PATH (bench/engine_bench.py --step-trace): "step_seq start end" per Step message,
    time.perf_counter() seconds, appended to PATH.sidecar; nothing is written without the variable."""
    _, ring = servicer
    monkeypatch.setenv("NINFER_STEP_TRACE", str(tmp_path / "t"))
    sv = _registered(ring)
    try:
        _prepare(sv, "a", ["yes", "no"])
        for seq in (7, 8):
            sv._step(pb.StepRequest(step_seq=seq, slot=seq % 2, rows=[pb.RowStep(request_id="a", row=0)]))
        lines = [line.split() for line in (tmp_path / "t.sidecar").read_text().splitlines()]
        assert [int(q) for q, _, _ in lines] == [7, 8]
        assert all(float(t0) <= float(t1) for _, t0, t1 in lines) and float(lines[0][2]) <= float(lines[1][1])
    finally:
        sv.close()
    assert servicer[0]._trace is None  # made without the variable


@pytest.mark.parametrize("cpus,fill,compile_threads,shards,shard_fill",
                         [(1, 1, 1, 1, 1), (2, 1, 1, 1, 1), (4, 4, 1, 1, 4), (16, 8, 4, 4, 4), (64, 8, 8, 4, 8)])
def test_auto_thread_counts_follow_the_cpus(monkeypatch, cpus, fill, compile_threads, shards, shard_fill):
    from constraint_service import server
    monkeypatch.setattr(server.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert server._auto_fill_threads() == fill and server._auto_compile_threads() == compile_threads
    assert server._auto_step_shards() == shards and server._auto_fill_threads(shards) == shard_fill


def _register(sv: ConstraintServicer) -> None:
    sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
        vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes), special_ids=list(VOCAB.special_ids),
        eos_ids=list(VOCAB.eos_ids)), Ctx())


def _warmed(sv: ConstraintServicer, shard: int, timeout: float = 30.0) -> None:
    """Wait for the background compile on ``shard`` to end (it was started by a Prepare)."""
    import time

    end = time.monotonic() + timeout
    while shard in sv._warming and time.monotonic() < end:
        time.sleep(0.01)
    assert shard not in sv._warming


def _on_both_shards(sv: ConstraintServicer) -> None:
    """Sessions "a" on shard 0 and "b" on shard 1 of a 2-shard servicer ("x*" fill-ins closed again)."""
    _prepare(sv, "a", ["yes", "no"])
    _prepare(sv, "x1", ["yes"])  # a new grammar: shard 0, the only one that has it
    _prepare(sv, "x2", ["yes"])  # shard 0 has 3 more: shard 1 compiles ["yes"] in the background
    _warmed(sv, 1)
    _prepare(sv, "b", ["yes"])  # now the least loaded shard that has it
    assert sv._owner == {"a": 0, "x1": 0, "x2": 0, "b": 1}
    for rid in ("x1", "x2"):
        sv.Close(pb.CloseRequest(request_id=rid), Ctx())


def test_sessions_go_to_shards_that_have_their_grammar_and_others_warm_in_the_background():
    """A Prepare never waits for a shard worker's compile: a new grammar's sessions go to this process (shard
    0) until a worker compiled it in the background; then the least loaded shard with the grammar."""
    geo = RingGeometry(num_slots=2, num_lanes=8, num_positions=1, vocab_size=VOCAB.vocab_size)
    ring = MaskRing.create(f"ninfer-test-place-{os.getpid()}-{uuid.uuid4().hex[:8]}", geo)
    sv = ConstraintServicer(SidecarOptions(isolate_compiles=False, step_shards=3))
    try:
        _register(sv)
        sv.AttachRing(pb.AttachRingRequest(name=ring.name, byte_size=ring.nbytes, num_slots=2, num_lanes=8,
                                           num_positions=1, num_words=geo.num_words), Ctx())
        assert sv.num_shards == 3
        _prepare(sv, "a1", ["yes", "no"])
        _prepare(sv, "a2", ["yes", "no"])  # 2 vs 0: within the slack, no compile elsewhere
        assert sv._owner == {"a1": 0, "a2": 0} and not sv._warming
        _prepare(sv, "a3", ["yes", "no"])  # 2 vs 0 before it: shard 1 warms; a3 still on shard 0
        assert sv._owner["a3"] == 0
        key = next(iter(sv._compiled_on[0]))
        _warmed(sv, 1)
        assert key in sv._compiled_on[1] and key not in sv._compiled_on[2]
        _prepare(sv, "a4", ["yes", "no"])  # shard 1 has it and 0 sessions
        _prepare(sv, "a5", ["yes", "no"])  # 3 / 1 / 0: shard 1 again (shard 2 is cold), 1 vs 0: no warm
        assert sv._owner["a4"] == 1 and sv._owner["a5"] == 1 and not sv._warming
        _prepare(sv, "a6", ["yes", "no"])  # 3 / 2 / 0: shard 1, and 2 > 0 + 1: shard 2 warms
        assert sv._owner["a6"] == 1
        _warmed(sv, 2)
        assert key in sv._compiled_on[2]
        _prepare(sv, "a7", ["yes", "no"])
        assert sv._owner["a7"] == 2
        _prepare(sv, "b1", ["no"])  # a new grammar; shard 2 is the least loaded but cold: shard 0
        assert sv._owner["b1"] == 0
        rows = [pb.RowStep(request_id=r, row=i) for i, r in enumerate(["a1", "a4", "a7", "b1"])]
        resp = sv._step(pb.StepRequest(step_seq=1, slot=1, rows=rows))
        assert [r.status for r in resp.rows] == [pb.ROW_STATUS_OK] * 4 and (ring.status(1)[:4, 0] == 1).all()
    finally:
        sv.close()
        ring.close()
        ring.unlink()


def test_a_lost_shard_worker_makes_the_sidecar_unavailable_until_it_registers_again():
    """A SIGKILLed Step shard worker: health goes NOT_SERVING at once (the engine's heartbeat restarts the
    sidecar), a Step touching that shard and every Prepare answer UNAVAILABLE; no row is answered as if its
    masks were written. A new RegisterVocabulary (an external sidecar's reconnect) starts fresh shards."""
    import signal
    import time

    from constraint_service.shard_pool import ShardBroken

    geo = RingGeometry(num_slots=2, num_lanes=4, num_positions=1, vocab_size=VOCAB.vocab_size)
    ring = MaskRing.create(f"ninfer-test-shard-{os.getpid()}-{uuid.uuid4().hex[:8]}", geo)
    health: list[bool] = []
    sv = ConstraintServicer(SidecarOptions(isolate_compiles=False, step_shards=2), on_health=health.append)
    try:
        _register(sv)
        sv.AttachRing(pb.AttachRingRequest(name=ring.name, byte_size=ring.nbytes, num_slots=2, num_lanes=4,
                                           num_positions=1, num_words=geo.num_words), Ctx())
        _on_both_shards(sv)  # "a" on shard 0, "b" on the worker
        rows = [pb.RowStep(request_id="a", row=0), pb.RowStep(request_id="b", row=1)]
        assert all(r.status == pb.ROW_STATUS_OK for r in sv._step(pb.StepRequest(step_seq=1, slot=1, rows=rows)).rows)
        (pid,) = sv.shard_pids
        os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while not health and time.monotonic() < end:  # the control reader sees the EOF by itself
            time.sleep(0.05)
        assert health == [False] and "shard worker 1" in sv.broken
        with pytest.raises(ShardBroken):
            sv._step(pb.StepRequest(step_seq=2, slot=0, rows=rows))
        with pytest.raises(Aborted):
            sv.Prepare(pb.PrepareRequest(request_id="c", constraint=pb.Constraint(kind="choice", choices=["x"])),
                       ctx := Ctx())
        assert ctx.status.code == grpc.StatusCode.UNAVAILABLE
        _register(sv)
        assert health == [False, True] and not sv.broken and sv.num_shards == 2 and sv.shard_pids != [pid]
        _on_both_shards(sv)  # the old sessions are gone with their generation
        resp = sv._step(pb.StepRequest(step_seq=3, slot=1, rows=rows))
        assert [r.status for r in resp.rows] == [pb.ROW_STATUS_OK] * 2 and (ring.status(1)[:2, 0] == 1).all()
    finally:
        sv.close()
        ring.close()
        ring.unlink()


def test_compile_threads_are_capped_at_the_cpus(monkeypatch):
    from constraint_service import server
    monkeypatch.setattr(server.os, "sched_getaffinity", lambda pid: {0, 1})
    sv = server.ConstraintServicer(server.SidecarOptions(compile_threads=100_000, isolate_compiles=True))
    try:
        sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
            vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes), special_ids=list(VOCAB.special_ids),
            eos_ids=list(VOCAB.eos_ids)), Ctx())
        assert sv._compiler.compile_threads == 2
    finally:
        sv.close()


def _blocked_prepare(sv, rid, choices):
    """Start Prepare(rid) on a thread; it stops inside the shard's open until ``go`` is set. Returns
    (thread, go, outcome dict: "status" = None on success, else the abort status). Opens after the
    first one are not held."""
    import threading

    entered, go, out = threading.Event(), threading.Event(), {}
    real_open = sv._local.open

    def slow_open(*a, **kw):
        if not entered.is_set():  # only this Prepare's open waits; later ones (the main thread's) go through
            entered.set()
            go.wait(30)
        return real_open(*a, **kw)

    sv._local.open = slow_open

    def run():
        ctx = Ctx()
        try:
            sv.Prepare(pb.PrepareRequest(request_id=rid, constraint=pb.Constraint(kind="choice", choices=choices)),
                       ctx)
            out["status"] = None
        except Aborted:
            out["status"] = ctx.status

    t = threading.Thread(target=run)
    t.start()
    assert entered.wait(30)
    return t, go, out


def _settled(sv) -> bool:
    """No Prepare is left opening a session (a shard's load counts open and opening sessions)."""
    return not sv._pending


def test_a_close_during_prepare_finds_no_session_and_leaves_none_orphaned(servicer):
    """Found by a differential fuzz of the Step shards: a Close (RPC or close row) that came while the
    request's Prepare was opening the session released the reservation, and Prepare then left a session no
    Step could reach and no Prepare could replace."""
    sv, ring = servicer
    t, go, out = _blocked_prepare(sv, "p", ["yes", "no"])
    with pytest.raises(Aborted):
        sv.Close(pb.CloseRequest(request_id="p"), ctx := Ctx())
    assert ctx.status.code == grpc.StatusCode.NOT_FOUND
    row = sv._step(pb.StepRequest(step_seq=1, slot=1, rows=[pb.RowStep(request_id="p", row=0, close=True)])).rows[0]
    assert row.status == pb.ROW_STATUS_INTEGRITY_ERROR and "no session" in row.error
    go.set()
    t.join(30)
    assert out["status"] is None and sv._owner == {"p": 0} and _settled(sv)
    resp = sv._step(pb.StepRequest(step_seq=2, slot=0, rows=[pb.RowStep(request_id="p", row=0)]))
    assert resp.rows[0].status == pb.ROW_STATUS_OK and ring.status(0)[0, 0] == 1
    assert sv.Close(pb.CloseRequest(request_id="p"), Ctx()).error == ""
    assert not sv._owner and len(sv._local) == 0 and _settled(sv)


def test_a_prepare_straddling_a_new_registration_is_refused_and_leaves_nothing(servicer):
    """Found by the same fuzz: a Prepare running across a RegisterVocabulary left a session the new
    registration did not count (and, on shards, indexed a shard list that was gone)."""
    sv, ring = servicer
    _prepare(sv, "old", ["yes"])
    t, go, out = _blocked_prepare(sv, "p", ["yes", "no"])
    _register(sv)
    assert not sv._owner and not sv._pending
    _prepare(sv, "new", ["yes"])  # prepared under the new registration while p still waits
    go.set()
    t.join(30)
    assert out["status"].code == grpc.StatusCode.UNAVAILABLE and not sv.broken
    assert sv._owner == {"new": 0} and len(sv._local) == 1 and _settled(sv)
