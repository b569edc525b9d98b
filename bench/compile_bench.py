"""Cold-compile latency, in-thread vs killable worker process (issue 14 defect 8).

For each schema of a deterministic JSONSchemaBench sample (:func:`bench_common.jsb_sample`), one cold
compile (a key never seen by that compiler) is timed through ``ConstraintCompiler.compile`` in both modes,
alternating per schema so both see the same machine load:

* ``thread``: the landed path (``isolate=False``): convert + compile on a thread; a timed-out one is
  abandoned and keeps running.
* ``isolated``: ``isolate=True`` (what the sidecar runs now): the compile is proven in a warm worker
  process (killed at the deadline), then the returned grammar is compiled in-process.

Then a cache hit is timed per schema (in-process in both modes), and a pathological grammar (the e2e
deadline test's 8000-rule chain) is sent with a 1 s deadline: how long its build keeps running after
the ``CompileTimeout`` is recorded (the abandoned thread until it ends; the killed worker not at all).
For reference, xgrammar's dynamic compile (masks built lazily at decode time; not used) is timed too.

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


def timeout_aftermath(vocab, isolate: bool, max_wait_s: float) -> dict:
    """What a pathological compile leaves behind after its CompileTimeout (1 s deadline).

    ``still_running_s``: how long its build kept running afterwards (the abandoned thread until it ended,
    at most ``max_wait_s``; the killed worker: until its process was gone). ``cpu_seconds_in_process``:
    CPU seconds this process (not the replacement worker starting up) used meanwhile.
    """
    import psutil

    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.errors import ConstraintError
    from constraint_service.types import ConstraintSpec
    from tests.e2e.test_compile_deadline_e2e import PATHOLOGICAL

    c = ConstraintCompiler(vocab, compile_timeout_s=1.0, isolate=isolate, max_cold_compiles=1)
    c.wait_workers(120)
    me = psutil.Process()
    pids = c.worker_pids
    try:
        c.compile(ConstraintSpec("grammar", PATHOLOGICAL))
        kind = "compiled"
    except ConstraintError as e:
        kind = e.kind
    t0, cpu0 = time.monotonic(), sum(me.cpu_times()[:2])
    while time.monotonic() - t0 < max_wait_s:
        if (any(psutil.pid_exists(p) for p in pids) if isolate else c.compiles_running[1] > 0):
            time.sleep(0.05)
            continue
        break
    running = time.monotonic() - t0
    burnt = sum(me.cpu_times()[:2]) - cpu0
    c.close()
    return dict(outcome=kind, still_running_s=round(running, 2), capped=running >= max_wait_s,
                cpu_seconds_in_process=round(burnt, 3), workers_killed=c.stats.killed)


def dynamic_compile_s(vocab, text: str) -> float:
    """Seconds of xgrammar's *dynamic* compile (token masks built lazily on first use) of the same grammar
    -- not what the sidecar does; recorded to show where the time of an eager compile goes."""
    import xgrammar as xgr

    from constraint_service.backend.xgrammar_backend import exclude_surrogates
    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.types import ConstraintSpec

    global _DYN
    if _DYN is None:
        c = ConstraintCompiler(vocab)
        _DYN = (c, xgr.GrammarCompiler(c.backend.tokenizer_info, max_threads=1, cache_enabled=False,
                                       enable_dynamic_compilation=True))
    c, dyn = _DYN
    t0 = time.perf_counter()
    _, canon, _ = c._key_and_source(ConstraintSpec("json_schema", text))
    dyn.compile_grammar(exclude_surrogates(c.grammar_of(c.backend, "json_schema", canon)))
    return time.perf_counter() - t0


_DYN = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60, help="schemas in the sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="compile deadline, seconds")
    ap.add_argument("--max-wait-s", type=float, default=120.0,
                    help="longest wait for a timed-out build to stop, seconds")
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
        try:
            row["dynamic_compile_only"] = round(dynamic_compile_s(vocab, text), 5)
        except ConstraintError as e:
            row["dynamic_compile_only"] = e.kind
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
        dynamic_compile_only_p50_ms=round(1000 * spread(r["dynamic_compile_only"] for r in both
                                                        if isinstance(r["dynamic_compile_only"], float))["median"], 2),
        cache_hit_s={m: spread(hit[m]) for m in modes},
        not_compiled={m: {r["id"]: r[m] for r in rows if not isinstance(r[m], float)} for m in modes},
        timeout_aftermath={m: timeout_aftermath(vocab, m == "isolated", args.max_wait_s) for m in modes},
        rows=rows,
    )
    for m in modes:
        out["cold_compile_s"][m].pop("values")
        out["cache_hit_s"][m].pop("values")
    path = results_path("compile_bench", "cpu", args.out)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("cold_compile_p50_ms", "dynamic_compile_only_p50_ms", "cold_compile_s",
                                          "cache_hit_s",
                                          "timeout_aftermath")}, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
