"""JSON Schema -> EBNF conversion time per schema, this tree vs another checkout, side by side.

Every schema of a JSONSchemaBench-format file (default: the MaskBench dev set, 9,009 schemas) is converted
once by ``constraint_service.json_schema.json_schema_to_ebnf`` in each tree: two worker processes (one per
tree, each imports its own tree's converter) take the same chunks of schemas in turn, the first one of a
chunk alternating, so both see the same machine load. Each worker converts a schema once (a cold
conversion, with whatever the process has cached from earlier schemas, as in the sidecar) and returns
its time (``time.perf_counter``, seconds) and a digest of the result: the grammar's SHA-256 or the
rejection's kind, location and message. The report gives, per tree, the total, p50 / p90 / p99 / max per
schema, the ratio of the totals, the schemas whose result differs between the trees, and the slowest
schemas. xgrammar is not involved (its compile is timed by ``mask_bench`` and ``compile_bench``).

Usage::

    git worktree add /tmp/base <rev>
    python bench/convert_bench.py --baseline-tree /tmp/base [--every 1] [--chunk 300] [--out PATH]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_common import JSB_DEV, pct, results_path, run_header  # noqa: E402


def _load(path: str, every: int) -> list[tuple[str, str]]:
    """``[(id, schema text)]`` of every ``every``-th record."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    return [(r["id"], json.dumps(r["schema"], ensure_ascii=False)) for r in recs[::every]]


def worker(tree: str, path: str, every: int) -> None:
    """Serve chunks: read ``start end`` lines on stdin, answer one JSON line ``[[id, digest, s], ...]``."""
    sys.path.insert(0, tree)
    from constraint_service.errors import ConstraintError
    from constraint_service.json_schema import json_schema_to_ebnf

    items = _load(path, every)
    print(json.dumps({"ready": len(items)}), flush=True)
    for line in sys.stdin:
        a, b = map(int, line.split())
        out = []
        for rid, src in items[a:b]:
            t0 = time.perf_counter()
            try:
                digest = hashlib.sha256(json_schema_to_ebnf(src).encode("utf-8")).hexdigest()
            except ConstraintError as e:
                digest = f"{e.kind}|{e.location}|{e.message}"
            out.append([rid, digest, time.perf_counter() - t0])
        print(json.dumps(out), flush=True)


def _summary(times: list[float]) -> dict:
    return {"total_s": sum(times), "p50_ms": 1e3 * statistics.median(times), "p90_ms": 1e3 * pct(times, 90),
            "p99_ms": 1e3 * pct(times, 99), "max_ms": 1e3 * max(times), "n": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(JSB_DEV), help="JSONSchemaBench-format .jsonl.gz (records with id, schema)")
    ap.add_argument("--baseline-tree", required=False, help="another checkout of this project (e.g. a worktree of an older revision)")
    ap.add_argument("--every", type=int, default=1, help="take every N-th schema")
    ap.add_argument("--chunk", type=int, default=300, help="schemas per turn")
    ap.add_argument("--out", default="", help="results JSON (default bench/results/convert_bench_<date>_cpu.json)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.data, args.every)
        return
    trees = {"this": str(ROOT)}
    if args.baseline_tree:
        trees["baseline"] = str(Path(args.baseline_tree).resolve())
    header = run_header("cpu", data=os.path.basename(args.data), every=args.every, trees=trees,
                        baseline_revision=_rev(trees.get("baseline")))
    procs = {}
    for name, tree in trees.items():
        procs[name] = subprocess.Popen([sys.executable, __file__, "--worker", tree, "--data", args.data,
                                        "--every", str(args.every)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    n = [json.loads(p.stdout.readline())["ready"] for p in procs.values()][0]
    rows: dict[str, dict] = {name: {} for name in trees}
    names = list(trees)
    t0 = time.perf_counter()
    for k, a in enumerate(range(0, n, args.chunk)):
        order = names if k % 2 == 0 else names[::-1]
        for name in order:
            p = procs[name]
            p.stdin.write(f"{a} {min(n, a + args.chunk)}\n")
            p.stdin.flush()
            for rid, digest, s in json.loads(p.stdout.readline()):
                rows[name][rid] = (digest, s)
        print(f"  {min(n, a + args.chunk)}/{n} schemas ({time.perf_counter() - t0:.0f} s)", flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait()

    result = dict(header)
    result["trees"] = {name: _summary([s for _, s in rows[name].values()]) for name in trees}
    ids = list(rows["this"])
    print(f"\nconversion of {n} schemas ({os.path.basename(args.data)}, every {args.every}):")
    print(f"{'tree':10} {'total s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>9}")
    for name, s in result["trees"].items():
        print(f"{name:10} {s['total_s']:9.1f} {s['p50_ms']:8.2f} {s['p90_ms']:8.2f} {s['p99_ms']:8.1f} {s['max_ms']:9.0f}")
    if "baseline" in rows:
        base, this = rows["baseline"], rows["this"]
        differ = [i for i in ids if base[i][0] != this[i][0]]
        result["differing"] = differ
        result["ratio_total"] = result["trees"]["baseline"]["total_s"] / result["trees"]["this"]["total_s"]
        slow = sorted(ids, key=lambda i: -base[i][1])[:15]
        result["slowest_in_baseline"] = [{"id": i, "baseline_ms": 1e3 * base[i][1], "this_ms": 1e3 * this[i][1],
                                          "result": this[i][0][:64]} for i in slow]
        print(f"baseline / this total: {result['ratio_total']:.2f}x; results differing: {len(differ)} of {n}")
        print(f"\n{'slowest in the baseline':45} {'baseline ms':>12} {'this ms':>9}")
        for r in result["slowest_in_baseline"]:
            print(f"{r['id'][:45]:45} {r['baseline_ms']:12.0f} {r['this_ms']:9.0f}")
    result["per_schema_ms"] = {name: [round(1e3 * rows[name][i][1], 2) for i in ids] for name in trees}  # data order
    out = results_path("convert_bench", "cpu", args.out)
    per = result.pop("per_schema_ms")
    out.write_text(json.dumps(result, indent=1)[:-2] + ',\n "per_schema_ms": ' + json.dumps(per) + "\n}")
    result["per_schema_ms"] = per
    _plot(result, out.with_suffix(".png"))
    print(f"wrote {out}")


def _rev(tree: str | None) -> str | None:
    if not tree:
        return None
    try:
        return subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _plot(result: dict, path: Path) -> None:
    """Per-schema conversion time, sorted (one curve per tree, log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, per in result["per_schema_ms"].items():
        xs = sorted(per)
        ax.plot(range(len(xs)), xs, label=f"{name} ({result['trees'][name]['total_s']:.0f} s total)")
    ax.set_yscale("log")
    ax.set_xlabel("schemas, sorted by conversion time")
    ax.set_ylabel("ms per schema")
    ax.set_title(f"JSON Schema -> EBNF conversion, {result['data']} ({result['revision'][:7]})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
