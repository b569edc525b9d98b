"""Public gRPC servicer: ``ninfer.v1.Generation`` (Generate, CountTokens).

Protocol types stop here (STYLE.md "generated protobuf types stop at the
servicer edge"): :mod:`gpu_engine.api.convert` turns the request into a
transport-free :class:`~gpu_engine.core.params.GenerateParams`, and
:class:`~gpu_engine.core.admission.Admission` validates, renders, tokenises
and prepares it on this (the caller's) thread — off the engine worker, as seed
000 §3 asks — before it is queued. Every rejection before queueing is a
:class:`ninfer_common.errors.RequestError`, answered with its gRPC code and a
structured ``ErrorDetail`` (:func:`ninfer_common.grpc_status.rpc_status_of`).
"""
from __future__ import annotations

import logging
from typing import Iterator

import grpc

from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc
from ninfer_common.errors import ErrorKind, RequestError
from ninfer_common.grpc_status import rpc_status_of
from ninfer_common.telemetry import get_tracer

from gpu_engine.api.convert import delta_to_proto, finish_to_proto, input_of, params_from_proto
from gpu_engine.core.admission import Admission
from gpu_engine.core.params import GenerateParams
from gpu_engine.core.request import Delta, Finish, Request
from gpu_engine.engine import Engine
from gpu_engine.frontend import Frontend

log = logging.getLogger("ninfer.server")
_tracer = get_tracer("ninfer.gpu_engine.server")


def _abort(context: grpc.ServicerContext, e: RequestError) -> None:
    context.abort_with_status(rpc_status_of(e, pb.ErrorDetail))


class GenerationServicer(pb_grpc.GenerationServicer):
    """Implements ``ninfer.v1.Generation`` on top of an :class:`Engine`.

    Args:
        engine: the running engine.
        frontend: tokenizer + chat template of the served model.
        default_max_tokens: budget when a request gives 0.
    """

    def __init__(self, engine: Engine, frontend: Frontend, default_max_tokens: int = 256, chat_output=None) -> None:
        self.engine = engine
        self.frontend = frontend
        self.default_max_tokens = default_max_tokens
        self.admission = Admission(engine, frontend, default_max_tokens, chat_output=chat_output)

    def build_request(self, msg: pb.GenerateRequest) -> Request:
        """Convert, validate, render, tokenize and prepare the constraint (raises RequestError)."""
        return self.admission.admit(params_from_proto(msg))

    # ----------------------------------------------------------------- RPCs
    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        if isinstance(request, _Undecodable):
            _abort(context, RequestError(ErrorKind.INVALID_REQUEST, f"cannot decode the request: {request.reason}"))
            return
        with _tracer.start_as_current_span("ninfer.generate") as span:
            span.set_attribute("gen_ai.request.max_tokens", int(request.max_tokens))
            try:
                req = self.build_request(request)
            except RequestError as e:
                span.set_attribute("ninfer.error.kind", str(e.kind))
                self.engine.metrics.request_rejected(str(e.kind))
                _abort(context, e)
                return
            context.add_callback(req.cancel)
            self.engine.submit(req)
            while True:
                ev = req.events.get()
                if isinstance(ev, Delta):
                    yield delta_to_proto(ev, req.output is not None)
                    continue
                assert isinstance(ev, Finish)
                span.set_attribute("gen_ai.usage.input_tokens", ev.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", ev.completion_tokens)
                span.set_attribute("gen_ai.response.finish_reasons", [str(ev.finish_reason)])
                yield pb.GenerateResponse(finish=finish_to_proto(ev))
                return

    def CountTokens(self, request: pb.CountTokensRequest, context: grpc.ServicerContext) -> pb.CountTokensResponse:
        if isinstance(request, _Undecodable):
            _abort(context, RequestError(ErrorKind.INVALID_REQUEST, f"cannot decode the request: {request.reason}"))
        prompt, messages, cont = input_of(request)
        try:
            ids = self.admission.encode(GenerateParams(prompt=prompt, messages=messages, continue_final_message=cont))
        except RequestError as e:
            _abort(context, e)
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
