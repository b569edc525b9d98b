"""``--step-send auto`` (:mod:`gpu_engine.engine.step_send`): the Step message goes out after the forward
launch while the sidecar's measured Step work is well under the measured forward, before it otherwise, with
hysteresis. The policy alone, then inside the real Engine on the rig of ``test_sidecar_replay`` with the
executor's CUDA-event timings and the sidecar's work figures set by the test."""
from __future__ import annotations

import pytest

from gpu_engine.engine.step_send import AUTO_ENTER, AUTO_LEAVE, STEP_SEND_MODES, StepSendPolicy
from gpu_engine.executor.graph_buckets import StepTiming

from test_sidecar_replay import CrashingSidecar, _drive, _req, _settled, _valid, rig  # noqa: E402, F401


def _feed(p: StepSendPolicy, work_ms: float, forward_ms: float, n: int) -> None:
    for _ in range(n):
        p.observe_forward(forward_ms)
        p.observe_work(work_ms)


def test_fixed_modes_ignore_measurements():
    for mode, after in (("before", False), ("after", True)):
        p = StepSendPolicy(mode, min_samples=1)
        _feed(p, 0.1, 10.0, 50)
        _feed(p, 50.0, 1.0, 50)
        assert p.after is after and p.switches == 0


def test_auto_needs_forward_samples_too():
    p = StepSendPolicy("auto", min_samples=4)
    for _ in range(3):
        p.observe_forward(5.0)
    for _ in range(50):
        p.observe_work(0.1)  # plenty of Step work, 3 < 4 forward times: no choice yet
    assert not p.after
    p.observe_forward(5.0)
    assert p.after


def test_setting_send_after_launch_fixes_the_mode(rig):
    eng, _ = rig(0)
    eng.step_send = StepSendPolicy("auto", min_samples=1)
    eng.send_after_launch = False
    assert eng.step_send.mode == "before"
    _feed(eng.step_send, 0.1, 10.0, 20)
    assert not eng.send_after_launch  # fixed: measurements no longer move it
    eng.send_after_launch = True
    assert eng.step_send.mode == "after" and eng.send_after_launch


def test_auto_waits_for_enough_samples_of_both_kinds():
    p = StepSendPolicy("auto", min_samples=8)
    for _ in range(7):
        p.observe_forward(5.0)
        p.observe_work(1.0)
    assert not p.after  # 7 < 8 of each
    for _ in range(20):
        p.observe_forward(5.0)  # forward times alone never decide
    assert not p.after
    p.observe_work(1.0)
    assert p.after and p.switches == 1


@pytest.mark.parametrize("work, forward, after", [
    (2.2, 5.6, True),  # the Qwen3-8B shape at B = 64 (README "Step after launch")
    (1.7, 1.3, False),  # SmolLM2 at B = 64
    (4.8, 5.5, False),  # the Llama-3.1-8B shape at B = 64
    (AUTO_ENTER * 5.0, 5.0, True), (AUTO_ENTER * 5.0 * 1.01, 5.0, False)])
def test_auto_chooses_from_the_ratio(work, forward, after):
    p = StepSendPolicy("auto", min_samples=4)
    _feed(p, work, forward, 40)
    assert p.after is after


def test_auto_has_hysteresis():
    p = StepSendPolicy("auto", min_samples=1, alpha=1.0)  # alpha 1: the EMA is the last value
    _feed(p, 1.0, 5.0, 1)
    assert p.after
    mid = (AUTO_ENTER + AUTO_LEAVE) / 2 * 5.0  # between the thresholds: the choice stays
    _feed(p, mid, 5.0, 5)
    assert p.after and p.switches == 1
    _feed(p, AUTO_LEAVE * 5.0, 5.0, 1)
    assert not p.after and p.switches == 2
    _feed(p, mid, 5.0, 5)
    assert not p.after and p.switches == 2


def test_auto_ema_smooths_one_outlier():
    p = StepSendPolicy("auto", min_samples=4, alpha=0.1)
    _feed(p, 1.0, 5.0, 20)
    assert p.after
    p.observe_work(30.0)  # one slow Step: EMA 1 + 0.1 * 29 = 3.9 < 0.8 * 5
    assert p.after
    for _ in range(10):
        p.observe_work(30.0)
    assert not p.after


@pytest.mark.parametrize("bad", [dict(mode="sometimes"), dict(enter=0.9, leave=0.5), dict(enter=0.0),
                                 dict(alpha=0.0), dict(alpha=1.5), dict(min_samples=0)])
def test_bad_settings_are_refused(bad):
    kw = dict(mode="auto")
    kw.update(bad)
    with pytest.raises(ValueError):
        StepSendPolicy(kw.pop("mode"), **kw)


def test_serve_offers_the_policy_modes():
    from gpu_engine.api.serve import build_parser

    act = next(a for a in build_parser()._actions if "--step-send" in a.option_strings)
    assert tuple(act.choices) == STEP_SEND_MODES and act.default == "auto"


class WorkSidecar(CrashingSidecar):
    """Answers every Step with the work figure the test sets (``work_ms``)."""

    work_ms = 1.0

    def recv_step(self, seq, timeout=None):
        results, _ = super().recv_step(seq, timeout)
        return results, self.work_ms / 1e3


@pytest.mark.parametrize("executor", ["eager", "cuda-program"])
def test_auto_in_the_engine_follows_the_measurements(rig, executor):
    """Forward event times of 5 ms and Step work of 1 ms: after some steps the Step goes out after the
    launch; work of 4.5 ms (0.9 of the forward): before it again. Every step still gets its masks."""
    eng, sc = rig(0, WorkSidecar, executor=executor)
    sc.release.set()
    eng.step_send = StepSendPolicy("auto", min_samples=3, alpha=1.0)
    prog = eng.program
    prog.step_timings = []  # what CudaProgram records from CUDA events on a GPU
    calls = []
    forward, send = prog.forward, sc.send_step

    def timed_forward(batch):
        calls.append("forward")
        out = forward(batch)
        pre = int(batch.prefill.sum())  # a prefill's forward time is no decode figure: must not count
        prog.step_timings.append(StepTiming(batch=len(batch.rows), prefill=pre, masked=True,
                                            forward_ms=0.5 if pre else 5.0, gap_ms=0.0, finish_ms=0.1, mask_bytes=0))
        # a speculative step's event (the executor records them too) is no plain forward either
        prog.step_timings.append(StepTiming(batch=len(batch.rows), prefill=0, masked=True, forward_ms=0.5,
                                            gap_ms=0.0, finish_ms=0.1, mask_bytes=0, speculative=True))
        return out

    prog.forward = timed_forward
    sc.send_step = lambda *a, **k: (calls.append("send"), send(*a, **k))[1]
    reqs = []

    def top_up():  # one constrained row at all times (the rig's grammar ends rows after a few tokens)
        if not reqs or reqs[-1].finished:
            reqs.append(_req(len(reqs), max_tokens=40))
            sc.state[reqs[-1].request_id] = 0
            eng.submit(reqs[-1])

    orders = []
    for i in range(30):
        if i == 15:
            sc.work_ms = 4.5
        top_up()
        n = len(calls)
        eng.step()
        orders.append(tuple(calls[n:n + 2]))
    first_after = orders.index(("forward", "send"))
    assert 2 <= first_after <= 6  # 3 samples of each kind, then the choice
    assert set(orders[first_after:16]) == {("forward", "send")}, orders
    assert orders[-5:] == [("send", "forward")] * 5, orders
    assert eng.step_send.switches == 2 and eng.stats.steps_sent_after >= 10
    _drive(eng, lambda: _settled(eng, reqs))
    assert len(reqs) > 1 and all(_valid(r) for r in reqs)


class CloseAwareSidecar(CrashingSidecar):
    """4 ms of work for a Step that fills masks, 0.01 ms for one that only closes sessions."""

    fills: list

    def recv_step(self, seq, timeout=None):
        fill = any(not r.close for r in self.msgs[0][2])  # the Step being answered
        self.fills = getattr(self, "fills", []) + [fill]
        results, _ = super().recv_step(seq, timeout)
        return results, (4.0 if fill else 0.01) / 1e3


def test_a_step_that_only_closes_sessions_is_no_work_sample(rig):
    """A constrained row ends while a plain row runs on: its close rides on the next Step, which fills no mask;
    that Step's tiny work figure must not pull the average towards "after"."""
    eng, sc = rig(0, CloseAwareSidecar)
    sc.release.set()
    eng.step_send = StepSendPolicy("auto", min_samples=1, alpha=1.0)
    c, u = _req(0, max_tokens=3), _req(1, constrained=False, max_tokens=12)
    sc.state[c.request_id] = 0
    eng.submit(c)
    eng.submit(u)
    _drive(eng, lambda: _settled(eng, [c, u]))
    assert True in sc.fills and False in sc.fills  # both kinds of Step were sent
    assert eng.step_send.num_work == sum(sc.fills) and eng.step_send.work_ms == 4.0
