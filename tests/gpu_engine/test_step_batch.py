"""StepBatch / build_step_batch (gpu_engine/core/batch.py): shapes, -1 padding, q forms, derived batches."""
from __future__ import annotations

import pytest
import torch

from gpu_engine.core.batch import NO_SLOT, build_step_batch
from gpu_engine.core.request import Request, SamplingOptions
from gpu_engine.executor.eager import Program


def _row(lane, out=(1,), cached=10):
    r = Request(f"r{lane}", prompt_ids=[0] * 5, max_tokens=64, sampling=SamplingOptions())
    r.lane, r.output_ids, r.num_cached = lane, list(out), cached
    return r


class _Deferred:  # the fields of gpu_engine.spec.drafters.DeviceDrafts that the builder reads
    def __init__(self, rows, ks):
        self.rows, self.ks = rows, ks


def test_host_drafts_are_padded_with_minus_one_and_rows_keep_their_order():
    rows = [_row(3), _row(0, out=(), cached=0), _row(5)]
    b = build_step_batch(rows, {3: [7, 8, 9], 5: [4]}, slot=1)
    assert b.size == 3 and b.rows == tuple(rows) and b.slot == 1
    assert b.lanes.dtype == torch.int32 and b.lanes.tolist() == [3, 0, 5]
    assert b.start.tolist() == [10, 0, 10] and b.prefill.tolist() == [False, True, False]
    assert b.drafts.dtype == torch.int32 and b.drafts.tolist() == [[7, 8, 9], [-1, -1, -1], [4, -1, -1]]
    assert b.num_drafts.tolist() == [3, 0, 1] and b.max_drafts == 3 and b.speculative
    assert b.draft_q is None  # every drafter one-hot
    assert [b.row_drafts(i) for i in range(3)] == [[7, 8, 9], [], [4]]


def test_no_drafts_gives_an_empty_k_axis_and_no_slot_by_default():
    b = build_step_batch([_row(0), _row(1)])
    assert b.drafts.shape == (2, 0) and b.max_drafts == 0 and not b.speculative and b.slot == NO_SLOT


def test_sparse_q_rows_and_one_hot_rows_share_one_tensor():
    rows = [_row(0), _row(1), _row(2)]
    q_ids = torch.tensor([[7, 3, 5], [8, 2, 6]])
    q_probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]])
    b = build_step_batch(rows, {0: [7, 8], 1: [9]}, {0: (q_ids, q_probs)})
    qi, qp = b.draft_q
    assert qi.shape == qp.shape == (3, 2, 3) and qi.dtype == torch.int64 and qp.dtype == torch.float32
    assert torch.equal(qi[0], q_ids) and torch.equal(qp[0], q_probs)
    assert qi[1].tolist() == [[9, -1, -1], [-1, -1, -1]] and qp[1].tolist() == [[1.0, 0, 0], [0, 0, 0]]
    assert (qi[2] == -1).all() and (qp[2] == 0).all()  # a row without drafts


def test_deferred_rows_count_their_drafts_and_with_drafts_fills_them():
    rows = [_row(0), _row(1, out=(), cached=0), _row(2)]
    b = build_step_batch(rows, {2: [5]}, deferred=[_Deferred([rows[0]], [3])], slot=0)
    assert b.num_drafts.tolist() == [3, 0, 1] and b.drafts[0].tolist() == [-1, -1, -1]
    assert b.row_drafts(0) == [] and len(b.deferred) == 1
    rows[1].num_cached = 5  # the forward prefilled row 1: the prefill flag must survive
    r = b.with_drafts({0: [4, 4, 6], 2: [5]})
    assert r.deferred == () and r.slot == 0 and r.drafts[0].tolist() == [4, 4, 6]
    assert r.prefill.tolist() == [False, True, False] and r.start.tolist() == [10, 0, 10]
    assert r.without_masks().slot == NO_SLOT


def test_select_keeps_every_per_row_field_in_step():
    rows = [_row(0), _row(1), _row(2)]
    q = (torch.tensor([[7]]), torch.tensor([[1.0]]))
    b = build_step_batch(rows, {0: [7], 2: [8, 9]}, {0: q})
    s = b.select([2, 0])
    assert s.rows == (rows[2], rows[0]) and s.lanes.tolist() == [2, 0]
    assert s.drafts.tolist() == [[8, 9], [7, -1]] and s.num_drafts.tolist() == [2, 1]
    assert s.draft_q[0][:, :, 0].tolist() == [[8, 9], [7, -1]]


def test_bad_drafts_raise_value_error():
    rows = [_row(0)]
    with pytest.raises(ValueError, match="both host and deferred"):
        build_step_batch(rows, {0: [1]}, deferred=[_Deferred(rows, [2])])
    with pytest.raises(ValueError, match="q has 1 positions for 2 drafts"):
        build_step_batch(rows, {0: [1, 2]}, {0: (torch.tensor([[1]]), torch.tensor([[1.0]]))})


def test_stage_masks_without_a_slot_is_a_clear_error():
    class _Model:
        max_lanes, max_seq_len = 2, 16

    prog = Program(_Model(), 8, torch.device("cpu"))
    with pytest.raises(ValueError, match="no ring slot"):
        prog.stage_masks(object(), build_step_batch([_row(0)]))


def test_select_of_rows_without_drafts_is_not_speculative():
    rows = [_row(0), _row(1)]
    b = build_step_batch(rows, {0: [7, 8]}, {0: (torch.tensor([[7], [8]]), torch.tensor([[1.0], [1.0]]))})
    s = b.select([1])
    assert s.max_drafts == 0 and not s.speculative and s.drafts.shape == (1, 0) and s.draft_q is None
