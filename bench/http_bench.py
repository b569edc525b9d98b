"""HTTP gateway vs gRPC: the same N concurrent streams on one server (issue 11).

usage:
  python bench/http_bench.py [--streams 64] [--max-tokens 64] [--rounds 2] [--max-lanes 64]
         [--engine HOST:PORT --gateway URL]      # reuse a running stack instead of starting one
         [--out bench/results/http_bench_cpu]
  python bench/http_bench.py --plot bench/results/http_bench_cpu.json   # table + plot from saved results

What it runs: one engine (``python -m gpu_engine``, default SmolLM2-135M, real sidecar and
ring) and one gateway (``python -m gateway``) pointed at it. Each round sends ``--streams``
concurrent streaming chat requests through gRPC (``ninfer.v1.Generation/Generate``, grpc.aio)
and then the same requests through HTTP (``POST /v1/chat/completions``, ``stream: true``,
``stream_options.include_usage``; SSE read with httpx2 and ``json.loads`` per event — a
client as light as the gRPC one). Request i has seed i and temperature 1.0 in both runs, and
the engine's draws depend only on (seed, position), so both transports generate the same
tokens. Rounds alternate gRPC / HTTP to spread drift of a shared machine over both.

Reported per transport: output tokens/s (sum of ``usage.completion_tokens`` over wall time
from first send to last finish), TTFT p50 and inter-token latency p50/p99 (gaps between
consecutive content messages of a stream, milliseconds), and HTTP/gRPC throughput ratio.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_common import pct  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."


async def grpc_round(target: str, n: int, max_tokens: int) -> dict:
    import grpc

    from clients.client import build_chat
    from ninfer.v1 import generation_pb2 as pb
    from ninfer.v1 import generation_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.GenerationStub(ch)

        async def one(i: int) -> dict:
            req = pb.GenerateRequest(request_id=f"bench-grpc-{i}", max_tokens=max_tokens,
                                     chat=build_chat([{"role": "user", "content": PROMPT}]))
            req.sampling.temperature, req.sampling.seed = 1.0, i
            t0, stamps, tokens = time.perf_counter(), [], 0
            async for resp in stub.Generate(req):
                if resp.text:
                    stamps.append(time.perf_counter())
                if resp.HasField("finish"):
                    tokens = resp.finish.usage.completion_tokens
            return {"t0": t0, "stamps": stamps, "tokens": tokens}

        start = time.perf_counter()
        rows = await asyncio.gather(*(one(i) for i in range(n)))
        return summarize(rows, time.perf_counter() - start)


async def http_round(url: str, n: int, max_tokens: int) -> dict:
    import httpx2

    limits = httpx2.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx2.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(i: int) -> dict:
            body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
                    "temperature": 1.0, "seed": i, "stream": True, "stream_options": {"include_usage": True}}
            t0, stamps, tokens = time.perf_counter(), [], 0
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        stamps.append(time.perf_counter())
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            return {"t0": t0, "stamps": stamps, "tokens": tokens}

        start = time.perf_counter()
        rows = await asyncio.gather(*(one(i) for i in range(n)))
        return summarize(rows, time.perf_counter() - start)


def summarize(rows: list[dict], wall_s: float) -> dict:
    """Throughput, TTFT and ITL of one round (times in ms, throughput in tokens/s)."""
    itl = [(b - a) * 1e3 for r in rows for a, b in zip(r["stamps"], r["stamps"][1:])]
    ttft = [(r["stamps"][0] - r["t0"]) * 1e3 for r in rows if r["stamps"]]
    tokens = sum(r["tokens"] for r in rows)
    return {"wall_s": wall_s, "output_tokens": tokens, "tokens_per_s": tokens / wall_s,
            "ttft_p50_ms": pct(ttft, 50), "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99),
            "itl_samples": len(itl)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``); nan elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def timed(coro_fn, procs: dict[str, int]) -> dict:
    """Runs one round and adds the CPU seconds each stack process spent in it
    (``cpu_s_<name>``) and per output token (``cpu_ms_per_token_<name>``)."""
    before = {k: cpu_seconds(pid) for k, pid in procs.items()}
    res = asyncio.run(coro_fn())
    for k, pid in procs.items():
        used = cpu_seconds(pid) - before[k]
        res[f"cpu_s_{k}"] = used
        res[f"cpu_ms_per_token_{k}"] = 1e3 * used / max(1, res["output_tokens"])
    return res


def wait_ready(proc: subprocess.Popen, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:  # type: ignore[union-attr]
        if needle in line:
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"process did not print {needle!r}")


def start_stack(args) -> tuple[list[subprocess.Popen], str, str]:
    from gateway import READY_LINE, spawn_gateway
    from tests.e2e.conftest import free_port  # noqa: PLC0415 - tiny helper

    eport, hport = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    engine = subprocess.Popen([sys.executable, "-m", "gpu_engine", "--port", str(eport), "--device", args.device,
                               "--max-lanes", str(args.max_lanes), "--max-seq-len", "512", "--log-level", "WARNING"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_ready(engine, "ninfer ready on", 600)
    gw = spawn_gateway(f"127.0.0.1:{eport}", hport, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wait_ready(gw, READY_LINE, 60)
    return [gw, engine], f"127.0.0.1:{eport}", f"http://127.0.0.1:{hport}"


def report(res: dict, out: Path) -> None:
    """Writes ``<out>.md`` (table) and ``<out>.png`` (plot) from the results dict."""
    g, h = res["grpc"], res["http"]
    cfg = res["config"]
    lines = [f"# HTTP gateway vs gRPC — {cfg['streams']} concurrent streams, max_tokens {cfg['max_tokens']}",
             "", f"Machine: {cfg['machine']} ({cfg['device']}); model {cfg['model']}; {cfg['rounds']} rounds, "
                 "mean of rounds.", "",
             "| transport | tokens/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms |", "|---|---|---|---|---|"]
    for name, r in (("gRPC", g), ("HTTP (gateway)", h)):
        lines.append(f"| {name} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['itl_p50_ms']:.1f} | "
                     f"{r['itl_p99_ms']:.1f} |")
    lines += ["", f"HTTP / gRPC throughput: **{res['ratio']:.3f}x** (target >= 0.95x); per round (gRPC and HTTP "
              f"back to back): {', '.join(f'{r:.2f}' for r in res.get('paired_ratios', []))}.", ""]
    if "cpu_ms_per_token_gateway" in h:
        lines += [f"CPU per output token (machine-load independent): gateway {h['cpu_ms_per_token_gateway']:.2f} ms "
                  f"(HTTP rounds), engine process (sidecar not counted) "
                  f"{h['cpu_ms_per_token_engine']:.2f} ms (HTTP) / {g['cpu_ms_per_token_engine']:.2f} ms (gRPC).", ""]
    if "loadavg" in cfg:
        lines += [f"Load average of the (shared, 2-core) machine at start / end: {cfg['loadavg'][0]:.1f} / "
                  f"{cfg['loadavg'][1]:.1f} — on a CPU shared by other jobs, throughput of single rounds swings "
                  "more than the transport difference; the CPU-per-token figures do not depend on that load.", ""]
    lines += [f"Command: `{res['command']}`"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(["gRPC", "HTTP"], [g["tokens_per_s"], h["tokens_per_s"]], color=["#4c72b0", "#dd8452"])
    axes[0].set_ylabel("output tokens/s")
    axes[0].set_title(f"throughput ({cfg['streams']} streams)")
    x = [0, 1]
    axes[1].bar([i - 0.2 for i in x], [g["itl_p50_ms"], g["itl_p99_ms"]], 0.4, label="gRPC", color="#4c72b0")
    axes[1].bar([i + 0.2 for i in x], [h["itl_p50_ms"], h["itl_p99_ms"]], 0.4, label="HTTP", color="#dd8452")
    axes[1].set_xticks(x, ["ITL p50", "ITL p99"])
    axes[1].set_ylabel("ms")
    axes[1].legend()
    fig.suptitle(f"{cfg['model']} on {cfg['device']} ({cfg['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def mean_of(rounds: list[dict]) -> dict:
    return {k: statistics.fmean(r[k] for r in rounds) for k in rounds[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-lanes", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--engine", help="running engine host:port (with --gateway)")
    ap.add_argument("--gateway", help="running gateway base URL (with --engine)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/http_bench_cpu"))
    ap.add_argument("--plot", help="re-render table + plot from a saved JSON")
    args = ap.parse_args()
    if args.plot:
        report(json.loads(Path(args.plot).read_text()), Path(args.plot))
        return 0
    load_start = os.getloadavg()[0]
    procs: list[subprocess.Popen] = []
    if args.engine and args.gateway:
        target, url = args.engine, args.gateway
    else:
        procs, target, url = start_stack(args)
    try:
        asyncio.run(grpc_round(target, 4, 8))  # warm-up: prefill paths, channel, gateway imports
        asyncio.run(http_round(url, 4, 8))
        rounds: dict[str, list[dict]] = {"grpc": [], "http": []}
        pids = {"gateway": procs[0].pid, "engine": procs[1].pid} if procs else {}
        for i in range(args.rounds):
            rounds["grpc"].append(timed(lambda: grpc_round(target, args.streams, args.max_tokens), pids))
            rounds["http"].append(timed(lambda: http_round(url, args.streams, args.max_tokens), pids))
            print(f"round {i}: grpc {rounds['grpc'][-1]['tokens_per_s']:.1f} tok/s, "
                  f"http {rounds['http'][-1]['tokens_per_s']:.1f} tok/s", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
    g, h = mean_of(rounds["grpc"]), mean_of(rounds["http"])
    res = {"config": {"streams": args.streams, "max_tokens": args.max_tokens, "rounds": args.rounds,
                      "max_lanes": args.max_lanes, "device": args.device, "model": "SmolLM2-135M-Instruct Q4_1",
                      "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, shared",
                      "loadavg": [load_start, os.getloadavg()[0]]},
           "grpc": g, "http": h, "ratio": h["tokens_per_s"] / g["tokens_per_s"],
           "paired_ratios": [hr["tokens_per_s"] / gr["tokens_per_s"] for gr, hr in zip(rounds["grpc"], rounds["http"])],
           "rounds": rounds,
           "command": "python " + " ".join([sys.argv[0], *sys.argv[1:]])}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    report(res, out)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
