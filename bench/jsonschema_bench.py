"""JSON Schema contract benchmark (issue 4): coverage, soundness, completeness, fuzz.

usage: python bench/jsonschema_bench.py DATAFILE [--limit N] [--sample N --seed S] [--out results.json]
                                        [--fuzz-walks N] [--fuzz-sample N] [--fuzz-max-tokens N]

DATAFILE: a .jsonl(.gz) file of records with `schema` and `tests: [{data, valid}]` (JSONSchemaBench
MaskBench format with `id` "<Subset>---<name>", or the JSON Schema Test Suite format with `file`).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import xgrammar as xgr  # noqa: E402

from constraint_service.errors import ConstraintError  # noqa: E402
from constraint_service.json_schema import canonicalize, json_schema_to_ebnf  # noqa: E402


def load_records(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    for r in recs:
        # Test Suite draft7 groups are meant to be read as draft-07: declare it (the service's default is 2020-12)
        if r.get("file", "").startswith("draft7/") and isinstance(r["schema"], dict) and "$schema" not in r["schema"]:
            r["schema"] = {"$schema": "http://json-schema.org/draft-07/schema#", **r["schema"]}
    return recs


def subset_of(rec) -> str:
    if "file" in rec:
        return rec["file"].split("/")[0]
    rid = rec.get("id", "")
    if "---" in rid:
        return rid.split("---")[0]
    return rid.split("_")[0] or "unknown"


def category_of(rec) -> str:
    if "file" in rec:
        return rec["file"].split("/")[-1].rsplit(".", 1)[0]
    return subset_of(rec)


def serialise(schema, data) -> bytes:
    return json.dumps(canonicalize(schema, data), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_NULL_COMPILER = None


def null_compiler():
    global _NULL_COMPILER
    if _NULL_COMPILER is None:
        _NULL_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)
    return _NULL_COMPILER


def accepts(compiled, data: bytes) -> bool:
    m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(m.accept_string(data)) and m.is_completed()


UNKNOWN_KEYWORDS = "reject"


def evaluate_record(rec, *, want_ebnf=False):
    """Returns a dict: status, kind, location, sound_violations, valid_total, valid_accepted, ..."""
    schema = rec["schema"]
    src = json.dumps(schema, ensure_ascii=False)
    out = {"id": rec.get("id") or f'{rec.get("file")}::{rec.get("description")}',
           "subset": subset_of(rec), "category": category_of(rec)}
    t0 = time.perf_counter()
    try:
        ebnf = json_schema_to_ebnf(src, unknown_keywords=UNKNOWN_KEYWORDS)
        compiled = null_compiler().compile_grammar(ebnf)
    except ConstraintError as e:
        out.update(status="rejected", kind=e.kind, location=e.location, message=e.message[:200])
        out["convert_s"] = time.perf_counter() - t0
        return out, None
    except Exception as e:  # a bug: count it separately, never as coverage
        out.update(status="error", kind=type(e).__name__, message=str(e)[:300])
        return out, None
    out["convert_s"] = time.perf_counter() - t0
    out["status"] = "accepted"
    vt = va = it = iv = 0
    violations = []
    misses = []
    for t in rec.get("tests", []):
        try:
            data = serialise(schema, t["data"])
        except (ValueError, TypeError):
            continue
        ok = accepts(compiled, data)
        if t["valid"]:
            vt += 1
            va += ok
            if not ok and len(misses) < 3:
                misses.append(data.decode("utf-8", "replace")[:200])
        else:
            it += 1
            if ok:
                iv += 1
                violations.append(data.decode("utf-8", "replace")[:300])
    out.update(valid_total=vt, valid_accepted=va, invalid_total=it, invalid_accepted=iv)
    if violations:
        out["violations"] = violations
    if misses:
        out["misses"] = misses
    return out, (ebnf if want_ebnf else None)


# ---- fuzz --------------------------------------------------------------------

class Fuzzer:
    def __init__(self, model_path, max_tokens, seed):
        from gpu_engine.model.vocab import load_vocabulary_from_gguf
        vocab = load_vocabulary_from_gguf(os.path.expanduser(model_path))
        toks = [b"" if i in vocab.special_ids else vocab.token_bytes[i] for i in range(len(vocab.token_bytes))]
        self.info = xgr.TokenizerInfo(toks, vocab_type=xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                      stop_token_ids=list(vocab.eos_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.toks = toks
        self.eos = set(vocab.eos_ids)
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        import numpy as np
        self.np = np

    def walks(self, schema, ebnf, n):
        import jsonschema
        np = self.np
        compiled = self.compiler.compile_grammar(ebnf)
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator = validator_cls(schema)
        res = {"walks": 0, "completed": 0, "failures": 0, "examples": []}
        bm = xgr.allocate_token_bitmask(1, self.info.vocab_size)
        for _ in range(n):
            m = xgr.GrammarMatcher(compiled)
            out = bytearray()
            res["walks"] += 1
            for step in range(self.max_tokens):
                m.fill_next_token_bitmask(bm)
                words = bm[0].numpy().view(np.uint32)
                bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.info.vocab_size]
                allowed = np.flatnonzero(bits)
                if len(allowed) == 0:
                    break
                stops = [i for i in allowed if i in self.eos]
                if stops and step >= self.max_tokens // 2:
                    tok = int(stops[0])
                else:
                    tok = int(allowed[self.rng.randrange(len(allowed))])
                if not m.accept_token(tok):
                    res["failures"] += 1
                    res["examples"].append({"error": "mask allowed a rejected token", "out": out.decode("utf-8", "replace")[:200]})
                    break
                if tok in self.eos:
                    break
                out += self.toks[tok]
            if m.is_terminated():
                res["completed"] += 1
                try:
                    value = json.loads(out.decode("utf-8"))
                    errs = list(validator.iter_errors(value))
                    if errs:
                        raise ValueError(errs[0].message)
                except Exception as e:  # noqa: BLE001
                    res["failures"] += 1
                    if len(res["examples"]) < 3:
                        res["examples"].append({"out": out.decode("utf-8", "replace")[:300], "error": str(e)[:200]})
        return res


# ---- main --------------------------------------------------------------------

def summarise(rows):
    def block(rs):
        n = len(rs)
        acc = [r for r in rs if r["status"] == "accepted"]
        kinds = collections.Counter(r["kind"] for r in rs if r["status"] != "accepted")
        vt = sum(r.get("valid_total", 0) for r in acc)
        va = sum(r.get("valid_accepted", 0) for r in acc)
        it = sum(r.get("invalid_total", 0) for r in acc)
        iv = sum(r.get("invalid_accepted", 0) for r in acc)
        allpass = sum(1 for r in acc if r.get("invalid_accepted", 0) == 0 and r.get("valid_accepted", 0) == r.get("valid_total", 0))
        return {"schemas": n, "accepted": len(acc), "coverage": round(len(acc) / n, 4) if n else 0.0,
                "rejected_by_kind": dict(kinds), "valid_instances": vt, "valid_accepted": va,
                "completeness": round(va / vt, 4) if vt else None, "invalid_instances": it,
                "soundness_violations": iv, "schemas_all_pass": allpass,
                "fuzz_walks": sum(r.get("fuzz", {}).get("walks", 0) for r in rs),
                "fuzz_completed": sum(r.get("fuzz", {}).get("completed", 0) for r in rs),
                "fuzz_failures": sum(r.get("fuzz", {}).get("failures", 0) for r in rs)}
    total = block(rows)
    by_subset = {s: block([r for r in rows if r["subset"] == s]) for s in sorted({r["subset"] for r in rows})}
    return total, by_subset


def category_table(rows):
    table = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        c = r["category"]
        if r["status"] != "accepted":
            table[c]["rejected"] += 1
        elif r.get("invalid_accepted", 0):
            table[c]["under-constrained"] += 1
        elif r.get("valid_accepted", 0) < r.get("valid_total", 0):
            table[c]["over-constrained"] += 1
        else:
            table[c]["all-pass"] += 1
    return {c: dict(v) for c, v in sorted(table.items())}


def print_table(title, total, by_subset):
    print(f"\n== {title}")
    hdr = f"{'subset':28} {'schemas':>7} {'accept':>7} {'cover':>6} {'valid':>7} {'compl':>6} {'invalid':>7} {'viol':>5} {'fuzzW':>6} {'fuzzF':>5}"
    print(hdr)
    for name, b in list(by_subset.items()) + [("TOTAL", total)]:
        comp = "-" if b["completeness"] is None else f"{b['completeness']:.3f}"
        print(f"{name[:28]:28} {b['schemas']:>7} {b['accepted']:>7} {b['coverage']:>6.3f} {b['valid_instances']:>7} {comp:>6} "
              f"{b['invalid_instances']:>7} {b['soundness_violations']:>5} {b['fuzz_walks']:>6} {b['fuzz_failures']:>5}")
    print("rejected by kind:", total["rejected_by_kind"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datafile")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--fuzz-walks", type=int, default=0, help="random walks per fuzzed schema")
    ap.add_argument("--fuzz-sample", type=int, default=None, help="fuzz only this many accepted schemas (seeded)")
    ap.add_argument("--fuzz-max-tokens", type=int, default=192)
    ap.add_argument("--model", default="~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--rows", action="store_true", help="include per-schema rows in the JSON output")
    ap.add_argument("--unknown-keywords", choices=["reject", "annotate"], default="reject")
    args = ap.parse_args(argv)
    global UNKNOWN_KEYWORDS
    UNKNOWN_KEYWORDS = args.unknown_keywords

    recs = load_records(args.datafile)
    if args.sample is not None and args.sample < len(recs):
        recs = random.Random(args.seed).sample(recs, args.sample)
    if args.limit is not None:
        recs = recs[: args.limit]
    t0 = time.time()
    rows = []
    ebnfs = {}
    for i, rec in enumerate(recs):
        row, ebnf = evaluate_record(rec, want_ebnf=args.fuzz_walks > 0)
        rows.append(row)
        if ebnf is not None:
            ebnfs[i] = ebnf
        if (i + 1) % 500 == 0:
            print(f"... {i + 1}/{len(recs)} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    if args.fuzz_walks > 0 and ebnfs:
        fz = Fuzzer(args.model, args.fuzz_max_tokens, args.seed)
        idx = sorted(ebnfs)
        if args.fuzz_sample is not None and args.fuzz_sample < len(idx):
            idx = sorted(random.Random(args.seed + 1).sample(idx, args.fuzz_sample))
        for k, i in enumerate(idx):
            try:
                rows[i]["fuzz"] = fz.walks(recs[i]["schema"], ebnfs[i], args.fuzz_walks)
            except Exception as e:  # noqa: BLE001
                rows[i]["fuzz"] = {"walks": 0, "completed": 0, "failures": 0, "error": str(e)[:200]}
            if (k + 1) % 200 == 0:
                print(f"... fuzz {k + 1}/{len(idx)} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    total, by_subset = summarise(rows)
    result = {"datafile": os.path.basename(args.datafile), "records": len(recs), "seconds": round(time.time() - t0, 1),
              "unknown_keywords": args.unknown_keywords, "fuzz_walks_per_schema": args.fuzz_walks, "fuzz_max_tokens": args.fuzz_max_tokens,
              "total": total, "by_subset": by_subset,
              "anchors": {"maskbench_llguidance": "8,909 of 11,306 passed, 0 invalid accepted",
                          "maskbench_xgrammar": "8,122 of 11,306 passed, 1,368 invalid accepted"}}
    if any("file" in r for r in recs):
        result["test_suite_categories"] = category_table(rows)
    result["violations"] = [{"id": r["id"], "instances": r["violations"]} for r in rows if r.get("violations")]
    result["errors"] = [{"id": r["id"], "kind": r["kind"], "message": r["message"]} for r in rows if r["status"] == "error"]
    result["fuzz_failures"] = [{"id": r["id"], **r["fuzz"]} for r in rows if r.get("fuzz", {}).get("failures")]
    result["rejection_locations"] = dict(collections.Counter(
        re.sub(r"/(properties|\$defs|definitions)/[^/]+", r"/\1/*", r.get("location", "")).split("/")[-1] + ":" + r["kind"]
        for r in rows if r["status"] == "rejected").most_common(40))
    if args.rows:
        result["rows"] = rows
    print_table(os.path.basename(args.datafile), total, by_subset)
    if "test_suite_categories" in result:
        print("\ncategory                          all-pass over under rejected")
        for c, v in result["test_suite_categories"].items():
            print(f"{c[:32]:32} {v.get('all-pass', 0):>8} {v.get('over-constrained', 0):>4} {v.get('under-constrained', 0):>5} {v.get('rejected', 0):>8}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
    return result


if __name__ == "__main__":
    main()
