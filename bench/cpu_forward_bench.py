"""Where a CPU decode step of the real model goes: float32 vs bfloat16 steps, the share of the matrix products,
and three float32 GEMM forms of the layer projections (issue 12, the CPU targets).

In one process: SmolLM2-135M-Instruct loaded per dtype off the main thread (as ``ninfer serve`` does,
``gpu_engine.api.serve.off_main_thread``), every lane's KV reserved; all timing on one other thread (as the
engine's ``ninfer-engine`` thread) with ``--threads`` torch threads (default: every core, the engine's default).

* ``steps``: ``--steps`` T = 1 decode forwards at ``--context`` positions (``bench/model_bench.py``'s
  ``decode_step_seconds``), per (dtype, KV pool, B), ``--repeats`` times with the arms alternated. KV pools
  (``--kv``): ``lane_major`` (the CPU default: the attention reads each lane's keys in place) and ``paged`` (a
  free-list pool of the same geometry: the rows' blocks are gathered, then SDPA).
* ``mm_share``: one ``torch.profiler`` run of 10 steps per (dtype, B): self CPU time of ``aten::mm`` /
  ``aten::addmm`` / ``aten::_mkl_linear`` over all ops.
* ``gemm`` (float32): every layer's four projections (qkv, o, gate/up, down; 120 products, ~0.4 GB of
  weights, so none stays in cache) at M = B rows, as ``F.linear`` on the ``[N, K]`` weights the model
  holds, ``x @ W`` on ``[K, N]`` copies, and MKL's packed GEMM (``torch.ops.mkl._mkl_linear`` on weights
  packed for exactly M rows: any other row count falls back to the plain GEMM; the packed copy's size is
  reported). ms per pass, repeats alternated.

usage: python bench/cpu_forward_bench.py [--batches 1 8 32] [--dtypes float32 bfloat16] [--kv lane_major paged]
                                       [--no-gemm] [--threads N] [--repeats 3] [--steps 15] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_common import fmt_spread, line_plot, results_path, run_header, spread  # noqa: E402

MM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "mkl::_mkl_linear")


def _load(dtype: torch.dtype, lanes: int, seq: int, kv: str = "lane_major"):
    """The model with every lane's KV reserved; ``kv="paged"`` swaps in a free-list pool of the same geometry."""
    from gpu_engine.api.serve import off_main_thread
    from gpu_engine.model.kv_cache import PagedKVCache
    from gpu_engine.model.loader import load_model

    model = off_main_thread(lambda: load_model("SmolLM2-135M-Instruct", device="cpu", dtype=dtype, max_lanes=lanes,
                                               max_seq_len=seq).model)
    if kv == "paged":
        c, old = model.config, model.kv
        model.kv = PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, max_lanes=old.max_lanes,
                                max_seq_len=old.max_seq_len, block_size=old.block_size, device="cpu", dtype=dtype,
                                lane_major=False)
    model.kv.reserve_all()
    return model


def _mm_share(model, batch: int, context: int) -> float:
    from torch.profiler import profile

    ids = torch.zeros(batch, 1, dtype=torch.long)
    lanes = torch.arange(batch)
    start = torch.full((batch,), context)
    for _ in range(3):
        model(ids, lanes, start, max_context=context + 64)
    with profile() as prof:
        for _ in range(10):
            model(ids, lanes, start, max_context=context + 64)
    ev = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ev)
    return sum(e.self_cpu_time_total for e in ev if e.key in MM_OPS) / total


def _gemm_arms(model, m: int) -> dict:
    """The float32 projection GEMM forms at ``m`` rows: name -> (callable running one pass, extra bytes)."""
    ws = [getattr(layer, n) for layer in model.layers for n in ("qkv", "o", "gate_up", "down")]
    xs = {w.shape[1]: torch.randn(m, w.shape[1]) for w in ws}
    kn = [w.t().contiguous() for w in ws]
    arms = {"linear_NK": (lambda: [F.linear(xs[w.shape[1]], w) for w in ws], 0),
            "matmul_KN": (lambda: [xs[w.shape[1]] @ t for w, t in zip(ws, kn)], sum(t.numel() * 4 for t in kn))}
    if hasattr(torch.ops, "mkl") and hasattr(torch.ops.mkl, "_mkl_linear"):
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in ws]
        arms["mkl_packed"] = (lambda: [torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, m)
                                       for w, p in zip(ws, packed)], sum(p.numel() * 4 for p in packed))
    return arms


def _time(fn, n: int = 5) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def run(args) -> dict:
    from model_bench import decode_step_seconds

    lanes, seq = max(args.batches), args.context + args.steps + 80
    arms = [(d, kv) for d in args.dtypes for kv in args.kv]
    models = {a: _load(getattr(torch, a[0]), lanes, seq, a[1]) for a in arms}
    steps: dict[tuple, list[float]] = {}
    gemm: dict[tuple, list[float]] = {}
    gemm_bytes: dict[str, int] = {}
    share: dict[tuple, float] = {}
    with torch.inference_mode():
        torch.set_num_threads(args.threads)
        for rep in range(args.repeats):
            for a in (arms if rep % 2 == 0 else arms[::-1]):
                for b in args.batches:
                    steps.setdefault((*a, b), []).append(1e3 * decode_step_seconds(models[a], b, args.context,
                                                                                   args.steps))
            print(f"rep {rep}: " + "  ".join(f"{d} {kv} B={b} {v[-1]:.1f} ms" for (d, kv, b), v in steps.items()),
                  flush=True)
        for a in arms:
            for b in args.batches:
                share[(*a, b)] = _mm_share(models[a], b, args.context)
        if not args.no_gemm and "float32" in args.dtypes:
            for b in args.batches:
                arms = _gemm_arms(models[("float32", args.kv[0])], b)
                for rep in range(args.repeats):
                    for name in (list(arms) if rep % 2 == 0 else list(arms)[::-1]):
                        gemm.setdefault((name, b), []).append(1e3 * _time(arms[name][0]))
                for name, (_, nbytes) in arms.items():
                    gemm_bytes[name] = nbytes
    res = run_header("cpu", model="SmolLM2-135M-Instruct", threads=args.threads, steps=args.steps,
                     context=args.context, repeats=args.repeats, step_ms=[], gemm_ms=[])
    for (d, kv, b), v in steps.items():
        res["step_ms"].append(dict(dtype=d, kv=kv, batch=b, ms=spread(v), mm_share=share[(d, kv, b)]))
    for (name, b), v in gemm.items():
        res["gemm_ms"].append(dict(form=name, batch=b, ms=spread(v), extra_weight_bytes=gemm_bytes[name]))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--kv", nargs="+", default=["lane_major"], choices=["lane_major", "paged"],
                    help="KV pools: lane-major (the CPU default, attention reads the pool in place) and/or "
                         "free-list (gather + SDPA)")
    ap.add_argument("--no-gemm", action="store_true", help="skip the GEMM forms")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core, the engine's default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.threads <= 0:
        from gpu_engine.api.serve import cpu_threads

        args.threads = cpu_threads(0)
    from gpu_engine.api.serve import off_main_thread

    res = off_main_thread(run, args)  # timed on a thread that is not the main one, as the engine's
    print(f"\ndecode step, {args.threads} threads ({res['device']}):")
    print(f"{'dtype':>9} {'KV pool':>10} {'B':>3} {'ms/step median [min-max]':>28} {'matrix products':>16}")
    for r in res["step_ms"]:
        s = r["ms"]
        print(f"{r['dtype']:>9} {r['kv']:>10} {r['batch']:>3} {fmt_spread(s, '{:.1f}'):>28} "
              f"{100 * r['mm_share']:>15.0f}%")
    print(f"\nfloat32 layer projections (120 products), ms per pass:")
    for r in res["gemm_ms"]:
        s = r["ms"]
        print(f"{r['form']:>11} B={r['batch']:<3} {fmt_spread(s, '{:.1f}'):>20}"
              f"  extra weight memory {r['extra_weight_bytes'] / 2**20:.0f} MiB")
    out = results_path("cpu_forward_bench", "cpu", args.out)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    series = {}
    for d in args.dtypes:
        for kv in args.kv:
            rows = [r for r in res["step_ms"] if (r["dtype"], r["kv"]) == (d, kv)]
            series[f"{d}, {kv.replace('_', '-')} KV"] = ([r["batch"] for r in rows], [r["ms"]["median"] for r in rows])
    line_plot(out.with_suffix(".png"), series, "batch (rows)", "ms per decode step",
              f"SmolLM2 CPU decode step, {args.threads} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
