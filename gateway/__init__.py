"""NInfer HTTP gateway: OpenAI Chat Completions / Responses and Anthropic Messages over HTTP+SSE,
translated to and from the public ``ninfer.v1`` gRPC API (the engine is reached only through it).

Entry points for the CLI and the engine's supervisor:

* :func:`main` — ``python -m gateway --engine HOST:PORT --port PORT [--api-key KEY] [--host H]``
  (and ``ninfer gateway ...``).
* :func:`spawn_gateway` — starts that process; ``ninfer serve --http-port PORT`` supervises it
  like the constraint sidecar.
"""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

READY_LINE = "ninfer gateway ready on"


def build_parser() -> argparse.ArgumentParser:
    """The gateway's command line."""
    from .app import DEFAULT_MAX_REQUEST_BYTES

    ap = argparse.ArgumentParser(prog="ninfer gateway", description="OpenAI/Anthropic HTTP gateway to an NInfer "
                                                                     "engine (public gRPC API)")
    ap.add_argument("--engine", default=os.environ.get("NINFER_SERVER", "127.0.0.1:50051"),
                    help="engine gRPC address host:port (default: $NINFER_SERVER or 127.0.0.1:50051)")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    ap.add_argument("--api-key", default=os.environ.get("NINFER_API_KEY"),
                    help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1/* "
                         "(default: $NINFER_API_KEY; unset = no auth)")
    ap.add_argument("--engine-api-key", default=os.environ.get("NINFER_ENGINE_API_KEY"),
                    help="bearer token the engine's gRPC API requires (its --api-key; default: "
                         "$NINFER_ENGINE_API_KEY; unset = none)")
    ap.add_argument("--served-model-name", default="SmolLM2-135M-Instruct",
                    help="model name listed by /v1/models and accepted in requests (alias 'default' always works)")
    ap.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                    help="request body limit in bytes; larger bodies get 413")
    ap.add_argument("--log-level", default=os.environ.get("NINFER_LOG_LEVEL", "INFO"))
    return ap


def main(argv: list[str] | None = None) -> int:
    """Runs the gateway until SIGINT/SIGTERM; returns the exit code.

    Prints ``ninfer gateway ready on HOST:PORT`` once it accepts requests.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvicorn

    from .app import GatewayConfig, create_app, wrap

    config = GatewayConfig(engine_target=args.engine, model_name=args.served_model_name, api_key=args.api_key,
                           engine_api_key=args.engine_api_key, max_request_bytes=args.max_request_bytes)
    app = wrap(create_app(config), config)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=5))

    startup = server.startup

    async def announce(sockets=None):
        await startup(sockets)
        if server.started:
            print(f"{READY_LINE} {args.host}:{args.port} (engine {args.engine})", flush=True)

    server.startup = announce  # type: ignore[method-assign]
    server.run()
    return 0 if server.started else 1


def spawn_gateway(engine_target: str, port: int, *, host: str = "127.0.0.1", api_key: str | None = None,
                  engine_api_key: str | None = None,
                  model_name: str | None = None, extra_args: list[str] | None = None,
                  **popen_kwargs) -> subprocess.Popen:
    """Starts ``python -m gateway`` as a child process (for ``ninfer serve --http-port``).

    Args:
        engine_target: the engine's gRPC ``host:port`` (the gateway connects lazily, so the
            engine may still be starting).
        port: HTTP port.
        host: HTTP listen address.
        api_key: bearer token (passed through the environment, not argv, so ``ps`` does not show it).
        engine_api_key: the engine's gRPC bearer token (also through the environment).
        model_name: served model name for ``/v1/models``.
        extra_args: more gateway arguments.
        popen_kwargs: passed to ``subprocess.Popen`` (e.g. ``stdout``).
    Returns:
        The process; it prints :data:`READY_LINE` when it listens. Stop it with SIGTERM.
    """
    cmd = [sys.executable, "-m", "gateway", "--engine", engine_target, "--host", host, "--port", str(port)]
    if model_name:
        cmd += ["--served-model-name", model_name]
    cmd += list(extra_args or [])
    env = dict(popen_kwargs.pop("env", None) or os.environ)
    if api_key:
        env["NINFER_API_KEY"] = api_key
    if engine_api_key:
        env["NINFER_ENGINE_API_KEY"] = engine_api_key
    return subprocess.Popen(cmd, env=env, **popen_kwargs)


__all__ = ["READY_LINE", "build_parser", "main", "spawn_gateway"]
