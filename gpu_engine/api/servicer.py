"""Public gRPC servicer: ``ninfer.v1.Generation`` (Generate, CountTokens).

Protocol types stop here (STYLE.md "generated protobuf types stop at the
servicer edge"): :mod:`gpu_engine.api.convert` turns the request into a
transport-free :class:`~gpu_engine.core.params.GenerateParams`, and
:class:`~gpu_engine.core.admission.Admission` validates, renders, tokenises
and prepares it on this (the caller's) thread — off the engine worker, as seed
000 §3 asks — before it is queued. Every rejection before queueing is a
:class:`ninfer_common.errors.RequestError`, answered with its gRPC code and a
structured ``ErrorDetail`` (:func:`ninfer_common.grpc_status.rpc_status_of`).

Tracing (issue 14 (9)): each Generate / CountTokens call has one span (``gen_ai.*`` attributes of the
OpenTelemetry GenAI semantic conventions: operation, model, response id = the request id, token usage,
finish reasons, sampling parameters); a rejected call's span has status ERROR and ``error.type`` = the
``ErrorKind``; every engine step span links to the request spans of its rows.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterator

import grpc

from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc
from ninfer_common.errors import ErrorKind, RequestError
from ninfer_common.grpc_status import rpc_status_of
from ninfer_common.telemetry import get_tracer, mark_error

from gpu_engine.api.convert import delta_to_proto, finish_to_proto, input_of, params_from_proto
from gpu_engine.core.admission import Admission
from gpu_engine.core.params import GenerateParams
from gpu_engine.core.request import Delta, Finish, Request
from gpu_engine.engine import Engine
from gpu_engine.frontend import Frontend

log = logging.getLogger("ninfer.server")
_tracer = get_tracer("ninfer.gpu_engine.server")


# Concurrent CountTokens calls; more answer RESOURCE_EXHAUSTED (tokenising is CPU work on the RPC pool).
COUNT_TOKENS_CONCURRENCY = 4
# Retry hint sent with RESOURCE_EXHAUSTED (google.rpc.RetryInfo), seconds.
RETRY_AFTER_S = 1.0


def _abort(context: grpc.ServicerContext, e: RequestError) -> None:
    if str(e.kind) == ErrorKind.SERVER_OVERLOADED:
        context.abort_with_status(_with_retry_hint(rpc_status_of(e, pb.ErrorDetail), RETRY_AFTER_S))
    context.abort_with_status(rpc_status_of(e, pb.ErrorDetail))


def _with_retry_hint(status: grpc.Status, retry_after_s: float) -> grpc.Status:
    """``status`` with a ``google.rpc.RetryInfo`` appended to its rich-error details."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    md = dict(status.trailing_metadata)
    rich = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    hint = any_pb2.Any()
    hint.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
        seconds=int(retry_after_s), nanos=int((retry_after_s % 1) * 1e9))))
    rich.details.append(hint)
    return rpc_status.to_status(rich)


class GenerationServicer(pb_grpc.GenerationServicer):
    """Implements ``ninfer.v1.Generation`` on top of an :class:`Engine`.

    Args:
        engine: the running engine.
        frontend: tokenizer + chat template of the served model.
        default_max_tokens: budget when a request gives 0.
        model_name: the served model's name (``gen_ai.request.model`` / ``gen_ai.response.model``).
    """

    def __init__(self, engine: Engine, frontend: Frontend, default_max_tokens: int = 256,
                 max_queued_requests: int = 64, chat_output=None, model_name: str = "") -> None:
        self.engine = engine
        self.model_name = model_name
        self.frontend = frontend
        self.default_max_tokens = default_max_tokens
        self.admission = Admission(engine, frontend, default_max_tokens, chat_output=chat_output)
        # Admission control (issue 14 (6)): Generate calls in flight (admitting, queued or running) are
        # bounded by lanes + queue; past it a call is refused at once with a retry hint, so the RPC
        # pool keeps threads for health checks.
        self.max_in_flight = engine.max_lanes + max(0, max_queued_requests)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._count_slots = threading.BoundedSemaphore(COUNT_TOKENS_CONCURRENCY)

    def _reject(self, context: grpc.ServicerContext, e: RequestError, span=None) -> None:
        """Count and answer a rejection before queueing (every path goes through here)."""
        if span is not None:
            span.set_attribute("ninfer.error.kind", str(e.kind))
            mark_error(span, str(e.kind), str(e))
        self.engine.metrics.request_rejected(str(e.kind))
        _abort(context, e)

    def _enter(self) -> bool:
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                return False
            self._in_flight += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def build_request(self, msg: pb.GenerateRequest) -> Request:
        """Convert, validate, render, tokenize and prepare the constraint (raises RequestError)."""
        return self.admission.admit(params_from_proto(msg))

    # ----------------------------------------------------------------- RPCs
    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        arrival = time.monotonic()
        with _tracer.start_as_current_span("ninfer.generate") as span:
            self._request_attributes(span, request)
            if isinstance(request, _Undecodable):
                self._reject(context, RequestError(ErrorKind.INVALID_REQUEST,
                                                   f"cannot decode the request: {request.reason}"), span)
                return
            if not self._enter():
                self._reject(context, RequestError(
                    ErrorKind.SERVER_OVERLOADED, f"the server is at capacity ({self.max_in_flight} requests running "
                    f"or queued); retry after {RETRY_AFTER_S:g} s"), span)
                return
            try:
                yield from self._generate(request, context, arrival, span)
            finally:
                self._leave()

    def _request_attributes(self, span, request) -> None:
        """GenAI semantic-convention attributes known before admission."""
        chat = not isinstance(request, _Undecodable) and request.WhichOneof("input") == "chat"
        span.set_attribute("gen_ai.operation.name", "chat" if chat else "text_completion")
        if self.model_name:
            span.set_attribute("gen_ai.request.model", self.model_name)
        if isinstance(request, _Undecodable):
            return
        span.set_attribute("gen_ai.request.max_tokens", int(request.max_tokens))

    def _generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext,
                  arrival: float, span) -> Iterator[pb.GenerateResponse]:
        try:
            req = self.build_request(request)
        except RequestError as e:
            self._reject(context, e, span)
            return
        span.set_attribute("gen_ai.response.id", req.request_id)
        sp = req.sampling
        for attr, value in (("temperature", float(sp.temperature)), ("top_p", float(sp.top_p)),
                            ("top_k", int(sp.top_k)), ("seed", int(sp.seed) & ((1 << 63) - 1))):
            span.set_attribute(f"gen_ai.request.{attr}", value)
        if self.model_name:
            span.set_attribute("gen_ai.response.model", self.model_name)
        req.trace_context = span.get_span_context()
        context.add_callback(req.cancel)
        self.engine.submit(req)
        metrics = self.engine.metrics
        last = None
        while True:
            ev = req.events.get()
            if isinstance(ev, Delta):
                n = len(ev.token_ids)
                if n:
                    now = time.monotonic()
                    if last is None:
                        metrics.first_token(now - arrival)
                    else:
                        metrics.inter_token((now - last) / n)
                    last = now
                yield delta_to_proto(ev, req.output is not None)
                continue
            assert isinstance(ev, Finish)
            span.set_attribute("gen_ai.usage.input_tokens", ev.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", ev.completion_tokens)
            span.set_attribute("gen_ai.response.finish_reasons", [str(ev.finish_reason)])
            if ev.error is not None:
                mark_error(span, str(ev.error.kind), str(ev.error))
            yield pb.GenerateResponse(finish=finish_to_proto(ev))
            return

    def CountTokens(self, request: pb.CountTokensRequest, context: grpc.ServicerContext) -> pb.CountTokensResponse:
        with _tracer.start_as_current_span("ninfer.count_tokens") as span:
            if self.model_name:
                span.set_attribute("gen_ai.request.model", self.model_name)
            if isinstance(request, _Undecodable):
                self._reject(context, RequestError(ErrorKind.INVALID_REQUEST,
                                                   f"cannot decode the request: {request.reason}"), span)
            if not self._count_slots.acquire(blocking=False):
                self._reject(context, RequestError(ErrorKind.SERVER_OVERLOADED, f"{COUNT_TOKENS_CONCURRENCY} "
                                                   f"CountTokens calls are running; retry after {RETRY_AFTER_S:g} s"),
                             span)
            try:
                prompt, messages, cont = input_of(request)
                try:
                    ids = self.admission.encode(GenerateParams(prompt=prompt, messages=messages,
                                                               continue_final_message=cont))
                except RequestError as e:
                    self._reject(context, e, span)
            finally:
                self._count_slots.release()
            span.set_attribute("gen_ai.usage.input_tokens", len(ids))
            return pb.CountTokensResponse(num_tokens=len(ids), max_context_tokens=self.engine.program.max_seq_len)


class _Undecodable:
    """Stand-in for a request whose bytes are not a valid message (e.g. invalid UTF-8 in a string)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(parse):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as e:  # noqa: BLE001 - answered as INVALID_ARGUMENT by the handler
            return _Undecodable(str(e) or type(e).__name__)

    return deserialize


def add_generation_servicer(servicer: GenerationServicer, server: grpc.Server) -> None:
    """Register ``servicer`` like the generated helper, but answer undecodable requests
    (invalid UTF-8 in a string field, truncated bytes) with INVALID_ARGUMENT and an
    ``ErrorDetail`` instead of gRPC's bare INTERNAL deserialization error."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=_lenient(pb.GenerateRequest.FromString),
            response_serializer=pb.GenerateResponse.SerializeToString),
        "CountTokens": grpc.unary_unary_rpc_method_handler(
            servicer.CountTokens, request_deserializer=_lenient(pb.CountTokensRequest.FromString),
            response_serializer=pb.CountTokensResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ninfer.v1.Generation", handlers),))
