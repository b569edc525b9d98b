"""Masks of the regex constraint's grammar forms, side by side on the same token trajectories.

usage: python bench/regex_bench.py [--jsb 64] [--tokens 64] [--repeats 5] [--forms ours structural xgrammar]
                                   [--out FILE.json]

Regexes: a curated list of what users constrain to (``CURATED``: identifiers, dates, phone numbers, sentences,
bounded free text) and ``--jsb`` distinct ``pattern`` values of the JSONSchemaBench (MaskBench dev) schemas,
the most frequent first, each used as a full-match regex (those our parser accepts). Per regex, each form is
compiled cold on one thread with the SmolLM2 vocabulary (the embedded model's GGUF):

* ``ours``: :func:`constraint_service.regex.regex_to_ebnf` (the minimal DFA as right-linear rules, or the
  structural form past ``REGEX_DFA_STATES``), compiled through the sidecar's backend (surrogates excluded);
* ``structural``: the regex's own structure as EBNF (``ast_to_expr``), the form the regex constraint had before
  the DFA form;
* ``xgrammar``: xgrammar's own converter (``GrammarCompiler.compile_regex``), where it accepts the regex;
* ``baseline`` (with ``--baseline-tree DIR``): the grammar text ``regex_to_ebnf`` of another checkout writes
  (e.g. a ``git worktree`` of the revision before a change), compiled like ours.

The trajectory is a seeded random walk of up to ``--tokens`` tokens on ours' masks (EOS only when nothing else
is legal). Every form replays it ``--repeats`` times; each ``fill_next_token_bitmask`` is timed and the median
per token kept. Also counted, on the first pass: positions where a form's mask differs from ours
(``mask_diffs``), and mask-allowed tokens (``--sound-check`` sampled per position) that the form's own matcher rejects
(``unsound``: a mask that lets the engine sample a token the grammar then refuses).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

from bench_common import JSB_DEV, pct, results_path, run_header  # noqa: E402

CURATED = {
    "sentence_words": r"[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\.",
    "phone_us": r"\(\d{3}\) \d{3}-\d{4}",
    "email": r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,6}",
    "date_iso": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "ipv4": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "words": r"\w+( \w+)*",
    "sentence_200": r"[A-Za-z ,']{1,200}\.",
    "line_300": r"[^\n]{0,300}",
    "line_1000": r"[^\n]{0,1000}",
    "line_any": r"[^\n]*",
    "sentiment": r"(Positive|Negative|Neutral)",
    "key_values": r"(\w+=\w+;)*",
    "answer_number": r"The answer is -?\d+(\.\d+)?\.",
    "yes_no_reason": r"(Yes|No): [a-z ,]{10,80}\.",
    "csv_row": r"[^,\n]+(,[^,\n]+){3}",
}


def jsb_patterns(n: int, path: Path = JSB_DEV) -> dict:
    """The ``n`` most frequent distinct ``pattern`` values of the dataset's schemas that our parser accepts
    (ties by text), named ``jsb_<rank>``."""
    from constraint_service.errors import ConstraintError
    from constraint_service.regex import parse_regex

    counts: dict[str, int] = {}

    def walk(o):
        if isinstance(o, dict):
            p = o.get("pattern")
            if isinstance(p, str):
                counts[p] = counts.get(p, 0) + 1
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                walk(json.loads(line)["schema"])
    out = {}
    for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(out) >= n:
            break
        try:
            parse_regex(p)
        except ConstraintError:
            continue
        out[f"jsb_{len(out)}"] = p
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jsb", type=int, default=64, help="JSONSchemaBench patterns (0 = the curated list only)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--forms", nargs="+", default=["ours", "structural", "xgrammar"],
                    choices=["ours", "structural", "xgrammar", "baseline"])
    ap.add_argument("--baseline-tree", default=None, help="a checkout whose regex_to_ebnf gives the baseline form")
    ap.add_argument("--only", nargs="*", default=None, help="regex names to run (default: all)")
    ap.add_argument("--sound-check", type=int, default=64,
                    help="mask-allowed tokens checked against the form's matcher per position (0 = every one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.forms[0] != "ours":
        args.forms = ["ours"] + [f for f in args.forms if f != "ours"]

    import torch
    import xgrammar as xgr

    from constraint_service.backend.xgrammar_backend import XGrammarBackend
    from constraint_service.regex import ast_to_expr, full_ast, parse_regex, regex_to_ebnf
    from constraint_service.vocab import Vocabulary
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    vocab = Vocabulary.from_any(load_vocabulary_from_gguf(args.model))
    be = XGrammarBackend(vocab)
    eos = set(vocab.eos_ids)
    regexes = dict(CURATED)
    if args.jsb:
        regexes.update(jsb_patterns(args.jsb))
    if args.only:
        regexes = {k: v for k, v in regexes.items() if k in args.only}
    baseline_text: dict = {}
    if args.baseline_tree:
        if "baseline" not in args.forms:
            args.forms.append("baseline")
        import subprocess

        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from constraint_service.regex import regex_to_ebnf\n"
                "out = {}\nfor k, p in json.loads(sys.stdin.read()).items():\n"
                "    try: out[k] = regex_to_ebnf(p)\n    except Exception as e: out[k] = None\nprint(json.dumps(out))")
        baseline_text = json.loads(subprocess.run([sys.executable, "-c", code, str(Path(args.baseline_tree).resolve())],
                                                  input=json.dumps(regexes), capture_output=True, text=True,
                                                  check=True, cwd="/").stdout)
    elif "baseline" in args.forms:
        ap.error("--forms baseline needs --baseline-tree")

    def compile_form(form: str, pattern: str, name: str):
        """(xgrammar CompiledGrammar, compile ms) or (None, error text)."""
        t = time.perf_counter()
        try:
            if form == "baseline":
                text = baseline_text.get(name)
                if text is None:
                    return None, "the baseline tree refused it"
                t = time.perf_counter()
                cg = be.compile(be.parse_ebnf(text, kind="InvalidRegex"), kind="regex", key=(), threads=1)._compiled
            elif form == "xgrammar":
                cg = xgr.GrammarCompiler(be.tokenizer_info, max_threads=1, cache_enabled=False).compile_regex(pattern)
            else:
                text = regex_to_ebnf(pattern) if form == "ours" else \
                    "root ::= " + ast_to_expr(full_ast(parse_regex(pattern)), json_mode=False) + "\n"
                cg = be.compile(be.parse_ebnf(text, kind="InvalidRegex"), kind="regex", key=(), threads=1)._compiled
        except Exception as e:  # noqa: BLE001 - a form that refuses a regex is recorded, not fatal
            return None, f"{type(e).__name__}: {str(e)[:200]}"
        return cg, (time.perf_counter() - t) * 1e3

    def allowed(bm) -> np.ndarray:
        bits = np.unpackbits(bm.numpy()[0].view(np.uint8), bitorder="little")[: vocab.vocab_size]
        return np.flatnonzero(bits)

    header = run_header("cpu", args=vars(args), vocab_size=vocab.vocab_size)
    results = {}
    print(f"{'regex':16s} {'form':10s} {'compile ms':>10s} {'mask mean us':>12s} {'p50':>7s} {'p99':>8s} "
          f"{'diffs':>5s} {'unsound':>7s}")
    for name, pattern in regexes.items():
        rng = np.random.default_rng(args.seed)
        compiled = {f: compile_form(f, pattern, name) for f in args.forms}
        ours = compiled["ours"][0]
        rec = dict(pattern=pattern, forms={})
        if ours is None:
            rec["error"] = compiled["ours"][1]
            results[name] = rec
            print(f"{name:16s} ours refused: {compiled['ours'][1]}")
            continue
        # the trajectory, on ours' masks
        bm = torch.zeros((1, be.num_words), dtype=torch.int32)
        m = xgr.GrammarMatcher(ours)
        traj: list[int] = []
        ref_masks = []
        while len(traj) < args.tokens:
            m.fill_next_token_bitmask(bm, 0)
            ref_masks.append(bm.numpy()[0].copy())
            ids = allowed(bm)
            non_eos = [int(t) for t in ids if int(t) not in eos]
            if not non_eos:
                break
            tok = int(rng.choice(non_eos))
            assert m.accept_token(tok), (name, tok)
            traj.append(tok)
        for form in args.forms:
            cg, info = compiled[form]
            if cg is None:
                rec["forms"][form] = dict(error=info)
                print(f"{name:16s} {form:10s} refused: {info[:80]}")
                continue
            per_pass = []
            diffs = unsound = 0
            for rep in range(args.repeats):
                m = xgr.GrammarMatcher(cg)
                times = []
                for i in range(len(ref_masks)):
                    t = time.perf_counter()
                    m.fill_next_token_bitmask(bm, 0)
                    times.append(time.perf_counter() - t)
                    if rep == 0:
                        row = bm.numpy()[0]
                        if form != "ours" and not np.array_equal(row, ref_masks[i]):
                            diffs += 1
                        ids = allowed(bm)
                        k = len(ids) if args.sound_check <= 0 else min(args.sound_check, len(ids))
                        for tok in (rng.choice(ids, size=k, replace=False) if k < len(ids) else ids):
                            if m.accept_token(int(tok)):
                                m.rollback(1)
                            elif int(tok) not in eos:
                                unsound += 1
                    if i < len(traj) and not m.accept_token(traj[i]):
                        break  # a form whose language differs: the rest of the trajectory is not its own
                per_pass.append(times)
            n = min(len(p) for p in per_pass)
            med = [statistics.median(p[i] for p in per_pass) * 1e6 for i in range(n)]
            rec["forms"][form] = dict(compile_ms=info, mask_us_mean=statistics.fmean(med), mask_us_p50=pct(med, 50),
                                      mask_us_p99=pct(med, 99), mask_us_max=max(med), masks=n, mask_diffs=diffs,
                                      unsound=unsound)
            f = rec["forms"][form]
            print(f"{name:16s} {form:10s} {info:10.1f} {f['mask_us_mean']:12.1f} {f['mask_us_p50']:7.1f} "
                  f"{f['mask_us_p99']:8.1f} {diffs:5d} {unsound:7d}", flush=True)
        results[name] = rec

    summary = {}
    for form in args.forms:
        ok = [r["forms"][form] for r in results.values() if "mask_us_mean" in r.get("forms", {}).get(form, {})]
        both = [(r["forms"][form]["mask_us_mean"], r["forms"]["ours"]["mask_us_mean"],
                 r["forms"][form]["compile_ms"], r["forms"]["ours"]["compile_ms"]) for r in results.values()
                if "mask_us_mean" in r.get("forms", {}).get(form, {}) and "mask_us_mean" in r["forms"].get("ours", {})]
        summary[form] = dict(
            regexes=len(ok), mask_us_mean_of_means=statistics.fmean(x["mask_us_mean"] for x in ok) if ok else None,
            compile_ms_p50=pct([x["compile_ms"] for x in ok], 50), unsound_total=sum(x["unsound"] for x in ok),
            regexes_unsound=sum(1 for x in ok if x["unsound"]), mask_diffs_total=sum(x["mask_diffs"] for x in ok),
            mask_ratio_to_ours_geomean=float(np.exp(np.mean([np.log(a / b) for a, b, _, _ in both]))) if both else None,
            mask_ratio_to_ours_max=max((a / b for a, b, _, _ in both), default=None),
            compile_ratio_to_ours_geomean=float(np.exp(np.mean([np.log(c / d) for _, _, c, d in both]))) if both else None)
    print("\nsummary (ratio = form / ours, geometric mean over the regexes both compiled):")
    for form, s in summary.items():
        print(f"  {form:10s} regexes {s['regexes']:3d}  mean of per-regex mask means {s['mask_us_mean_of_means'] or 0:8.1f} us"
              f"  compile p50 {s['compile_ms_p50']:7.1f} ms  mask ratio {s['mask_ratio_to_ours_geomean'] or 0:5.2f}"
              f" (max {s['mask_ratio_to_ours_max'] or 0:7.1f})  compile ratio {s['compile_ratio_to_ours_geomean'] or 0:5.2f}"
              f"  unsound {s['unsound_total']} in {s['regexes_unsound']} regexes  mask diffs {s['mask_diffs_total']}")
    out = results_path("regex_bench", "cpu", args.out)
    out.write_text(json.dumps(dict(header, summary=summary, results=results), indent=1))
    print(f"wrote {out}")
    _plot(results, args.forms, out.with_suffix(".png"))
    return 0


def _plot(results: dict, forms: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    for form, marker in zip(forms[1:], "os^"):
        pts = [(r["forms"]["ours"]["mask_us_mean"], r["forms"][form]["mask_us_mean"]) for r in results.values()
               if "mask_us_mean" in r.get("forms", {}).get(form, {}) and "mask_us_mean" in r["forms"].get("ours", {})]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, label=form, alpha=0.7)
    lo, hi = ax.get_xlim()[0], max(ax.get_xlim()[1], ax.get_ylim()[1])
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="equal")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ours (DFA form): mean us per mask")
    ax.set_ylabel("other form: mean us per mask")
    ax.set_title("Regex constraint masks, per regex (SmolLM2 vocabulary)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
