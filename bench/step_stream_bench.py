"""Step stream round trips: the local step socket vs the gRPC ``Step`` RPC, blocking and soft waits.

The engine's Step stream carries one message per constrained step, on its critical path. This measures
the round trip (send -> answer in hand) of each transport the engine has
(:class:`gpu_engine.sidecar.stream.SocketStepStream`, the default, and
:class:`gpu_engine.sidecar.stream.StepStream` on gRPC), each with the engine's two waits: blocking
(``recv()``, a constrained-only step) and soft (``recv(timeout)``, the deferred mask wait of a mixed
step, which on gRPC runs ``next()`` on a reader thread). The peer is an echo sidecar in a child process
(real grpcio, real protobuf, the sidecar's real ``StepSocketServer``; no mask work) answering each
``--rows``-row StepRequest with one OK row result per row, as the sidecar does. Variants are
interleaved in each repeat. Usage: ``python bench/step_stream_bench.py [--steps 2000] [--rows 64] [--out PATH]``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from bench_common import fmt_spread, results_path, run_header, spread  # noqa: E402
from constraint_service.step_socket import StepSocketServer  # noqa: E402
from gpu_engine.sidecar.client import STEP_SWITCH_INTERVAL_S  # noqa: E402
from gpu_engine.sidecar.stream import SocketStepStream, StepStream  # noqa: E402
from ninfer.constraint.v1 import constraint_pb2 as pb  # noqa: E402
from ninfer.constraint.v1 import constraint_pb2_grpc as pb_grpc  # noqa: E402
from ninfer_common.step_socket import step_socket_path  # noqa: E402


def answer(req: pb.StepRequest) -> pb.StepResponse:
    """The echo sidecar's answer: one OK row result per row (what a healthy sidecar sends)."""
    resp = pb.StepResponse(step_seq=req.step_seq, slot=req.slot)
    add = resp.rows.add
    for r in req.rows:
        add(request_id=r.request_id, row=r.row, status=pb.ROW_STATUS_OK)
    return resp


class Echo(pb_grpc.ConstraintServiceServicer):
    def Step(self, requests, context):  # noqa: N802 - gRPC method name
        for req in requests:
            yield answer(req)


def serve_echo(sock: str) -> None:
    """The child process: gRPC on ``sock`` and the step socket beside it, until killed."""
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_ConstraintServiceServicer_to_server(Echo(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    StepSocketServer(step_socket_path(sock), answer, lambda: "")
    server.wait_for_termination()


def request(seq: int, rows: int) -> pb.StepRequest:
    """A StepRequest as the engine builds it for ``rows`` plain decode rows (one committed token each)."""
    msg = pb.StepRequest(step_seq=seq, slot=seq % 2)
    add = msg.rows.add
    for i in range(rows):
        add(request_id=f"bench-{i:04d}-0123456789abcdef", row=i, commit_tokens=[1000 + i])
    return msg


def round_trips(stream, steps: int, timeout: float | None, seq0: int, rows: int) -> list[float]:
    """Microseconds from sending each Step (message already built) to holding its answer."""
    out = []
    for i in range(seq0, seq0 + steps):
        msg = request(i, rows)
        t = time.perf_counter()
        stream.send(msg)
        r = stream.recv(timeout)
        out.append((time.perf_counter() - t) * 1e6)
        assert r is not None and r.step_seq == i and len(r.rows) == rows
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=64, help="rows per StepRequest")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--soft-wait-ms", type=float, default=200.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    sys.setswitchinterval(STEP_SWITCH_INTERVAL_S)  # as the engine sets it while a Step stream is open
    d = tempfile.mkdtemp(prefix="ninfer-stepbench-")
    sock = os.path.join(d, "s.sock")
    child = mp.get_context("spawn").Process(target=serve_echo, args=(sock,), daemon=True)
    child.start()
    while not os.path.exists(step_socket_path(sock)):
        time.sleep(0.05)
    channel = grpc.insecure_channel(f"unix://{sock}")
    streams = {"grpc": StepStream(pb_grpc.ConstraintServiceStub(channel), 1, 30.0),
               "socket": SocketStepStream(step_socket_path(sock), 1, 30.0, child.pid)}
    variants = [(t, w) for t in ("socket", "grpc") for w in ("blocking", "soft")]
    res: dict = {f"{t}_{w}": [] for t, w in variants}
    try:
        seq = 0
        for t in streams:  # warm-up
            round_trips(streams[t], 200, None, seq, args.rows)
            seq += 200
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits every variant alike
            for t, w in variants:
                rt = sorted(round_trips(streams[t], args.steps, None if w == "blocking" else args.soft_wait_ms / 1e3,
                                        seq, args.rows))
                seq += args.steps
                res[f"{t}_{w}"].append(dict(p50_us=rt[len(rt) // 2], p90_us=rt[int(0.9 * len(rt))],
                                            p99_us=rt[int(0.99 * len(rt))]))
    finally:
        for s in streams.values():
            s.close()
        channel.close()
        child.kill()
    out = dict(header=run_header("cpu", steps=args.steps, rows=args.rows, soft_wait_ms=args.soft_wait_ms,
                                 repeats=args.repeats), results={})
    for name, runs in res.items():
        out["results"][name] = {k: spread(r[k] for r in runs) for k in ("p50_us", "p90_us", "p99_us")}
        print(f"{name:16s}", {k: fmt_spread(v) for k, v in out["results"][name].items()}, flush=True)
    r = out["results"]
    for w in ("blocking", "soft"):
        ratio = r[f"grpc_{w}"]["p50_us"]["median"] / r[f"socket_{w}"]["p50_us"]["median"]
        out["results"][f"grpc_over_socket_p50_{w}"] = ratio
        print(f"{w}: gRPC p50 / socket p50 = {ratio:.2f}x")
    path = results_path("step_stream_bench", "cpu", args.out or None)
    path.write_text(json.dumps(out, indent=1))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
