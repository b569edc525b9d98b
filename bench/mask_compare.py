"""Mask cost of our JSON Schema grammars vs xgrammar's own converter (issue 12, part 1).

usage: python bench/mask_compare.py DATAFILE [--limit 500] [--seed 0] [--repeats 5] [--warmup 1]
                                     [--ids-from PREV.json] [--model GGUF] [--out PREFIX] [--no-plot]
       python bench/mask_compare.py X --compare BEFORE.json AFTER.json [--project FULL.json] [--out PREFIX]

DATAFILE: JSONSchemaBench MaskBench records (``.jsonl(.gz)``, read in place) with ``schema`` and
``tests: [{data, valid}]``.  Records that have a valid instance are taken in ``bench/mask_bench.py``'s
deterministic round-robin order across subsets until ``--limit`` schemas have been compared (schemas our
converter rejects, xgrammar cannot compile, or either grammar refuses the trajectory are skipped and
recorded); ``--ids-from`` takes exactly the ids tried by an earlier result file instead, so a run before
and after a converter change measures the same schemas.

Per schema, on the SmolLM2 vocabulary (``--model``):

* **ours**: ``ConstraintCompiler.compile`` of the ``json_schema`` kind (canonical key, our
  ``json_schema_to_ebnf``, xgrammar ``compile_grammar``), cold; its wall time is the cold compile time.
* **xgr**: ``xgrammar.GrammarCompiler(max_threads=1, cache_enabled=False).compile_json_schema`` of the
  same schema text, compact separators, no free whitespace, ``strict_mode=False`` (additional properties
  allowed, as in our contract).  Schemas xgrammar cannot compile are skipped and recorded.
* **trajectory**: the first valid test instance in our canonical generation form
  (``json_schema.canonicalize``; compact separators, declared order), tokenised with the model tokenizer,
  then EOS.  It must be accepted (and terminate) under both grammars; otherwise the schema is skipped and
  recorded (a rejection by our grammar is a completeness defect and is listed by id).
* **timing**: ``--warmup`` + ``--repeats`` passes, alternating which grammar goes first; each pass creates a
  fresh ``GrammarMatcher`` and, per trajectory position, times one ``fill_next_token_bitmask`` into a
  ``[1, W]`` int32 tensor (``time.perf_counter_ns``; the Python call overhead is in both columns) and then
  ``accept_token``.  The per-token figure is the median over the timed passes; the spread over passes is
  kept as each schema's relative IQR of the per-pass means.  A pathological grammar is timed once: an
  first pass of ours runs under ``--slow-s`` seconds; if it spends more, the tokens it
  reached (all, or a prefix) are compared by that single pass against one pass of xgrammar's on the same
  prefix (``capped`` and ``tokens`` in its row).  Each mask is checked to allow the
  trajectory's token.

Per-schema ratio = mean per-token time of ours / of xgr.  Reported: the ratio distribution (p10..max,
geometric mean, share of schemas <= 1.25x), pooled per-token p50/p99/p99.9 of both, cold compile
p50/p90/p99 of both, the worst schemas.  Output: ``PREFIX.json`` (per-schema rows included) and
``PREFIX.png`` (ratio CDF + per-token CDF), default ``bench/results/mask_compare_<date>``; a table on
stdout.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402

from bench_common import with_deadline  # noqa: E402
from mask_bench import (DEFAULT_MODEL, cpu_model, git_rev, load_records, pct,  # noqa: E402
                        sample_records, subset_of, summary)

TARGET_RATIO = 1.25
TARGET_P999_US = 1000.0
TARGET_COMPILE_P50_MS = 20.0


def _xgr_compile(gc, text: str, timeout_s: float):
    """compile_json_schema with a deadline: (compiled | None, seconds, error | None)."""
    return with_deadline(lambda: gc.compile_json_schema(text, any_whitespace=False, separators=(",", ":"),
                                                        strict_mode=False), timeout_s)


def time_trajectory(xgr, compiled, traj: list[int], bm, budget_s: float = 0.0) -> tuple[list[int], int]:
    """One pass: per-position fill time (ns) and the number of masks that refused the trajectory token.
    With budget_s > 0 the pass stops after the token at which budget_s seconds have been spent."""
    m = xgr.GrammarMatcher(compiled)
    out = []
    misses = 0
    pc = time.perf_counter_ns
    budget_ns = int(budget_s * 1e9)
    spent = 0
    fill = m.fill_next_token_bitmask
    acc = m.accept_token
    row = bm[0]
    for t in traj:
        t0 = pc()
        fill(bm, 0)
        dt = pc() - t0
        out.append(dt)
        spent += dt
        if not (int(row[t >> 5]) >> (t & 31)) & 1:
            misses += 1
        if not acc(t):
            raise RuntimeError("trajectory rejected during timing")
        if budget_ns and spent > budget_ns:
            break
    return out, misses


def accepts(xgr, compiled, traj: list[int]) -> bool:
    m = xgr.GrammarMatcher(compiled)
    return all(m.accept_token(t) for t in traj) and m.is_terminated()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("datafile")
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per schema and grammar")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes before them")
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="per-compile deadline, s (both)")
    ap.add_argument("--slow-s", type=float, default=2.0,
                    help="time budget of the first pass of ours; a schema over it is timed once (recorded)")
    ap.add_argument("--ids-from", default="", help="measure exactly the schema ids of this earlier result")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--baseline-emit", default="",
                    help="an earlier emit.py to time as a third grammar (same reducer, same trajectories)")
    ap.add_argument("--checkpoint", type=int, default=25, help="rewrite the JSON every N compared schemas")
    ap.add_argument("--shard", default="", help="K/N: only candidates with index %% N == K")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N candidates (of the shard)")
    ap.add_argument("--merge", nargs="*", default=None,
                    help="instead of measuring: combine the JSON (and .tokens.json.gz) of shard runs into --out")
    ap.add_argument("--note", default="", help="free text stored in the result (e.g. which emitter ran)")
    ap.add_argument("--worst", type=int, default=15, help="worst schemas listed")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                    help="instead of measuring: two runs on the same ids (e.g. two revisions, --ids-from) side by "
                         "side per schema; with --project FULL.json, FULL's ratios of those ids scaled by AFTER/BEFORE")
    ap.add_argument("--project", default="", help="a full-sample result to project a --compare onto")
    args = ap.parse_args(argv)

    if args.merge:
        return merge(args)
    if args.compare:
        return compare(args)

    import torch
    import xgrammar as xgr

    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.errors import ConstraintError
    from constraint_service.json_schema import canonicalize
    from constraint_service.types import ConstraintSpec
    from gpu_engine.model.tokenizer import NInferTokenizer
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    started = datetime.datetime.now(datetime.timezone.utc)
    t_all = time.perf_counter()
    recs = load_records(args.datafile)
    if args.ids_from:
        with open(args.ids_from) as f:
            want = json.load(f)["sample_ids"]
        by_id = {r["id"]: r for r in recs}
        sample = [by_id[i] for i in want if i in by_id]
        scanned = len(sample)
    else:  # the whole deterministic round-robin order; records are taken until --limit are compared
        sample, scanned = sample_records(recs, len(recs), args.seed)
    if args.shard:  # K/N: every N-th candidate from the K-th (run N shards side by side, then --merge)
        k, nsh = (int(x) for x in args.shard.split("/"))
        sample = sample[k::nsh]
    sample = sample[args.skip:]
    print(f"{len(recs)} records; up to {len(sample)} candidates over {len(set(map(subset_of, sample)))} subsets",
          flush=True)

    vocab = load_vocabulary_from_gguf(args.model)
    tok = NInferTokenizer.from_gguf(args.model)
    eos = vocab.eos_ids[0]
    compiler = ConstraintCompiler(vocab, compile_timeout_s=args.compile_timeout, cache_bytes=1 << 20)
    info = compiler.backend.tokenizer_info
    gc = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    num_words = compiler.backend.fill_words  # the words xgrammar writes (narrower than V's for a padded vocabulary)
    bm = torch.zeros((1, num_words), dtype=torch.int32)
    bm_np = bm.numpy()

    base_emit = _load_baseline(args.baseline_emit) if args.baseline_emit else None
    names = ["ours"] + (["base"] if base_emit else []) + ["xgr"]
    skipped = collections.defaultdict(list)  # reason -> ids
    rows = []
    cold = {k: [] for k in names}
    toks = {k: [] for k in names}  # pooled per-token medians, ns
    misses = {k: 0 for k in names}
    t0 = time.perf_counter()
    tried = []

    def riqr(a):
        return float((np.percentile(a, 75) - np.percentile(a, 25)) / max(np.median(a), 1e-9))

    for n, rec in enumerate(sample):
        if len(rows) >= args.limit:
            break
        tried.append(rec)
        rid = rec["id"]
        text = json.dumps(rec["schema"], ensure_ascii=False)
        g = {}
        try:
            cc, ci = compiler.compile(ConstraintSpec("json_schema", text))
            g["ours"] = cc._compiled
            cold["ours"].append(ci.seconds)
        except ConstraintError as e:
            skipped[f"ours:{e.kind}"].append(rid)
            if e.kind == "CompileTimeout":
                cold["ours"].append(args.compile_timeout)  # censored at the deadline
            continue
        if base_emit is not None:
            tb = time.perf_counter()
            try:
                ebnf = base_emit(text)
                g["base"] = compiler.backend.compile(compiler.backend.parse_ebnf(ebnf), kind="json_schema",
                                                     key=("base", text))._compiled
                cold["base"].append(time.perf_counter() - tb)
            except Exception as e:  # noqa: BLE001 - recorded; the schema is compared without it
                skipped["base:" + type(e).__name__].append(rid)
                continue
        xc, xs, xerr = _xgr_compile(gc, text, args.compile_timeout)
        if xc is None:
            skipped["xgr:" + ("timeout" if xerr == "timeout" else "error")].append(rid)
            continue
        cold["xgr"].append(xs)
        g["xgr"] = xc
        inst = next(t["data"] for t in rec["tests"] if t.get("valid"))
        s = json.dumps(canonicalize(rec["schema"], inst), separators=(",", ":"), ensure_ascii=False)
        traj = tok.encode(s) + [eos]
        bad = [k for k in names if not accepts(xgr, g[k], traj)]
        if bad:
            skipped[f"{bad[0]}_rejects_canonical_instance"].append(rid)
            continue
        per = {k: [] for k in names}
        full_traj = traj
        # pathological grammars: the first pass of each of ours (and the baseline) runs under a time budget;
        # if one runs out, only the tokens it reached are compared, by a single pass each (recorded as capped)
        firsts = {}
        for k in names[:-1]:
            firsts[k] = time_trajectory(xgr, g[k], traj, bm_np, args.slow_s)
            if len(firsts[k][0]) < len(traj) or sum(firsts[k][0]) > args.slow_s * 1e9:
                traj = traj[:len(firsts[k][0])]
        capped = len(traj) < len(full_traj) or any(sum(f[0]) > args.slow_s * 1e9 for f in firsts.values())
        if capped:
            for k in names:
                ts, miss = time_trajectory(xgr, g[k], traj, bm_np)
                per[k].append(ts)
                misses[k] += miss
        else:
            for p in range(args.warmup + args.repeats):
                order = names[p % len(names):] + names[:p % len(names)]
                for k in order:
                    ts, miss = time_trajectory(xgr, g[k], traj, bm_np)
                    if p >= args.warmup:
                        per[k].append(ts)
                        misses[k] += miss
        med = {k: np.median(np.asarray(v, dtype=np.float64), axis=0) for k, v in per.items()}
        pass_means = {k: np.asarray(v, dtype=np.float64).mean(axis=1) for k, v in per.items()}
        row = {"id": rid, "subset": subset_of(rec), "tokens": len(traj), "trajectory_tokens": len(full_traj),
               "timed_passes": len(per["ours"]), "capped": capped}
        for k in names:
            toks[k].extend(med[k].tolist())
            row[f"{k}_mean_us"] = float(med[k].mean()) / 1e3
            row[f"{k}_max_us"] = float(med[k].max()) / 1e3
            row[f"{k}_spread"] = riqr(pass_means[k])
            row[f"{k}_compile_ms"] = cold[k][-1] * 1e3
        row["ratio"] = row["ours_mean_us"] / row["xgr_mean_us"]
        if base_emit is not None:
            row["base_ratio"] = row["base_mean_us"] / row["xgr_mean_us"]
        rows.append(row)
        if len(rows) % args.checkpoint == 0:
            r = [x["ratio"] for x in rows]
            print(f"  {n + 1} tried ({time.perf_counter() - t0:.0f} s) compared {len(rows)}, "
                  f"ratio p50 {pct(r, 50):.2f} mean {np.mean(r):.2f}", flush=True)
            write_report(args, started, t_all, vocab, names, tried, rows, skipped, toks, cold, misses, final=False)

    if not rows:
        print("no schema compared", file=sys.stderr)
        return 1
    write_report(args, started, t_all, vocab, names, tried, rows, skipped, toks, cold, misses, final=True)
    return 0


def merge(args) -> int:
    """Combine shard results: rows, skipped lists, per-token and compile samples; report as one run."""
    parts = []
    for path in args.merge:
        base = path[:-5] if path.endswith(".json") else path
        with open(base + ".json") as f:
            res = json.load(f)
        with gzip.open(base + ".tokens.json.gz", "rt") as f:
            tk = json.load(f)
        parts.append((res, tk))
    names = list(parts[0][1])
    seen: set = set()
    rows = []
    for res, _ in parts:  # an id measured by two runs counts once (the first)
        for r in res["rows"]:
            if r["id"] not in seen:
                seen.add(r["id"])
                rows.append(r)
    tried = [{"id": i} for res, _ in parts for i in res["sample_ids"]]
    skipped = collections.defaultdict(list)
    for res, _ in parts:
        for k, v in res["schemas"]["skipped"].items():
            skipped[k].extend(v["ids"])
    toks = {k: [x * 1e3 for _, tk in parts for x in tk[k]] for k in names}
    cold = {k: [r[f"{k}_compile_ms"] / 1e3 for r in rows] for k in names}
    misses = {k: sum(res["mask_misses"][k] for res, _ in parts) for k in names}
    first = parts[0][0]
    args.note = first["note"] + f" | merged from {len(parts)} shard runs: " + ", ".join(
        f"{res['command']} (rev {res['git_revision']}, complete={res['complete']}, {res['seconds']} s)"
        for res, _ in parts)
    for k in ("limit", "seed", "repeats", "warmup", "compile_timeout_s", "slow_s", "baseline_emit"):
        setattr(args, {"compile_timeout_s": "compile_timeout"}.get(k, k), first["params"][k])

    class V:
        vocab_size = first["model_vocabulary"]["vocab_size"]

    started = datetime.datetime.fromisoformat(first["date"])
    write_report(args, started, time.perf_counter(), V, names, tried, rows, skipped, toks, cold, misses,
                 final=True)
    return 0


def compare(args) -> int:
    """Two result files on the same schemas (a converter change measured before and after, each run's
    xgrammar column timed in the same process as its ours column): per-schema ratio ours/xgr before and
    after, their distributions over the common ids, pooled per-token percentiles of ours; with --project, a
    full-sample run whose ratios of the common ids are multiplied by (after ours/xgr) / (before ours/xgr)
    (a projection: a ratio measured on one machine carried onto another run's ratios, labelled as such)."""
    runs = []
    for path in args.compare:
        base = path[:-5] if path.endswith(".json") else path
        with open(base + ".json") as f:
            runs.append(json.load(f))
    by = [{r["id"]: r for r in res["rows"]} for res in runs]
    common = [i for i in by[0] if i in by[1]]
    before = np.array([by[0][i]["ratio"] for i in common])
    after = np.array([by[1][i]["ratio"] for i in common])
    out = {"bench": "mask_compare_ab", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": "python " + " ".join(sys.argv), "git_revision": git_rev(),
           "runs": [{k: res[k] for k in ("command", "git_revision", "date", "device", "note")} for res in runs],
           "common_ids": len(common),
           "only_in": [sorted(set(by[0]) - set(by[1])), sorted(set(by[1]) - set(by[0]))],
           "skipped": [res["schemas"]["skipped"] for res in runs],
           "ratio_before": _ratio_summary(before), "ratio_after": _ratio_summary(after),
           "per_token_us_ours": [res["per_token_us"]["ours"] for res in runs],
           "cold_compile_ms_ours": [res["cold_compile_ms"]["ours"] for res in runs],
           "rows": [{"id": i, "before": by[0][i]["ratio"], "after": by[1][i]["ratio"],
                     "ours_us_before": by[0][i]["ours_mean_us"], "ours_us_after": by[1][i]["ours_mean_us"],
                     "xgr_us_before": by[0][i]["xgr_mean_us"], "xgr_us_after": by[1][i]["xgr_mean_us"]}
                    for i in common]}
    print(f"{len(common)} schemas in both runs; ratio ours/xgr       p50     p90     max    mean  <=1.25")
    for name, r in (("before", out["ratio_before"]), ("after", out["ratio_after"])):
        print(f"  {name:44s} {r['p50']:7.2f} {r['p90']:7.2f} {r['max']:7.1f} {r['mean']:7.2f} "
              f"{100 * r['share_le_target']:6.1f}%")
    for k, name in enumerate(("before", "after")):
        t = out["per_token_us_ours"][k]
        print(f"  ours per token {name}: p50 {t['p50']:.1f} p99 {t['p99']:.1f} p99.9 {t['p99.9']:.1f} us; "
              f"cold compile p50 {out['cold_compile_ms_ours'][k]['p50']:.0f} ms")
    worst = sorted(out["rows"], key=lambda r: -r["before"])[: args.worst]
    print("  largest before: id, ratio before -> after, ours us before -> after")
    for r in worst:
        print(f"    {r['id']:40s} {r['before']:9.2f} -> {r['after']:6.2f}   {r['ours_us_before']:10.1f} -> "
              f"{r['ours_us_after']:8.1f}")
    if args.project:
        with open(args.project) as f:
            full = json.load(f)
        scale = {r["id"]: r["after"] / r["before"] for r in out["rows"]}
        proj = np.array([r["ratio"] * scale.get(r["id"], 1.0) for r in full["rows"]])
        out["projection"] = {"onto": args.project, "onto_revision": full["git_revision"],
                             "scaled_ids": sum(r["id"] in scale for r in full["rows"]),
                             "ratio_measured": _ratio_summary([r["ratio"] for r in full["rows"]]),
                             "ratio_projected": _ratio_summary(proj)}
        m, pj = out["projection"]["ratio_measured"], out["projection"]["ratio_projected"]
        print(f"  projected onto {args.project} ({out['projection']['scaled_ids']} of {len(full['rows'])} rows "
              f"scaled): mean {m['mean']:.2f} -> {pj['mean']:.2f}, p99 {m['p99']:.2f} -> {pj['p99']:.2f}, "
              f"share <= 1.25 {100 * m['share_le_target']:.1f}% -> {100 * pj['share_le_target']:.1f}%")
    path = (args.out or os.path.join(ROOT, "bench", "results", "mask_compare_ab")) + ".json"
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")
    return 0


def _load_baseline(path: str):
    """An earlier emit.py (e.g. `git show REV:constraint_service/json_schema/emit.py > FILE`) loaded as a
    sibling module of the current one; returns schema text -> EBNF through the current reducer."""
    import importlib.util

    from constraint_service.json_schema import parse_schema, reduce_schema

    spec = importlib.util.spec_from_file_location("constraint_service.json_schema._emit_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return lambda text: mod.emit_grammar(reduce_schema(parse_schema(text)))


def _ratio_summary(ratios) -> dict:
    ratios = np.asarray(ratios, dtype=np.float64)
    return summary(ratios) | {"p10": pct(ratios, 10), "geomean": float(np.exp(np.log(ratios).mean())),
                              "share_le_target": float((ratios <= TARGET_RATIO).mean())}


def write_report(args, started, t_all, vocab, names, tried, rows, skipped, toks, cold, misses, final):
    ratio_keys = ["ratio"] + (["base_ratio"] if "base" in names else [])
    ratio = {k: _ratio_summary([r[k] for r in rows]) for k in ratio_keys}
    tok_summary = {k: summary(v, 1e-3) for k, v in toks.items()}
    mean_of_means = {k: float(np.mean([r[f"{k}_mean_us"] for r in rows])) for k in names}
    worst = sorted(rows, key=lambda r: -r["ratio"])[:args.worst]
    slowest = sorted(rows, key=lambda r: -r["ours_max_us"])[:args.worst]
    by_subset = {}
    for sub in sorted(set(r["subset"] for r in rows)):
        rr = [r for r in rows if r["subset"] == sub]
        by_subset[sub] = {"n": len(rr)}
        for k in ratio_keys:
            a = np.asarray([r[k] for r in rr])
            by_subset[sub] |= {f"{k}_p50": pct(a, 50), f"{k}_mean": float(a.mean()), f"{k}_max": float(a.max())}
    date = started.strftime("%Y-%m-%d")
    out = args.out or os.path.join(ROOT, "bench", "results", f"mask_compare_{date}")
    result = {
        "bench": "mask_compare",
        "complete": final,
        "date": started.isoformat(timespec="seconds"),
        "device": {"cpu": cpu_model(), "cpus_visible": os.cpu_count(), "platform": platform.platform(),
                   "python": platform.python_version(), "xgrammar": _xgr_version(),
                   "loadavg_at_write": os.getloadavg()},
        "command": " ".join(["python", *sys.argv]),
        "git_revision": git_rev(),
        "note": args.note,
        "datafile": os.path.basename(args.datafile),
        "model_vocabulary": {"file": os.path.basename(args.model), "vocab_size": vocab.vocab_size},
        "params": {"limit": args.limit, "seed": args.seed, "repeats": args.repeats, "warmup": args.warmup,
                   "compile_timeout_s": args.compile_timeout, "ids_from": args.ids_from,
                   "slow_s": args.slow_s, "baseline_emit": args.baseline_emit},
        "definition": "per token: median over timed passes of one fill_next_token_bitmask (fresh matcher per "
                      "pass, [1, W] int32); per-schema ratio = mean per-token time / xgr's on the same "
                      "canonical trajectory (ratio: ours, base_ratio: the baseline emitter); xgr = "
                      "compile_json_schema(any_whitespace=False, separators=(',', ':'), strict_mode=False); cold "
                      "compile: ours = ConstraintCompiler.compile (convert + compile), base = baseline emit + "
                      "compile, xgr = compile_json_schema",
        "targets": {"ratio_per_schema_mean": TARGET_RATIO, "p999_per_token_us": TARGET_P999_US,
                    "cold_compile_p50_ms": TARGET_COMPILE_P50_MS},
        "schemas": {"tried": len(tried), "compared": len(rows),
                    "subsets_tried": dict(collections.Counter(map(subset_of, tried))),
                    "subsets_compared": dict(collections.Counter(r["subset"] for r in rows)),
                    "capped": sum(r["capped"] for r in rows),
                    "skipped": {k: {"n": len(v), "ids": v} for k, v in sorted(skipped.items())}},
        "ratio": ratio,
        "ratio_by_subset": by_subset,
        "per_token_us": tok_summary,
        "mean_of_schema_means_us": mean_of_means,
        "cold_compile_ms": {k: summary(v, 1e3) for k, v in cold.items()},
        "mask_misses": misses,
        "worst_ratio": worst,
        "slowest_token": slowest,
        "sample_ids": [r["id"] for r in tried],
        "rows": rows,
        "seconds": round(time.perf_counter() - t_all, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with gzip.open(out + ".tokens.json.gz", "wt") as f:  # pooled per-token medians (us), for --merge
        json.dump({k: [round(x / 1e3, 2) for x in v] for k, v in toks.items()}, f)
    if not final:
        return
    if not args.no_plot:
        plot(rows, toks, out + ".png", result)
    print()
    print(f"compared {len(rows)} of {len(tried)} schemas tried ({result['schemas']['capped']} capped); skipped: "
          f"{ {k: len(v) for k, v in sorted(skipped.items())} }")
    print(f"{'per-schema ratio to xgr':28} {'p10':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>8} {'mean':>7} "
          f"{'geo':>6} {'<=1.25':>7}")
    for k, r in ratio.items():
        print(f"{'ours' if k == 'ratio' else 'baseline':28} {r['p10']:7.2f} {r['p50']:7.2f} {r['p90']:7.2f} "
              f"{r['p99']:7.2f} {r['max']:8.1f} {r['mean']:7.2f} {r['geomean']:6.2f} {r['share_le_target']:7.1%}")
    print(f"{'per token (us)':28} {'n':>7} {'mean':>7} {'p50':>7} {'p99':>7} {'p99.9':>8} {'max':>9}")
    for k, v in tok_summary.items():
        print(f"{k:28} {v['n']:7d} {v['mean']:7.1f} {v['p50']:7.1f} {v['p99']:7.1f} {v['p99.9']:8.1f} "
              f"{v['max']:9.1f}")
    print(f"{'cold compile (ms)':28} {'n':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>9}")
    for k, v in result["cold_compile_ms"].items():
        if v.get("n"):
            print(f"{k:28} {v['n']:7d} {v['p50']:7.1f} {v['p90']:7.1f} {v['p99']:7.1f} {v['max']:9.1f}")
    print(f"{'subset (ratio ours/xgr)':28} {'n':>7} {'p50':>7} {'mean':>7} {'max':>8}")
    for k, v in by_subset.items():
        print(f"{k:28} {v['n']:7d} {v['ratio_p50']:7.2f} {v['ratio_mean']:7.2f} {v['ratio_max']:8.1f}")
    print("worst ratios: id, tokens, ours mean/max us, xgr mean/max us, ratio")
    for w in worst:
        print(f"  {w['id']:44} {w['tokens']:5d} {w['ours_mean_us']:8.1f} {w['ours_max_us']:8.1f} "
              f"{w['xgr_mean_us']:7.1f} {w['xgr_max_us']:7.1f} {w['ratio']:7.2f}")
    print(f"mask misses: {misses}")
    print(f"wrote {out}.json" + ("" if args.no_plot else f" and {out}.png"))


def _xgr_version() -> str:
    try:
        from importlib.metadata import version
        return version("xgrammar")
    except Exception:  # noqa: BLE001
        return "?"


def plot(rows, toks, path: str, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, label in (("ratio", "ours"), ("base_ratio", "baseline emitter")):
        if key not in rows[0]:
            continue
        x = np.sort([r[key] for r in rows])
        a1.plot(x, np.arange(1, len(x) + 1) / len(x), label=f"{label} (p50 {np.median(x):.2f})")
    a1.axvline(TARGET_RATIO, color="r", ls="--", label=f"target {TARGET_RATIO}x")
    a1.set_xscale("log")
    a1.set_xlabel("per-schema mean mask time / xgrammar compile_json_schema's")
    a1.set_ylabel("CDF over schemas")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=8)
    for name, v in toks.items():
        y = np.sort(np.asarray(v) / 1e3)
        a2.plot(y, np.arange(1, len(y) + 1) / len(y), label=f"{name} (p99.9 {pct(y, 99.9):.0f} us)")
    a2.axvline(TARGET_P999_US, color="r", ls="--", label="1 ms")
    a2.set_xscale("log")
    a2.set_xlabel("per-token fill_next_token_bitmask (us), median over passes")
    a2.set_ylabel("CDF over tokens")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=8)
    r = result["ratio"]["ratio"]
    fig.suptitle(f"mask_compare {result['date'][:10]}  {result['schemas']['compared']} schemas  ratio p50 "
                 f"{r['p50']:.2f} mean {r['mean']:.2f}  xgrammar {result['device']['xgrammar']}\n"
                 f"{result['device']['cpu']}  rev {result['git_revision'][:12]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
