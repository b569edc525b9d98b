"""``--cpu-threads``: the CPU engine's torch intra-op thread count (gpu_engine.api.serve.cpu_threads)."""
from __future__ import annotations

import os

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
