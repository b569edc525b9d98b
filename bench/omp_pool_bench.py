"""CPU decode step of the real model on an engine-like thread, with the model loaded on the main thread vs
on a thread that has ended (``gpu_engine.api.serve.off_main_thread``), at 1 and 2 torch threads.

Why: libgomp (torch's OpenMP runtime) keeps a pool of worker threads for every thread that ran a parallel
region, for that thread's life. With more of them than CPUs, its workers stop spinning between regions and
sleep, and each of a decode forward's short parallel regions waits for them to wake. The engine's forwards run
on the ``ninfer-engine`` thread, not the main thread, so a load on the main thread leaves exactly that.

Each (load, threads) arm runs in its own process (the pool is per process), arms alternated in each repeat.
A process loads SmolLM2-135M-Instruct (float32) on the main thread or off it, then on a new thread times
``--steps`` T = 1 decode forwards (``bench/model_bench.py``'s ``decode_step_seconds``) at each batch.
Reported: median ms per step over repeats, [min-max], and the ratio main-thread load / off-main-thread load.

usage: python bench/omp_pool_bench.py [--batches 1 8] [--threads 1 2] [--repeats 3] [--steps 20] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402

_CHILD = """
import json, sys, threading, torch
sys.path[:0] = [{root!r}, {bench!r}]
from gpu_engine.api.serve import off_main_thread
from gpu_engine.model.loader import load_model
from model_bench import decode_step_seconds
load = lambda: load_model("SmolLM2-135M-Instruct", device="cpu", max_lanes={lanes}, max_seq_len=1024).model
model = off_main_thread(load) if {off} else load()
out = {{}}
def engine_thread():
    torch.set_num_threads({threads})
    with torch.inference_mode():
        for b in {batches}:
            out[b] = decode_step_seconds(model, b, 100, steps={steps})
t = threading.Thread(target=engine_thread)
t.start()
t.join()
print(json.dumps(out))
"""


def _arm(load_off: bool, threads: int, batches: list[int], steps: int) -> dict[int, float]:
    code = _CHILD.format(root=str(ROOT), bench=str(ROOT / "bench"), lanes=max(batches), off=load_off,
                         threads=threads, batches=batches, steps=steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"arm load_off_main={load_off} threads={threads} failed:\n{out.stderr}")
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    arms = [(load, n) for n in args.threads for load in ("main", "off_main")]
    ms: dict[tuple, list[float]] = {}
    for rep in range(args.repeats):
        for load, n in (arms if rep % 2 == 0 else arms[::-1]):
            got = _arm(load == "off_main", n, args.batches, args.steps)
            for b, s in got.items():
                ms.setdefault((load, n, b), []).append(1e3 * s)
            print(f"rep {rep} load={load:<8} threads={n}: " + "  ".join(f"B={b} {1e3 * s:.1f} ms" for b, s in got.items()),
                  flush=True)
    res = run_header("cpu", model="SmolLM2-135M-Instruct (float32)", steps=args.steps, repeats=args.repeats, rows=[])
    print(f"\n{'threads':>7} {'B':>3} {'load on main (ms/step)':>26} {'load off main':>22} {'main / off':>10}")
    for n in args.threads:
        for b in args.batches:
            a, o = spread(ms[("main", n, b)]), spread(ms[("off_main", n, b)])
            res["rows"].append(dict(threads=n, batch=b, load_main_ms=a, load_off_main_ms=o,
                                    ratio=a["median"] / o["median"]))
            print(f"{n:>7} {b:>3} {fmt_spread(a, '{:.1f}'):>26} {fmt_spread(o, '{:.1f}'):>22} "
                  f"{a['median'] / o['median']:>10.2f}")
    out = results_path("omp_pool_bench", "cpu", args.out)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
