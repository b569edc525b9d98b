"""CPU throughput through the real stack: batch 1 and 8, constrained vs unconstrained.

Starts ``python -m gpu_engine`` (which starts its constraint sidecar) on a free
port, then for each batch size sends that many concurrent ``Generate``
requests over gRPC for each constraint kind, side by side in one run, and
reports output tokens/s (sum of completion tokens / wall seconds), TTFT and
inter-token latency (client-side, from stream arrival times). A warm-up round
per kind is excluded (it also fills the compile cache, so constrained rows are
measured with cached grammars, as a steady-state service sees them).

Usage: ``python bench/cpu_bench.py [--batches 1 8] [--max-tokens 48] [--repeats 2] [--out bench/results/cpu_bench.json]``
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
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


def _start(port: int, lanes: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "gpu_engine", "--port", str(port), "--device", "cpu",
                          "--max-lanes", str(lanes), "--max-seq-len", "1024", "--log-level", "WARNING"],
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


def run(args: argparse.Namespace) -> dict:
    from clients.client import NInferClient

    port = _free_port()
    proc = _start(port, max(args.batches))
    rows = []
    try:
        with NInferClient(f"127.0.0.1:{port}") as c:
            for kind, constraint in KINDS.items():  # warm-up: compile caches, allocator
                _one(c, constraint, 8, 0)
            for b in args.batches:
                for kind, constraint in KINDS.items():
                    for rep in range(args.repeats):
                        with ThreadPoolExecutor(b) as ex:
                            t0 = time.perf_counter()
                            outs = list(ex.map(lambda i: _one(c, constraint, args.max_tokens, 1000 * rep + i),
                                               range(b)))
                            wall = time.perf_counter() - t0
                        toks = sum(o["tokens"] for o in outs)
                        itl = [x for o in outs for x in o["itl_s"]]
                        rows.append({"batch": b, "kind": kind, "repeat": rep, "tokens": toks, "wall_s": wall,
                                     "tokens_per_s": toks / wall,
                                     "ttft_p50_ms": 1e3 * statistics.median(o["ttft_s"] for o in outs),
                                     "itl_p50_ms": 1e3 * statistics.median(itl) if itl else float("nan"),
                                     "itl_p99_ms": 1e3 * sorted(itl)[int(0.99 * (len(itl) - 1))] if itl else float("nan")})
                        print(f"batch {b:2d} {kind:14s} rep {rep}: {toks} tokens in {wall:.2f} s "
                              f"= {toks / wall:.1f} tok/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    summary = []
    for b in args.batches:
        base = statistics.median(r["tokens_per_s"] for r in rows if r["batch"] == b and r["kind"] == "unconstrained")
        for kind in KINDS:
            sel = [r for r in rows if r["batch"] == b and r["kind"] == kind]
            tps = statistics.median(r["tokens_per_s"] for r in sel)
            summary.append({"batch": b, "kind": kind, "tokens_per_s": tps, "ratio_vs_unconstrained": tps / base,
                            "ttft_p50_ms": statistics.median(r["ttft_p50_ms"] for r in sel),
                            "itl_p50_ms": statistics.median(r["itl_p50_ms"] for r in sel),
                            "itl_p99_ms": statistics.median(r["itl_p99_ms"] for r in sel)})
    return {"rows": rows, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_bench.json")
    args = ap.parse_args()
    res = run(args)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = "unknown"
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": f"CPU: {cpu}, "
            f"{os.cpu_count()} cores", "command": " ".join([Path(sys.executable).name] + sys.argv), "revision": rev,
            "model": "SmolLM2-135M-Instruct Q4_1 (dequantised to float32)", "max_tokens": args.max_tokens,
            "note": "through the public gRPC API and the real sidecar; tokens/s = completion tokens / wall seconds"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, **res}, indent=1))
    print(f"\n{'batch':>5} {'kind':14s} {'tok/s':>8} {'ratio':>6} {'TTFT p50 ms':>12} {'ITL p50 ms':>11} {'ITL p99 ms':>11}")
    for s in res["summary"]:
        print(f"{s['batch']:5d} {s['kind']:14s} {s['tokens_per_s']:8.1f} {s['ratio_vs_unconstrained']:6.2f} "
              f"{s['ttft_p50_ms']:12.1f} {s['itl_p50_ms']:11.1f} {s['itl_p99_ms']:11.1f}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
