"""Cost of the soft mask wait's thread hop on a real gRPC Step stream (issue 14, deferred mask wait).

A mixed step waits for the sidecar's answer with ``StepStream.recv(timeout)``, which runs gRPC's
blocking ``next()`` on the stream's reader thread; a constrained-only step reads it on the engine
thread (``recv()``). This measures the Step round trip (send -> answer in hand) of both against an
in-process echo servicer on a unix socket (real grpcio, real protobuf; no mask work), so the
difference is the hop. Usage: ``python bench/step_stream_bench.py [--steps 2000] [--out PATH]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402
from gpu_engine.sidecar.client import STEP_SWITCH_INTERVAL_S  # noqa: E402
from gpu_engine.sidecar.stream import StepStream  # noqa: E402
from ninfer.constraint.v1 import constraint_pb2 as pb  # noqa: E402
from ninfer.constraint.v1 import constraint_pb2_grpc as pb_grpc  # noqa: E402


class Echo(pb_grpc.ConstraintServiceServicer):
    def Step(self, requests, context):  # noqa: N802 - gRPC method name
        for req in requests:
            yield pb.StepResponse(step_seq=req.step_seq, slot=req.slot)


def round_trips(stream: StepStream, steps: int, timeout: float | None, seq0: int) -> list[float]:
    """Microseconds from queueing each Step to holding its answer."""
    out = []
    for i in range(seq0, seq0 + steps):
        t = time.perf_counter()
        stream.send(pb.StepRequest(step_seq=i, slot=i % 2))
        r = stream.recv(timeout)
        out.append((time.perf_counter() - t) * 1e6)
        assert r is not None and r.step_seq == i
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--soft-wait-ms", type=float, default=200.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    sys.setswitchinterval(STEP_SWITCH_INTERVAL_S)  # as the engine sets it while a Step stream is open
    d = tempfile.mkdtemp(prefix="ninfer-stepbench-")
    sock = os.path.join(d, "s.sock")
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_ConstraintServiceServicer_to_server(Echo(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{sock}")
    stream = StepStream(pb_grpc.ConstraintServiceStub(channel), 1, 30.0)
    res: dict = {"blocking": [], "soft": []}
    try:
        round_trips(stream, 200, None, 0)  # warm-up
        seq = 200
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
            for name, timeout in (("blocking", None), ("soft", args.soft_wait_ms / 1e3)):
                rt = sorted(round_trips(stream, args.steps, timeout, seq))
                seq += args.steps
                res[name].append(dict(p50_us=rt[len(rt) // 2], p90_us=rt[int(0.9 * len(rt))],
                                      p99_us=rt[int(0.99 * len(rt))]))
    finally:
        stream.close()
        channel.close()
        server.stop(0)
    out = dict(header=run_header("cpu", steps=args.steps, soft_wait_ms=args.soft_wait_ms), results={})
    for name, runs in res.items():
        out["results"][name] = {k: spread(r[k] for r in runs) for k in ("p50_us", "p90_us", "p99_us")}
        print(name, {k: fmt_spread(v) for k, v in out["results"][name].items()}, flush=True)
    path = results_path("step_stream_bench", "cpu", args.out or None)
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
