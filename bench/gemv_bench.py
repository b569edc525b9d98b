"""Projection GEMMs of a decode step with few token rows: cuBLAS (``F.linear``) vs NInfer's Triton GEMV
(:mod:`gpu_engine.model.gemv`), per weight shape of the SmolLM2-135M, Qwen3-0.6B and Llama-3.1-8B presets.

Each timing replays a CUDA graph of ``--calls`` calls that cycle over enough copies of the weight to
exceed the L2 cache (so every call reads its weight from HBM, as in a real step, where each layer has
its own weights), ``--repeats`` times; the table gives microseconds per call (median, min-max) and the
achieved bandwidth (weight bytes / time). ``--sweep`` also times every ``(BLOCK_N, BLOCK_K, warps)`` of a
grid at ``M = 1`` and prints the best per shape (how :func:`~gpu_engine.model.gemv.gemv_config` was set).

``python bench/gemv_bench.py [--rows 1 2 4 8] [--sweep] [--out PATH]`` (CUDA only).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402
from gpu_engine.model.config import PRESETS  # noqa: E402
from gpu_engine.model import gemv as gemv_mod  # noqa: E402

MODELS = ("smollm2-135m-random", "qwen3-0.6b-random", "llama-8b-random")
L2_BYTES = 60 << 20  # H200: 50 MB of L2; cycle over more than this


def shapes(name: str) -> list[tuple[str, int, int]]:
    """``(projection, N, K)`` of one layer (and the LM head) of a preset."""
    c = PRESETS[name]
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return [("qkv", q + 2 * kv, c.hidden_size), ("o", c.hidden_size, q),
            ("gate_up", 2 * c.intermediate_size, c.hidden_size), ("down", c.hidden_size, c.intermediate_size),
            ("lm_head", c.vocab_size, c.hidden_size)]


def time_us(fn_of, weights: list, calls: int, repeats: int) -> dict:
    """Microseconds per call of ``fn_of(w)`` over ``calls`` calls cycling through ``weights``, from a graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for w in weights[:2]:
            fn_of(w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn_of(weights[i % len(weights)])
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return spread(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8], help="token rows M")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sweep", action="store_true", help="time a grid of GEMV configs at M = --sweep-rows per shape")
    ap.add_argument("--sweep-rows", type=int, default=1, help="M of the sweep")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gemv_bench needs CUDA")
    dt = torch.bfloat16
    rows = []
    for name in a.models:
        for proj, n, k in shapes(name):
            nbytes = n * k * 2
            copies = max(2, -(-L2_BYTES // nbytes))
            ws = [torch.randn(n, k, device="cuda", dtype=dt) * 0.02 for _ in range(copies)]
            rec = dict(model=name, proj=proj, N=n, K=k, weight_bytes=nbytes, config=list(gemv_mod.gemv_config(n, k)),
                       rows={})
            for m in a.rows:
                x = torch.randn(m, k, device="cuda", dtype=dt)
                torch.testing.assert_close(gemv_mod.gemv(x, ws[0]), F.linear(x, ws[0]), rtol=2e-2, atol=2e-2)
                cub = time_us(lambda w: F.linear(x, w), ws, a.calls, a.repeats)
                ours = time_us(lambda w: gemv_mod.gemv(x, w), ws, a.calls, a.repeats)
                rec["rows"][m] = dict(cublas_us=cub, gemv_us=ours, speedup=cub["median"] / ours["median"],
                                      cublas_tbps=nbytes / cub["median"] / 1e6, gemv_tbps=nbytes / ours["median"] / 1e6)
                print(f"{name:20s} {proj:8s} N={n:<6d} K={k:<6d} M={m:<2d} cuBLAS {fmt_spread(cub, '{:.2f}')} us "
                      f"({nbytes / cub['median'] / 1e6:.2f} TB/s)  GEMV {fmt_spread(ours, '{:.2f}')} us "
                      f"({nbytes / ours['median'] / 1e6:.2f} TB/s)  x{cub['median'] / ours['median']:.2f}", flush=True)
            if a.sweep:
                x = torch.randn(a.sweep_rows, k, device="cuda", dtype=dt)
                grid = []
                orig = gemv_mod.gemv_config
                for bn in (1, 2, 4, 8):
                    for bk in (512, 1024, 2048, 4096):
                        for warps in (2, 4, 8):
                            if bk > max(16, gemv_mod.next_pow2(k)) * 2 or bn * bk > 32768:
                                continue
                            gemv_mod.gemv_config = lambda n_, k_, c=(bn, bk, warps): c
                            try:
                                t = time_us(lambda w: gemv_mod.gemv(x, w), ws, a.calls, 3)["median"]
                            finally:
                                gemv_mod.gemv_config = orig
                            grid.append(dict(block_n=bn, block_k=bk, warps=warps, us=t))
                grid.sort(key=lambda r: r["us"])
                rec["sweep"] = grid
                print("   best: " + ", ".join(f"({g['block_n']},{g['block_k']},{g['warps']}) {g['us']:.2f} us"
                                              for g in grid[:4]), flush=True)
            rows.append(rec)
            del ws
            torch.cuda.empty_cache()
    out = results_path("gemv_bench", "cuda", a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(header=run_header("cuda", calls=a.calls, repeats=a.repeats), rows=rows), indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
