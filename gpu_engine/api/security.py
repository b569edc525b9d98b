"""Transport security of the public port: TLS / mutual TLS credentials and bearer-token auth.

* ``--tls-cert`` + ``--tls-key`` (PEM files) serve TLS; ``--tls-client-ca`` additionally requires
  and verifies a client certificate signed by that CA (mutual TLS).
* ``--api-key`` (or ``$NINFER_API_KEY``, which keeps the key out of the process list) requires
  ``authorization: Bearer <key>`` metadata on every RPC except ``grpc.health.v1`` (probes carry no
  secrets); a missing or wrong key is ``UNAUTHENTICATED``. Keys are compared in constant time.
"""
from __future__ import annotations

import hmac
from pathlib import Path

import grpc

__all__ = ["ApiKeyInterceptor", "server_credentials"]

# Methods answered without a key: standard health checks (Kubernetes / compose probes).
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
# Server-streaming methods of the public API (their refusal must be a streaming handler).
_STREAMING = frozenset({"/ninfer.v1.Generation/Generate"})


def server_credentials(cert_file: str, key_file: str, client_ca_file: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials from PEM files; with ``client_ca_file`` clients must present a certificate it signed.

    Raises:
        OSError: a file cannot be read.
    """
    pair = [(Path(key_file).read_bytes(), Path(cert_file).read_bytes())]
    if client_ca_file:
        return grpc.ssl_server_credentials(pair, root_certificates=Path(client_ca_file).read_bytes(),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials(pair)


class ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses RPCs without ``authorization: Bearer <api_key>`` (health checks excepted).

    Args:
        api_key: the shared secret (non-empty).
    Raises:
        ValueError: ``api_key`` is empty.
    """

    def __init__(self, api_key: str) -> None:
        if not api_key:
            raise ValueError("api_key: expected a non-empty string")
        self._expected = f"Bearer {api_key}".encode()

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(OPEN_METHOD_PREFIXES):
            return continuation(handler_call_details)
        got = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                got = value if isinstance(value, str) else value.decode("latin-1")
                break
        if hmac.compare_digest(got.encode("utf-8", "replace"), self._expected):
            return continuation(handler_call_details)
        return _deny(method, "missing or invalid API key (send `authorization: Bearer <key>`)")


def _deny(method: str, message: str):
    def abort(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if method in _STREAMING:
        def abort_stream(request, context):
            abort(request, context)
            yield  # pragma: no cover - abort raises

        return grpc.unary_stream_rpc_method_handler(abort_stream)
    return grpc.unary_unary_rpc_method_handler(abort)
