"""``ninfer serve`` / ``python -m gpu_engine``: start the engine, its sidecar and the public gRPC server.

Prints a line containing ``ready`` once requests are accepted; SIGINT or
SIGTERM stop the server, the engine, the sidecar, and remove the mask ring.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from concurrent import futures

from gpu_engine.spec.registry import SpecMethod
from ninfer_common.shutdown import ShutdownLatch

log = logging.getLogger("ninfer.serve")
# Largest request message accepted on the public port, bytes.
MAX_REQUEST_BYTES = 8 << 20
# gRPC worker threads kept beyond the Generate capacity (lanes + queue) for health checks, CountTokens
# and reflection, so a saturated server still answers its probes (issue 14 (6)).
HEALTH_RESERVE_WORKERS = 16


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ninfer serve", description="Serve a model with grammar-constrained decoding")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=50051, help="gRPC port (default 50051)")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct",
                    help="model name (the embedded default) or a path to a .gguf file / HF directory")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    ap.add_argument("--max-lanes", type=int, default=8, help="resident batch slots (continuous batching)")
    ap.add_argument("--max-seq-len", type=int, default=2048, help="context length per lane in tokens")
    ap.add_argument("--attention", choices=["auto", "reference", "triton"], default="auto",
                    help="forward kernels: auto = Triton (paged decode attention + fused norm/RoPE/SiLU) on CUDA, eager torch (gather + SDPA) on CPU")
    ap.add_argument("--max-tokens-default", type=int, default=256, help="budget when a request gives none")
    ap.add_argument("--speculative", choices=[m.value for m in SpecMethod], default="none")
    ap.add_argument("--num-draft-tokens", type=int, default=0, help="K draft tokens per step (0 = no speculation)")
    ap.add_argument("--draft-layers", type=int, default=0, help="early-exit drafter depth L (default: layers/4)")
    ap.add_argument("--grammar-cache-bytes", type=int, default=256 << 20)
    ap.add_argument("--max-cold-compiles", type=int, default=2)
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="grammar compile deadline, seconds")
    ap.add_argument("--mask-probe-limit-ms", type=float, default=250.0,
                    help="the sidecar refuses a constraint (GrammarTooExpensive) when one token mask of a short "
                         "deterministic walk after its compile takes longer than this, CPU ms (default 250; 0 = no "
                         "probe): a grammar like ([a-z]+ \" \"?){0,200} costs seconds per mask and would stall every "
                         "other constrained request at each step")
    ap.add_argument("--mask-fill-threads", type=int, default=0,
                    help="sidecar threads for the batched mask fill (0 = auto: min(8, CPUs); 1 on 2 CPUs)")
    ap.add_argument("--mask-fill-rows-per-thread", type=int, default=-1,
                    help="rows each sidecar mask-fill thread must have: a step filling fewer rows uses fewer "
                         "threads, 1 below twice this (-1 = the sidecar's default, 16; 0 = always --mask-fill-threads)")
    ap.add_argument("--compile-threads", type=int, default=0,
                    help="sidecar threads per cold grammar compile (0 = auto: a quarter of the CPUs, 1 to 8)")
    ap.add_argument("--step-shards", type=int, default=1,
                    help="sidecar processes sharing the per-step mask work, each owning some constrained requests "
                         "and compiling their grammars once per process (default 1; 0 = auto: 1 below 8 CPUs, else "
                         "CPUs/4, at most 4). On the H200 host 4 shards made constrained decode steps 4-25%% faster "
                         "at B = 64/128 but lost overall throughput while new grammars compiled in each shard")
    ap.add_argument("--step-transport", choices=["socket", "grpc"], default="socket",
                    help="transport of the engine's per-step Step stream to the sidecar: the sidecar's local "
                         "step socket (default; gRPC when the sidecar has none) or the gRPC Step RPC. Same "
                         "protobuf messages; the socket saves gRPC's thread hand-offs on every constrained step")
    ap.add_argument("--cpu-threads", type=int, default=0,
                    help="torch intra-op threads of a CPU engine's decode forwards (0 = auto: every core it may "
                         "use, at most torch's default)")
    ap.add_argument("--cpu-prefill-threads", type=int, default=0,
                    help="torch intra-op threads of a CPU engine's prefill forwards (0 = auto: every core, at most "
                         "torch's default)")
    ap.add_argument("--prefill-token-budget", type=int, default=4096,
                    help="prompt tokens per batched prefill forward (rows admitted together share it)")
    ap.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--max-queued-requests", type=int, default=64,
                    help="admitted requests that may wait for a lane; past it Generate answers RESOURCE_EXHAUSTED "
                         "with a retry hint (default 64)")
    ap.add_argument("--sidecar-socket", default="", metavar="PATH",
                    help="use the constraint sidecar already listening on this unix socket (e.g. a Kubernetes "
                         "sidecar container running `python -m constraint_service --socket PATH`) instead of "
                         "starting one; it must run under the same uid")
    ap.add_argument("--sidecar-deadline", type=float, default=20.0, metavar="SECONDS",
                    help="a sidecar that gives no Step answer or heartbeat within this many seconds is treated as "
                         "hung: killed and restarted (an external one: reconnected); default 20")
    ap.add_argument("--mask-soft-wait", type=float, default=200.0, metavar="MS",
                    help="a step with constrained and unconstrained rows waits this long for the sidecar's masks, "
                         "then samples the unconstrained rows alone; the constrained ones get theirs when the "
                         "answer comes (or are parked past --sidecar-deadline). 0 = always wait; default 200")
    ap.add_argument("--step-send", choices=["before", "after", "auto"], default="auto",  # step_send.STEP_SEND_MODES
                    help="where a step without drafts sends its Step message to the sidecar: before its forward "
                         "launch or right after it. 'after' starts the forward sooner and the sidecar later: it pays "
                         "only when the sidecar's Step work is well under the forward (a large model; README 'Step "
                         "after launch'). 'auto' (default) chooses from the measured Step work and forward time: "
                         "after while the work is under 0.6x the forward, before again from 0.8x; before until "
                         "measured (a CPU engine records no forward times: always before)")
    ap.add_argument("--overlap-schedule", choices=["on", "off"], default="on",
                    help="queue a plain decode step's next forward on the GPU before the step's tokens are read "
                         "back, so the GPU does not wait for the host between steps (CUDA graphs only; README "
                         "'Overlap scheduling'). Default on; off for A/B runs")
    ap.add_argument("--sidecar-max-restarts", type=int, default=5, metavar="N",
                    help="past N sidecar restarts within 60 s, constrained requests fail with "
                         "ConstraintServiceUnavailable instead of waiting for it (default 5)")
    ap.add_argument("--tls-cert", default="", metavar="PEM", help="serve TLS with this certificate chain")
    ap.add_argument("--tls-key", default="", metavar="PEM", help="private key of --tls-cert")
    ap.add_argument("--tls-client-ca", default="", metavar="PEM",
                    help="require client certificates signed by this CA (mutual TLS; needs --tls-cert)")
    ap.add_argument("--api-key", default=os.environ.get("NINFER_API_KEY", ""),
                    help="require `authorization: Bearer KEY` on every RPC but health checks "
                         "(default: $NINFER_API_KEY; prefer the variable, argv is visible to other users)")
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="serve Prometheus /metrics on this port (0 = off)")
    ap.add_argument("--log-level", default=os.environ.get("NINFER_LOG_LEVEL", "INFO"))
    http = ap.add_argument_group("HTTP gateway (`ninfer serve` only; OpenAI / Anthropic protocols, off by default)")
    http.add_argument("--http-port", type=int, default=0, help="also start the HTTP gateway on this port")
    http.add_argument("--http-host", default=None, help="gateway listen address (default: --host)")
    return ap


def _cores() -> int:
    """CPUs this process may run on (``os.sched_getaffinity``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_prefill_threads(requested: int = 0) -> int:
    """Intra-op threads for a CPU engine's prefill forwards (:attr:`gpu_engine.executor.eager.Program.prefill_threads`):
    ``requested`` if > 0, else every core this process may run on, capped at torch's default. Read before
    :func:`cpu_threads` is applied (torch's default is the process's setting until then)."""
    import torch

    return requested if requested > 0 else max(1, min(torch.get_num_threads(), _cores()))


def cpu_threads(requested: int = 0) -> int:
    """Intra-op threads for a CPU engine's decode forwards: ``requested`` if > 0, else every core this process
    may run on (``os.sched_getaffinity``), capped at torch's default.

    Every core, not one left for the constraint sidecar: the sidecar's Step work is ~1.6 ms even for 64
    rows on this project's 2-core box (``bench/results/step_fill_bench_20261204_cpu.json``) and a CPU engine
    runs at most a few rows beside a forward of 30-80 ms, so a forward thread it preempts costs little. On
    that box (SmolLM2, ``bench/cpu_bench.py``, B = 1 and 8, 2 repeats,
    ``bench/results/cpu_threads_20261204_{1t,2t}_cpu.json``) 2 threads gave 1.57x the tokens/s of 1 at
    B = 1 and 1.76x at B = 8 unconstrained, 1.6-1.7x for JSON Schema and regex rows. With the model loaded
    on the main thread (see :func:`off_main_thread`) 2 threads were no faster than 1 at B = 1.
    """
    import torch

    if requested > 0:
        return requested
    return max(1, min(torch.get_num_threads(), _cores()))


def off_main_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run on a new thread that ends before this returns; its result, or its exception
    re-raised here. :func:`build_stack` loads a CPU model this way.

    Why: torch's OpenMP runtime (libgomp) gives every thread that runs a parallel region a pool of worker
    threads that lives as long as that thread. While the process holds more such workers than it has CPUs,
    libgomp's workers stop spinning between regions (libgomp ``env.c``: a throttled spin count of 100
    instead of 300,000, "~3 ms") and sleep on a futex, so each of a decode forward's many short parallel
    regions waits for them to wake. Loading the model on the main thread left a pool there for the life of
    the process: on this project's 2-core box the engine thread's SmolLM2 decode step then took 46.6 ms at
    B = 1 and 84.8 ms at B = 8 on 2 threads, against 29.8 and 69.5 ms with the load off the main thread
    (``bench/omp_pool_bench.py``, ``bench/results/omp_pool_bench_20261204_cpu.json``). A thread's pool is
    freed when the thread exits. Only for work that starts no child process: a child using
    ``PR_SET_PDEATHSIG`` (the constraint sidecar does) dies with the thread that started it.
    """
    import threading

    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            out["error"] = e

    t = threading.Thread(target=run, name="ninfer-load")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def build_stack(args: argparse.Namespace):
    """Load the model and create ring, sidecar, program and engine (not started)."""
    import torch

    from shared_memory.ring import MaskRing, default_ring_name

    from gpu_engine.engine.loop import Engine, ring_geometry
    from gpu_engine.frontend.prompt import Frontend
    from gpu_engine.hub.fetch import ensure_model
    from gpu_engine.model.loader import load_model, resolve_device
    from gpu_engine.sidecar.client import Sidecar
    from gpu_engine.sidecar.supervisor import SidecarSupervisor

    from gpu_engine.model.config import PRESETS

    path = args.model if args.model in PRESETS else ensure_model(args.model)  # presets: random weights
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    load = dict(device=args.device, dtype=dtype, max_lanes=args.max_lanes, max_seq_len=args.max_seq_len)
    if resolve_device(args.device).type == "cpu":  # no OpenMP pool left on this thread (see off_main_thread)
        loaded = off_main_thread(load_model, str(path), **load)
    else:
        loaded = load_model(str(path), **load)
    loaded.model.set_attention(args.attention)  # before the executor captures its CUDA graphs
    prefill_threads = 0
    if loaded.model.device.type == "cpu":
        prefill_threads = cpu_prefill_threads(args.cpu_prefill_threads)
        torch.set_num_threads(cpu_threads(args.cpu_threads))
    if args.speculative != "none" and args.num_draft_tokens <= 0:
        args.num_draft_tokens = 4
    k = args.num_draft_tokens if args.speculative != "none" else args.num_draft_tokens
    vocab = loaded.vocab
    geo = ring_geometry(args.max_lanes, k, vocab.vocab_size)
    ring = MaskRing.create(default_ring_name(str(args.port)), geo)
    ring_info = dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots, num_lanes=geo.num_lanes,
                     num_positions=geo.num_positions, num_words=geo.num_words)
    # The socket lives in a fresh private (0700) directory the Sidecar creates: no other user can place
    # or reach a socket there, and the Sidecar checks the peer's credentials before trusting it.
    sidecar = Sidecar(args.sidecar_socket or None, vocab, ring_info, external=bool(args.sidecar_socket),
                      step_deadline_s=args.sidecar_deadline,
                      # a Prepare may wait for a compile slot, then compile: two compile timeouts plus the deadline;
                      # with Step shards it may compile again in a worker (at most 3 timeouts there)
                      prepare_timeout_s=(2 if args.step_shards == 1 else 5) * args.compile_timeout
                      + args.sidecar_deadline, step_transport=args.step_transport,
                      extra_args=[
        "--grammar-cache-bytes", str(args.grammar_cache_bytes), "--max-cold-compiles", str(args.max_cold_compiles),
        "--compile-timeout", str(args.compile_timeout), "--fill-threads", str(args.mask_fill_threads),
        "--compile-threads", str(args.compile_threads), "--step-shards", str(args.step_shards),
        "--fill-rows-per-thread", str(args.mask_fill_rows_per_thread),
        "--mask-probe-limit-ms", str(args.mask_probe_limit_ms)])
    SidecarSupervisor(sidecar, args.sidecar_deadline, max_restarts=args.sidecar_max_restarts)  # started by the engine
    from gpu_engine.executor import make_program

    program = make_program(loaded, ring, cuda_graphs=args.cuda_graphs)
    program.prefill_token_budget = max(1, args.prefill_token_budget)
    program.prefill_threads = prefill_threads
    engine = Engine(program, vocab, sidecar=sidecar, ring=ring, spec_method=args.speculative,
                    num_draft_tokens=k, draft_layers=args.draft_layers, mask_soft_wait_s=args.mask_soft_wait / 1e3,
                    step_send=args.step_send, overlap_schedule=None if args.overlap_schedule == "on" else False)
    frontend = Frontend(loaded.tokenizer, lambda msgs, agp: loaded.render_chat(msgs, agp))
    return engine, frontend, loaded


def chat_output_frontend(loaded, frontend):
    """Tools / thinking frontend of the loaded model (family from its architecture and template), or None
    when the model has no chat template."""
    from gpu_engine.frontend.output import ChatOutputFrontend, family_rules

    template = loaded.chat_template
    if template is None:
        return None
    return ChatOutputFrontend(frontend, family_rules(loaded.config.arch, template.source), template)


def _set_health(hs, serving: bool) -> None:
    """Both health services ("" and ``ninfer.v1.Generation``) SERVING or NOT_SERVING."""
    from grpc_health.v1 import health_pb2

    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", "ninfer.v1.Generation"):
        hs.set(service, status)


def serve_main(argv: list[str] | None = None) -> int:
    """Entry point of ``ninfer serve``; returns the process exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.http_port or args.http_host:
        # `ninfer serve` strips these before calling us; reaching here means `python -m gpu_engine`, which has no
        # gateway to start: refuse rather than ignore the flag.
        ap.error("--http-port/--http-host start the HTTP gateway and need `ninfer serve` (or run `ninfer gateway`)")
    if args.mask_soft_wait < 0:
        ap.error(f"--mask-soft-wait must be >= 0 ms, got {args.mask_soft_wait:g}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from ninfer_common.telemetry import server_interceptors, setup_metrics, setup_tracing
    from ninfer.v1 import generation_pb2

    from shared_memory.errors import RingError

    from gpu_engine.api.security import ApiKeyInterceptor, server_credentials
    from gpu_engine.api.servicer import GenerationServicer, add_generation_servicer
    from ninfer_common.gc_heap import freeze_heap

    setup_tracing("ninfer-engine")
    if setup_metrics("ninfer-engine", args.metrics_port, args.host):
        print(f"metrics on http://{args.host}:{args.metrics_port}/metrics", flush=True)
    latch = ShutdownLatch()  # handlers that take no lock (see ninfer_common.shutdown)
    latch.install((signal.SIGTERM, signal.SIGINT))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    # Bind the public port before anything else (ring, sidecar, model): a second server on a taken
    # port must fail here without touching the live server's ring. SO_REUSEPORT off: gRPC enables it
    # by default, which lets a second process share (and steal connections from) a live port.
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        print("error: --tls-cert and --tls-key go together; --tls-client-ca needs them", file=sys.stderr)
        return 2
    interceptors = list(server_interceptors())
    if args.api_key:
        interceptors.insert(0, ApiKeyInterceptor(args.api_key))
    reserve = HEALTH_RESERVE_WORKERS
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.max_lanes + args.max_queued_requests + reserve,
                                                    thread_name_prefix="ninfer-rpc"),
                         interceptors=interceptors,
                         options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES), ("grpc.so_reuseport", 0)])
    address = f"{args.host}:{args.port}"
    try:
        if args.tls_cert:
            port = server.add_secure_port(address, server_credentials(args.tls_cert, args.tls_key,
                                                                      args.tls_client_ca or None))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    except OSError as e:
        print(f"error: cannot read TLS files: {e}", file=sys.stderr, flush=True)
        return 2
    if port == 0:
        print(f"error: cannot listen on {args.host}:{args.port} (is another server running on this port?)",
              file=sys.stderr, flush=True)
        return 1
    try:
        engine, frontend, loaded = build_stack(args)
    except RingError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    engine.start()
    freeze_heap("ninfer serve")  # model, graphs, sidecar client built: out of every later collection
    add_generation_servicer(GenerationServicer(engine, frontend, default_max_tokens=args.max_tokens_default,
                                               max_queued_requests=args.max_queued_requests,
                                               chat_output=chat_output_frontend(loaded, frontend),
                                               model_name=os.path.basename(str(args.model).rstrip("/"))), server)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection([
        generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server)
    server.start()
    if engine.supervisor is not None:  # NOT_SERVING while the constraint sidecar is down
        engine.supervisor.add_listener(lambda state: _set_health(hs, state == "up"))
    else:
        _set_health(hs, True)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not (args.api_key or args.tls_client_ca):
        log.warning("listening on %s without --api-key or mutual TLS: anyone who can reach the port can use it",
                    args.host)
    print(f"ninfer ready on {args.host}:{port} (model {loaded.source}, device {engine.program.device}, "
          f"lanes {args.max_lanes})", flush=True)
    try:
        latch.wait()  # polls: a signal the kernel delivers to another thread (CUDA's, say) is seen too
    finally:
        hs.enter_graceful_shutdown()
        server.stop(grace=2.0).wait()
        engine.stop()
        print("ninfer stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve_main())
