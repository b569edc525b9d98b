"""``ninfer serve``: the engine (with its sidecar) and, when ``--http-port`` is given, the HTTP gateway.

The gateway is a separate process and a plain client of the public gRPC API, so it may not be
imported by the engine; this dispatcher is the one place that knows both.
"""
from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str]) -> int:
    """Runs ``ninfer serve`` with ``argv`` (without the subcommand); returns the exit code."""
    from gateway.supervisor import run_serve_with_http
    from gpu_engine.api.serve import serve_main

    return run_serve_with_http(serve_main, list(argv))
