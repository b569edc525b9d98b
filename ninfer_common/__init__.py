"""Neutral code shared by the servers, the front doors and the tools.

Pure Python plus the gRPC status helpers: no torch, no xgrammar, no server.
``errors`` is the project's exception hierarchy (an :class:`~ninfer_common.errors.ErrorKind`,
a message and a location); ``grpc_status`` maps it to a gRPC status with a packed
error detail; ``telemetry`` sets up tracing and metrics. Every front door (the gRPC
servicer today, the HTTP gateway next) maps :mod:`ninfer_common.errors` to its own
status.
"""
