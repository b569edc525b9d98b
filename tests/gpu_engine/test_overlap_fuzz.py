"""Random schedules, overlap scheduling on vs off: every request must get the same tokens and finish.

The adversary for :mod:`gpu_engine.engine.overlap` (queued forwards, admission ahead, discards): a plan of
6-18 requests with random prompts (1 to seq - 4 tokens), budgets, temperatures, arrivals, cancellations,
penalised rows (never queued ahead), DFA-constrained rows and, in the ``force`` runs, forced tokens appended
after commits (a thinking budget's forced close: the queued forward is discarded, and with it the prefill of
requests it had admitted). Configurations: plain, chunked eager prefill (a 5-token budget), the Step sent
before the launch, a 20-position context, and admission ahead off. A cancelled request is compared up to the
shorter of its two outputs (its cancel lands at a step boundary that the overlap may shift by one token).

``NINFER_OVERLAP_FUZZ_SEEDS`` sets the number of seeds per configuration (default 12). The GPU test runs
the first 6 plans with CUDA graphs and a GPU that lags the host (``torch.cuda._sleep`` before each forward and
prefill, so pinned uploads are still queued when the next forward is written).
"""
from __future__ import annotations

import os
import random

import pytest
import torch

from gpu_engine.core.request import ConstraintRef, Request, SamplingOptions

from test_overlap_schedule import _close, _engine  # noqa: E402
from test_sidecar_replay import V, _finish, _settled  # noqa: E402

LANES = 6
SEEDS = int(os.environ.get("NINFER_OVERLAP_FUZZ_SEEDS", "12"))


def _make(device: str, overlap: bool, seq: int, budget: int, step_send: str, admission: bool, graphs: bool,
          sleep_cycles: int):
    eng, sc = _engine(device, overlap, use_graphs=graphs, forcing=True, step_send=step_send, seq=seq, lanes=LANES,
                      prefill_graphs="on" if graphs else "off")
    prog = eng.program
    prog.prefill_token_budget = budget
    if sleep_cycles:  # the GPU lags the host: this forward's uploads are still queued when the next is written
        fr, pr = prog._forward_rows, prog._prefill_rows

        def slow_forward(batch, ahead):
            torch.cuda._sleep(sleep_cycles)
            return fr(batch, ahead)

        def slow_prefill(rows):
            torch.cuda._sleep(sleep_cycles)
            return pr(rows)

        prog._forward_rows, prog._prefill_rows = slow_forward, slow_prefill
    eng.overlap_admission = admission
    return eng, sc


def _plan(seed: int, seq: int, force: bool) -> list[dict]:
    rnd = random.Random(seed)
    reqs = []
    for i in range(rnd.randint(6, 18)):
        cons = rnd.random() < 0.25
        reqs.append(dict(
            rid=f"q{i}", prompt=[rnd.randrange(0, V - 1) for _ in range(rnd.randint(1, seq - 4))],
            max_tokens=12 if cons else rnd.randint(1, 30), temp=rnd.choice([0.0, 0.7, 1.0, 1.3]),
            seed=rnd.randrange(1000), cons=cons, pen=rnd.random() < 0.1, arrive=rnd.randint(0, 25),
            cancel=rnd.randint(1, 40) if rnd.random() < 0.2 else None,
            force=rnd.randint(1, 6) if force and rnd.random() < 0.3 and not cons else None))
    return reqs


def _run(seed: int, overlap: bool, device: str = "cpu", seq: int = 48, budget: int = 4096, step_send: str = "after",
         force: bool = False, admission: bool = True, graphs: bool = False, sleep_cycles: int = 0):
    """``(sorted (request id, tokens, finish reason, error) per request, (steps ahead, discarded))``."""
    eng, sc = _make(device, overlap, seq, budget, step_send, admission, graphs, sleep_cycles)
    plan = _plan(seed, seq, force)
    eng.force = {d["rid"]: d["force"] for d in plan if d["force"]}
    reqs = []
    try:
        objs = {}
        for d in plan:
            objs[d["rid"]] = Request(d["rid"], d["prompt"], d["max_tokens"],
                                     SamplingOptions(temperature=d["temp"], seed=d["seed"],
                                                     presence_penalty=0.5 if d["pen"] else 0.0),
                                     constraint=ConstraintRef("grammar", source="g", prefix=b"{") if d["cons"] else None,
                                     sidecar_generation=1)
            if d["cons"]:
                sc.state[d["rid"]] = 0
        for step in range(3000):
            for d in plan:
                if d["arrive"] == step:
                    eng.submit(objs[d["rid"]])
                    reqs.append(objs[d["rid"]])
                if d["cancel"] is not None and d["arrive"] + d["cancel"] == step:
                    objs[d["rid"]].cancelled.set()
            eng.step()
            if step > 26 and _settled(eng, reqs):
                break
        else:
            raise AssertionError("the engine did not settle")
        out = []
        for r in reqs:
            f = _finish(r)
            out.append((r.request_id, list(r.output_ids), str(f.finish_reason), None if f.error is None else str(f.error)))
        return sorted(out), (eng.steps_ahead, eng.ahead_discarded)
    finally:
        _close(eng)


def _same(on: list, off: list, counts) -> None:
    assert len(on) == len(off)
    for a, b in zip(on, off):
        if "cancelled" in (a[2], b[2]):  # the cancel may land one step apart: compare the common prefix
            n = min(len(a[1]), len(b[1]))
            assert a[1][:n] == b[1][:n], (a, b, counts)
        else:
            assert a == b, (a, b, counts)


CONFIGS = dict(plain={}, chunked_prefill=dict(budget=5), step_before=dict(step_send="before"), short_context=dict(seq=20),
               forced=dict(force=True))


@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_schedules_give_the_same_tokens_with_the_overlap_on_and_off(seed, cfg):
    kw = CONFIGS[cfg]
    off, _ = _run(seed, False, **kw)
    on, counts = _run(seed, True, **kw)
    _same(on, off, counts)
    assert counts[0] > 0  # forwards were queued ahead


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_schedules_without_admission_ahead_give_the_same_tokens(seed):
    off, _ = _run(seed, False, force=True)
    on, counts = _run(seed, True, force=True, admission=False)
    _same(on, off, counts)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", ["plain", "forced"])
def test_cuda_random_schedules_with_a_lagging_gpu_give_the_same_tokens(cfg):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for seed in range(6):
        kw = dict(CONFIGS[cfg], device="cuda", graphs=True, sleep_cycles=2_000_000)
        off, _ = _run(seed, False, **kw)
        on, counts = _run(seed, True, **kw)
        _same(on, off, counts)
