"""Sidecar crash / hang recovery on the real stack (issue 14 (3), (4)): how long, and what is lost.

Starts ``python -m gpu_engine`` (default model, CPU unless ``--device``) with ``--sidecar-deadline``,
then, ``--repeats`` times each, SIGKILLs or SIGSTOPs the sidecar while 16 constrained streams
(JSON Schema / regex, from ``tests/e2e/test_supervision_e2e.py``) and one unconstrained stream run:

* ``health_down_s`` / ``health_up_s``: fault -> public health ``NOT_SERVING`` seen; -> ``SERVING`` again
  (polled every 0.1 s, both services);
* ``constrained_resume_s``: fault -> first constrained token after health went ``NOT_SERVING`` (tokens
  right after the fault may still come from steps done before the sidecar actually stopped);
* ``unconstrained_max_gap_s``: the longest gap between unconstrained tokens from 1 s before the fault
  until health is back (an engine thread blocked by a restart shows up here);
* ``valid`` / ``failed``: constrained streams that completed in their language / ended with an error;
* ``mask_waits_deferred``: steps whose masks missed ``--mask-soft-wait`` (their unconstrained rows went on).

A ``healthy`` trial first runs the same streams without a fault: its ``mask_waits_deferred`` should be 0
and ``sidecar_wait_max_le_s`` (the smallest ``ninfer_sidecar_wait_seconds`` bucket bound holding every
exposed mask wait of the trial) shows how far below the soft budget healthy steps stay.

Usage: ``python bench/supervision_bench.py [--repeats 3] [--deadline 5] [--mask-soft-wait 200] [--out PATH]``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import urllib.request
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402
from tests.e2e.conftest import Stack, free_port  # noqa: E402
from tests.e2e.test_supervision_e2e import Feeder, HealthWatch, Streams, _metric, _sigcont, _valid  # noqa: E402


def _wait_buckets(stack: Stack) -> dict[float, float]:
    """``ninfer_sidecar_wait_seconds`` cumulative bucket counts by upper bound (seconds)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=30).read().decode()
    return {float(le): float(v) for le, v in re.findall(
        r'^ninfer_sidecar_wait_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', body, re.M)}


def healthy(stack: Stack, client, n: int) -> dict:
    """The same streams without a fault: deferred mask waits and the longest exposed mask wait."""
    b0, d0 = _wait_buckets(stack), _metric(stack, "ninfer_mask_wait_deferred_total")
    feeder = Feeder(client)
    feeder.start()
    streams = Streams(client, n)
    streams.join()
    feeder.stop.set()
    feeder.join(60)
    b1 = _wait_buckets(stack)
    delta = {le: b1[le] - b0.get(le, 0.0) for le in sorted(b1)}
    total = delta.get(float("inf"), 0.0)
    ok = [i for i, r in streams.results.items() if r.error is None and _valid(i, r.text)]
    return dict(mask_waits_deferred=_metric(stack, "ninfer_mask_wait_deferred_total") - d0, constrained_steps=total,
                sidecar_wait_max_le_s=next((le for le, v in delta.items() if v >= total), None),
                unconstrained_max_gap_s=max((b - a for a, b in zip(feeder.arrivals, feeder.arrivals[1:])),
                                            default=None), valid=len(ok), streams=n)


def trial(stack: Stack, client, sig: int, n: int, hang_s: float) -> dict:
    d0 = _metric(stack, "ninfer_mask_wait_deferred_total")
    watch, feeder = HealthWatch(stack.target), Feeder(client)
    watch.start()
    feeder.start()
    streams = Streams(client, n)
    streams.wait_started(2)
    pid = stack.sidecar_pid()
    t0 = time.monotonic()
    os.kill(pid, sig)
    resume = threading.Timer(hang_s, _sigcont, args=(pid,)) if sig == signal.SIGSTOP else None
    if resume is not None:
        resume.start()
    streams.join()
    if resume is not None:
        resume.join()
    while not watch.changes or watch.changes[-1][1] != "SERVING" or watch.changes[-1][0] < t0:
        time.sleep(0.1)
        if time.monotonic() - t0 > 300:
            break
    feeder.stop.set()
    watch.stop.set()
    feeder.join(60)
    watch.join(30)
    down = next((t for t, s in watch.changes if s == "NOT_SERVING" and t > t0), None)
    up = next((t for t, s in watch.changes if s == "SERVING" and down is not None and t > down), None)
    arrivals = sorted(t for t in feeder.arrivals if t0 - 1 <= t <= (up or time.monotonic()) + 1)
    resumed = [t for t in streams.first_after(down if down is not None else t0) if t is not None]
    ok = [i for i, r in streams.results.items() if r.error is None and _valid(i, r.text)]
    return dict(health_down_s=None if down is None else down - t0, health_up_s=None if up is None else up - t0,
                constrained_resume_s=min(resumed) - t0 if resumed else None,
                unconstrained_max_gap_s=max((b - a for a, b in zip(arrivals, arrivals[1:])), default=None),
                valid=len(ok), failed=sum(1 for r in streams.results.values() if r.error is not None) +
                len(streams.errors), streams=n,
                mask_waits_deferred=_metric(stack, "ninfer_mask_wait_deferred_total") - d0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=5.0, help="--sidecar-deadline of the stack, seconds")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--hang", type=float, default=10.0, help="SIGSTOP length unless the sidecar is killed first")
    ap.add_argument("--mask-soft-wait", type=float, default=200.0, help="--mask-soft-wait of the stack, ms")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from clients.client import NInferClient

    stack = Stack(free_port(), extra=["--sidecar-deadline", str(args.deadline), "--device", args.device,
                                      "--mask-soft-wait", str(args.mask_soft_wait)])
    stack.metrics_port = free_port()
    stack.extra += ["--metrics-port", str(stack.metrics_port)]
    stack.start()
    out = dict(header=run_header(args.device, deadline_s=args.deadline, streams=args.streams,
                                 mask_soft_wait_ms=args.mask_soft_wait), trials={})
    try:
        with NInferClient(stack.target) as c:
            out["healthy"] = healthy(stack, c, args.streams)
            print("healthy", out["healthy"], flush=True)
            for name, sig in (("sigkill", signal.SIGKILL), ("sigstop", signal.SIGSTOP)):
                runs = [trial(stack, c, sig, args.streams, args.hang) for _ in range(args.repeats)]
                out["trials"][name] = dict(runs=runs, **{k: spread(r[k] for r in runs) for k in (
                    "health_down_s", "health_up_s", "constrained_resume_s", "unconstrained_max_gap_s")})
                print(name, {k: fmt_spread(out["trials"][name][k]) for k in ("health_down_s", "health_up_s",
                                                                               "constrained_resume_s",
                                                                               "unconstrained_max_gap_s")},
                      "valid", [r["valid"] for r in runs], "failed", [r["failed"] for r in runs], flush=True)
            out["restarts"] = _metric(stack, "ninfer_sidecar_restarts_total")
            out["replays"] = _metric(stack, "ninfer_sidecar_replays_total")
    finally:
        stack.stop()
    path = results_path("supervision_bench", args.device, args.out or None)
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
