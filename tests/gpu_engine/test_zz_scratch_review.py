import torch
from gpu_engine.core.request import Request, SamplingOptions
from test_overlap_schedule import _engine, _close
from test_sidecar_replay import _finish, _settled


def _drive(overlap, force_at):
    eng, sc = _engine("cpu", overlap, forcing=True)
    try:
        eng.force_rid, eng.force_at = "a", force_at
        a = Request("a", [1, 2, 3], 10, SamplingOptions(temperature=1.0, seed=3))
        b = Request("b", [4, 5], 6, SamplingOptions(temperature=1.0, seed=5))
        eng.submit(a)
        for step in range(200):
            if step == force_at - 1:  # b waits while a's step that gets the forced token is sampled
                eng.submit(b)
            eng.step()
            if _settled(eng, [a, b]):
                break
        out = []
        for r in (a, b):
            f = _finish(r)
            out.append((r.request_id, r.output_ids, f.finish_reason, f.error))
        return out, (eng.steps_ahead, eng.ahead_discarded)
    finally:
        _close(eng)


def test_discard_after_admission_ahead():
    off, _ = _drive(False, 3)
    on, counts = _drive(True, 3)
    print(off, on, counts)
    assert on == off
