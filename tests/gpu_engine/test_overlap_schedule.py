"""Overlap scheduling (:mod:`gpu_engine.engine.overlap`): the next plain decode step's forward is queued
during this step's Finish, reading its input ids on the device.

Real Engine, real CudaProgram phases (eager on the CPU, CUDA graphs on the device), a real tiny Llama
(logits depend on the token *and* its position, so an input queued at the wrong position or with the
wrong id changes the tokens), a real mask ring and the DFA sidecar of ``test_sidecar_replay``. Every
request must get the same tokens and events with the overlap on and off (draws depend on seed and
position only), while most steps actually run a forward queued ahead; requests that arrive, are
cancelled or get forced tokens in the middle, and a sidecar that dies, must not change that.
"""
from __future__ import annotations

import os
import uuid

import pytest
import torch

from gpu_engine.core.request import ConstraintRef, Request, SamplingOptions
from gpu_engine.engine.loop import Engine, ring_geometry
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.sidecar.supervisor import SidecarState
from shared_memory.ring import MaskRing

from test_sidecar_replay import A, EOS, V, CrashingSidecar, _drive, _finish, _settled, _valid, rig  # noqa: E402, F401

CFG = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, name="tiny")
LANES, SEQ = 8, 64


class ForcingEngine(Engine):
    """Appends one forced token ``A`` (as a thinking budget's forced close does) to each request of ``force``
    (request id -> output length) once it has that many tokens and room for more: the forward queued for it
    during that step no longer matches and is discarded."""

    force: dict[str, int] = {}

    def _commit(self, r, toks):
        super()._commit(r, toks)
        k = self.force.get(r.request_id)
        if k is not None and len(r.output_ids) == k and not r.finished and r.num_cached + 3 < self.program.max_seq_len:
            self.program.append_forced(r, [A])
            r.output_ids.append(A)


def _engine(device: str, overlap: bool, crash_at: int = 0, use_graphs: bool = False, forcing: bool = False,
            step_send: str = "after", seq: int = SEQ, lanes: int = LANES, prefill_graphs: str = "off"):
    from gpu_engine.executor.cuda_graph import CudaProgram

    vocab = TokenVocabulary(V, tuple(bytes([65 + i]) for i in range(V)), frozenset({EOS}), (EOS,))
    ring = MaskRing.create(f"ninfer-test-overlap-{os.getpid()}-{uuid.uuid4().hex[:8]}", ring_geometry(lanes, 0, V))
    model = build_model(CFG, torch.device(device), torch.float32, lanes, seq, weights="random", seed=5)
    prog = CudaProgram(model, V, torch.device(device), ring, use_graphs=use_graphs, prefill_graphs=prefill_graphs)
    sc = CrashingSidecar(ring, crash_at)
    sc.release.set()
    eng = (ForcingEngine if forcing else Engine)(prog, vocab, sidecar=sc, ring=ring, overlap_schedule=overlap,
                                                 step_send=step_send)
    return eng, sc


def _close(eng: Engine) -> None:
    eng.program.close()
    eng.ring.close()
    eng.ring.unlink()


def _requests(tag: str = "") -> list[Request]:
    """Three DFA-constrained rows and five plain ones (temperatures 0.7-1.3, budgets 4-25)."""
    out = []
    for i in range(8):
        cons = i < 3
        out.append(Request(f"r{tag}{i}", [1 + i % 5, 2, 3 + i], 12 if cons else 4 + 3 * i,
                           SamplingOptions(temperature=0.7 + 0.1 * i, seed=17 * i + 3),
                           constraint=ConstraintRef("grammar", source="g", prefix=b"{") if cons else None,
                           sidecar_generation=1))
    return out


def _run(device: str, overlap: bool, crash_at: int = 0, use_graphs: bool = False, forcing: bool = False,
         step_send: str = "after", seq: int = SEQ, admission: bool = True):
    """Drive the engine step by step: 8 requests at once, 4 more (one constrained) after 5 steps (lanes are
    free only once rows finish), one cancelled at step 9; returns per request ``(ids, event summary)``, the
    engine's counters (``eng.admitted_ahead``: prefill rows carried by queued forwards) and the logits
    sampled. ``admission``: the engine's ``overlap_admission`` (off by default; on here, as the harder case)."""
    eng, sc = _engine(device, overlap, crash_at, use_graphs, forcing, step_send, seq)
    eng.overlap_admission = admission
    queued = []  # per forward queued ahead: did it carry a constrained row
    prefills = []  # per forward queued ahead: its prefill rows (admission ahead)
    ahead = eng.program.forward_ahead

    def recording_ahead(b):
        queued.append(any(r.constraint for r in b.rows))
        prefills.append(int(b.prefill.sum()))
        return ahead(b)

    eng.program.forward_ahead = recording_ahead
    if forcing:
        eng.force = {"r5": 3}
    counted = []  # the ninfer_steps_ahead_total increments (result used / discarded)
    eng.metrics.step_ahead = counted.append
    seen = {}  # (request id, output position) -> the logits it was sampled from
    sample = eng.program.sample

    def recording_sample(batch, logits, *a, **kw):
        for i, r in enumerate(batch.rows):
            seen[(r.request_id, len(r.output_ids))] = logits[i, 0].float().cpu().clone()
        return sample(batch, logits, *a, **kw)

    eng.program.sample = recording_sample
    try:
        first, late = _requests(), _requests("late")[2:6]
        for r in first + late:
            if r.constraint is not None:
                sc.state[r.request_id] = 0
        for r in first:
            eng.submit(r)
        reqs = first + late
        for step in range(3000):
            if step == 5:
                for r in late:
                    eng.submit(r)
            if step == 9:
                first[7].cancelled.set()
            if crash_at and eng.num_parked and sc.supervisor.state is SidecarState.DOWN:
                sc.supervisor.state = SidecarState.UP  # restarted: the parked rows are re-prepared
            eng.step()
            if step > 9 and _settled(eng, reqs):
                break
        else:
            raise AssertionError("the engine did not settle")
        got = []
        for r in reqs:
            fin = _finish(r)
            got.append((r.request_id, list(r.output_ids), fin.finish_reason, fin.error is None))
            if r.constraint is not None and fin.finish_reason != "cancelled":
                assert _valid(r), (r.request_id, r.output_ids)
        eng.queued_constrained = any(queued)
        eng.admitted_ahead = sum(prefills)
        assert counted.count(True) == eng.steps_ahead and counted.count(False) == eng.ahead_discarded
        if overlap and eng.steps_ahead:  # the queued launches' host time is its own phase, not "sample"'s
            assert eng.stats.host_phase_s.get("ahead", 0) > 0
        return got, (eng.steps_ahead, eng.ahead_discarded, eng.replays, any(queued), sum(prefills)), seen
    finally:
        _close(eng)


def _same_logits(a: dict, b: dict) -> None:
    """Every (request, position) sampled in both runs was sampled from the same logits."""
    common = a.keys() & b.keys()
    assert len(common) > 50
    for k in common:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5, msg=lambda m: f"{k}: {m}")


def test_overlap_gives_the_same_tokens_and_most_steps_run_a_forward_queued_ahead():
    off, (n_off, _, _, _, _), lo_off = _run("cpu", False)
    on, (n_on, discarded, _, cons, admitted), lo_on = _run("cpu", True)
    assert on == off
    _same_logits(lo_on, lo_off)
    assert n_off == 0 and n_on >= 10 and cons, n_on
    assert admitted >= 2  # late requests were admitted while a step was sampled, their prefill queued ahead
    assert any(f[2] == "cancelled" for f in on) and sum(len(f[1]) for f in on) > 60


def test_without_admission_ahead_a_waiting_request_keeps_the_forward_from_being_queued():
    """``overlap_admission`` off: no queued forward carries a prefill row, the tokens are the same, and
    fewer steps run a forward queued ahead than with it on."""
    off, _, lo_off = _run("cpu", False)
    on, (n_on, _, _, _, admitted), lo_on = _run("cpu", True, admission=False)
    _, (n_admit, _, _, _, _), _ = _run("cpu", True)
    assert on == off and admitted == 0 and 5 <= n_on < n_admit
    _same_logits(lo_on, lo_off)


def test_constrained_rows_are_queued_ahead_only_while_the_step_goes_out_after_the_launch():
    """With the Step sent before the forward (the sidecar slower than the forward), a step with constrained
    rows launches its own forward; once only plain rows are left, their forwards are queued ahead."""
    off, _, lo_off = _run("cpu", False, step_send="before")
    on, (n_on, _, _, cons, _), lo_on = _run("cpu", True, step_send="before")
    assert on == off and n_on >= 5 and not cons
    _same_logits(lo_on, lo_off)


def test_rows_that_reach_the_context_limit_end_the_same_way():
    """With 15 usable positions the longer plain rows end on ``length`` at the context limit, one of them
    while the next forward is already queued (its last queued position is still inside the lane)."""
    off, _, lo_off = _run("cpu", False, seq=16)
    on, (n_on, _, _, _, _), lo_on = _run("cpu", True, seq=16)
    assert on == off and n_on >= 5
    assert sum(f[2] == "length" and len(f[1]) < 4 + 3 * int(f[0][-1]) for f in on if not f[0].startswith("rlate")) >= 2
    _same_logits(lo_on, lo_off)


def test_a_row_given_tokens_the_queued_forward_did_not_foresee_discards_it():
    off, (_, d_off, _, _, _), lo_off = _run("cpu", False, forcing=True)
    on, (n_on, discarded, _, cons, admitted), lo_on = _run("cpu", True, forcing=True)
    assert on == off and d_off == 0
    _same_logits(lo_on, lo_off)
    assert discarded >= 1 and n_on >= 10
    assert [f[1][3] for f in on if f[0] == "r5"] == [A]  # the forced token is there


def test_a_sidecar_that_dies_under_the_overlap_parks_and_replays_with_the_same_tokens():
    ref, _, _ = _run("cpu", True)
    got, (n_on, _, replays, _, _), _ = _run("cpu", True, crash_at=4)
    off, (_, _, replays_off, _, _), _ = _run("cpu", False, crash_at=4)
    assert replays == replays_off == 4 and n_on >= 5  # the 3 constrained rows and the late one
    assert got == ref == off


def test_forward_ahead_takes_prefill_rows_only_after_the_decode_rows():
    eng, _ = _engine("cpu", True)
    try:
        from gpu_engine.core.batch import build_step_batch

        new, old = _requests()[4:6]
        new.lane, old.lane = 0, 1
        with pytest.raises(ValueError):
            eng.program.forward_ahead(build_step_batch([new]))  # no output yet: a prefill row, and no decode row
        old.output_ids, old.num_cached = [3], len(old.prompt_ids)
        with pytest.raises(ValueError):
            eng.program.forward_ahead(build_step_batch([new, old]))
    finally:
        _close(eng)


@pytest.mark.gpu
@pytest.mark.parametrize("use_graphs", [True, False], ids=["graphs", "eager"])
def test_cuda_overlap_gives_the_same_tokens(use_graphs):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    off, _, lo_off = _run("cuda", False, use_graphs=use_graphs)
    on, (n_on, _, _, _, _), lo_on = _run("cuda", True, use_graphs=use_graphs)
    assert on == off and n_on >= 10
    _same_logits(lo_on, lo_off)
    forced_off, _, lo_off = _run("cuda", False, use_graphs=use_graphs, forcing=True)
    forced_on, (_, discarded, _, _, _), lo_on = _run("cuda", True, use_graphs=use_graphs, forcing=True)
    assert forced_on == forced_off and discarded >= 1
    _same_logits(lo_on, lo_off)


def test_overlap_is_on_by_default_only_where_a_forward_can_be_queued_ahead():
    """Default: on for the CUDA-graph executor on CUDA, off on the CPU (a synchronous forward; tests turn it
    on); never for the eager Program (it has no ``forward_ahead``)."""
    from gpu_engine.executor.eager import Program

    for flag, want in ((False, False), (True, True)):
        eng, _ = _engine("cpu", flag)
        try:
            assert eng.overlap_schedule is want and eng.overlap_admission is False  # admission ahead: opt-in
        finally:
            _close(eng)
    eng, sc = _engine("cpu", True)
    try:
        assert Engine(eng.program, eng.vocab, sidecar=sc, ring=eng.ring).overlap_schedule is False  # CPU
        plain = Engine(Program(eng.program.model, V, torch.device("cpu")), eng.vocab, sidecar=sc, ring=eng.ring,
                       overlap_schedule=True)
        assert plain.overlap_schedule is False
    finally:
        _close(eng)


@pytest.mark.gpu
def test_overlap_is_on_by_default_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    eng, sc = _engine("cuda", True, use_graphs=True)
    try:
        assert Engine(eng.program, eng.vocab, sidecar=sc, ring=eng.ring).overlap_schedule is True
    finally:
        _close(eng)


def test_a_deferred_mask_wait_under_the_overlap_gives_the_same_tokens(rig):
    """A slow sidecar's answer is deferred (the plain row goes on alone, the constrained rows wait as the pending
    step): no forward is queued while a Step is pending, none from the settled pending step, and every request
    gets the tokens of a run with neither the overlap nor a deferral."""
    from test_mask_deferral import _finish_late, _start

    outputs = []
    for overlap, late_steps in ((False, 0), (True, 5)):
        eng, sc, reqs, free = _start(rig, executor="cuda-program")
        eng.overlap_schedule, eng.send_after_launch = overlap, True
        launches = []
        ahead = eng.program.forward_ahead
        eng.program.forward_ahead = lambda b: (launches.append(eng._pending), ahead(b))[1]
        outputs.append(_finish_late(eng, sc, reqs + [free], late_steps))
        assert all(p is None for p in launches)  # never queued while a Step answer was pending
        assert (eng.steps_ahead > 0) is overlap
    assert outputs[0] == outputs[1]


def test_settling_a_pending_step_queues_no_forward(rig):
    """The step that settles a pending Step (its plain row gone meanwhile, so the pending rows are every
    resident row) launches its rows' forward itself: nothing may be queued from inside the settle, where the
    step had already taken (or not) its queued forward. (Today CudaProgram samples pending rows, whose logits
    are a saved copy, on its eager path, which never queues; the engine also passes ``allow_ahead=False``
    there. This guards both against a graph path for them.)"""
    from test_mask_deferral import _done, _start

    eng, sc, reqs, free = _start(rig, executor="cuda-program")
    eng.overlap_schedule, eng.send_after_launch = True, True
    where = []
    settle, ahead = eng._settle_pending, eng.program.forward_ahead

    def settling(*a, **kw):
        where.append("settle")
        try:
            return settle(*a, **kw)
        finally:
            where.pop()

    eng._settle_pending = settling
    eng.program.forward_ahead = lambda b: (where and pytest.fail("forward queued while settling"), ahead(b))[1]
    sc.late = True
    eng.step()  # deferred: the constrained rows wait as the pending step, the plain row goes on
    assert eng._pending is not None
    free.cancel()
    sc.late = False
    _drive(eng, lambda: _done(eng, reqs + [free]))
    assert all(r.output_ids[-1] == EOS for r in reqs) and eng.steps_ahead > 0


def _forced_with_admission(overlap: bool, force_at: int = 3):
    """Request "a" gets a forced token after its ``force_at``-th (its queued forward is discarded) while "b",
    submitted just before into the one lane that just came free (every lane filled: admission ahead), was
    admitted into that same queued forward. Returns the outputs, (steps ahead, discarded) and the prefill rows
    queued ahead."""
    eng, _ = _engine("cpu", overlap, forcing=True)
    eng.overlap_admission = True
    queued_prefills = []
    ahead = eng.program.forward_ahead
    eng.program.forward_ahead = lambda batch: (queued_prefills.append(int(batch.prefill.sum())), ahead(batch))[1]
    try:
        eng.force = {"a": force_at}
        a = Request("a", [1, 2, 3], 10, SamplingOptions(temperature=1.0, seed=3))
        fill = [Request(f"f{i}", [2 + i, 1], force_at - 1 if i == 0 else 10, SamplingOptions(temperature=1.0, seed=i))
                for i in range(LANES - 1)]
        b = Request("b", [4, 5], 6, SamplingOptions(temperature=1.0, seed=5))
        for r in [a] + fill:
            eng.submit(r)
        reqs = [a, b] + fill
        for step in range(200):
            if step == force_at - 1:  # f0 has just ended: b waits for its lane while a's next step is sampled
                eng.submit(b)
            eng.step()
            if _settled(eng, reqs):
                break
        out = [(r.request_id, list(r.output_ids), f.finish_reason, f.error) for r, f in ((r, _finish(r)) for r in reqs)]
        return out, (eng.steps_ahead, eng.ahead_discarded), sum(queued_prefills)
    finally:
        _close(eng)


def test_a_discarded_queued_forward_gives_back_the_prefill_of_the_requests_it_admitted():
    """The admitted request's prefill went with the discarded forward: it is prefilled again (not decoded from
    a prompt-length position with no token, which raised IndexError and failed every resident request)."""
    off, _, _ = _forced_with_admission(False)
    on, (_, discarded), admitted = _forced_with_admission(True)
    assert on == off and discarded >= 1 and admitted >= 1
    assert on[0][1][3] == A and len(on[1][1]) == 6 and all(f[3] is None for f in on)


def test_a_request_cancelled_before_it_has_a_lane_frees_no_one_elses_kv():
    """Cancelled while waiting (lane -1): releasing "its" lane freed the last lane's KV blocks (a negative
    index), under the request that lives there."""
    def make():  # p0 ends after 1 token and frees lane 0; p7 holds the last lane
        return [Request(f"p{i}", [1 + i, 2], 1 if i == 0 else 12, SamplingOptions(temperature=1.0, seed=i))
                for i in range(LANES)]

    eng, _ = _engine("cpu", False)
    try:
        reqs = make()
        for r in reqs:
            eng.submit(r)
        eng.step()  # every lane taken, the last one by p7; p0 done
        assert reqs[0].finished and eng._lanes[LANES - 1] is reqs[-1]
        released = []
        release = eng.program.release_lane
        eng.program.release_lane = lambda lane: (released.append(lane), release(lane))[1]
        extra = Request("x", [3], 4, SamplingOptions(temperature=1.0, seed=9))
        eng.submit(extra)
        extra.cancelled.set()
        eng.step()  # x is taken from the queue for lane 0 and finished as cancelled, never given the lane
        assert extra.lane == -1 and _finish(extra).finish_reason == "cancelled"
        assert released == []  # (its free blocks came back to p7 on the same step here: same ids, same KV)
        ref_eng, _ = _engine("cpu", False)
        try:
            ref = make()
            for r in ref:
                ref_eng.submit(r)
            _drive(ref_eng, lambda: all(r.finished for r in ref))
        finally:
            _close(ref_eng)
        _drive(eng, lambda: all(r.finished for r in reqs))
        assert [r.output_ids for r in reqs] == [r.output_ids for r in ref]
    finally:
        _close(eng)
