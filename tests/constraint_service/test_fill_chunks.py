"""A Step's rows filled in chunks on the fill thread (overlapping the next rows' commits), or spread over
Step shard worker processes, write exactly what one fill of all rows after all commits in one process
writes: same ring bytes, same row results."""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from conftest import EOS, VOCAB, warm_every_shard

from constraint_service.server import ConstraintServicer, SidecarOptions
from constraint_service.types import UNCONSTRAINED
from ninfer.constraint.v1 import constraint_pb2 as pb
from shared_memory.layout import RingGeometry
from shared_memory.ring import MaskRing

LANES, POSITIONS = 12, 3


class Ctx:
    def abort_with_status(self, status):  # pragma: no cover - a failing Prepare fails the test
        raise AssertionError(status)


def _tok(b: bytes) -> int:
    return VOCAB.token_bytes.index(b)


def _make(chunk_rows: int, shards: int = 1):
    geo = RingGeometry(num_slots=2, num_lanes=LANES, num_positions=POSITIONS, vocab_size=VOCAB.vocab_size)
    ring = MaskRing.create(f"ninfer-test-chunks-{os.getpid()}-{uuid.uuid4().hex[:8]}", geo)
    sv = ConstraintServicer(SidecarOptions(fill_chunk_rows=chunk_rows, isolate_compiles=False, step_shards=shards))
    sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
        vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes), special_ids=list(VOCAB.special_ids),
        eos_ids=list(VOCAB.eos_ids)), Ctx())
    sv.AttachRing(pb.AttachRingRequest(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots,
                                       num_lanes=geo.num_lanes, num_positions=geo.num_positions,
                                       num_words=ring.geometry.num_words), Ctx())
    kinds = [pb.Constraint(kind="regex", source="[a-c]{2,6}x"), pb.Constraint(kind="choice", choices=["abc", "abd", "b"]),
             pb.Constraint(kind="grammar", source='root ::= "a" [b-c]* "x"')]
    for c in kinds:  # every shard has every grammar: the sessions are placed by load alone
        warm_every_shard(sv, c)
    for i in range(9):
        sv.Prepare(pb.PrepareRequest(request_id=f"r{i}", constraint=kinds[i % 3]), Ctx())
    return sv, ring


def _steps():
    a, b, c, x = (_tok(ch) for ch in (b"a", b"b", b"c", b"x"))
    first = [pb.RowStep(request_id=f"r{i}", row=i, commit_tokens=[], draft_tokens=[a, b][: i % 3])
             for i in range(9)]
    first.append(pb.RowStep(request_id="missing", row=10, commit_tokens=[]))  # no session: integrity error
    second = [pb.RowStep(request_id=f"r{i}", row=i, commit_tokens=[a], draft_tokens=[c, x][: (i + 1) % 3])
              for i in range(9)]
    second[4] = pb.RowStep(request_id="r4", row=4, commit_tokens=[x])  # illegal for a choice row
    second.append(pb.RowStep(request_id="r7", row=7, close=True))  # close of a row filled in this Step
    third = [pb.RowStep(request_id=f"r{i}", row=i, commit_tokens=[b], draft_tokens=[c, x][: i % 3])
             for i in (0, 2, 3, 5, 6, 8)]
    third.append(pb.RowStep(request_id="r8", row=8, close=True, commit_tokens=[EOS]))
    return [first, second, third]


def _run(chunk_rows: int, shards: int = 1):
    sv, ring = _make(chunk_rows, shards)
    try:  # the asserts inside: a failing one still closes the servicer and unlinks the ring
        assert sv.num_shards == shards
        if shards > 1:  # the nine sessions are spread over every shard
            assert sorted(set(sv._owner.values())) == list(range(shards)), sv._owner
        out = []
        for seq, rows in enumerate(_steps(), start=1):
            slot = seq % 2
            resp = sv._step(pb.StepRequest(step_seq=seq, slot=slot, rows=rows))
            out.append(([(r.request_id, r.row, r.status, r.complete, r.terminated, r.error, r.mask_positions)
                         for r in resp.rows], ring.bitmask(slot).copy(), ring.status(slot).copy()))
        return out
    finally:
        sv.close()
        ring.close()
        ring.unlink()


@pytest.mark.parametrize("chunk_rows", [1, 4])
def test_chunked_fill_writes_the_same_slot_as_one_fill(chunk_rows):
    want, got = _run(0), _run(chunk_rows)
    for (rows_w, bits_w, st_w), (rows_g, bits_g, st_g) in zip(want, got):
        assert rows_g == rows_w
        np.testing.assert_array_equal(st_g, st_w)
        np.testing.assert_array_equal(bits_g, bits_w)
    rows, _, status = got[0]
    assert sum(r[2] == pb.ROW_STATUS_INTEGRITY_ERROR for r in rows) == 1
    assert (status[9] == UNCONSTRAINED).all() and (status[11] == UNCONSTRAINED).all()
    assert got[0][1][:9].any(axis=(1, 2)).all()  # every constrained row got a mask


@pytest.mark.parametrize("shards,chunk_rows", [(3, 0), (2, 2)])
def test_step_shards_write_the_same_slot_as_one_process(shards, chunk_rows):
    want, got = _run(0), _run(chunk_rows, shards)
    for (rows_w, bits_w, st_w), (rows_g, bits_g, st_g) in zip(want, got):
        assert rows_g == rows_w
        np.testing.assert_array_equal(st_g, st_w)
        np.testing.assert_array_equal(bits_g, bits_w)
    assert got[0][1][:9].any(axis=(1, 2)).all()


def test_a_shard_worker_masks_json_schema_rows_like_the_sidecar():
    """A shard worker compiles the grammar the sidecar converted (its text), not the schema: every mask of
    a JSON Schema row stepped through a valid instance byte by byte is the same in both processes."""
    schema = '{"type":"object","properties":{"a":{"type":"integer","minimum":3},"b":{"enum":["x","yz"]}},' \
             '"required":["a"],"additionalProperties":false}'
    text = b'{"a":42,"b":"yz"}'
    masks = []
    for shards in (1, 2):
        geo = RingGeometry(num_slots=2, num_lanes=2, num_positions=1, vocab_size=VOCAB.vocab_size)
        ring = MaskRing.create(f"ninfer-test-json-{os.getpid()}-{uuid.uuid4().hex[:8]}", geo)
        sv = ConstraintServicer(SidecarOptions(isolate_compiles=False, step_shards=shards))
        try:
            sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
                vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes),
                special_ids=list(VOCAB.special_ids), eos_ids=list(VOCAB.eos_ids)), Ctx())
            sv.AttachRing(pb.AttachRingRequest(name=ring.name, byte_size=ring.nbytes, num_slots=2, num_lanes=2,
                                               num_positions=1, num_words=geo.num_words), Ctx())
            for rid, src in (("j0", schema), ("j1", schema.replace('"minimum":3', '"minimum":4'))):
                # every shard has both grammars: j1 lands on the worker (the least loaded) when there is one
                warm_every_shard(sv, pb.Constraint(kind="json_schema", source=src))
                sv.Prepare(pb.PrepareRequest(request_id=rid, constraint=pb.Constraint(kind="json_schema",
                                                                                    source=src)), Ctx())
            assert sorted(sv._owner.values()) == ([0, 0] if shards == 1 else [0, 1])
            got = []
            for i in range(len(text) + 1):
                commit = [] if i == 0 else [_tok(text[i - 1:i])]
                resp = sv._step(pb.StepRequest(step_seq=i + 1, slot=i % 2, rows=[
                    pb.RowStep(request_id="j0", row=0, commit_tokens=commit),
                    pb.RowStep(request_id="j1", row=1, commit_tokens=commit)]))
                assert [r.status for r in resp.rows] == [pb.ROW_STATUS_OK] * 2, resp
                got.append(ring.bitmask(i % 2).copy())
            assert resp.rows[0].complete and resp.rows[1].complete
            masks.append(got)
        finally:
            sv.close()
            ring.close()
            ring.unlink()
    for one, two in zip(*masks):
        np.testing.assert_array_equal(two[1], one[1])  # the worker's row
        np.testing.assert_array_equal(two[0], one[0])
