"""GPU idle per step (EngineStats.per_step_gpu_idle_ms), the headline overlap metric of issue 12."""
from types import SimpleNamespace

import pytest

from gpu_engine.engine.stats import EngineStats, record_idle
from gpu_engine.engine.step_send import StepSendPolicy
from gpu_engine.executor.graph_buckets import StepTiming


def _engine(program):
    return SimpleNamespace(stats=EngineStats(), program=program, step_send=StepSendPolicy("auto"))


def _record(eng, *args, **kw):
    record_idle(eng.stats, eng.step_send, eng.program, *args, **kw)


def _timing(fwd, gap, fin):
    return StepTiming(batch=4, prefill=0, masked=True, forward_ms=fwd, gap_ms=gap, finish_ms=fin, mask_bytes=0)


def test_cuda_events_idle_is_wall_minus_forward_and_finish():
    prog = SimpleNamespace(timing=True, step_timings=[_timing(9.0, 9.0, 9.0)])
    eng = _engine(prog)
    prog.step_timings.append(_timing(2.0, 0.7, 1.0))  # recorded during the step
    _record(eng, 0.0045, prog.step_timings, 1, 0, prefill=False)
    st = eng.stats
    assert st.idle_source == "cuda_events"
    assert st.per_step_gpu_busy_ms == [pytest.approx(3.0)]
    assert st.per_step_gpu_idle_ms == [pytest.approx(1.5)]
    assert st.per_step_wall_ms == [pytest.approx(4.5)] and st.per_step_prefill == [False]
    assert eng.step_send.num_forward == 1 and eng.step_send.forward_ms == pytest.approx(2.0)  # the new event only


def test_cpu_idle_is_the_host_wait_on_the_sidecar():
    eng = _engine(SimpleNamespace())  # eager program: no CUDA events
    eng.stats.per_step_wait_ms[:] = [5.0, 1.25]  # the second entry was appended during this step
    _record(eng, 0.010, None, 0, 1, prefill=True)
    assert eng.stats.idle_source == "host_wait"
    assert eng.stats.per_step_gpu_idle_ms == [pytest.approx(1.25)]
    _record(eng, 0.010, None, 0, 2, prefill=False)  # unconstrained step: no wait
    assert eng.stats.per_step_gpu_idle_ms[-1] == 0.0


def test_cuda_step_without_events_records_nothing():
    prog = SimpleNamespace(timing=True, step_timings=[])
    eng = _engine(prog)
    _record(eng, 0.004, prog.step_timings, 0, 0, prefill=False)
    assert eng.stats.per_step_gpu_idle_ms == [] and eng.stats.per_step_wall_ms == []


def test_per_step_history_is_trimmed_to_its_limit_and_kept_whole_without_one():
    """Each per-step list (and an extra one, the executor's step_timings) keeps its last ``history_limit``
    entries once it holds twice as many; ``history_limit=None`` keeps everything."""
    from gpu_engine.engine.stats import PER_STEP_FIELDS

    for limit in (3, None):
        st, extra = EngineStats(history_limit=limit), []
        for i in range(11):
            for f in PER_STEP_FIELDS:
                getattr(st, f).append(i)
            extra.append(i)
            st.trim_history(extra)
            if limit is not None:
                assert len(extra) < 2 * limit
        # limit 3: trimmed to the last 3 when the 6th and the 9th entries came, then two more
        want = list(range(11)) if limit is None else [6, 7, 8, 9, 10]
        assert extra == want and all(getattr(st, f) == want for f in PER_STEP_FIELDS)


def test_a_long_running_engine_keeps_bounded_per_step_lists():
    """A real engine (tiny model, CPU) over ~60 steps with ``history_limit = 4``: every per-step list it fills
    holds at most 8 entries (trimmed before a step, filled by it) and ends with its newest step; the default limit is large enough for any window a
    test or metric reads."""
    from gpu_engine.engine.stats import HISTORY_STEPS
    from test_overlap_schedule import _close, _engine as _tiny_engine, _requests

    eng, _ = _tiny_engine("cpu", False)
    try:
        assert eng.stats.history_limit == HISTORY_STEPS >= 4096
        eng.stats.history_limit = 4
        r = _requests()[7]  # plain, 25 tokens
        r.max_tokens = 60
        eng.submit(r)
        walls = []
        while not r.finished:
            eng.step()
            walls.append(eng.stats.per_step_wall_ms[-1])
            assert 0 < len(eng.stats.per_step_wall_ms) <= 8 and len(eng.stats.per_step_gpu_idle_ms) <= 8
        assert eng.stats.steps >= 50 and eng.stats.per_step_wall_ms[-1] == walls[-1]
    finally:
        _close(eng)
