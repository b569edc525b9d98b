"""The CPU draw of :func:`gpu_engine.sample.sampler.draw`: one exponential race over the whole vocabulary vs
slices of ``DRAW_CHUNK`` token ids (the CPU default), the same tokens.

On one thread that is not the main one (as the engine's), ``--threads`` torch threads (default: every core):
per batch B, softmax weights of ``[B, V]`` random logits at temperature 0.8, ``--calls`` draws at successive
positions per arm, the arms alternated ``--repeats`` times; tokens checked equal first. Reported: ms per draw
(median [min-max] over repeats) and the ratio whole / sliced.

usage: python bench/cpu_draw_bench.py [--batches 1 8 32] [--vocab 49152] [--calls 50] [--repeats 5] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from bench_common import fmt_spread, line_plot, results_path, run_header, spread  # noqa: E402


def run(args) -> dict:
    from gpu_engine.sample import sampler

    torch.set_num_threads(args.threads)
    sliced = sampler.DRAW_CHUNK
    arms = {"whole": args.vocab + 1, "sliced": sliced}
    res = run_header("cpu", vocab=args.vocab, threads=args.threads, calls=args.calls, repeats=args.repeats,
                     draw_chunk=sliced, rows=[])
    g = torch.Generator().manual_seed(0)
    try:
        for b in args.batches:
            w = torch.softmax(torch.randn(b, args.vocab, generator=g) * 3 / 0.8, dim=-1)
            seed = torch.arange(b, dtype=torch.int64) * 1000 + 7
            toks, ms = {}, {a: [] for a in arms}
            for a, chunk in arms.items():
                sampler.DRAW_CHUNK = chunk
                toks[a] = torch.stack([sampler.draw(w, seed, torch.full((b,), p), 0) for p in range(args.calls)])
            if not torch.equal(toks["whole"], toks["sliced"]):
                raise SystemExit(f"B={b}: the sliced draw picked other tokens")
            for rep in range(args.repeats):
                for a in (list(arms) if rep % 2 == 0 else list(arms)[::-1]):
                    sampler.DRAW_CHUNK = arms[a]
                    t0 = time.perf_counter()
                    for p in range(args.calls):
                        sampler.draw(w, seed, torch.full((b,), p), 0)
                    ms[a].append(1e3 * (time.perf_counter() - t0) / args.calls)
            row = dict(batch=b, whole_ms=spread(ms["whole"]), sliced_ms=spread(ms["sliced"]))
            row["ratio_whole_over_sliced"] = row["whole_ms"]["median"] / row["sliced_ms"]["median"]
            res["rows"].append(row)
    finally:
        sampler.DRAW_CHUNK = sliced
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--vocab", type=int, default=49152, help="V (SmolLM2's by default)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core, the engine's default)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from gpu_engine.api.serve import cpu_threads, off_main_thread

    args.threads = args.threads if args.threads > 0 else cpu_threads(0)
    res = off_main_thread(run, args)
    print(f"CPU draw, V = {args.vocab}, {args.threads} threads ({res['device']}), ms per draw:")
    print(f"{'B':>4} {'whole':>22} {'sliced':>22} {'whole/sliced':>13}")
    for r in res["rows"]:
        print(f"{r['batch']:>4} {fmt_spread(r['whole_ms'], '{:.2f}'):>22} {fmt_spread(r['sliced_ms'], '{:.2f}'):>22}"
              f" {r['ratio_whole_over_sliced']:>13.2f}")
    out = results_path("cpu_draw_bench", "cpu", args.out)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    rows = res["rows"]
    line_plot(out.with_suffix(".png"), {a: ([r["batch"] for r in rows], [r[f"{a}_ms"]["median"] for r in rows])
                                        for a in ("whole", "sliced")},
              "batch (rows)", "ms per draw", f"CPU draw, V = {args.vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
