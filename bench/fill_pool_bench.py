"""xgrammar's batch mask fill vs a persistent pool of Python threads, per call size and thread count.

usage: python bench/fill_pool_bench.py [--model GGUF] [--rows 16 64 128] [--threads 1 2 4 8] [--reps 300]
                                     [--walk 30] [--seed 0] [--out FILE.json]

The question (issue 12 "No stall on expensive rows"): xgrammar's ``BatchGrammarMatcher`` pays a fixed cost per
call for its threads; would our own persistent threads, each calling ``GrammarMatcher.fill_next_token_bitmask``
(which runs without the GIL) for its share of the rows, fill a Step's rows sooner?

Matchers: the ``bench/schemas_sample.json`` schemas compiled with xgrammar's ``compile_json_schema`` on the
SmolLM2 vocabulary, cycled over ``max(--rows)`` rows, each walked 0..``--walk`` random legal tokens (fixed
seed, EOS excluded) so the rows sit at different grammar states. Per (rows, threads): three ways to fill rows
``0..rows-1`` of one ``[rows, W]`` int32 tensor, each called 30 times to warm up and then ``--reps`` times:

* ``batch``: ``BatchGrammarMatcher(threads).batch_fill_next_token_bitmask``;
* ``pool``: a ``ThreadPoolExecutor(threads - 1)`` (at least 1) made once per (rows, threads); the calling thread
  fills every ``threads``-th row itself and waits for the pool's ``threads - 1`` shares;
* ``serial``: one ``fill_next_token_bitmask`` per row on the calling thread (independent of ``threads``).

Every way's bitmask must equal the serial one. Reported: p50 and p90 microseconds per call; JSON with the
run header (date, device, command, revision).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _timed(fn, reps: int) -> dict:
    for _ in range(30):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return {"p50_us": float(np.median(ts) * 1e6), "p90_us": float(np.percentile(ts, 90) * 1e6)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--walk", type=int, default=30, help="at most this many random legal tokens per row first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    import xgrammar as xgr

    from bench_common import results_path, run_header
    from constraint_service.backend.xgrammar_backend import XGrammarBackend
    from constraint_service.vocab import Vocabulary
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    vocab = Vocabulary.from_any(load_vocabulary_from_gguf(args.model))
    backend = XGrammarBackend(vocab, fill_threads=1)
    compiler = xgr.GrammarCompiler(backend.tokenizer_info, max_threads=4, cache_enabled=False)
    schemas = json.loads((ROOT / "bench" / "schemas_sample.json").read_text())["schemas"]
    compiled = [compiler.compile_json_schema(json.dumps(s), any_whitespace=False) for s in schemas]
    W, V, eos = backend.num_words, vocab.vocab_size, set(vocab.eos_ids)
    rng = random.Random(args.seed)

    def walked(cg):
        m = xgr.GrammarMatcher(cg)
        bm = torch.zeros((1, W), dtype=torch.int32)
        for _ in range(rng.randint(0, args.walk)):
            m.fill_next_token_bitmask(bm)
            legal = np.unpackbits(bm.numpy().view(np.uint8), bitorder="little")[:V].nonzero()[0]
            legal = [int(t) for t in legal if int(t) not in eos]
            if not legal:
                break
            m.accept_token(rng.choice(legal))
        return m

    n_max = max(args.rows)
    matchers = [walked(compiled[i % len(compiled)]) for i in range(n_max)]
    out = torch.zeros((n_max, W), dtype=torch.int32)
    res = run_header("cpu", rows=args.rows, threads=args.threads, reps=args.reps, walk=args.walk, seed=args.seed,
                     schemas=len(schemas), vocab_size=V, results=[])
    print(f"{'rows':>5} {'threads':>7} {'batch p50':>10} {'pool p50':>10} {'serial p50':>11}   (us per call)")
    for rows in args.rows:
        ms, idx = matchers[:rows], list(range(rows))

        def serial():
            for i, m in zip(idx, ms):
                m.fill_next_token_bitmask(out, i)

        t_serial = _timed(serial, args.reps)
        ref = out[:rows].clone()
        for n in args.threads:
            batch = xgr.BatchGrammarMatcher(n)
            out.zero_()
            t_batch = _timed(lambda: batch.batch_fill_next_token_bitmask(ms, out, idx), args.reps)
            assert torch.equal(out[:rows], ref), "batch fill differs from the serial fill"
            shares = [(ms[k::n], idx[k::n]) for k in range(n)]

            def work(share):
                for m, i in zip(*share):
                    m.fill_next_token_bitmask(out, i)

            with ThreadPoolExecutor(max(1, n - 1)) as pool:
                def pooled():
                    futures = [pool.submit(work, s) for s in shares[1:]]
                    work(shares[0])
                    for f in futures:
                        f.result()

                out.zero_()
                t_pool = _timed(pooled, args.reps)
            assert torch.equal(out[:rows], ref), "pool fill differs from the serial fill"
            res["results"].append(dict(rows=rows, threads=n, batch=t_batch, pool=t_pool, serial=t_serial))
            print(f"{rows:5d} {n:7d} {t_batch['p50_us']:10.1f} {t_pool['p50_us']:10.1f} {t_serial['p50_us']:11.1f}"
                  f"   (p90 batch {t_batch['p90_us']:.0f}, pool {t_pool['p90_us']:.0f})")
    path = results_path("fill_pool_bench", "cpu", args.out)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
