"""The gateway's only way to the engine: the public ``ninfer.v1`` gRPC API (asyncio).

Uses the generated stubs and the pure helpers of the Python client library
(:func:`clients.client.result_from_finish`, :func:`clients.errors.error_detail_from_rpc_error`);
never imports ``gpu_engine`` or ``constraint_service`` (an import contract in CI checks it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.client import CHANNELS, GenerationResult, result_from_finish, tool_call_dict
from clients.errors import error_detail_from_rpc_error
from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc

from .errors import GRPC_TO_HTTP, ApiError, engine_rejection, field_path

#: Largest gRPC message the gateway sends or accepts (matches the engine's 8 MiB receive limit).
MAX_MESSAGE_BYTES = 8 << 20


@dataclass
class ConstraintOrigin:
    """Where a request's body constraint and tool schemas came from, to map engine error
    locations back to request field paths.

    Attributes:
        field: request field path of the constraint source (``"text.format.schema"``), or None
            when the request has no body constraint.
        document: the parsed schema (for array-index rendering) or None.
        tools: the request's tools in order (:class:`gateway.tools.ToolSpec`: ``schema_path`` and
            ``parameters``); engine locations ``/tools/i/function/parameters/...`` map onto them.
        thinking_field: the request field that asked for thinking (``"thinking.type"``,
            ``"chat_template_kwargs.enable_thinking"``); engine locations ``/thinking/...`` map onto it.
    """

    field: str | None
    document: Any = None
    tools: list = field(default_factory=list)
    thinking_field: str | None = None


@dataclass
class Delta:
    """One streamed piece of output.

    Attributes:
        channel: ``"content"``, ``"reasoning"`` or ``"tool_call"``.
        text: the text of a content/reasoning delta ("" for tool calls).
        tool_call_index: index of the call within the turn (``tool_call`` only).
        tool_call: ``{"id", "name", "arguments_json"}`` — a complete, decoded call (``tool_call`` only;
            the raw wire text of a call is never surfaced).
    """

    channel: str
    text: str = ""
    tool_call_index: int = 0
    tool_call: dict | None = None


_TOOL_LOCATION = re.compile(r"^/tools/(\d+)(/.*)?$")


def tool_location(origin: ConstraintOrigin | None, location: str) -> str | None:
    """Maps an engine location inside a tool (``/tools/1/function/parameters/properties/days``) to the
    protocol's field path (``tools[1].function.parameters.properties.days`` for Chat,
    ``tools[1].parameters...`` for Responses, ``tools[1].input_schema...`` for Messages).

    Returns:
        The path, or None when ``location`` is not inside a declared tool.
    """
    m = _TOOL_LOCATION.match(location or "")
    if origin is None or m is None or int(m.group(1)) >= len(origin.tools):
        return None
    spec = origin.tools[int(m.group(1))]
    rest = m.group(2) or ""
    for prefix in ("/function/parameters", "/parameters", "/input_schema"):
        if rest == prefix or rest.startswith(prefix + "/"):
            return field_path(spec.schema_path, rest[len(prefix):], spec.parameters)
    base = spec.schema_path.rsplit(".", 1)[0]  # tools[i] or tools[i].function
    tail = rest[len("/function"):] if rest.startswith("/function") and base.endswith(".function") else rest
    return field_path(base, tail)


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
    tool_path = tool_location(origin, location)
    if tool_path is None and origin is not None and origin.thinking_field and (location or "").startswith("/thinking"):
        tool_path = origin.thinking_field  # e.g. thinking asked of a model without a thinking stage
    if tool_path is not None:  # a tool's schema / name, the thinking switch: the request's own field path
        return ApiError(GRPC_TO_HTTP.get(code, 500), f"{kind or 'InvalidRequest'} at {tool_path}: {message}",
                        tool_path, kind or None)
    return engine_rejection(code, kind, message, location, origin.field if origin else None,
                            origin.document if origin else None)


class GenerationCall:
    """One in-flight ``Generate`` RPC, already past the engine's admission checks.

    Iterate :meth:`deltas` for :class:`Delta` pieces (content, reasoning, complete tool calls);
    afterwards :attr:`result` holds the :class:`clients.client.GenerationResult` (content text,
    reasoning, tool calls, finish reason, usage, constraint, error).
    """

    def __init__(self, call: Any, first: pb.GenerateResponse, request_id: str) -> None:
        self._call = call
        self._first: pb.GenerateResponse | None = first
        self.request_id = request_id
        self._parts: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[dict] = []
        self.result: GenerationResult | None = None

    def _take(self, resp: pb.GenerateResponse) -> Delta | None:
        channel = CHANNELS.get(resp.channel, "content")
        delta = None
        if channel == "content" and resp.text:
            self._parts.append(resp.text)
            delta = Delta("content", resp.text)
        elif channel == "reasoning" and resp.text:
            self._reasoning.append(resp.text)
            delta = Delta("reasoning", resp.text)
        elif channel == "tool_call" and resp.HasField("tool_call"):
            call = tool_call_dict(resp.tool_call)
            self._calls.append(call)
            delta = Delta("tool_call", "", resp.tool_call_index, call)
        if resp.HasField("finish"):
            self.result = result_from_finish(resp.finish, "".join(self._parts), [], self.request_id)
        return delta

    def _partial(self, code: str, kind: str, message: str) -> GenerationResult:
        return GenerationResult(text="".join(self._parts), finish_reason="error",
                                reasoning="".join(self._reasoning) if self._reasoning else None,
                                tool_calls=list(self._calls),
                                error={"code": code, "kind": kind, "message": message, "location": ""})

    async def deltas(self) -> AsyncIterator[Delta]:
        """Yields each :class:`Delta` (non-empty content/reasoning text, complete tool calls);
        sets :attr:`result` at the end.

        A stream that breaks after admission (engine restart) ends with an
        ``"error"`` result instead of raising.
        """
        try:
            if self._first is not None:
                first, self._first = self._first, None
                delta = self._take(first)
                if delta is not None:
                    yield delta
            while self.result is None:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:
                    break
                delta = self._take(resp)
                if delta is not None:
                    yield delta
        except grpc.RpcError as err:
            detail = error_detail_from_rpc_error(err)
            self.result = self._partial(err.code().name, detail.kind if detail else "EngineStreamBroken",
                                        detail.message if detail else (err.details() or ""))
        finally:
            if self.result is None:
                self.cancel()
        if self.result is None:
            self.result = self._partial("INTERNAL", "IncompleteStream",
                                        "the engine stream ended without a finish message")

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
