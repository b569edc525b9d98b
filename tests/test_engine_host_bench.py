"""bench/engine_host_bench.py without its model and sidecar: the stand-in executor's forward and sampling (every
token drawn is allowed by the staged mask; an empty mask is a dead end), the summary over repeats and the
thread-CPU clock of ``--clock cpu``."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import engine_host_bench as ehb  # noqa: E402
from gpu_engine.core.batch import build_step_batch  # noqa: E402
from gpu_engine.core.request import ConstraintRef, Request, SamplingOptions  # noqa: E402

V = 100


def _program():
    model = SimpleNamespace(max_lanes=4, max_seq_len=64)
    return ehb.null_program_class()(model, V, torch.device("cpu"))


def _rows(n: int) -> list[Request]:
    rows = []
    for i in range(n):
        r = Request(f"r{i}", [1, 2, 3], 8, SamplingOptions(), constraint=ConstraintRef("regex", "a"))
        r.lane = i
        rows.append(r)
    return rows


def test_forward_counts_a_prefill_rows_prompt_and_returns_fixed_logits():
    prog, rows = _program(), _rows(3)
    rows[1].output_ids, rows[1].num_cached = [7], 5
    logits = prog.forward(build_step_batch(rows))
    assert logits.shape == (3, 1, V) and [r.num_cached for r in rows] == [3, 5, 3]
    assert torch.equal(logits, prog.forward(build_step_batch(rows)))


def test_sample_draws_only_allowed_tokens_and_reports_an_empty_mask():
    prog, rows = _program(), _rows(4)
    for r in rows:
        r.output_ids, r.num_cached = [5], 10
    words = np.zeros((4, 1, 4), dtype=np.uint32)
    allowed = {0: {3}, 1: {40, 99}, 3: {0, 31, 64}}  # row 2: no token allowed
    for row, toks in allowed.items():
        for t in toks:
            words[row, 0, t // 32] |= np.uint32(1 << (t % 32))
    batch = build_step_batch(rows)
    for _ in range(50):
        out = prog.sample(batch, None, torch.from_numpy(words.view(np.int32)), None, torch.ones(4, dtype=torch.bool))
        for i, (toks, err) in enumerate(out):
            if i == 2:
                assert toks == [] and err.kind == "ConstraintDeadEnd"
            else:
                assert err is None and len(toks) == 1 and toks[0] in allowed[i]
    assert [r.num_cached for r in rows] == [60] * 4  # a decode row's input token is cached once per draw
    out = prog.sample(batch, None, torch.from_numpy(words.view(np.int32)), None, torch.tensor([1, 1, 0, 1]).bool())
    assert out[2][1] is None and 0 <= out[2][0][0] < V  # a row without its mask is not held to it


def test_summary_takes_the_median_of_each_phase_over_the_repeats():
    runs = [dict(batch=64, host_phase_ms_mean=dict(send=s, commit=1.0)) for s in (0.3, 0.1, 0.2)]
    got = ehb.summary(runs + [dict(batch=32, host_phase_ms_mean=dict(send=9.0))])
    assert got["64"]["send"]["median"] == 0.2 and got["64"]["send"]["n"] == 3 and got["64"]["commit"]["median"] == 1.0
    assert got["32"]["send"]["median"] == 9.0 and got["32"]["stage"]["median"] is None


def test_the_cpu_clock_times_the_engine_phases_in_thread_time(monkeypatch):
    from gpu_engine.engine import loop, mask_wait

    monkeypatch.setattr(loop, "time", loop.time)
    monkeypatch.setattr(mask_wait, "time", mask_wait.time)
    ehb.use_cpu_clock()
    assert loop.time.perf_counter is time.thread_time and mask_wait.time.perf_counter is time.thread_time
    assert loop.time.monotonic is time.monotonic  # the rest of the time module as it is
    t0, w0 = loop.time.perf_counter(), time.perf_counter()
    time.sleep(0.05)  # asleep: wall time passes, the thread's CPU time hardly does
    assert loop.time.perf_counter() - t0 < 0.02 < time.perf_counter() - w0


def test_drain_cancels_what_a_run_left_and_steps_until_the_engine_is_idle():
    rows, waiting = _rows(3), _rows(1)

    class Engine:
        _lanes, _closing, _pending, steps = [rows[0], None, rows[1], rows[2]], [], None, 0

        def _drain_waiting(self):
            return list(waiting)

        def step(self):  # one resident request finishes per step (its close answered at once)
            self.steps += 1
            live = [i for i, r in enumerate(self._lanes) if r is not None]
            if live:
                assert self._lanes[live[0]].cancelled.is_set()
                self._lanes[live[0]] = None
            return bool(live)

        @property
        def num_active(self):
            return sum(r is not None for r in self._lanes)

    eng = Engine()
    ehb.drain(eng)
    assert eng.num_active == 0 and eng.steps == 4 and all(r.cancelled.is_set() for r in rows + waiting)
    eng._lanes = [rows[0]]
    eng.step = lambda: True  # never idle

    with pytest.raises(RuntimeError):
        ehb.drain(eng, max_steps=5)
