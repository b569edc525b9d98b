"""The gateway's only way to the engine: the public ``ninfer.v1`` gRPC API (asyncio).

Uses the generated stubs and the pure helpers of the Python client library
(:func:`clients.client.result_from_finish`, :func:`clients.errors.error_detail_from_rpc_error`);
never imports ``gpu_engine`` or ``constraint_service`` (an import contract in CI checks it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.client import GenerationResult, result_from_finish
from clients.errors import error_detail_from_rpc_error
from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc

from .errors import ApiError, engine_rejection

#: Largest gRPC message the gateway sends or accepts (matches the engine's 8 MiB receive limit).
MAX_MESSAGE_BYTES = 8 << 20


@dataclass
class ConstraintOrigin:
    """Where a request's body constraint came from, to map engine error locations back.

    Attributes:
        field: request field path of the constraint source (``"text.format.schema"``).
        document: the parsed schema (for array-index rendering) or None.
    """

    field: str
    document: Any = None


def rejection_from_rpc_error(err: grpc.RpcError, origin: ConstraintOrigin | None) -> ApiError:
    """Maps a failed RPC (rejection before queueing, engine down, ...) to an :class:`ApiError`."""
    try:
        code = err.code()
    except Exception:  # noqa: BLE001 - not a Call
        code = grpc.StatusCode.UNKNOWN
    detail = error_detail_from_rpc_error(err)
    if detail is not None:
        kind, message, location = detail.kind, detail.message, detail.location
    else:
        kind, message, location = "", (err.details() if hasattr(err, "details") else str(err)) or str(code), ""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            kind, message = "EngineUnavailable", f"the engine is not reachable ({code.name}): {message}"
    return engine_rejection(code, kind, message, location, origin.field if origin else None,
                            origin.document if origin else None)


class GenerationCall:
    """One in-flight ``Generate`` RPC, already past the engine's admission checks.

    Iterate :meth:`deltas` for text deltas; afterwards :attr:`result` holds the
    :class:`clients.client.GenerationResult` (finish reason, usage, constraint, error).
    """

    def __init__(self, call: Any, first: pb.GenerateResponse, request_id: str) -> None:
        self._call = call
        self._first: pb.GenerateResponse | None = first
        self.request_id = request_id
        self._parts: list[str] = []
        self._num_tokens = 0
        self.result: GenerationResult | None = None

    def _take(self, resp: pb.GenerateResponse) -> str:
        self._parts.append(resp.text)
        self._num_tokens += len(resp.token_ids)
        if resp.HasField("finish"):
            self.result = result_from_finish(resp.finish, "".join(self._parts), [], self.request_id)
        return resp.text

    async def deltas(self) -> AsyncIterator[str]:
        """Yields each non-empty text delta; sets :attr:`result` at the end.

        A stream that breaks after admission (engine restart) ends with an
        ``"error"`` result instead of raising.
        """
        try:
            if self._first is not None:
                first, self._first = self._first, None
                text = self._take(first)
                if text:
                    yield text
            while self.result is None:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:
                    break
                text = self._take(resp)
                if text:
                    yield text
        except grpc.RpcError as err:
            detail = error_detail_from_rpc_error(err)
            self.result = GenerationResult(text="".join(self._parts), finish_reason="error", error={
                "code": err.code().name, "kind": detail.kind if detail else "EngineStreamBroken",
                "message": detail.message if detail else (err.details() or ""), "location": ""})
        finally:
            if self.result is None:
                self.cancel()
        if self.result is None:
            self.result = GenerationResult(text="".join(self._parts), finish_reason="error", error={
                "code": "INTERNAL", "kind": "IncompleteStream",
                "message": "the engine stream ended without a finish message", "location": ""})

    async def collect(self) -> GenerationResult:
        """Consumes the stream and returns the result."""
        async for _ in self.deltas():
            pass
        assert self.result is not None
        return self.result

    def cancel(self) -> None:
        """Cancels the RPC (idempotent); the engine frees the lane."""
        self._call.cancel()


class EngineClient:
    """An asyncio gRPC channel to one engine.

    Args:
        target: ``host:port`` of the engine's public gRPC server.
        api_key: the engine's bearer token (``authorization`` metadata on Generate / CountTokens;
            health checks carry none); None = the engine requires no key.
    """

    def __init__(self, target: str, api_key: str | None = None) -> None:
        self.target = target
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        self._channel = grpc.aio.insecure_channel(target, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        self._stub = pb_grpc.GenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()

    async def start(self, req: pb.GenerateRequest, origin: ConstraintOrigin | None = None) -> GenerationCall:
        """Starts ``Generate`` and waits for its first message, so that a rejection before
        queueing is raised here — before any HTTP status or SSE byte is sent.

        Raises:
            ApiError: the engine rejected the request (400 with the field path for
                constraint errors) or is unreachable (503).
        """
        call = self._stub.Generate(req, metadata=self._metadata)
        try:
            first = await call.read()
        except grpc.RpcError as err:
            raise rejection_from_rpc_error(err, origin) from None
        except BaseException:
            call.cancel()
            raise
        if first is grpc.aio.EOF:
            raise ApiError(502, "the engine ended the stream without a message", None, "IncompleteStream")
        return GenerationCall(call, first, req.request_id)

    async def count_tokens(self, req: pb.CountTokensRequest) -> pb.CountTokensResponse:
        """``CountTokens``; raises :class:`ApiError` on failure."""
        try:
            return await self._stub.CountTokens(req, timeout=30.0, metadata=self._metadata)
        except grpc.RpcError as err:
            raise rejection_from_rpc_error(err, None) from None

    async def healthy(self) -> bool:
        """True when the engine's ``grpc.health.v1`` reports SERVING for ``ninfer.v1.Generation``."""
        try:
            resp = await self._health.Check(health_pb2.HealthCheckRequest(service="ninfer.v1.Generation"),
                                            timeout=2.0)
        except grpc.RpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING
