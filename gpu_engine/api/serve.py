"""``ninfer serve`` / ``python -m gpu_engine``: start the engine, its sidecar and the public gRPC server.

Prints a line containing ``ready`` once requests are accepted; SIGINT or
SIGTERM stop the server, the engine, the sidecar, and remove the mask ring.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from concurrent import futures

from gpu_engine.spec.registry import SpecMethod

log = logging.getLogger("ninfer.serve")


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
    ap.add_argument("--max-tokens-default", type=int, default=256, help="budget when a request gives none")
    ap.add_argument("--speculative", choices=[m.value for m in SpecMethod], default="none")
    ap.add_argument("--num-draft-tokens", type=int, default=0, help="K draft tokens per step (0 = no speculation)")
    ap.add_argument("--draft-layers", type=int, default=0, help="early-exit drafter depth L (default: layers/4)")
    ap.add_argument("--grammar-cache-bytes", type=int, default=256 << 20)
    ap.add_argument("--max-cold-compiles", type=int, default=2)
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="grammar compile deadline, seconds")
    ap.add_argument("--mask-fill-threads", type=int, default=0,
                    help="sidecar threads for the batched mask fill (0 = auto: min(8, CPUs); 1 on 2 CPUs)")
    ap.add_argument("--prefill-token-budget", type=int, default=4096,
                    help="prompt tokens per batched prefill forward (rows admitted together share it)")
    ap.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="serve Prometheus /metrics on this port (0 = off)")
    ap.add_argument("--log-level", default=os.environ.get("NINFER_LOG_LEVEL", "INFO"))
    http = ap.add_argument_group("HTTP gateway (`ninfer serve` only; OpenAI / Anthropic protocols, off by default)")
    http.add_argument("--http-port", type=int, default=0, help="also start the HTTP gateway on this port")
    http.add_argument("--http-host", default=None, help="gateway listen address (default: --host)")
    return ap


def build_stack(args: argparse.Namespace):
    """Load the model and create ring, sidecar, program and engine (not started)."""
    import torch

    from shared_memory.ring import MaskRing, default_ring_name

    from gpu_engine.engine.loop import Engine, ring_geometry
    from gpu_engine.frontend.prompt import Frontend
    from gpu_engine.hub.fetch import ensure_model
    from gpu_engine.model.loader import load_model
    from gpu_engine.sidecar.client import Sidecar

    from gpu_engine.model.config import PRESETS

    path = args.model if args.model in PRESETS else ensure_model(args.model)  # presets: random weights
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    loaded = load_model(str(path), device=args.device, dtype=dtype, max_lanes=args.max_lanes,
                        max_seq_len=args.max_seq_len)
    if args.speculative != "none" and args.num_draft_tokens <= 0:
        args.num_draft_tokens = 4
    k = args.num_draft_tokens if args.speculative != "none" else args.num_draft_tokens
    vocab = loaded.vocab
    geo = ring_geometry(args.max_lanes, k, vocab.vocab_size)
    ring = MaskRing.create(default_ring_name(str(args.port)), geo)
    ring_info = dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots, num_lanes=geo.num_lanes,
                     num_positions=geo.num_positions, num_words=geo.num_words)
    sidecar = Sidecar(f"/tmp/ninfer-{args.port}-constraint.sock", vocab, ring_info, extra_args=[
        "--grammar-cache-bytes", str(args.grammar_cache_bytes), "--max-cold-compiles", str(args.max_cold_compiles),
        "--compile-timeout", str(args.compile_timeout), "--fill-threads", str(args.mask_fill_threads)])
    from gpu_engine.executor import make_program

    program = make_program(loaded, ring, cuda_graphs=args.cuda_graphs)
    program.prefill_token_budget = max(1, args.prefill_token_budget)
    engine = Engine(program, vocab, sidecar=sidecar, ring=ring, spec_method=args.speculative,
                    num_draft_tokens=k, draft_layers=args.draft_layers)
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


def serve_main(argv: list[str] | None = None) -> int:
    """Entry point of ``ninfer serve``; returns the process exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.http_port or args.http_host:
        # `ninfer serve` strips these before calling us; reaching here means `python -m gpu_engine`, which has no
        # gateway to start: refuse rather than ignore the flag.
        ap.error("--http-port/--http-host start the HTTP gateway and need `ninfer serve` (or run `ninfer gateway`)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    from ninfer_common.telemetry import server_interceptors, setup_metrics, setup_tracing
    from ninfer.v1 import generation_pb2

    from gpu_engine.api.servicer import GenerationServicer, add_generation_servicer

    setup_tracing("ninfer-engine")
    if setup_metrics("ninfer-engine", args.metrics_port, args.host):
        print(f"metrics on http://{args.host}:{args.metrics_port}/metrics", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    engine, frontend, loaded = build_stack(args)
    engine.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), interceptors=server_interceptors(),
                         options=[("grpc.max_receive_message_length", 8 << 20)])
    add_generation_servicer(GenerationServicer(engine, frontend, default_max_tokens=args.max_tokens_default,
                                               chat_output=chat_output_frontend(loaded, frontend)), server)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection([
        generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    if port == 0:
        print(f"error: cannot listen on {args.host}:{args.port}", file=sys.stderr)
        engine.stop()
        return 1
    server.start()
    hs.set("", health_pb2.HealthCheckResponse.SERVING)
    hs.set("ninfer.v1.Generation", health_pb2.HealthCheckResponse.SERVING)
    print(f"ninfer ready on {args.host}:{port} (model {loaded.source}, device {engine.program.device}, "
          f"lanes {args.max_lanes})", flush=True)
    try:
        stop.wait()
    finally:
        hs.enter_graceful_shutdown()
        server.stop(grace=2.0).wait()
        engine.stop()
        print("ninfer stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve_main())
