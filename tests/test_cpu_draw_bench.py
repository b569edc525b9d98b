"""bench/cpu_draw_bench.py: both arms run, their tokens are checked equal, and the sampler's slice width is
restored afterwards."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_runs_both_arms_and_writes_json(tmp_path):
    out = tmp_path / "d.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_draw_bench.py"), "--batches", "1", "3",
                        "--vocab", "40000", "--calls", "2", "--repeats", "2", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert [row["batch"] for row in r["rows"]] == [1, 3]
    for row in r["rows"]:
        assert row["whole_ms"]["n"] == row["sliced_ms"]["n"] == 2
        assert row["ratio_whole_over_sliced"] > 0
    assert r["draw_chunk"] < 40000  # the sliced arm really slices this vocabulary


def test_restores_the_slice_width():
    sys.path.insert(0, str(ROOT / "bench"))
    import argparse

    import cpu_draw_bench
    import torch
    from gpu_engine.sample import sampler

    before, threads = sampler.DRAW_CHUNK, torch.get_num_threads()
    try:
        cpu_draw_bench.run(argparse.Namespace(batches=[2], vocab=20000, threads=threads, calls=1, repeats=1))
    finally:
        torch.set_num_threads(threads)
    assert sampler.DRAW_CHUNK == before
