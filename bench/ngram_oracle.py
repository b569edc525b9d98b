"""Prompt-lookup (n-gram) drafting replayed on real greedy outputs: which drafts a greedy verifier accepts.

usage:
  python bench/ngram_oracle.py [--workloads json_schema json_schema_jsb] [--jsb 32] [--max-tokens 128]
  python bench/ngram_oracle.py --replay bench/results/ngram_oracle_cpu.json   # tables again from its outputs

Greedy speculative decoding commits exactly the tokens greedy decoding without speculation gives (the
engine's tests check this token for token), so the accepted length of a draft at output position ``t``
is known once those tokens are: the longest common prefix of the drafts and ``output[t:t + K]``. This
harness generates the greedy outputs once (the real engine and sidecar in this process, on the CPU, no
speculation; :mod:`spec_bench`'s prompts and JSONSchemaBench sample), then replays
:func:`gpu_engine.spec.drafters.ngram_propose` at every output position for each drafter setting
(``K``, ``min_n``, ``max_n``) and reports, per setting:

* the steps the engine takes over those outputs with that drafter (a step commits the accepted drafts
  plus one token): the share of speculative steps (a proposal was made), the accepted drafts per
  speculative step (overall and by the length of the matched n-gram) and the acceptance rate;
* a step-cost projection: a position with a proposal is a speculative step of cost ``r`` (in plain
  steps) committing ``accepted + 1`` tokens, one without is a plain step of cost 1 committing 1; the
  projected speed-up over plain decoding is ``tokens / cost``. ``r`` is the measured ratio of a
  speculative step's time to a plain step's (``--cost-ratios``; ``bench/results/spec_jsb_h200.json``
  gives about 1.4 at B = 1 on the H200). Prefill steps and batching are left out: the projection ranks
  settings, the engine benchmark (``spec_bench.py``) measures them.

Results: JSON with the outputs (token ids) and the tables, ``bench/results/ngram_oracle_<tag>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import run_header  # noqa: E402


def generate(args) -> list[dict]:
    """Greedy outputs of each workload's requests (no speculation), in-process engine on ``args.device``."""
    import spec_bench
    from bench_common import jsb_sample
    from gpu_engine.api.serve import build_parser, build_stack
    from gpu_engine.api.servicer import GenerationServicer

    sargs = build_parser().parse_args([
        "--port", str(args.port), "--device", args.device, "--model", args.model, "--max-lanes", str(args.batch),
        "--max-seq-len", str(args.max_seq_len), "--log-level", "WARNING"])
    engine, frontend, _ = build_stack(sargs)
    if engine.sidecar is not None:
        engine.sidecar.startup_timeout_s = max(engine.sidecar.startup_timeout_s, 600.0)
        engine.sidecar.start()
    svc = GenerationServicer(engine, frontend)
    seqs = []
    try:
        served: list = []  # the JSONSchemaBench requests, run to the end while the sample is checked
        if "json_schema_jsb" in args.workloads:
            spec_bench.prepare_jsb(engine, svc, jsb_sample(3 * args.jsb, max_chars=args.jsb_max_chars),
                                   n=args.jsb, max_tokens=args.max_tokens, served=served)
            seqs += [{"workload": "json_schema_jsb", "prompt_ids": list(r.prompt_ids),
                      "output_ids": list(r.output_ids)} for r in served]
        for workload in [w for w in args.workloads if w != "json_schema_jsb"]:
            n = len(spec_bench.PROMPTS)
            for start in range(0, n, args.batch):
                reqs = [svc.build_request(spec_bench._message(workload, i, [], "none", 0, args.max_tokens, 0.0))
                        for i in range(start, min(n, start + args.batch))]
                for r in reqs:
                    engine.submit(r)
                spec_bench._run_until_published(engine, reqs)
                for r in reqs:
                    seqs.append({"workload": workload, "prompt_ids": list(r.prompt_ids),
                                 "output_ids": list(r.output_ids)})
                print(f"  {workload}: {len(seqs)} outputs", flush=True)
    finally:
        engine.stop()
    return seqs


def match_length(context: list[int], max_n: int, min_n: int) -> int:
    """Length of the longest suffix n-gram (``min_n <= n <= max_n``) with an earlier occurrence; 0 if none
    (the n that :func:`ngram_propose` uses)."""
    from gpu_engine.spec.drafters import ngram_propose

    for n in range(max_n, min_n - 1, -1):
        if ngram_propose(context, 1, n, n):
            return n
    return 0


def walk(seqs: list[dict], k: int, min_n: int, max_n: int, max_tokens: int | None = None) -> list[tuple[int, int, int]]:
    """The engine's steps over the greedy outputs with this drafter: one ``(n, drafts, accepted)`` per step
    after each output's first token (``n`` = matched n-gram length, 0 and no drafts for a plain step); a
    step commits ``accepted + 1`` tokens (fewer at the output's end), as the greedy verifier does. The
    draft budget is the engine's (``Drafting._draft_budget``): at most ``k`` and ``max_tokens - len(output)
    - 1``, with ``max_tokens`` the output's own (``max_tokens`` key), else the argument, else its length
    (an output that stopped at its limit)."""
    from gpu_engine.spec.drafters import ngram_propose

    steps = []
    for s in seqs:
        out = s["output_ids"]
        if not out:
            continue
        limit = s.get("max_tokens") or max_tokens or len(out)
        ctx = list(s["prompt_ids"]) + [out[0]]
        t = 1
        while t < len(out):
            drafts = ngram_propose(ctx, max(0, min(k, limit - t - 1)), max_n, min_n)
            acc = 0
            while acc < len(drafts) and t + acc < len(out) and drafts[acc] == out[t + acc]:
                acc += 1
            steps.append((match_length(ctx, max_n, min_n) if drafts else 0, len(drafts), acc))
            n_commit = min(acc + 1, len(out) - t)
            ctx.extend(out[t:t + n_commit])
            t += n_commit
    return steps


def replay(seqs: list[dict], k: int, min_n: int, max_n: int, cost_ratios: list[float],
           max_tokens: int | None = None) -> dict:
    """One drafter setting over the outputs: speculative-step share, accepted drafts per speculative step
    (overall and by matched n-gram length) and the projected speed-up for each cost ratio ``r`` (a
    speculative step costs ``r`` plain steps)."""
    steps = walk(seqs, k, min_n, max_n, max_tokens)
    spec = [(n, d, a) for n, d, a in steps if d]
    tokens = sum(len(s["output_ids"]) - 1 for s in seqs if s["output_ids"])
    by_n: dict[int, list[int]] = {}
    for n, _, a in spec:
        by_n.setdefault(n, []).append(a)
    return {"k": k, "min_n": min_n, "max_n": max_n, "steps": len(steps), "spec_steps": len(spec),
            "spec_share": round(len(spec) / max(len(steps), 1), 4),
            "accepted_per_spec_step": round(sum(a for *_, a in spec) / max(len(spec), 1), 4),
            "acceptance_rate": round(sum(a for *_, a in spec) / max(sum(d for _, d, _ in spec), 1), 4),
            "by_match_length": {str(n): {"spec_steps": len(v), "accepted_per_spec_step": round(sum(v) / len(v), 4)}
                                for n, v in sorted(by_n.items())},
            # tokens / cost, cost = plain steps + r x speculative steps (plain decoding: 1 token per unit)
            "projected_speedup": {str(r): round(tokens / (len(steps) - len(spec) + r * len(spec)), 4)
                                  for r in cost_ratios}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--workloads", nargs="+", default=["json_schema", "json_schema_jsb"],
                    choices=["none", "json_schema", "json_schema_jsb"])
    ap.add_argument("--jsb", type=int, default=32)
    ap.add_argument("--jsb-max-chars", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8])
    ap.add_argument("--min-ns", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--max-ns", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--cost-ratios", type=float, nargs="+", default=[1.2, 1.4, 1.6])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--replay", metavar="JSON", help="replay the outputs saved in a results file")
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    if args.replay:
        doc = json.loads(Path(args.replay).read_text())
        seqs = doc["outputs"]
    else:
        import os

        args.port = args.port or 40000 + os.getpid() % 20000
        seqs = generate(args)
        doc = {**run_header(args.device, benchmark="ngram_oracle"), "max_tokens": args.max_tokens, "outputs": seqs}
    doc["settings"] = {}
    for workload in args.workloads:
        ws = [s for s in seqs if s["workload"] == workload]
        if not ws:
            continue
        rows = [replay(ws, k, mn, mx, args.cost_ratios, doc.get("max_tokens")) for k in args.ks for mx in args.max_ns for mn in args.min_ns
                if mn <= mx]
        doc["settings"][workload] = rows
        print(f"\n{workload}: {len(ws)} outputs, {sum(len(s['output_ids']) for s in ws)} tokens")
        print(f"{'K':>2} {'min_n':>5} {'max_n':>5} {'spec':>5} {'acc/step':>8} {'acc.rate':>8}  "
              + " ".join(f"{'r=' + str(r):>7}" for r in args.cost_ratios)
              + "   accepted per speculative step by matched n (steps)")
        for r in rows:
            print(f"{r['k']:>2} {r['min_n']:>5} {r['max_n']:>5} {r['spec_share']:>5.2f} "
                  f"{r['accepted_per_spec_step']:>8.2f} {r['acceptance_rate']:>8.3f}  "
                  + " ".join(f"{v:>7.2f}" for v in r["projected_speedup"].values()) + "   "
                  + ", ".join(f"n={n}: {v['accepted_per_spec_step']:.2f} ({v['spec_steps']})"
                              for n, v in r["by_match_length"].items()))
    out = Path(args.replay) if args.replay else Path(args.out_dir) / f"ngram_oracle_{args.tag}.json"
    doc["replay_command"] = " ".join([Path(sys.executable).name] + sys.argv) if args.replay else None
    out.write_text(json.dumps(doc) + "\n")  # a replay rewrites the tables of its own file
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
