"""CPU throughput through the real stack: batch 1 and 8, constrained vs unconstrained.

Starts ``python -m gpu_engine`` (which starts its constraint sidecar) on a free
port, then for each batch size sends that many concurrent ``Generate``
requests over gRPC for each constraint kind, side by side in one run, and
reports output tokens/s (sum of completion tokens / wall seconds), TTFT and
inter-token latency (client-side, from stream arrival times). A warm-up round
per kind is excluded (it also fills the compile cache, so constrained rows are
measured with cached grammars, as a steady-state service sees them).

Closed loop (issue 12): each of B client lanes sends its next request as soon as the previous one
ends; ``--requests-per-lane`` measured requests per lane (default 9 x 48 tokens >= 400 decode steps)
after one warm-up request per lane; ``--repeats`` (default 3) repeats with every kind interleaved in
each; medians and [min-max] spreads. Side by side in the same run: ``transformers`` ``generate`` on the
same weights (float32, default cache), unless ``--no-baseline``.

Usage: ``python bench/cpu_bench.py [--batches 1 8] [--max-tokens 48] [--repeats 3] [--kinds ...] [--hf-threads 0 1]
[--quick] [--out FILE.json] [--engine-args --cpu-threads 2]``
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "summary": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "summary", "tags"], "additionalProperties": False}
KINDS = {
    "unconstrained": None,
    "json_schema": {"json_schema": json.dumps(SCHEMA)},
    "gbnf": {"grammar": 'root ::= sentence (" " sentence)*\nsentence ::= [A-Z] [a-z ,]+ "."'},
    "regex": {"regex": r"[A-Za-z][A-Za-z ,']{10,400}\."},
}
PROMPT = "Write a short description of a lighthouse keeper's day."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, lanes: int, extra: list[str] = ()) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "gpu_engine", "--port", str(port), "--device", "cpu",
                          "--max-lanes", str(lanes), "--max-seq-len", "1024", "--log-level", "WARNING", *extra],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    ready = threading.Event()

    def pump() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            if "ninfer ready on" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(600):
        p.kill()
        raise RuntimeError("server did not start")
    return p


def _one(client, constraint, max_tokens: int, seed: int) -> dict:
    t0 = time.perf_counter()
    arrivals = []
    n = 0
    stream = client.generate(messages=[{"role": "user", "content": PROMPT}], constraint=constraint,
                             max_tokens=max_tokens, temperature=0.8, seed=seed)
    for ev in stream:
        if ev.token_ids:
            arrivals.append(time.perf_counter())
            n += len(ev.token_ids)
    res = stream.result
    assert res.error is None, res.error
    itl = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"tokens": res.usage["completion_tokens"], "ttft_s": (arrivals[0] - t0) if arrivals else float("nan"),
            "itl_s": itl, "finish": res.finish_reason}


def _closed_loop(c, constraint, b: int, per_worker: int, max_tokens: int, seed0: int) -> dict:
    """``b`` client threads, each sending ``per_worker + 1`` requests back to back (a finished request is
    replaced at once: closed loop, concurrency ``b``); each thread's first request is warm-up. tokens/s =
    completion tokens of the measured requests / wall time from the first measured request's start to the
    last one's end."""
    lock = threading.Lock()
    outs, starts, ends = [], [], []

    def worker(i: int) -> None:
        _one(c, constraint, max_tokens, seed0 + 1000 * i)  # warm-up request of this lane
        t = time.perf_counter()
        with lock:
            starts.append(t)
        for j in range(per_worker):
            o = _one(c, constraint, max_tokens, seed0 + 1000 * i + j + 1)
            with lock:
                outs.append(o)
        with lock:
            ends.append(time.perf_counter())

    with ThreadPoolExecutor(b) as ex:
        list(ex.map(worker, range(b)))
    wall = max(ends) - min(starts)
    toks = sum(o["tokens"] for o in outs)
    itl = [x for o in outs for x in o["itl_s"]]
    return {"tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall, "requests": len(outs),
            "ttft_p50_ms": 1e3 * statistics.median(o["ttft_s"] for o in outs),
            "itl_p50_ms": 1e3 * statistics.median(itl) if itl else float("nan"),
            "itl_p99_ms": 1e3 * sorted(itl)[int(0.99 * (len(itl) - 1))] if itl else float("nan")}


class HFBaseline:
    """``transformers`` ``generate`` on the same weights (SmolLM2 GGUF dequantised to float32, like the
    engine), same chat-rendered prompt, same sampling (temperature 0.8), its default (dynamic) KV cache
    as a user's plain ``generate`` call; B identical prompts per batch; tokens counted up to each row's EOS."""

    def __init__(self, model_name: str, dtypes: tuple[str, ...] = ("float32",)) -> None:
        import copy

        import torch
        import transformers

        from gpu_engine.hub.fetch import ensure_model
        from gpu_engine.model.gguf_loader import load_gguf_weights
        from gpu_engine.model.loader import load_tokenizer

        path = ensure_model(model_name)
        cfg, weights = load_gguf_weights(path)
        tok, chat = load_tokenizer(model_name)
        hf_cfg = transformers.LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rope_theta=cfg.rope_theta,
            rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
            max_position_embeddings=cfg.max_position, eos_token_id=list(tok.vocab.eos_ids))
        model = transformers.LlamaForCausalLM(hf_cfg)
        if cfg.tie_word_embeddings:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        model.load_state_dict(weights, strict=False)
        model = model.to(torch.float32).eval()
        #: dtype name -> model (one copy per dtype: ``--hf-dtypes``; float32 is what a user's plain load gives)
        self.models = {d: (model if d == "float32" else copy.deepcopy(model).to(getattr(torch, d))) for d in dtypes}
        self.prompt = tok.encode(chat.render([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
        self.eos = set(tok.vocab.eos_ids)
        self.torch = torch
        self.default_threads = torch.get_num_threads()

    def run(self, b: int, rounds: int, max_tokens: int, seed: int, threads: int = 0,
            dtype: str = "float32") -> dict:
        """``rounds`` timed ``generate`` calls of ``b`` rows after one warm-up call, with ``threads`` torch
        intra-op threads (0 = torch's default, what a user's plain call gets), on the ``dtype`` copy of the
        weights (one of the constructor's ``dtypes``)."""
        torch = self.torch
        default_threads = torch.get_num_threads()
        torch.set_num_threads(threads if threads > 0 else self.default_threads)
        try:
            return self._run(self.models[dtype], b, rounds, max_tokens, seed)
        finally:
            torch.set_num_threads(default_threads)

    def _run(self, model, b: int, rounds: int, max_tokens: int, seed: int) -> dict:
        torch = self.torch
        ids = torch.tensor([self.prompt] * b)
        kw = dict(max_new_tokens=max_tokens, do_sample=True, temperature=0.8, top_k=0, top_p=1.0,
                  pad_token_id=next(iter(self.eos)))
        with torch.inference_mode():  # warm-up: allocator and kernels, 8 tokens
            model.generate(ids, attention_mask=torch.ones_like(ids), **{**kw, "max_new_tokens": 8})
            toks = 0
            t0 = time.perf_counter()
            for r in range(rounds):
                torch.manual_seed(seed + r)
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                for row in out[:, len(self.prompt):].tolist():
                    toks += next((j + 1 for j, x in enumerate(row) if x in self.eos), len(row))
            wall = time.perf_counter() - t0
        return {"tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall, "requests": rounds * b,
                "torch_threads": torch.get_num_threads()}


def engine_dtype(engine_args: list[str]) -> str:
    """The weight dtype of the CPU engine that ``_start`` runs with ``engine_args``, read by the engine's own
    argument parser (``--dtype auto`` resolved as :func:`gpu_engine.model.loader.default_dtype` does on the CPU)."""
    import torch

    from gpu_engine.api.serve import build_parser
    from gpu_engine.model.loader import default_dtype

    name = build_parser().parse_known_args(list(engine_args))[0].dtype
    return str(default_dtype(torch.device("cpu"))).removeprefix("torch.") if name == "auto" else name


def hf_kind(threads: int, dtype: str = "float32") -> str:
    """The row name of a transformers baseline: ``transformers`` (torch's default threads, float32), then
    ``_<n>t`` for ``threads`` > 0 and ``_bf16`` / ``_fp16`` for another dtype."""
    name = "transformers" if threads <= 0 else f"transformers_{threads}t"
    return name + {"float32": "", "bfloat16": "_bf16", "float16": "_fp16"}[dtype]


def run(args: argparse.Namespace) -> dict:
    from clients.client import NInferClient

    port = _free_port()
    proc = _start(port, max(args.batches), args.engine_args)
    rows = []
    hf = HFBaseline(args.model, tuple(args.hf_dtypes)) if args.baseline else None
    hf_kinds = {hf_kind(n, d): (n, d) for d in args.hf_dtypes for n in args.hf_threads} if hf else {}
    kinds = list(hf_kinds) + [k for k in KINDS if k in args.kinds]
    try:
        with NInferClient(f"127.0.0.1:{port}") as c:
            for kind, constraint in KINDS.items():  # warm-up: compile caches, allocator
                _one(c, constraint, 8, 0)
            for rep in range(args.repeats):
                for b in args.batches:
                    for kind in kinds:  # side by side: every kind once per repeat, interleaved
                        load0 = os.getloadavg()[0]
                        if kind in hf_kinds:
                            out = hf.run(b, args.requests_per_lane, args.max_tokens, 7000 + rep, *hf_kinds[kind])
                        else:
                            out = _closed_loop(c, KINDS[kind], b, args.requests_per_lane, args.max_tokens,
                                               100000 * rep)
                        rows.append({"batch": b, "kind": kind, "repeat": rep, **out,
                                     "loadavg_1min": [load0, os.getloadavg()[0]]})
                        print(f"batch {b:2d} {kind:14s} rep {rep}: {out['tokens']} tokens in {out['wall_s']:.2f} s "
                              f"= {out['tokens_per_s']:.1f} tok/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return {"rows": rows, "summary": summarise(rows, args.batches, kinds)}


def summarise(rows: list[dict], batches: list[int], kinds: list[str]) -> list[dict]:
    """Per (batch, kind): median tokens/s with its spread, ratio vs unconstrained, and per-repeat ratios vs
    every transformers variant (``ratio_vs_<variant>``; ``ratio_vs_transformers`` = default threads)."""
    summary = []
    for b in batches:
        unc = [r["tokens_per_s"] for r in rows if r["batch"] == b and r["kind"] == "unconstrained"]
        base = statistics.median(unc) if unc else None
        hf = {k: {r["repeat"]: r["tokens_per_s"] for r in rows if r["batch"] == b and r["kind"] == k}
              for k in kinds if k.startswith("transformers")}
        for kind in kinds:
            sel = [r for r in rows if r["batch"] == b and r["kind"] == kind]
            sp = spread(r["tokens_per_s"] for r in sel)
            row = {"batch": b, "kind": kind, "tokens_per_s": sp["median"], "tokens_per_s_spread": sp,
                   "ratio_vs_unconstrained": sp["median"] / base if base else None,
                   "ratio_vs_transformers": None, "ratio_vs_transformers_spread": spread([]),
                   "loadavg_1min_median": statistics.median(x for r in sel for x in r["loadavg_1min"])}
            # the load of the shared machine drifts: a ratio is the median of per-repeat ratios (each against
            # the transformers run of the same repeat, measured minutes apart at most)
            for hk, by_rep in hf.items():
                per_rep = spread(r["tokens_per_s"] / by_rep[r["repeat"]] for r in sel if r["repeat"] in by_rep)
                row[f"ratio_vs_{hk}"], row[f"ratio_vs_{hk}_spread"] = per_rep["median"], per_rep
            for key in ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms"):
                vals = [r[key] for r in sel if key in r]
                row[key] = statistics.median(vals) if vals else float("nan")
            summary.append(row)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests-per-lane", type=int, default=9,
                    help="measured requests per concurrent lane (9 x 48 tokens = 432 decode steps per lane)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS),
                    help="engine variants to run (default: all)")
    ap.add_argument("--hf-threads", type=int, nargs="+", default=[0],
                    help="transformers baseline variants by torch intra-op threads (0 = torch's default; "
                         "e.g. 0 1 adds a one-thread row)")
    ap.add_argument("--hf-dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
                    help="transformers baseline variants by weight dtype (float32 = a plain load of the GGUF; "
                         "bfloat16 is the fair row for an engine run with --engine-args --dtype bfloat16)")
    ap.add_argument("--engine-args", nargs=argparse.REMAINDER, default=[],
                    help="extra arguments for `python -m gpu_engine` (last on the line), e.g. --cpu-threads 2")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="skip transformers generate (run side by side by default)")
    ap.add_argument("--quick", action="store_true", help="smoke run: B 1 2, 16 tokens, 2 requests per lane, 2 repeats")
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default bench/results/cpu_bench_<date>_cpu.json)")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.max_tokens, args.requests_per_lane, args.repeats = [1, 2], 16, 2, 2
    res = run(args)
    out = results_path("cpu_bench", "cpu", str(args.out) if args.out else None)
    meta = run_header("cpu", model=f"{args.model} (GGUF dequantised to float32; engine {engine_dtype(args.engine_args)})",
                      max_tokens=args.max_tokens,
                      requests_per_lane=args.requests_per_lane, repeats=args.repeats,
                      engine_args=args.engine_args, hf_threads=args.hf_threads, hf_dtypes=args.hf_dtypes,
                      client_torch_default_threads=__import__("torch").get_num_threads(),
                      note="engine: through the public gRPC API and the real sidecar, closed loop (each of B "
                      "client lanes sends its next request when the previous one ends; first request per lane "
                      "is warm-up); tokens/s = completion tokens / wall seconds; transformers: generate() of B "
                      "rows x requests_per_lane rounds after an 8-token warm-up call, same weights/prompt/sampling, "
                      "default cache, torch threads per hf_threads (0 = default); medians over repeats, kinds "
                      "interleaved within each repeat; ratio_vs_transformers = median over repeats of (kind / "
                      "transformers at default threads, same repeat); loadavg_1min per row: the machine is "
                      "shared, read ratios, not absolute tokens/s")
    out.write_text(json.dumps({"meta": meta, **res}, indent=1))
    print(f"\n{'batch':>5} {'kind':14s} {'tok/s median [min-max]':>24} {'vs unc.':>7} {'vs HF [min-max]':>16} "
          f"{'TTFT p50 ms':>12} {'ITL p50 ms':>11} {'ITL p99 ms':>11}")
    for s in res["summary"]:
        vs_hf = fmt_spread(s["ratio_vs_transformers_spread"], "{:.2f}")
        vs_unc = f"{s['ratio_vs_unconstrained']:7.2f}" if s["ratio_vs_unconstrained"] is not None else "      -"
        print(f"{s['batch']:5d} {s['kind']:14s} {fmt_spread(s['tokens_per_s_spread'], '{:.1f}'):>24} "
              f"{vs_unc} {vs_hf:>16} {s['ttft_p50_ms']:12.1f} {s['itl_p50_ms']:11.1f} "
              f"{s['itl_p99_ms']:11.1f}")
    print(f"\nwrote {out}")
    try:
        print(f"wrote {plot(res, meta, out.with_suffix('.png'))}")
    except ImportError:
        print("matplotlib missing: no plot")
    return 0


def plot(res: dict, meta: dict, path: Path) -> Path:
    """Grouped bars: tokens/s per kind and batch (median, error bars = min-max over repeats)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(s["kind"] for s in res["summary"]))
    batches = sorted({s["batch"] for s in res["summary"]})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    w = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        sel = [next(s for s in res["summary"] if s["batch"] == b and s["kind"] == kind) for b in batches]
        med = [s["tokens_per_s"] for s in sel]
        err = [[m - s["tokens_per_s_spread"]["min"] for m, s in zip(med, sel)],
               [s["tokens_per_s_spread"]["max"] - m for m, s in zip(med, sel)]]
        ax.bar([i + k * w for i in range(len(batches))], med, w, yerr=err, capsize=3, label=kind)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(batches))], [f"B={b}" for b in batches])
    ax.set(ylabel="output tokens/s", title=f"CPU through the public API ({meta['revision'][:10]}, {meta['date']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
