"""Deferred mask wait (issue 14: unconstrained rows never wait on a constrained problem).

Real engine + real eager Program + real mask ring, the bigram "model" of ``test_sidecar_replay`` and
a fake sidecar whose Step answers can be held back (a slow or hung sidecar): a soft wait sees no
answer, the unconstrained rows commit tokens meanwhile, and the constrained rows get exactly the
token their mask allows once the answer comes — or are parked and replayed when the hard deadline
passes. The real-process version (SIGSTOP of the real sidecar) is in ``tests/e2e/test_supervision_e2e.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpu_engine.engine.loop import Engine
from gpu_engine.sidecar.client import SidecarUnavailable
from gpu_engine.sidecar.supervisor import SidecarState
from gpu_engine.core.request import ConstraintRef, Request, SamplingOptions

# same folder: the bigram rig (real Engine, Program, ring) and its DFA sidecar
from test_sidecar_replay import LENGTH, V, EOS, CrashingSidecar, _drive, _finish, rig  # noqa: E402, F401

WORD = [3, 7, 7, 3, 9, 3]  # the language here: exactly this word, then EOS (each mask allows one token)
assert len(WORD) == LENGTH


def word_allowed(state: int) -> np.ndarray:
    a = np.zeros(V, bool)
    a[WORD[state] if state < len(WORD) else EOS] = True
    return a


class LateSidecar(CrashingSidecar):
    """The DFA sidecar (never crashing by itself) for the one-word language. While :attr:`late` is set an
    answer is held back (a soft wait sees ``None``); :meth:`expire` makes the next wait fail as the Step
    stream's watchdog does past the hard deadline (the sidecar comes back as a new generation without
    sessions, ``DOWN`` until the test says it is up)."""

    language = staticmethod(word_allowed)

    def __init__(self, ring, crash_at: int = 0) -> None:
        super().__init__(ring, 0)
        self.release.set()
        self.late, self.expired = False, False
        self.timeouts: list = []  # the timeout of every recv_step

    def expire(self) -> None:
        self.expired = True

    def send_step(self, seq, slot, rows, generation=None):
        assert not self.msgs, "a Step was sent while an answer was outstanding"
        super().send_step(seq, slot, rows, generation)

    def recv_step(self, seq, timeout=None):
        self.timeouts.append(timeout)
        if self.expired:  # the hard deadline passed: the stream is cancelled, the sidecar restarted
            self.expired, self.msgs, self.state = False, [], {}
            self.generation += 1
            self.supervisor.state = SidecarState.DOWN
            raise SidecarUnavailable("Step stream broke (no Step answer within 5 s)")
        if self.late:
            assert timeout is not None, "a blocking wait on an answer that never comes"
            return None
        return super().recv_step(seq)


def _req(i: int, constrained: bool = True, max_tokens: int = 20) -> Request:
    return Request(f"r{i}", [1, 2], max_tokens, SamplingOptions(seed=7 * i + 3, temperature=1.0),
                   constraint=ConstraintRef("grammar", source="g") if constrained else None, sidecar_generation=1)


def _start(rig, soft_wait_s: float = 0.001, n: int = 3, executor: str = "eager"):
    eng, sc = rig(0, LateSidecar, executor=executor, mask_soft_wait_s=soft_wait_s)
    reqs, free = [_req(i) for i in range(n)], _req(9, constrained=False, max_tokens=60)
    sc.state.update({r.request_id: 0 for r in reqs})  # prepared by admission in generation 1
    for r in reqs + [free]:
        eng.submit(r)
    _drive(eng, lambda: all(len(r.output_ids) >= 2 for r in reqs))
    return eng, sc, reqs, free


def _done(eng: Engine, reqs: list[Request]) -> bool:
    return all(r.finished for r in reqs) and not eng._closing and not eng._parked and eng._pending is None


def _finish_late(eng: Engine, sc: LateSidecar, reqs: list[Request], late_steps: int) -> list[list[int]]:
    """Run ``late_steps`` steps with the sidecar's answers late (0: none), then every request to its end; the
    requests' tokens. Checks that exactly one mask wait was deferred when any step was late."""
    if late_steps:
        sc.late = True
        for _ in range(late_steps):
            eng.step()
        sc.late = False
    _drive(eng, lambda: _done(eng, reqs))
    assert eng.stats.mask_waits_deferred == (1 if late_steps else 0)
    return [r.output_ids for r in reqs]


def test_unconstrained_rows_commit_while_the_answer_is_late_then_pending_rows_get_the_masked_token(rig):
    eng, sc, reqs, free = _start(rig)
    before = {r.request_id: list(r.output_ids) for r in reqs}
    sc.late = True  # the sidecar is slow: the next mixed step's answer is not there within the soft budget
    n_free, n_msgs = len(free.output_ids), len(sc.timeouts)
    for _ in range(8):
        eng.step()
    assert eng._pending is not None and eng.stats.mask_waits_deferred == 1
    assert len(free.output_ids) >= n_free + 8  # one token per step, none waited for the masks
    assert {r.request_id: r.output_ids for r in reqs} == before  # constrained rows sat out
    assert all(t == 0.0 for t in sc.timeouts[n_msgs + 1:])  # later steps only polled, never blocked
    sc.late = False
    eng.step()  # the answer is there: the pending rows are sampled with their saved logits and masks
    assert eng._pending is None  # (then the step went on with every row: a new Step was sent)
    for r in reqs:
        n = len(before[r.request_id])
        assert len(r.output_ids) > n and r.output_ids == (WORD + [EOS])[:len(r.output_ids)], r.output_ids
    _drive(eng, lambda: _done(eng, reqs + [free]))
    for r in reqs:
        f = _finish(r)
        assert f.error is None and r.output_ids == WORD + [EOS] and f.constraint.complete, (f, r.output_ids)
    assert _finish(free).error is None and len(free.output_ids) == 60


@pytest.mark.parametrize("executor", ["eager", "cuda-program"])
def test_a_deferred_wait_does_not_change_the_output(rig, executor):
    """Draws depend on (seed, position) and the saved logits: the same requests give the same tokens
    whether or not some of their steps were deferred (``cuda-program``: CudaProgram's static logits
    buffer and subset Finish, then its eager path for the pending rows, on the CPU)."""
    outputs = []
    for late_steps in (0, 5):
        eng, sc, reqs, free = _start(rig, executor=executor)
        outputs.append(_finish_late(eng, sc, reqs + [free], late_steps))
    assert outputs[0] == outputs[1]


def test_a_pending_row_can_be_cancelled_and_its_close_rides_on_the_next_step(rig):
    eng, sc, reqs, free = _start(rig)
    sc.late = True
    eng.step()
    reqs[0].cancel()
    eng.step()
    assert eng._pending is not None and reqs[0].finished  # its lane is free; its close waits for the Step
    sc.late = False
    _drive(eng, lambda: _done(eng, reqs + [free]))
    assert _finish(reqs[0]).finish_reason == "cancelled"
    assert all(_finish(r).error is None and r.output_ids == WORD + [EOS] for r in reqs[1:])


def test_with_only_constrained_rows_left_the_step_waits_for_the_answer(rig):
    eng, sc, reqs, free = _start(rig, n=2)
    sc.late = True
    eng.step()
    assert eng._pending is not None
    free.cancel()  # no unconstrained row left: the next step waits for the answer (in soft-budget slices)
    sc.late = False
    n0 = len(sc.timeouts)
    eng.step()
    assert eng._pending is None and sc.timeouts[n0] == eng.mask_soft_wait_s
    _drive(eng, lambda: _done(eng, reqs))
    assert all(r.output_ids == WORD + [EOS] for r in reqs)
    assert eng.stats.mask_waits_deferred == 1  # nothing new came in: constrained-only steps were never split


def test_a_request_submitted_during_a_constrained_only_wait_is_admitted_at_once(rig):
    """A hung sidecar with only constrained rows resident must not hold a new unconstrained request in the
    queue until the hard deadline: the sliced wait ends, the step becomes the pending one, and the new
    request decodes while the answer is still outstanding."""
    eng, sc, reqs, free = _start(rig, n=2)
    free.cancel()
    _drive(eng, lambda: free.finished and None in eng._lanes and eng._pending is None)
    late_req = _req(10, constrained=False, max_tokens=30)
    polls, recv = [], sc.recv_step

    def recv_and_submit(seq, timeout=None):
        polls.append(timeout)
        if len(polls) == 3:  # the third slice of the wait: a client submits a request
            eng.submit(late_req)
        return recv(seq, timeout)

    sc.recv_step = recv_and_submit
    before = {r.request_id: list(r.output_ids) for r in reqs}
    sc.late = True
    eng.step()  # constrained rows only: waits in slices until the new request shows up
    assert eng._pending is not None and eng.stats.mask_waits_deferred == 1
    assert len(polls) == 3 and all(t == eng.mask_soft_wait_s for t in polls)
    for _ in range(6):
        eng.step()
    assert len(late_req.output_ids) >= 5  # decoding while the answer is outstanding
    assert {r.request_id: r.output_ids for r in reqs} == before
    sc.late = False
    _drive(eng, lambda: _done(eng, reqs + [late_req]))
    assert all(_finish(r).error is None and r.output_ids == WORD + [EOS] for r in reqs)
    assert _finish(late_req).error is None and len(late_req.output_ids) == 30


def test_an_answer_past_the_hard_deadline_parks_and_replays_the_pending_rows(rig):
    eng, sc, reqs, free = _start(rig)
    sc.late = True
    for _ in range(3):
        eng.step()
    n_free = len(free.output_ids)
    sc.expire()  # the watchdog cancels the stream: the pending rows take the supervision path
    eng.step()
    assert eng._pending is None and all(r.parked and not r.finished for r in reqs)
    sc.late = False
    _drive(eng, lambda: len(free.output_ids) >= n_free + 3)  # unconstrained rows go on meanwhile
    sc.supervisor.state = SidecarState.UP  # restarted
    _drive(eng, lambda: _done(eng, reqs + [free]))
    assert sorted(rid for rid, _ in sc.prepared) == sorted(r.request_id for r in reqs) and eng.replays == len(reqs)
    for r in reqs:
        f = _finish(r)
        assert f.error is None and r.output_ids == WORD + [EOS] and f.constraint.complete, (f, r.output_ids)


def test_soft_wait_zero_always_waits_and_negative_is_refused(rig):
    eng, sc, reqs, free = _start(rig, soft_wait_s=0.0)
    _drive(eng, lambda: _done(eng, reqs + [free]))
    assert eng.stats.mask_waits_deferred == 0 and set(sc.timeouts) == {None}
    with pytest.raises(ValueError, match="mask_soft_wait_s"):
        rig(0, LateSidecar, mask_soft_wait_s=-1.0)


@pytest.mark.parametrize("executor", ["eager", "spec-graphs"])
def test_speculative_rows_defer_the_same_way_and_give_the_same_tokens(executor):
    """Drafts and ``[P, T, V]`` logits of pending speculative rows are kept: verifying them later gives
    the tokens of a run without deferral (eager ``Program`` and ``CudaProgram``'s static speculative
    phase, run on the CPU)."""
    import test_spec_step_engine as spec  # noqa: E402  (same folder)

    class HoldingSidecar(spec.FakeSidecar):
        """Holds every third Step's answer back for two soft waits."""

        held: dict

        def recv_step(self, seq, timeout=None):
            if timeout is not None and seq % 3 == 1 and self.held.setdefault(seq, 0) < 2:
                self.held[seq] += 1
                return None
            return super().recv_step(seq)

    outputs, deferred = [], []
    for hold in (False, True):
        table, dfa, qs, _allowed = spec._chain_world(seed=3)
        eng = spec._engine(table, dfa, spec.FixedQDrafter(lambda prev: qs[prev]), k=2, max_lanes=8,
                           executor=executor)
        if hold:
            eng.sidecar = HoldingSidecar(eng.ring, dfa)
            eng.sidecar.held = {}
        reqs = [spec._req(i, 2, 12, constrained=i % 3 != 0) for i in range(24)]
        fins = spec._run(eng, reqs)
        assert all(f.error is None for f in fins), [f.error for f in fins if f.error]
        assert sum(f.draft_tokens for f in fins) > 0
        outputs.append([r.output_ids for r in reqs])
        deferred.append(eng.stats.mask_waits_deferred)
    assert deferred[0] == 0 and deferred[1] > 0
    assert outputs[0] == outputs[1]


def test_serve_refuses_a_negative_soft_wait(capsys):
    from gpu_engine.api.serve import build_parser, serve_main

    assert build_parser().parse_args([]).mask_soft_wait == 200.0  # the documented default, ms
    with pytest.raises(SystemExit) as e:
        serve_main(["--mask-soft-wait", "-5"])
    assert e.value.code == 2 and "--mask-soft-wait must be >= 0 ms" in capsys.readouterr().err


def test_a_close_only_wait_is_interruptible_too(rig):
    """The last constrained rows finished and nothing else is resident: their closes ride on a Step of their
    own. With the sidecar slow, a request submitted during that wait is admitted at once; the closes are
    settled later and the finished requests still get their Finish with the constraint's outcome."""
    eng, sc, reqs, free = _start(rig, n=2)
    free.cancel()
    _drive(eng, lambda: all(r.finished for r in reqs) and free.finished)
    assert eng._closing and eng._pending is None  # closes queued for a Step of their own
    new_req = _req(11, constrained=False, max_tokens=20)
    polls, recv = [], sc.recv_step

    def recv_and_submit(seq, timeout=None):
        polls.append(timeout)
        if len(polls) == 2:
            eng.submit(new_req)
        return recv(seq, timeout)

    sc.recv_step = recv_and_submit
    sc.late = True
    eng.step()  # the close-only Step: its wait ends when the request comes in
    assert eng._pending is not None and not eng._pending.batch.rows and len(polls) == 2
    for _ in range(5):
        eng.step()
    assert len(new_req.output_ids) >= 4  # decoding while the close answer is outstanding
    sc.late = False
    _drive(eng, lambda: _done(eng, reqs + [new_req]))
    for r in reqs:
        f = _finish(r)
        assert f.error is None and f.constraint.complete and r.output_ids == WORD + [EOS], (f, r.output_ids)
    assert _finish(new_req).error is None and len(new_req.output_ids) == 20
