"""Public gRPC servicer: ``ninfer.v1.Generation`` (Generate, CountTokens).

Protocol types stop here (STYLE.md "generated protobuf types stop at the
servicer edge"): requests are validated, rendered and tokenized, their
constraint is prepared in the sidecar on this (the caller's) thread — off
the engine worker, as seed 000 §3 asks — and only then queued. Every
rejection before queueing is a gRPC error with a structured ``ErrorDetail``.
"""
from __future__ import annotations

import hashlib
import logging
import math
import uuid
from typing import Iterator

import grpc

from ninfer_common.grpc_status import make_rpc_status
from ninfer_common.telemetry import get_tracer
from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc

from gpu_engine.engine.loop import Engine
from gpu_engine.errors import RequestError
from gpu_engine.frontend.prompt import Frontend, validate_messages
from gpu_engine.core.request import ConstraintRef, Delta, Finish, Request, SamplingOptions
from gpu_engine.api.tools_convert import chat_messages_of, thinking_of, tool_choice_of, tools_of, uses_tools_or_thinking
from gpu_engine.frontend.output import ChatOutputFrontend

log = logging.getLogger("ninfer.server")
_tracer = get_tracer("ninfer.gpu_engine.server")

MAX_CONSTRAINT_SOURCE_BYTES = 1 << 20  # 1 MiB of schema / grammar / regex text
MAX_CHOICES = 4096
_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "error": pb.FINISH_REASON_ERROR,
           "cancelled": pb.FINISH_REASON_CANCELLED, "tool_calls": pb.FINISH_REASON_TOOL_CALLS}
_CHANNEL = {"content": pb.CHANNEL_CONTENT, "reasoning": pb.CHANNEL_REASONING, "tool_call": pb.CHANNEL_TOOL_CALL}
_CACHE = {"hit": pb.CACHE_STATUS_HIT, "built": pb.CACHE_STATUS_BUILT, "waited": pb.CACHE_STATUS_WAITED}
SPEC_METHODS = {pb.SPECULATIVE_METHOD_NONE: "none", pb.SPECULATIVE_METHOD_NGRAM: "ngram",
                pb.SPECULATIVE_METHOD_EARLY_EXIT: "early-exit",
                pb.SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED: "early-exit-sampled"}


def _abort(context: grpc.ServicerContext, e: RequestError) -> None:
    context.abort_with_status(make_rpc_status(
        e.code, pb.ErrorDetail(code=e.code.name, kind=e.kind, message=e.message, location=e.location)))


def _has_unknown_fields(msg) -> bool:
    try:
        from google.protobuf import unknown_fields

        return len(unknown_fields.UnknownFieldSet(msg)) > 0
    except (ImportError, AttributeError):  # pragma: no cover - older protobuf
        return bool(msg.UnknownFields())


def _constraint_of(msg: pb.GenerateRequest) -> ConstraintRef | None:
    if not msg.HasField("constraint"):
        return None
    c = msg.constraint
    which = c.WhichOneof("kind")
    if which is None or _has_unknown_fields(c):
        # A constraint this server cannot read must never be dropped silently.
        raise RequestError("InvalidRequest", "the `constraint` field is set but holds no constraint kind this server "
                           "knows (expected json_object, json_schema, grammar, regex or choice)")
    if which == "json_object":
        return ConstraintRef("json_object")
    if which == "choice":
        if len(c.choice.options) > MAX_CHOICES:
            raise RequestError("InvalidChoice", f"expected at most {MAX_CHOICES} options, got {len(c.choice.options)}")
        return ConstraintRef("choice", choices=tuple(c.choice.options))
    src = getattr(c, which)
    if len(src.encode()) > MAX_CONSTRAINT_SOURCE_BYTES:
        raise RequestError("InvalidRequest", f"constraint source too large: {len(src.encode())} bytes "
                           f"(limit {MAX_CONSTRAINT_SOURCE_BYTES})")
    return ConstraintRef(which, source=src)


class GenerationServicer(pb_grpc.GenerationServicer):
    """Implements ``ninfer.v1.Generation`` on top of an :class:`Engine`.

    Args:
        engine: the running engine.
        frontend: tokenizer + chat template of the served model.
        default_max_tokens: budget when a request gives 0.
    """

    def __init__(self, engine: Engine, frontend: Frontend, default_max_tokens: int = 256,
                 chat_output: "ChatOutputFrontend | None" = None) -> None:
        self.engine = engine
        self.frontend = frontend
        self.default_max_tokens = default_max_tokens
        #: tools / thinking support of the served model (None: plain chat only)
        self.chat_output = chat_output

    # ----------------------------------------------------------- validation
    def _sampling(self, msg: pb.GenerateRequest, request_id: str) -> SamplingOptions:
        s = msg.sampling
        temp = s.temperature if s.HasField("temperature") else 1.0
        top_p = s.top_p if s.HasField("top_p") else 1.0
        min_p = s.min_p if s.HasField("min_p") else 0.0
        top_k = s.top_k if s.HasField("top_k") else 0
        if not (math.isfinite(temp) and temp >= 0):
            raise RequestError("InvalidRequest", f"temperature must be a finite number >= 0, got {temp}")
        if not (0 < top_p <= 1):
            raise RequestError("InvalidRequest", f"top_p must be in (0, 1], got {top_p}")
        if not (0 <= min_p <= 1):
            raise RequestError("InvalidRequest", f"min_p must be in [0, 1], got {min_p}")
        if top_k < 0:
            raise RequestError("InvalidRequest", f"top_k must be >= 0, got {top_k}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(s, name)
            if not (math.isfinite(v) and -2.0 <= v <= 2.0):
                raise RequestError("InvalidRequest", f"{name} must be in [-2, 2], got {v}")
        if s.HasField("seed"):
            seed = s.seed - (1 << 64) if s.seed >= (1 << 63) else s.seed  # uint64 -> int64, bijective
        else:
            seed = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little") & ((1 << 63) - 1)
        return SamplingOptions(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                               presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty)

    def build_request(self, msg: pb.GenerateRequest) -> Request:
        """Validate, render, tokenize and prepare the constraint (raises RequestError)."""
        request_id = msg.request_id or uuid.uuid4().hex
        which = msg.WhichOneof("input")
        if which is None:
            raise RequestError("InvalidRequest", "expected one of `prompt` or `chat`, got neither")
        prefix = b""
        plan = None
        constraint = _constraint_of(msg)
        if which == "chat":
            msgs = chat_messages_of(msg.chat)
            validate_messages(msgs)
            if msg.chat.continue_final_message:
                if msgs[-1]["role"] != "assistant":
                    raise RequestError("InvalidRequest", "continue_final_message needs a final assistant message, "
                                       f"got role {msgs[-1]['role']!r}")
                prefix = msgs[-1]["content"].encode()
            tools, choice, thinking = _frontend_errors(lambda: (tools_of(msg), tool_choice_of(msg), thinking_of(msg)))
            co = self.chat_output
            if co is not None and co.needs_plan(tools, choice, thinking, msgs):
                prompt_ids, plan = _frontend_errors(lambda: co.prepare(
                    msgs, tools, choice, thinking, constraint.kind if constraint else None,
                    constraint.source if constraint else None, continue_final=msg.chat.continue_final_message))
            elif uses_tools_or_thinking(msg):
                raise RequestError("InvalidRequest", "this server's model has no tool / thinking frontend", "/tools")
            else:
                prompt_ids = self.frontend.encode_chat(msgs, continue_final=msg.chat.continue_final_message)
        else:
            if uses_tools_or_thinking(msg):
                raise RequestError("InvalidRequest", "tools and thinking need chat input (`chat`), not `prompt`",
                                   "/tools")
            prompt_ids = self.frontend.encode_prompt(msg.prompt)
        if not prompt_ids:
            raise RequestError("InvalidRequest", "the prompt is empty (0 tokens)")
        max_ctx = self.engine.program.max_seq_len
        if len(prompt_ids) >= max_ctx - 1:
            raise RequestError("InvalidRequest", f"prompt has {len(prompt_ids)} tokens; the context limit is "
                               f"{max_ctx} (at least 1 must remain for output)")
        max_tokens = msg.max_tokens or self.default_max_tokens
        sampling = self._sampling(msg, request_id)
        if msg.speculative.method not in SPEC_METHODS and msg.speculative.method != pb.SPECULATIVE_METHOD_UNSPECIFIED:
            raise RequestError("InvalidRequest", f"unknown speculative method {msg.speculative.method}")
        method = SPEC_METHODS.get(msg.speculative.method, self.engine.spec_method)
        k = msg.speculative.num_draft_tokens or self.engine.num_draft_tokens
        if method != "none" and k > self.engine.num_draft_tokens:
            raise RequestError("InvalidRequest", f"num_draft_tokens {k} exceeds the server's maximum "
                               f"{self.engine.num_draft_tokens} (start the server with --num-draft-tokens)")
        if method != "none" and self.engine.num_draft_tokens == 0:
            raise RequestError("InvalidRequest", "speculative decoding is not enabled on this server "
                               "(start it with --num-draft-tokens K)")
        wrapper = ""
        if plan is not None and plan.wrapped:
            wrapper = plan.grammar_key()
            if constraint is None:  # the tool / thinking language alone
                constraint = ConstraintRef("tools" if plan.policy.tools else "thinking")
        req = Request(request_id=request_id, prompt_ids=prompt_ids, max_tokens=max_tokens, sampling=sampling,
                      constraint=constraint, spec_method=method, num_draft_tokens=k if method != "none" else 0)
        if plan is not None:
            req.output = self.chat_output.new_stream(plan)
        if constraint is not None:
            sc = self.engine.sidecar
            if sc is None:
                raise RequestError("ConstraintServiceUnavailable", "this server runs without a constraint sidecar",
                                   code=grpc.StatusCode.FAILED_PRECONDITION)
            body_kind = "" if constraint.kind in ("tools", "thinking") else constraint.kind
            info = sc.prepare(request_id, body_kind, constraint.source, list(constraint.choices), prefix,
                              wrapper=wrapper)
            req.sidecar_generation = info.generation
            req.constraint_info = {"cache": info.cache, "prepare_seconds": info.prepare_seconds}
        return req

    # ----------------------------------------------------------------- RPCs
    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        if isinstance(request, _Undecodable):
            _abort(context, RequestError("InvalidRequest", f"cannot decode the request: {request.reason}"))
            return
        with _tracer.start_as_current_span("ninfer.generate") as span:
            span.set_attribute("gen_ai.request.max_tokens", int(request.max_tokens))
            try:
                req = self.build_request(request)
            except RequestError as e:
                span.set_attribute("ninfer.error.kind", e.kind)
                self.engine.metrics.request_rejected(e.kind)
                _abort(context, e)
                return
            context.add_callback(req.cancel)
            self.engine.submit(req)
            while True:
                ev = req.events.get()
                if isinstance(ev, Delta):
                    resp = pb.GenerateResponse(text=ev.text, token_ids=ev.token_ids)
                    if req.output is not None:
                        resp.channel = _CHANNEL[ev.channel]
                        resp.tool_call_index = ev.call_index
                        if ev.call is not None:
                            resp.tool_call.CopyFrom(pb.ToolCall(**ev.call))
                    yield resp
                    continue
                assert isinstance(ev, Finish)
                span.set_attribute("gen_ai.usage.input_tokens", ev.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", ev.completion_tokens)
                span.set_attribute("gen_ai.response.finish_reasons", [ev.finish_reason])
                yield pb.GenerateResponse(finish=self._finish_msg(ev))
                return

    @staticmethod
    def _finish_msg(ev: Finish) -> pb.Finish:
        f = pb.Finish(finish_reason=_FINISH[ev.finish_reason], usage=pb.Usage(
            prompt_tokens=ev.prompt_tokens, completion_tokens=ev.completion_tokens, draft_tokens=ev.draft_tokens,
            accepted_draft_tokens=ev.accepted_draft_tokens))
        if ev.constraint is not None:
            c = ev.constraint
            f.constraint.CopyFrom(pb.ConstraintResult(
                kind=c["kind"], complete=bool(c.get("complete")), terminated=bool(c.get("terminated")),
                cache=_CACHE.get(c.get("cache", ""), pb.CACHE_STATUS_UNSPECIFIED),
                prepare_seconds=float(c.get("prepare_seconds", 0.0)), mask_positions=int(c.get("mask_positions", 0))))
            if c.get("branch"):
                f.constraint.branch = c["branch"]
        if ev.error is not None:
            f.error.CopyFrom(pb.ErrorDetail(**ev.error))
        for call in ev.tool_calls:
            f.tool_calls.add(**call)
        if ev.reasoning is not None:
            f.reasoning = ev.reasoning
        return f

    def CountTokens(self, request: pb.CountTokensRequest, context: grpc.ServicerContext) -> pb.CountTokensResponse:
        if isinstance(request, _Undecodable):
            _abort(context, RequestError("InvalidRequest", f"cannot decode the request: {request.reason}"))
        which = request.WhichOneof("input")
        try:
            if which == "chat":
                ids = self.frontend.encode_chat([{"role": m.role, "content": m.content} for m in request.chat.messages],
                                                continue_final=request.chat.continue_final_message)
            elif which == "prompt":
                ids = self.frontend.encode_prompt(request.prompt)
            else:
                raise RequestError("InvalidRequest", "expected one of `prompt` or `chat`, got neither")
        except RequestError as e:
            _abort(context, e)
        return pb.CountTokensResponse(num_tokens=len(ids), max_context_tokens=self.engine.program.max_seq_len)


def _frontend_errors(fn):
    """Runs ``fn``; a project RequestError (frontend plan / contract rejections) becomes the servicer's."""
    from ninfer_common.errors import RequestError as CommonRequestError

    try:
        return fn()
    except CommonRequestError as e:
        raise RequestError(str(e.kind), e.message, e.location) from None


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
