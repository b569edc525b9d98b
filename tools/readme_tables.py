"""Regenerate the README's benchmark tables from committed results JSON (issue 12 "Honest benchmarks").

usage:
  python tools/readme_tables.py [--engine FILE.json] [--engine-8b FILE.json] [--forward FILE.json]
                                [--spec FILE.json] [--cpu FILE.json]
                                [--jsonschema-suite FILE.json] [--write README.md]

Each table is rendered from one results file (default: the newest ``bench/results/<bench>_*.json`` of
that benchmark, CUDA preferred for engine/spec) and starts with a provenance line (date, device,
revision, command). Without ``--write`` the tables are printed; with it, the text between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (NAME = engine | engine_8b | forward | spec | cpu |
jsonschema_suite) in the README is
replaced, and a README that lacks a marker pair is left unchanged for that table (reported on stderr).
Random-weight models are labelled "random weights" in their table heading.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _num(x, fmt="{:,.0f}") -> str:
    return "–" if x is None else fmt.format(x)


def _fmt_spread(med, sp: dict, fmt="") -> str:
    """``med`` plus `` (min–max)`` of the spread ``sp`` when repeats differ (default format: integer from
    100 up, else 3 digits)."""
    if med is None:
        return "–"
    fmt = fmt or ("{:,.0f}" if abs(med) >= 100 else "{:.3g}")
    if sp.get("n", 1) > 1 and sp.get("min") is not None and sp["min"] != sp["max"]:
        return f"{fmt.format(med)} ({fmt.format(sp['min'])}–{fmt.format(sp['max'])})"
    return fmt.format(med)


def _spread(row: dict, key: str, fmt="") -> str:
    """``row[key]`` with the spread ``row[key + "_spread"]`` (:func:`_fmt_spread`)."""
    return _fmt_spread(row.get(key), row.get(f"{key}_spread") or {}, fmt)


def _provenance(doc: dict) -> str:
    return (f"_{doc.get('date', '?')}, {doc.get('device') or doc.get('device_name', '?')}, revision "
            f"`{doc.get('revision', '?')}`; command: `{doc.get('command', '?')}`_")


def engine_tables(doc: dict) -> str:
    """Per model: one row per B; per variant tok/s (median, spread over repeats), decode ratio vs
    unconstrained, GPU idle per decode step (% of the step), HBM-bound fraction of the unconstrained step."""
    s = doc.get("settings", {})
    out = [_provenance(doc), "",
           f"{s.get('steps')} measured steps after {s.get('warm_steps')} warm-up, {s.get('repeats', 1)} repeat(s) "
           "(median, min–max); closed loop at constant B; cells: tok/s (decode ratio vs unconstrained; GPU idle "
           "% of the decode step)."]
    for m in doc.get("models", []):
        runs = m.get("runs", [])
        variants = [v for v in ("none", "json_schema", "json_schema_jsb", "grammar", "regex")
                    if any(r["variant"] == v for r in runs)]
        names = {"none": "unconstrained", "json_schema": "JSON Schema (sample)",
                 "json_schema_jsb": "JSON Schema (JSONSchemaBench)", "grammar": "GBNF", "regex": "regex"}
        tag = "**random weights**" if m.get("random_weights") else "real weights"
        out += ["", f"**{m['label']}** ({tag}, V = {m.get('vocab_size'):,}, {m.get('dtype', '')})", "",
                "| B | " + " | ".join(names[v] for v in variants) + " | HBM-bound fraction |",
                "|---:|" + "---:|" * (len(variants) + 1)]
        for b in sorted({r["batch"] for r in runs}):
            by = {r["variant"]: r for r in runs if r["batch"] == b}
            base = by.get("none")
            cells = []
            for v in variants:
                r = by.get(v)
                if r is None:
                    cells.append("–")
                    continue
                extra = []
                if v != "none" and base and base.get("decode_tokens_per_s") and r.get("decode_tokens_per_s"):
                    extra.append(f"{r['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}")
                if r.get("gpu_idle_pct") is not None:
                    extra.append(f"idle {r['gpu_idle_pct']:.1f}%")
                cells.append(_spread(r, "tokens_per_s") + (f" ({'; '.join(extra)})" if extra else ""))
            frac = _num(base.get("hbm_bound_fraction") if base else None, "{:.2f}")
            out.append(f"| {b} | " + " | ".join(cells) + f" | {frac} |")
        for bl in m.get("baseline", []):
            eng = next((r for r in runs if r["batch"] == bl["batch"] and r["variant"] == bl["variant"]), None)
            ratio = f"{eng['tokens_per_s'] / bl['tokens_per_s']:.1f}×" if eng and bl.get("tokens_per_s") else "–"
            out.append(f"* vs `transformers`{' + xgrammar' if bl['variant'] != 'none' else ''}"
                       f"{' (static cache)' if bl.get('cache') == 'static' else ''} B={bl['batch']} {bl['variant']}: {_spread(bl, 'tokens_per_s')} tok/s → engine {ratio}")
    return "\n".join(out)


def spec_table(doc: dict) -> str:
    out = [_provenance(doc), "",
           f"K = {doc.get('num_draft_tokens')}, T = {doc.get('temperature')}, {doc.get('steps', '?')} steps × "
           f"{doc.get('repeats', 1)} repeat(s), {doc.get('loop', 'open loop: B requests submitted at once').split(';')[0]}"
           " (median, min–max).", "",
           "| method | workload | B | tok/s | speed-up vs none | mean accepted length |",
           "|---|---|---:|---:|---:|---:|"]
    for r in doc.get("results", []):
        workload = r.get("workload") or ("json_schema" if r["constrained"] else "none")
        out.append(f"| {r['label']} | {workload} | {r['batch']} | "
                   f"{_spread(r, 'tokens_per_s', '{:,.1f}')} | {_num(r.get('speedup_vs_none'), '{:.2f}')} | "
                   f"{_num(r.get('mean_accepted_len'), '{:.2f}')} |")
    return "\n".join(out)


def cpu_table(doc: dict) -> str:
    """bench/cpu_bench.py's summary: one row per (B, kind); one ratio column per extra ``transformers`` baseline
    that ran (``ratio_vs_transformers_1t``: 1 thread, ``_bf16``: bfloat16, ...)."""
    meta = doc.get("meta", {})
    summary = doc.get("summary", [])
    extra = sorted({k[len("ratio_vs_transformers_"):] for s in summary for k in s
                    if k.startswith("ratio_vs_transformers_") and not k.endswith("_spread")})
    label = {"1t": "1 thread"}
    out = [_provenance(meta), "", "| B | kind | tok/s | vs unconstrained | vs transformers (per repeat) | "
           + "".join(f"vs transformers {label.get(e, e)} | " for e in extra) + "load avg |",
           "|---:|---|---:|---:|---:|" + "---:|" * len(extra) + "---:|"]
    for s in summary:
        out.append(f"| {s['batch']} | {s['kind']} | {_spread(s, 'tokens_per_s', '{:,.1f}')} | "
                   f"{_num(s.get('ratio_vs_unconstrained'), '{:.2f}')} | "
                   f"{_spread(s, 'ratio_vs_transformers', '{:.2f}')} | "
                   + "".join(f"{_spread(s, 'ratio_vs_transformers_' + e, '{:.2f}')} | " for e in extra)
                   + f"{_num(s.get('loadavg_1min_median'), '{:.1f}')} |")
    return "\n".join(out)


SUITE_COLS = ["all-pass", "outside-form", "format-asserted", "over-constrained", "under-constrained", "rejected"]


def jsonschema_suite_table(doc: dict) -> str:
    """JSON Schema Test Suite run of bench/jsonschema_bench.py: totals, then the category counts summed
    over the suite's files (schemas: all-pass, outside-form, format-asserted, over-/under-constrained,
    rejected)."""
    t = doc["total"]
    rev = doc.get("revision", {})
    out = [f"_{doc.get('date', '?')}, revision `{rev.get('git_head', '?')[:7]}` (converter "
           f"{rev.get('converter_sha256', '?')}); command: `{doc.get('command', '?')}`_", "",
           "| schemas accepted | invalid instances accepted | invalid mutants accepted | valid instances accepted "
           "| valid outside the generation form | valid only as a format annotation | fuzz walks / failures |",
           "|---:|---:|---:|---:|---:|---:|---:|",
           f"| {t['accepted']:,} / {t['schemas']:,} | **{t['soundness_violations']}** / {t['invalid_instances']:,} | "
           f"**{t['mutants_accepted']}** / {t['mutants_invalid']:,} | {t['valid_accepted']:,} / {t['valid_instances']:,} | "
           f"{t.get('valid_outside_form', 0)} | {t.get('valid_format_asserted', 0)} | "
           f"{t['fuzz_walks']:,} / **{t['fuzz_failures']}** |", "",
           "| schemas by category | " + " | ".join(SUITE_COLS) + " |", "|---" + "|---:" * len(SUITE_COLS) + "|"]
    tot = {c: sum(v.get(c, 0) for v in doc["test_suite_categories"].values()) for c in SUITE_COLS}
    out.append("| all files | " + " | ".join(str(tot[c]) for c in SUITE_COLS) + " |")
    return "\n".join(out)


def forward_table(doc: dict) -> str:
    """``bench/forward_profile.py``: per shape, the eager-torch and fused decode step (median, spread), the
    speedup, kernels per step and the step's multiple of the HBM-bandwidth bound."""
    h = doc.get("header", {})
    out = [_provenance(h), "",
           f"Random weights, bf16, one T = 1 decode step replayed from a CUDA graph, median (min–max) of "
           f"{h.get('repeats')} × {h.get('steps')} steps; bound = (parameter + live KV bytes) / 4.8 TB/s.", "",
           "| shape (random weights) | B | context | eager torch, ms | fused Triton, ms | speedup | kernels / step "
           "| × HBM bound |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = doc.get("rows", [])
    gemv = any("triton_cublas" in r for r in rows)  # runs since the GEMV arm: fused with cuBLAS only, as served
    if gemv:
        out[-2] = ("| shape (random weights) | B | context | eager torch, ms | fused, cuBLAS GEMMs, ms | fused as served "
                   "(Triton GEMV at 1 row), ms | speedup vs eager | kernels / step | × HBM bound |")
        out[-1] = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for r in rows:
        ref, fused = r["reference"], r["triton"]
        ref_ms, fused_ms = ref["step_ms"], fused["step_ms"]
        mid = ""
        if gemv:
            cub = r["triton_cublas"]["step_ms"]
            mid = f"{_fmt_spread(cub['median'], cub, '{:.2f}')} | "
        out.append(f"| {r['model'].removesuffix('-random')} | {r['batch']} | {r['context']:,} | "
                   f"{_fmt_spread(ref_ms['median'], ref_ms, '{:.2f}')} | {mid}"
                   f"{_fmt_spread(fused_ms['median'], fused_ms, '{:.2f}')} | {r['speedup']:.2f}× | "
                   f"{ref['kernels_per_step']:,.0f} → {fused['kernels_per_step']:,.0f} | {fused['bound_ratio']:.2f} |")
    return "\n".join(out)


def _run_date(path: Path) -> str:
    """The run's own ``date`` (ISO 8601, sorts as text); ``""`` when the file has none. A file's mtime
    is no order: a fresh clone gives every file the same one."""
    try:
        date = json.loads(path.read_text()).get("date")
    except (OSError, ValueError, AttributeError):
        return ""
    return date if isinstance(date, str) else ""


def newest(prefix: str, prefer: str = "cuda") -> Path | None:
    """Newest run among ``bench/results/<prefix>*.json`` by the date it records (then by name), files
    whose name contains ``prefer`` first."""
    files = sorted(RESULTS.glob(f"{prefix}*.json"), key=lambda p: (_run_date(p), p.name), reverse=True)
    pref = [p for p in files if prefer in p.name]
    return (pref or files or [None])[0]


def replace_block(text: str, name: str, body: str) -> tuple[str, bool]:
    """Replace the text between the ``bench:name`` markers; (new text, found)."""
    pat = re.compile(rf"(<!-- bench:{name} -->\n)(?:.*?\n)?(<!-- /bench:{name} -->)", re.S)
    if not pat.search(text):
        return text, False
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text), True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", type=Path, default=None)
    ap.add_argument("--engine-8b", type=Path, default=None, help="engine bench of the 8B shapes")
    ap.add_argument("--forward", type=Path, default=None, help="bench/forward_profile.py results")
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--cpu", type=Path, default=None)
    ap.add_argument("--jsonschema-suite", type=Path, default=None)
    ap.add_argument("--write", type=Path, default=None, help="README to update between the markers")
    args = ap.parse_args(argv)
    srcs = {"engine": args.engine or RESULTS / "engine_bench_h200.json",
            "engine_8b": args.engine_8b or RESULTS / "engine_bench_h200_8b.json",
            "forward": args.forward or RESULTS / "forward_profile_h200.json",
            "spec": args.spec or newest("spec"),
            "cpu": args.cpu or newest("cpu_bench", prefer="cpu_bench_"),
            "jsonschema_suite": args.jsonschema_suite or RESULTS / "jsonschema_test_suite.json"}
    render = {"engine": engine_tables, "engine_8b": engine_tables, "forward": forward_table, "spec": spec_table, "cpu": cpu_table, "jsonschema_suite": jsonschema_suite_table}
    blocks = {}
    for name, path in srcs.items():
        if path is None or not Path(path).exists():
            print(f"{name}: no results file", file=sys.stderr)
            continue
        try:
            blocks[name] = f"<!-- generated by tools/readme_tables.py from {Path(path).name} -->\n" + \
                render[name](json.loads(Path(path).read_text()))
        except (KeyError, TypeError, ValueError) as e:
            print(f"{name}: {path} is not in the expected format ({e!r})", file=sys.stderr)
    if args.write is None:
        for name, body in blocks.items():
            print(f"### {name}\n{body}\n")
        return 0
    text = args.write.read_text()
    for name, body in blocks.items():
        text, found = replace_block(text, name, body)
        if not found:
            print(f"{name}: no <!-- bench:{name} --> ... <!-- /bench:{name} --> markers in {args.write}",
                  file=sys.stderr)
    args.write.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
