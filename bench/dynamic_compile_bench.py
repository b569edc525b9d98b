"""Eager vs dynamic (lazy) xgrammar compilation of our JSON Schema grammars: where a cold compile's time goes,
and what the issue-12 target "cold compile p50 <= 20 ms" would cost if masks were built on first use.

The sidecar compiles eagerly (``xgrammar.GrammarCompiler(enable_dynamic_compilation=False)``, the default): every
token mask of every grammar position is built before the request is admitted, in the request's prepare (seed 000
§编译与缓存: compile cost belongs to the request that brings the grammar, outside the engine's step). xgrammar's
dynamic compilation builds a position's mask cache entry the first time a matcher needs it, during a fill, i.e.
inside the sidecar's Step that every row of the batch waits for.

Per schema, in the deterministic round-robin order of ``bench/mask_compare.py`` over JSONSchemaBench (MaskBench
dev), SmolLM2's vocabulary, one thread everywhere:

* ``convert_ms``: our canonical form + ``json_schema_to_ebnf`` (the sidecar's conversion).
* ``eager_ms`` / ``dynamic_ms``: ``compile_grammar`` of that grammar by an eager and a dynamic compiler (no
  compiler cache; the eager one under ``--compile-timeout``, censored there).
* the canonical trajectory of the first valid instance (as ``mask_compare.py``), then EOS, walked three times,
  one ``fill_next_token_bitmask`` per token: with the eager grammar, with the dynamic grammar (``first``: masks
  built on first use) and with the dynamic grammar again in a fresh matcher (``second``: masks reused).
  Every dynamic mask is compared bit for bit with the eager mask at the same position (``mask_diffs``).
* ``first_request_ms``: convert + dynamic compile + the sum of the first walk's fills: when the first request's
  last mask was ready, had masks been built lazily.

Reported: p50/p90/max of the cold paths (convert + eager, convert + dynamic, first request dynamic), pooled
per-token fill times of the three walks (p50/p99/p99.9/max), the tokens whose first-use fill took over 1 ms and
over the sidecar's mask-probe limit (250 ms), and mask differences (must be 0). The per-token figures pool the
schemas whose eager compile ended in time (the three walks then cover the same tokens); the first-use walk
is also pooled over every schema.

usage: python bench/dynamic_compile_bench.py [--limit 60] [--compile-timeout 10] [--out FILE.json]
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

import numpy as np  # noqa: E402

from bench_common import JSB_DEV, pct, results_path, run_header, subset_of, with_deadline  # noqa: E402

PROBE_LIMIT_MS = 250.0


def walk(xgr, compiled, traj: list[int], bm, masks: list | None = None, budget_s: float = 0.0,
         record: list | None = None):
    """One matcher over ``traj``: per-token fill ns; with ``masks`` (eager rows), the positions whose mask differs;
    with ``record``, a copy of every mask appended to it. Stops after the token at which ``budget_s`` (> 0)
    seconds of fills have been spent."""
    m = xgr.GrammarMatcher(compiled)
    row = bm[0]
    out, diffs, spent = [], 0, 0
    for i, t in enumerate(traj):
        t0 = time.perf_counter_ns()
        m.fill_next_token_bitmask(bm, 0)
        dt = time.perf_counter_ns() - t0
        out.append(dt)
        spent += dt
        if masks is not None and i < len(masks) and not np.array_equal(row.numpy(), masks[i]):
            diffs += 1
        if record is not None:
            record.append(row.numpy().copy())
        if not m.accept_token(t):
            raise RuntimeError("trajectory rejected")
        if budget_s and spent > budget_s * 1e9:
            break
    return out, diffs


def run(args) -> dict:
    import torch
    import xgrammar as xgr

    from constraint_service.backend.xgrammar_backend import exclude_surrogates
    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.errors import ConstraintError
    from constraint_service.json_schema import canonicalize
    from constraint_service.types import ConstraintSpec
    from gpu_engine.model.tokenizer import NInferTokenizer
    from gpu_engine.model.vocab import load_vocabulary_from_gguf
    from mask_bench import DEFAULT_MODEL, load_records, sample_records

    recs = load_records(args.data)
    sample, _ = sample_records(recs, len(recs), args.seed)
    vocab = load_vocabulary_from_gguf(DEFAULT_MODEL)
    tok = NInferTokenizer.from_gguf(DEFAULT_MODEL)
    eos = vocab.eos_ids[0]
    conv = ConstraintCompiler(vocab)
    info = conv.backend.tokenizer_info
    eager = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    dynamic = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False, enable_dynamic_compilation=True)
    bm = torch.zeros((1, conv.backend.fill_words), dtype=torch.int32)
    rows, skipped = [], {}
    for rec in sample:
        if len(rows) >= args.limit:
            break
        text = json.dumps(rec["schema"], ensure_ascii=False)
        t0 = time.perf_counter()
        try:
            _, canon, _ = conv._key_and_source(ConstraintSpec("json_schema", text))
            grammar = exclude_surrogates(conv.grammar_of(conv.backend, "json_schema", canon))
        except ConstraintError as e:
            skipped.setdefault(f"ours:{e.kind}", []).append(rec["id"])
            continue
        convert_s = time.perf_counter() - t0
        gd, dyn_s, derr = with_deadline(lambda: dynamic.compile_grammar(grammar), args.compile_timeout)
        if gd is None:
            skipped.setdefault(f"dynamic:{derr}", []).append(rec["id"])
            continue
        ge, eager_s, eerr = with_deadline(lambda: eager.compile_grammar(grammar), args.compile_timeout)
        inst = next(t["data"] for t in rec["tests"] if t.get("valid"))
        traj = tok.encode(json.dumps(canonicalize(rec["schema"], inst), separators=(",", ":"),
                                     ensure_ascii=False)) + [eos]
        try:
            masks = None
            eager_ns: list[int] = []
            if ge is not None:
                masks = []
                eager_ns, _ = walk(xgr, ge, traj, bm, record=masks)
            first, d1 = walk(xgr, gd, traj, bm, masks, budget_s=args.walk_budget)
            second, d2 = walk(xgr, gd, traj, bm, masks)
        except RuntimeError:
            skipped.setdefault("trajectory_rejected", []).append(rec["id"])
            continue
        row = dict(id=rec["id"], subset=subset_of(rec), tokens=len(traj), convert_ms=convert_s * 1e3,
                   eager_ms=eager_s * 1e3, eager_error=eerr, dynamic_ms=dyn_s * 1e3,
                   first_request_ms=(convert_s + dyn_s) * 1e3 + sum(first) / 1e6,
                   first_walk_tokens=len(first), mask_diffs=d1 + d2,
                   first_ns=first, second_ns=second, eager_ns=eager_ns)
        rows.append(row)
        print(f"{rec['id'][:48]:48s} conv {row['convert_ms']:7.1f}  eager {row['eager_ms']:8.1f}"
              f"{'*' if eerr else ' '} dyn {row['dynamic_ms']:6.1f}  first walk {sum(first) / 1e6:8.1f} ms"
              f" (max {max(first) / 1e6:6.2f})  second {sum(second) / 1e6:6.2f}  diffs {d1 + d2}", flush=True)
    return dict(rows=rows, skipped=skipped)


def summarize(rows: list[dict]) -> dict:
    def dist(xs):
        return {"p50": pct(xs, 50), "p90": pct(xs, 90), "max": max(xs) if xs else float("nan"), "n": len(xs)}

    both = [r for r in rows if r["eager_ns"]]  # the three walks over the same tokens

    def per_token(key, rs=both):
        us = [v / 1e3 for r in rs for v in r[key]]
        return {"p50": pct(us, 50), "p99": pct(us, 99), "p99.9": pct(us, 99.9), "max": max(us) if us else None,
                "n": len(us)}

    first_us = [v / 1e3 for r in rows for v in r["first_ns"]]
    return {
        "cold_eager_ms": dist([r["convert_ms"] + r["eager_ms"] for r in rows]),
        "cold_dynamic_ms": dist([r["convert_ms"] + r["dynamic_ms"] for r in rows]),
        "first_request_dynamic_ms": dist([r["first_request_ms"] for r in rows]),
        "eager_timeouts": sum(1 for r in rows if r["eager_error"]),
        "fill_us": {"eager": per_token("eager_ns"), "dynamic_first_use": per_token("first_ns"),
                    "dynamic_reused": per_token("second_ns"),
                    "dynamic_first_use_all_schemas": per_token("first_ns", rows)},
        "first_use_fills_over_1ms": sum(1 for u in first_us if u > 1e3),
        "first_use_fills_over_probe_limit": sum(1 for u in first_us if u > PROBE_LIMIT_MS * 1e3),
        "schemas_with_a_first_use_fill_over_10ms": sum(1 for r in rows if max(r["first_ns"]) > 1e7),
        "mask_diffs": sum(r["mask_diffs"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(JSB_DEV), help="MaskBench records (.jsonl.gz), read in place")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="eager compile deadline, s (censored)")
    ap.add_argument("--walk-budget", type=float, default=20.0, help="first-use walk budget, s of fills")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    res = run_header("cpu", schemas=args.limit, compile_timeout_s=args.compile_timeout, threads=1)
    res.update(run(args))
    res["summary"] = summarize(res["rows"])
    s = res["summary"]
    print(json.dumps(s, indent=1))
    out = results_path("dynamic_compile_bench", "cpu", args.out)
    out.write_text(json.dumps(res))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
