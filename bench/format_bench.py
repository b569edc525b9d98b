"""Compile time and per-token mask cost of `format` string schemas (issue 13: leap seconds, hostname).

usage: python bench/format_bench.py [--formats date-time time hostname] [--repeats 5] [--model GGUF] [--out FILE]

Per format, the schema {"type": "string", "format": F} goes through the project's converter
(``json_schema_to_ebnf``) and xgrammar ``GrammarCompiler(max_threads=1, cache_enabled=False)`` on the
SmolLM2 vocabulary: cold compile seconds (``--repeats`` fresh compiles, median).  Masks: every
instance of F below (valid ones, leap seconds and the longest hostname labels included) is serialised as a
JSON string, tokenised with the model tokenizer, then EOS; per position one ``fill_next_token_bitmask``
into a ``[1, W]`` int32 tensor is timed (``time.perf_counter_ns``), then ``accept_token``.  Reported:
median and max per-token microseconds over all positions of all instances, pooled over ``--repeats``
passes; an instance the grammar refuses is listed under `refused` (its positions up to the refusal count).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

INSTANCES = {
    "date-time": ["1963-06-19T08:30:06.283185Z", "1998-12-31T23:59:60Z", "1998-12-31T15:59:60.123-08:00",
                  "2024-02-29T00:00:00+05:30"],
    "time": ["08:30:06Z", "23:59:60Z", "01:29:60+01:30", "12:00:00.5-02:00"],
    "hostname": ["www.example.com", "a" * 63 + ".com", "a-b.c-d.e-f.g-h", "xn-a.example"],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", nargs="+", default=list(INSTANCES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    import torch
    import xgrammar as xgr
    from constraint_service.json_schema import json_schema_to_ebnf
    from gpu_engine.model.tokenizer import NInferTokenizer
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    model = os.path.expanduser(args.model)
    vocab = load_vocabulary_from_gguf(model)
    tok = NInferTokenizer.from_gguf(model)
    toks = [b"" if i in vocab.special_ids else vocab.token_bytes[i] for i in range(len(vocab.token_bytes))]
    info = xgr.TokenizerInfo(toks, vocab_type=xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                             stop_token_ids=list(vocab.eos_ids))
    eos = vocab.eos_ids[0]
    bm = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    rows = {}
    for fmt in args.formats:
        ebnf = json_schema_to_ebnf(json.dumps({"type": "string", "format": fmt}))
        compile_s = []
        compiled = None
        for _ in range(args.repeats):
            gc = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            t0 = time.perf_counter()
            compiled = gc.compile_grammar(ebnf)
            compile_s.append(time.perf_counter() - t0)
        per_tok = []
        refused = set()
        for _ in range(args.repeats):
            for inst in INSTANCES.get(fmt, []):
                traj = tok.encode(json.dumps(inst)) + [eos]
                m = xgr.GrammarMatcher(compiled)
                for t in traj:
                    t0 = time.perf_counter_ns()
                    m.fill_next_token_bitmask(bm)
                    per_tok.append((time.perf_counter_ns() - t0) / 1000)
                    if not m.accept_token(t):
                        refused.add(inst)  # recorded (a completeness miss of that revision)
                        break
        rows[fmt] = {"ebnf_chars": len(ebnf), "rules": ebnf.count("::="),
                     "compile_ms_median": round(1000 * statistics.median(compile_s), 1),
                     "mask_us_median": round(statistics.median(per_tok), 2), "mask_us_max": round(max(per_tok), 1),
                     "positions": len(per_tok), "instances": INSTANCES.get(fmt, []), "refused": sorted(refused)}
        print(fmt, {k: v for k, v in rows[fmt].items() if k != "instances"}, flush=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "constraint_service"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python"] + sys.argv), "revision": rev + ("+dirty" if dirty else ""),
              "repeats": args.repeats, "formats": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
