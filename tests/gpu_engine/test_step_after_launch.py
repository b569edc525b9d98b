"""Step after launch (``Engine.send_after_launch``): a plain step's Step message goes out right after its
forward launch instead of before it. The rig of ``test_sidecar_replay`` (real Engine, real eager Program and
CudaProgram phases, real mask ring, a DFA sidecar) checks the order of the two calls, that every request gets
the same tokens either way (draws depend on seed and position only), and that a sidecar lost when the Step is
sent, after the forward was launched, parks the constrained rows while the plain rows keep their draw."""
from __future__ import annotations

import pytest

from gpu_engine.sidecar.client import SidecarUnavailable
from gpu_engine.sidecar.supervisor import SidecarState

from test_deferred_publish import _submit_mixed  # noqa: E402
from test_sidecar_replay import CrashingSidecar, _drive, _finish, _req, _settled, _valid, rig  # noqa: E402, F401


class SendFailingSidecar(CrashingSidecar):
    """Sending the ``crash_at``-th Step fails: the sidecar died before it took the message, and comes back as a
    new generation with no sessions."""

    def __init__(self, ring, crash_at: int) -> None:
        super().__init__(ring, 0)  # answers never fail
        self.send_crash_at, self.sends = crash_at, 0

    def send_step(self, seq, slot, rows, generation=None):
        self.sends += 1
        if self.sends == self.send_crash_at:
            self.generation += 1
            self.state = {}
            self.supervisor.state = SidecarState.DOWN
            raise SidecarUnavailable("Step stream broke (the sidecar is gone)")
        super().send_step(seq, slot, rows, generation)


def _run(rig, after: bool, executor: str, crash_at: int = 0, sidecar_cls=CrashingSidecar):
    eng, sc = rig(crash_at, sidecar_cls, executor=executor)
    eng.send_after_launch = after
    reqs = _submit_mixed(eng, sc)
    if crash_at:
        plain = [r for r in reqs if r.constraint is None]
        for _ in range(200):  # step by step up to the step whose send fails
            before = [len(r.output_ids) for r in plain]
            eng.step()
            if eng.num_parked:
                break
        assert eng.num_parked == 3 and sc.sends == crash_at
        # the failed step still samples its plain rows (the forward was launched for them): one token each
        assert [len(r.output_ids) for r in plain] == [n + 1 for n in before]
        assert not any(r.finished for r in reqs if r.constraint is not None)
        sc.supervisor.state = SidecarState.UP  # restarted
    _drive(eng, lambda: _settled(eng, reqs))
    for r in reqs:
        assert _finish(r).error is None and r.output_ids
        assert r.constraint is None or _valid(r)
    return [r.output_ids for r in reqs], eng


@pytest.mark.parametrize("executor", ["eager", "cuda-program"])
def test_the_step_goes_out_after_the_forward_launch_only_when_asked(rig, executor):
    for after in (False, True):
        eng, sc = rig(0, executor=executor)
        sc.release.set()
        eng.send_after_launch = after
        calls = []
        forward, send = eng.program.forward, sc.send_step
        eng.program.forward = lambda batch: (calls.append("forward"), forward(batch))[1]
        sc.send_step = lambda *a, **k: (calls.append("send"), send(*a, **k))[1]
        r = _req(0, max_tokens=12)
        sc.state[r.request_id] = 0
        eng.submit(r)
        _drive(eng, lambda: _settled(eng, [r]))
        pair = ["forward", "send"] if after else ["send", "forward"]
        n = len(r.output_ids)
        # every step of the row: the Step message and the forward, in that order; then the close-only Step
        assert calls[:2 * n] == pair * n and calls[2 * n:] == ["send"], calls
        assert _valid(r)


@pytest.mark.parametrize("executor", ["eager", "cuda-program"])
def test_the_tokens_do_not_depend_on_where_the_step_goes_out(rig, executor):
    before, _ = _run(rig, False, executor)
    after, eng = _run(rig, True, executor)
    assert before == after
    assert eng.stats.host_phase_s.get("forward", 0) > 0 and eng.stats.host_phase_s.get("send", 0) > 0


@pytest.mark.parametrize("executor", ["eager", "cuda-program"])
def test_a_sidecar_lost_after_the_launch_parks_the_constrained_rows(rig, executor):
    ref, _ = _run(rig, False, executor)
    got, eng = _run(rig, True, executor, crash_at=3, sidecar_cls=SendFailingSidecar)
    assert eng.replays == 3
    assert got == ref  # the plain rows kept their draws; the replayed rows decoded the same tokens


@pytest.mark.parametrize("flag, expected", [(None, False), ("before", False), ("after", True), ("auto", False)])
def test_serve_step_send_reaches_the_engine(flag, expected):
    """``ninfer serve --step-send after`` turns it on (default: auto, which starts before: nothing measured
    yet); the stack is built, not started."""
    import socket

    from gpu_engine.api.serve import build_parser, build_stack

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["--port", str(port), "--device", "cpu", "--model", "qwen3-tiny-random", "--max-lanes", "2",
            "--max-seq-len", "64"] + (["--step-send", flag] if flag else [])
    engine, _, _ = build_stack(build_parser().parse_args(argv))
    try:
        assert engine.send_after_launch is expected  # auto starts before (no measurements yet)
        assert engine.step_send.mode == (flag or "auto")
    finally:
        engine.sidecar.stop()  # never started: removes its private socket directory
        engine.program.close()
        engine.ring.close()
        engine.ring.unlink()


def test_a_step_with_drafts_keeps_the_step_before_its_forward(rig):
    """Speculative steps keep their own order (the lookahead masks need the drafts): with host drafts the Step
    goes out first even when send_after_launch is on."""
    eng, sc = rig(0)
    sc.release.set()
    eng.send_after_launch = True
    r = _req(0, max_tokens=12)
    sc.state[r.request_id] = 0
    eng.submit(r)
    for _ in range(2):  # prefill, then a plain decode step: forward first
        eng.step()
    assert r.output_ids and not r.finished

    class Stop(Exception):
        pass

    calls = []
    send = sc.send_step

    def forward(batch):
        calls.append("forward")
        raise Stop  # the order is all this test needs

    eng.program.forward = forward
    sc.send_step = lambda *a, **k: (calls.append("send"), send(*a, **k))[1]
    eng._propose_rows = lambda rows: ({rows[0].lane: [r.output_ids[-1]]}, {}, [])  # one host draft
    with pytest.raises(Stop):
        eng.step()
    assert calls == ["send", "forward"]
