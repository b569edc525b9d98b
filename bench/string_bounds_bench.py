"""Bounded JSON strings (``maxLength``): compile time and per-token mask time of our grammar vs xgrammar's own.

usage: python bench/string_bounds_bench.py [--bounds 16 64 100 128 200 256 300 1000] [--repeats 3]
                                           [--model GGUF] [--out FILE.json]

Per bound n, the schema ``{"type": "string", "maxLength": n}`` on the SmolLM2 vocabulary (``--model``):

* **ours**: ``json_schema_to_ebnf`` then xgrammar ``compile_grammar`` (one thread, no cache): its wall time;
* **xgr**: xgrammar's ``compile_json_schema`` of the same schema (compact, one thread, no cache). Its
  language is not the same: it leaves escapes out of bounded strings and lets raw control characters in
  (``root_characters ::= [^"\\\\\\r\\n]``), which is why it can use its fast counted repetition of one
  character class; it is here as the speed reference only.

Trajectories: two JSON strings of n characters, words (``"word "`` repeated) and letters
(``"abcdefghij"`` repeated), tokenised greedily into the longest vocabulary tokens, then the closing quote.
Each grammar fills one mask (``fill_next_token_bitmask`` into a ``[1, W]`` int32 tensor) per token,
``--repeats`` passes with a fresh matcher; per token the median over passes; reported per bound and
trajectory: mean and max microseconds per mask, and the characters read before the slowest mask.
Every token must be accepted. Output: a table and JSON with the run header (date, device, command,
revision).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TEXTS = {"words": "word ", "letters": "abcdefghij"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bounds", type=int, nargs="+", default=[16, 64, 100, 128, 200, 256, 300, 1000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    import xgrammar as xgr

    from bench_common import results_path, run_header
    from constraint_service.backend.xgrammar_backend import XGrammarBackend
    from constraint_service.json_schema import json_schema_to_ebnf
    from constraint_service.vocab import Vocabulary
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    vocab = Vocabulary.from_any(load_vocabulary_from_gguf(args.model))
    backend = XGrammarBackend(vocab, fill_threads=1)
    W = backend.num_words
    by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if b and i not in vocab.special_ids}
    longest = max(map(len, by_bytes))

    def tokens(text: str) -> list[int]:
        data, out, i = text.encode(), [], 0
        while i < len(data):
            for n in range(min(longest, len(data) - i), 0, -1):
                if data[i:i + n] in by_bytes:
                    out.append(by_bytes[data[i:i + n]])
                    i += n
                    break
            else:
                raise SystemExit(f"no token for byte {data[i]!r}")
        return out

    def masks(compiled, ids: list[int]) -> dict:
        bm = torch.zeros((1, W), dtype=torch.int32)
        passes = []
        for _ in range(args.repeats):
            m = xgr.GrammarMatcher(compiled)
            ts = []
            for t in ids:
                a = time.perf_counter_ns()
                m.fill_next_token_bitmask(bm)
                ts.append(time.perf_counter_ns() - a)
                if not m.accept_token(t):
                    raise SystemExit(f"token {t} rejected")
            passes.append(ts)
        per_token = np.median(np.array(passes), axis=0) / 1e3
        chars = np.cumsum([0] + [len(vocab.token_bytes[t]) for t in ids])[:-1]
        worst = int(np.argmax(per_token))
        return {"mean_us": float(per_token.mean()), "max_us": float(per_token.max()),
                "chars_before_max": int(chars[worst]), "tokens": len(ids)}

    compiler = xgr.GrammarCompiler(backend.tokenizer_info, max_threads=1, cache_enabled=False)
    res = run_header("cpu", bounds=args.bounds, repeats=args.repeats, vocab_size=vocab.vocab_size, results=[])
    print(f"{'maxLength':>9} {'grammar':>7} {'compile ms':>10}  " +
          "  ".join(f"{k + ' mean/max us':>24}" for k in TEXTS))
    for n in args.bounds:
        schema = json.dumps({"type": "string", "maxLength": n})
        traj = {k: tokens(json.dumps((unit * (n // len(unit) + 1))[:n])) for k, unit in TEXTS.items()}
        t = time.perf_counter()
        ours = compiler.compile_grammar(xgr.Grammar.from_ebnf(json_schema_to_ebnf(schema)))
        ours_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        lib = compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=False)
        lib_ms = (time.perf_counter() - t) * 1e3
        for name, compiled, ms in (("ours", ours, ours_ms), ("xgr", lib, lib_ms)):
            row = {"max_length": n, "grammar": name, "compile_ms": ms,
                   **{k: masks(compiled, ids) for k, ids in traj.items()}}
            res["results"].append(row)
            cells = "  ".join(f"{row[k]['mean_us']:11.1f} / {row[k]['max_us']:9.1f}" for k in TEXTS)
            print(f"{n:9d} {name:>7} {ms:10.0f}  {cells}", flush=True)
    path = results_path("string_bounds_bench", "cpu", args.out)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
