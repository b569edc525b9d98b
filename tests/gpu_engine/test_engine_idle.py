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
