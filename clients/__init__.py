"""NInfer Python client library and the ``ninfer`` CLI.

Only needs ``grpcio`` (+ ``grpcio-status``, ``grpcio-health-checking``) and the
generated ``ninfer.v1`` stubs; never imports torch or xgrammar.
"""

from .client import (
    DEFAULT_TARGET,
    GenerateEvent,
    GenerationResult,
    GenerationStream,
    NInferClient,
    TokenCount,
    build_constraint,
    build_tool_choice,
    build_tools,
    default_target,
)
from .errors import (
    ErrorDetail,
    NInferError,
    RequestRejected,
    ServerError,
    ServerUnavailable,
    error_detail_from_rpc_error,
    exception_from_rpc_error,
)

__all__ = [
    "DEFAULT_TARGET",
    "ErrorDetail",
    "GenerateEvent",
    "GenerationResult",
    "GenerationStream",
    "NInferClient",
    "NInferError",
    "RequestRejected",
    "ServerError",
    "ServerUnavailable",
    "TokenCount",
    "build_constraint",
    "build_tool_choice",
    "build_tools",
    "default_target",
    "error_detail_from_rpc_error",
    "exception_from_rpc_error",
]
