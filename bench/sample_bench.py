"""The fused sampler's Finish kernels with split rows vs one program per row (``sample_fused(splits=...)``).

For each vocabulary (SmolLM2 49,152; Llama-3 128,256; Qwen3 151,936), batch size and variant (unmasked, or a
bitmask on every row; temperature 0.8, so both passes run), one CUDA graph replays ``--calls`` calls of
:func:`gpu_engine.sample.fused_sample.sample_fused` with ``splits=1`` and the same with the default
(:func:`~gpu_engine.sample.fused_sample.split_count`), the two arms alternating, ``--repeats`` times each.
The table gives microseconds per call (median, min-max) and the ratio one-program / split; both arms'
tokens are checked equal first. Writes JSON (``--out``) and a plot next to it.

``python bench/sample_bench.py [--batches 1 2 8 32 64 128] [--calls 200] [--repeats 7] [--out PATH]`` (CUDA only).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402
from gpu_engine.sample.bitmask import pack_bitmask  # noqa: E402
from gpu_engine.sample.fused_sample import sample_fused, split_count  # noqa: E402

VOCABS = {"smollm2": 49152, "llama3": 128256, "qwen3": 151936}


def _graph(fn, calls: int) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def _time_us(g: torch.cuda.CUDAGraph, calls: int) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 8, 32, 64, 128])
    ap.add_argument("--vocabs", nargs="+", default=list(VOCABS), choices=list(VOCABS))
    ap.add_argument("--calls", type=int, default=200, help="calls per graph replay")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("sample_bench needs CUDA")
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in a.vocabs:
        v = VOCABS[name]
        for b in a.batches:
            logits = (torch.randn(b, v, generator=gen) * 3).to(dev)
            words = pack_bitmask(torch.rand(b, v, generator=gen) < 0.3).to(dev)
            enabled = torch.ones(b, dtype=torch.bool, device=dev)
            temp = torch.full((b,), 0.8, device=dev)
            seed = torch.arange(b, dtype=torch.int64, device=dev)
            pos = torch.arange(b, dtype=torch.int64, device=dev) * 7
            for masked in (False, True):
                w, e = (words, enabled) if masked else (None, None)
                outs = {k: (torch.empty(b, dtype=torch.int64, device=dev), torch.empty(b, dtype=torch.int32, device=dev))
                        for k in ("one", "split")}
                arms = {"one": 1, "split": None}
                fns = {k: (lambda k=k: sample_fused(logits, temp, seed, pos, w, e, out=outs[k], splits=arms[k]))
                       for k in arms}
                graphs = {k: _graph(fns[k], a.calls) for k in arms}
                if not (torch.equal(outs["one"][0], outs["split"][0]) and torch.equal(outs["one"][1], outs["split"][1])):
                    raise SystemExit(f"{name} B={b} masked={masked}: split rows drew other tokens")
                times: dict[str, list[float]] = {k: [] for k in arms}
                for _ in range(a.repeats):
                    for k in arms:  # alternating
                        times[k].append(_time_us(graphs[k], a.calls))
                one, split = spread(times["one"]), spread(times["split"])
                rec = dict(vocab=name, V=v, batch=b, masked=masked, runs=split_count(b, v, dev), one_us=one,
                           split_us=split, speedup=one["median"] / split["median"])
                rows.append(rec)
                print(f"{name:8s} V={v:<6d} B={b:<4d} {'masked  ' if masked else 'unmasked'} runs={rec['runs']:<3d} "
                      f"one {fmt_spread(one, '{:.1f}')} us  split {fmt_spread(split, '{:.1f}')} us  "
                      f"x{rec['speedup']:.2f}", flush=True)
                del graphs
            torch.cuda.empty_cache()
    out = results_path("sample_bench", "cuda", a.out)  # its folder created
    out.write_text(json.dumps(dict(header=run_header("cuda", calls=a.calls, repeats=a.repeats), rows=rows), indent=1))
    print(f"results: {out}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in a.vocabs:
        for masked in (False, True):
            pts = [(r["batch"], r["speedup"]) for r in rows if r["vocab"] == name and r["masked"] == masked]
            ax.plot(*zip(*pts), marker="o", linestyle="-" if masked else "--",
                    label=f"{name} {'masked' if masked else 'unmasked'}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (rows)")
    ax.set_ylabel("one program per row / split rows (time ratio)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
