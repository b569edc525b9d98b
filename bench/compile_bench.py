"""Cold-compile latency, in-thread vs killable worker process (issue 14 defect 8).

For each schema of a deterministic JSONSchemaBench sample (:func:`bench_common.jsb_sample`), one cold
compile (a key never seen by that compiler) is timed through ``ConstraintCompiler.compile`` in both modes,
alternating per schema so both see the same machine load:

* ``thread``: the landed path (``isolate=False``): convert + compile on a thread; a timed-out one is
  abandoned and keeps running.
* ``isolated``: ``isolate=True`` (what the sidecar runs now): the compile is proven in a warm worker
  process (killed at the deadline), then the returned grammar is compiled in-process.

Then a cache hit is timed per schema (in-process in both modes), and a pathological grammar (the e2e
deadline test's 8000-rule chain) is sent with a 1 s deadline: the CPU seconds the process and its
children burn in the ``--after-s`` seconds after its ``CompileTimeout`` are recorded (the abandoned thread
keeps a core busy; the killed worker burns nothing).

Usage::

    nice -n 10 python bench/compile_bench.py --n 60 [--timeout 10] [--out bench/results/compile_bench_cpu.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_common import jsb_sample, results_path, run_header, spread  # noqa: E402


def _vocab(model: str):
    from constraint_service.vocab import Vocabulary
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    return Vocabulary.from_any(load_vocabulary_from_gguf(str(Path(model).expanduser())))


def _cpu_seconds(proc) -> float:
    """User + system CPU seconds of ``proc`` and its live children."""
    total = sum(proc.cpu_times()[:2])
    for ch in proc.children(recursive=True):
        try:
            total += sum(ch.cpu_times()[:2])
        except Exception:  # noqa: BLE001 - a child that just ended
            pass
    return total


def timeout_aftermath(vocab, isolate: bool, after_s: float) -> dict:
    """CPU seconds burnt in the ``after_s`` seconds after a pathological compile's CompileTimeout."""
    import psutil

    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.errors import ConstraintError
    from constraint_service.types import ConstraintSpec
    from tests.e2e.test_compile_deadline_e2e import PATHOLOGICAL

    c = ConstraintCompiler(vocab, compile_timeout_s=1.0, isolate=isolate, max_cold_compiles=1)
    c.wait_workers(120)
    me = psutil.Process()
    try:
        c.compile(ConstraintSpec("grammar", PATHOLOGICAL))
        kind = "compiled"
    except ConstraintError as e:
        kind = e.kind
    cpu0 = _cpu_seconds(me)
    time.sleep(after_s)
    burnt = _cpu_seconds(me) - cpu0
    c.close()
    return dict(outcome=kind, after_s=after_s, cpu_seconds_after_timeout=round(burnt, 3),
                workers_killed=c.stats.killed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60, help="schemas in the sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="compile deadline, seconds")
    ap.add_argument("--after-s", type=float, default=5.0, help="window after a CompileTimeout, seconds")
    ap.add_argument("--model", default="~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.errors import ConstraintError
    from constraint_service.types import ConstraintSpec

    vocab = _vocab(args.model)
    sample = jsb_sample(args.n, seed=args.seed)
    modes = {m: ConstraintCompiler(vocab, compile_timeout_s=args.timeout, isolate=(m == "isolated"))
             for m in ("thread", "isolated")}
    for c in modes.values():
        c.wait_workers(120)
        c.backend  # vocabulary index built before timing (both modes)
    cold: dict[str, list] = {m: [] for m in modes}
    hit: dict[str, list] = {m: [] for m in modes}
    rows = []
    for sid, text in zip(sample["ids"], sample["schemas"]):
        row = {"id": sid}
        for m, c in modes.items():
            spec = ConstraintSpec("json_schema", text)
            t0 = time.perf_counter()
            try:
                c.compile(spec)
                s = time.perf_counter() - t0
                row[m] = round(s, 5)
                cold[m].append(s)
                t1 = time.perf_counter()
                c.compile(spec)
                hit[m].append(time.perf_counter() - t1)
            except ConstraintError as e:
                row[m] = e.kind
        rows.append(row)
        print(row, flush=True)
    for c in modes.values():
        c.close()
    both = [r for r in rows if all(isinstance(r[m], float) for m in modes)]
    out = dict(
        run_header("cpu", bench="compile_bench", n=args.n, seed=args.seed, compile_timeout_s=args.timeout,
                   model=args.model, sample_source=sample["source"]),
        cold_compile_s={m: spread(r[m] for r in both) for m in modes},
        cold_compile_p50_ms={m: round(1000 * spread(r[m] for r in both)["median"], 2) for m in modes},
        cache_hit_s={m: spread(hit[m]) for m in modes},
        not_compiled={m: {r["id"]: r[m] for r in rows if not isinstance(r[m], float)} for m in modes},
        timeout_aftermath={m: timeout_aftermath(vocab, m == "isolated", args.after_s) for m in modes},
        rows=rows,
    )
    for m in modes:
        out["cold_compile_s"][m].pop("values")
        out["cache_hit_s"][m].pop("values")
    path = results_path("compile_bench", "cpu", args.out)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("cold_compile_p50_ms", "cold_compile_s", "cache_hit_s",
                                          "timeout_aftermath")}, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
