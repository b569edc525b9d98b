"""An engine step that raises (an engine bug) after its Step message went out: ``Engine._run`` fails the resident
requests, drops the Step's outstanding answer (``Sidecar.drain_step``) so the next Step reads its own answer, and
publishes the Finish of every session close that Step, or an abandoned pending step, carried. Real Engine, eager
Program and mask ring with the DFA sidecar of ``test_sidecar_replay`` (which asserts every answer's sequence)."""
from __future__ import annotations

import threading

import pytest

from gpu_engine.core.request import Finish

from test_sidecar_replay import CrashingSidecar, _req, rig  # noqa: F401


def _events(r):
    out = []
    while not r.events.empty():
        out.append(r.events.get())
    return out


def _raise_in_next_forward(eng) -> None:
    forward = eng.program.forward

    def boom(batch):
        eng.program.forward = forward
        raise RuntimeError("device lost")

    eng.program.forward = boom


def _run_until(eng, done, limit_s: float = 10.0) -> None:
    t = threading.Thread(target=eng._run, daemon=True)
    t.start()
    for _ in range(int(limit_s / 0.01)):
        if done():
            break
        threading.Event().wait(0.01)
    eng._stop.set()
    eng._wake.set()
    t.join(5)
    assert done()


def test_a_step_failing_after_its_step_message_keeps_the_stream_in_step(rig):
    eng, sc = rig(0, CrashingSidecar)
    sc.release.set()
    a = _req(1, max_tokens=50)
    sc.state[a.request_id] = 0
    eng.submit(a)
    for _ in range(3):
        eng.step()
    _raise_in_next_forward(eng)  # the Step of this step is sent, then the forward raises
    b = _req(2, max_tokens=3)  # a request after the failure: its Steps must read their own answers
    _run_until(eng, lambda: a.finished)
    sc.state[b.request_id] = 0
    eng._stop.clear()
    eng.submit(b)
    _run_until(eng, lambda: b.finished and not eng._closing)  # CrashingSidecar.recv_step asserts each seq
    assert isinstance(_events(a)[-1], Finish)
    fin = _events(b)[-1]
    assert isinstance(fin, Finish) and fin.error is None and len(b.output_ids) == 3
    eng.stop()


@pytest.mark.parametrize("where", ["after_send", "before_send"])
def test_closes_carried_by_a_failed_step_get_their_finish(rig, where):
    """A request finished at step n: its close rides on step n + 1's Step; that step raises after sending it (the
    close is settled from the drained answer) or before (the close goes back to the queue and rides on the next
    Step). Either way the session is closed once and its Finish is published, clean."""
    eng, sc = rig(0, CrashingSidecar)
    sc.release.set()
    a, b = _req(1, max_tokens=2), _req(2, max_tokens=50)
    for r in (a, b):
        sc.state[r.request_id] = 0
        eng.submit(r)
    while not a.finished:
        eng.step()
    assert eng._closing and not any(isinstance(e, Finish) for e in list(a.events.queue))
    if where == "after_send":
        _raise_in_next_forward(eng)
    else:
        send = sc.send_step

        def boom(*args, **kw):
            sc.send_step = send
            raise RuntimeError("serialisation bug")

        sc.send_step = boom
    _run_until(eng, lambda: b.finished and not eng._closing and any(isinstance(e, Finish) for e in list(a.events.queue)))
    fin = _events(a)[-1]
    assert isinstance(fin, Finish) and fin.error is None and fin.finish_reason.value == "length"
    assert fin.constraint is not None and a.request_id not in sc.state  # its session was closed
    assert isinstance(_events(b)[-1], Finish)
    eng.stop()
