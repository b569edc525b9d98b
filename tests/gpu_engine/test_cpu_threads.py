"""``--cpu-threads``: the CPU engine's torch intra-op thread count (gpu_engine.api.serve.cpu_threads)."""
from __future__ import annotations

import os

import pytest
import torch

from gpu_engine.api.serve import build_parser, cpu_threads


def test_explicit_count_wins() -> None:
    assert cpu_threads(3) == 3
    assert build_parser().parse_args(["--cpu-threads", "2"]).cpu_threads == 2


def test_auto_takes_every_core_and_never_exceeds_torch_default(monkeypatch) -> None:
    assert build_parser().parse_args([]).cpu_threads == 0
    for cores, default, want in ((2, 2, 2), (1, 1, 1), (8, 8, 8), (16, 4, 4), (2, 8, 2)):
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


def test_off_main_thread_returns_the_result_or_raises_from_another_thread() -> None:
    import threading

    from gpu_engine.api.serve import off_main_thread

    assert off_main_thread(lambda a, b=0: (a + b, threading.current_thread() is threading.main_thread()), 2, b=3) \
        == (5, False)
    with pytest.raises(KeyError, match="missing"):
        off_main_thread(lambda: {}["missing"])


def _build_stack_load(monkeypatch, argv: list[str]) -> tuple:
    """``(path, kwargs, thread)`` of the one ``load_model`` call :func:`build_stack` makes for ``argv``
    (the fake load stops the build right there)."""
    import threading

    import gpu_engine.model.loader as loader
    from gpu_engine.api.serve import build_stack

    calls = []

    class Stop(Exception):
        pass

    def fake_load(path, **kw):
        calls.append((path, kw, threading.current_thread()))
        raise Stop

    monkeypatch.setattr(loader, "load_model", fake_load)
    with pytest.raises(Stop):
        build_stack(build_parser().parse_args(argv))
    (call,) = calls
    return call


def test_build_stack_loads_a_cpu_model_off_the_main_thread(monkeypatch) -> None:
    """The load runs on a thread that has ended when build_stack goes on (so no OpenMP pool is left on the
    thread that keeps running); the arguments reach load_model unchanged."""
    import threading

    path, kw, thread = _build_stack_load(monkeypatch, ["--device", "cpu", "--model", "smollm2-135m-random",
                                                       "--max-lanes", "3", "--max-seq-len", "96"])
    assert path == "smollm2-135m-random" and kw == dict(device="cpu", dtype=None, max_lanes=3, max_seq_len=96)
    assert thread is not threading.main_thread() and not thread.is_alive()


def test_build_stack_loads_a_cuda_model_on_the_calling_thread(monkeypatch) -> None:
    """Only CPU loads move: a CUDA model is loaded (and later captured in graphs) on the thread that builds
    the stack, as before."""
    import threading

    import gpu_engine.model.loader as loader

    monkeypatch.setattr(loader, "resolve_device", lambda device="auto": torch.device("cuda"))
    _, _, thread = _build_stack_load(monkeypatch, ["--device", "cuda", "--model", "smollm2-135m-random"])
    assert thread is threading.current_thread()


_POOL_PROBE = """
import os, sys, torch
from gpu_engine.api.serve import off_main_thread
torch.set_num_threads(2)
def threads():
    return len(os.listdir("/proc/self/task"))
def work():
    a = torch.ones(1024, 1024)
    return float((a @ a).sum())
base = threads()
import time
off_main_thread(work)
for _ in range(100):  # the pool's workers exit just after the thread that owned it
    after_scratch = threads()
    if after_scratch <= base:
        break
    time.sleep(0.02)
work()
after_main = threads()
print(base, after_scratch, after_main)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or len(os.sched_getaffinity(0)) < 2
                    or "OpenMP" not in torch.__config__.parallel_info() or "x86" not in os.uname().machine,
                    reason="needs Linux /proc, 2 CPUs and an x86 torch on OpenMP (whose BLAS threads are OpenMP's)")
def test_a_parallel_region_leaves_worker_threads_on_its_thread_and_off_main_thread_takes_them_away() -> None:
    """The reason off_main_thread exists, checked on this torch build: a 2-thread matrix product on the
    main thread leaves OpenMP worker threads behind for the life of the process; the same product on
    off_main_thread's thread leaves none once it returns."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _POOL_PROBE], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    base, after_scratch, after_main = map(int, out.stdout.split())
    assert after_scratch == base
    assert after_main > base
