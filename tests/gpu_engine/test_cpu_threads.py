"""``--cpu-threads``: the CPU engine's torch intra-op thread count (gpu_engine.api.serve.cpu_threads)."""
from __future__ import annotations

import os

import pytest
import torch

from gpu_engine.api.serve import build_parser, cpu_threads


def test_explicit_count_wins() -> None:
    assert cpu_threads(3) == 3
    assert build_parser().parse_args(["--cpu-threads", "2"]).cpu_threads == 2


def test_auto_leaves_one_core_and_never_exceeds_torch_default(monkeypatch) -> None:
    assert build_parser().parse_args([]).cpu_threads == 0
    for cores, default, want in ((2, 2, 1), (1, 1, 1), (8, 8, 7), (16, 4, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cores: set(range(c)))
        monkeypatch.setattr(torch, "get_num_threads", lambda d=default: d)
        assert cpu_threads(0) == want, (cores, default)


def test_prefill_threads_auto_takes_every_core_and_never_exceeds_torch_default(monkeypatch) -> None:
    from gpu_engine.api.serve import cpu_prefill_threads

    assert cpu_prefill_threads(3) == 3
    assert build_parser().parse_args(["--cpu-prefill-threads", "2"]).cpu_prefill_threads == 2
    assert build_parser().parse_args([]).cpu_prefill_threads == 0
    for cores, default, want in ((2, 2, 2), (1, 1, 1), (8, 8, 8), (16, 4, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cores: set(range(c)))
        monkeypatch.setattr(torch, "get_num_threads", lambda d=default: d)
        assert cpu_prefill_threads(0) == want, (cores, default)


def test_prefill_forwards_run_on_prefill_threads_and_decode_on_the_process_setting() -> None:
    """A CPU Program's prefill forwards run with ``prefill_threads`` intra-op threads, restored afterwards
    (also when the forward raises), and give the same logits as on the process's own setting."""
    from gpu_engine.core.request import Request, SamplingOptions
    from gpu_engine.executor.eager import Program
    from gpu_engine.model.config import PRESETS
    from gpu_engine.model.llama import build_model

    import dataclasses

    model = build_model(dataclasses.replace(PRESETS["smollm2-135m-random"], num_layers=2), weights="random",
                        max_lanes=2, max_seq_len=64)
    prog = Program(model, model.config.vocab_size, torch.device("cpu"))
    seen: list[int] = []
    fwd = model.forward

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return fwd(*a, **k)

    model.forward = spy
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        rows = [Request(f"r{i}", [5, 6, 7, 8 + i], 4, SamplingOptions()) for i in range(2)]
        for i, r in enumerate(rows):
            r.lane = i
        base = prog._prefill_rows(rows)
        prog.prefill_threads = 2
        for r in rows:
            r.num_cached = 0
        got = prog._prefill_rows(rows)
        assert seen == [1, 2] and torch.get_num_threads() == 1
        torch.testing.assert_close(got, base, rtol=1e-4, atol=1e-4)
        model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
        for r in rows:
            r.num_cached = 0
        with pytest.raises(RuntimeError, match="boom"):
            prog._prefill_rows(rows)
        assert torch.get_num_threads() == 1  # restored after a failing prefill too
    finally:
        torch.set_num_threads(old)
