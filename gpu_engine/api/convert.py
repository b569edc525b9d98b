"""Protobuf <-> plain values at the servicer edge (STYLE "generated protobuf types stop at the servicer edge").

``ninfer.v1`` messages become :class:`gpu_engine.core.params.GenerateParams`
(:func:`params_from_proto`); an engine :class:`~gpu_engine.core.request.Finish`
becomes a ``ninfer.v1.Finish`` (:func:`finish_to_proto`). Each public enum has
exactly one mapping here.
"""
from __future__ import annotations

from ninfer.v1 import generation_pb2 as pb
from ninfer_common.constraint_kind import ConstraintKind
from ninfer_common.errors import ErrorKind, RequestError

from gpu_engine.api.tools_convert import thinking_of, tool_choice_of, tools_of
from gpu_engine.core.params import ChatMessage, ConstraintParams, GenerateParams
from gpu_engine.core.request import CacheStatus, Finish, FinishReason, SpecMethod

__all__ = ["SPEC_METHODS", "finish_to_proto", "input_of", "params_from_proto"]

#: public SpeculativeMethod -> SpecMethod (UNSPECIFIED = the server default)
SPEC_METHODS = {pb.SPECULATIVE_METHOD_NONE: SpecMethod.NONE, pb.SPECULATIVE_METHOD_NGRAM: SpecMethod.NGRAM,
                pb.SPECULATIVE_METHOD_EARLY_EXIT: SpecMethod.EARLY_EXIT,
                pb.SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED: SpecMethod.EARLY_EXIT_SAMPLED}
_FINISH = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
           FinishReason.ERROR: pb.FINISH_REASON_ERROR, FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
           FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS}
#: Delta.channel -> public Channel
CHANNELS = {"content": pb.CHANNEL_CONTENT, "reasoning": pb.CHANNEL_REASONING, "tool_call": pb.CHANNEL_TOOL_CALL}
_CACHE = {CacheStatus.HIT: pb.CACHE_STATUS_HIT, CacheStatus.BUILT: pb.CACHE_STATUS_BUILT,
          CacheStatus.WAITED: pb.CACHE_STATUS_WAITED}


def _has_unknown_fields(msg) -> bool:
    try:
        from google.protobuf import unknown_fields

        return len(unknown_fields.UnknownFieldSet(msg)) > 0
    except (ImportError, AttributeError):  # pragma: no cover - older protobuf
        return bool(msg.UnknownFields())


def constraint_of(msg: pb.GenerateRequest) -> ConstraintParams | None:
    """The request's constraint, or None.

    Raises:
        RequestError: ``InvalidRequest`` when the field is set but holds no kind this server knows
            (a constraint must never be dropped silently).
    """
    if not msg.HasField("constraint"):
        return None
    c = msg.constraint
    which = c.WhichOneof("kind")
    if which is None or _has_unknown_fields(c):
        raise RequestError(ErrorKind.INVALID_REQUEST, "the `constraint` field is set but holds no constraint kind "
                           "this server knows (expected json_object, json_schema, grammar, regex or choice)")
    kind = ConstraintKind.parse(which)
    value = getattr(c, which)
    if isinstance(value, str):  # text-source kinds: json_schema, grammar, regex, ...
        return ConstraintParams(kind, source=value)
    options = getattr(value, "options", None)  # choice
    return ConstraintParams(kind, choices=tuple(options) if options is not None else ())


def input_of(msg) -> tuple[str | None, list[ChatMessage] | None, bool]:
    """``(prompt, messages, continue_final_message)`` of a GenerateRequest / CountTokensRequest."""
    which = msg.WhichOneof("input")
    if which == "chat":
        return None, [ChatMessage(m.role, m.content, tuple({"id": c.id, "name": c.name,
                                                             "arguments": c.arguments_json or "{}"} for c in m.tool_calls),
                                  m.tool_call_id, m.name) for m in msg.chat.messages], msg.chat.continue_final_message
    if which == "prompt":
        return msg.prompt, None, False
    return None, None, False


def params_from_proto(msg: pb.GenerateRequest) -> GenerateParams:
    """A ``GenerateRequest`` as :class:`GenerateParams` (not yet validated).

    Raises:
        RequestError: ``InvalidRequest`` for no input, an unreadable constraint or an unknown
            speculative method.
    """
    prompt, messages, cont = input_of(msg)
    if prompt is None and messages is None:
        raise RequestError(ErrorKind.INVALID_REQUEST, "expected one of `prompt` or `chat`, got neither")
    s = msg.sampling
    method = msg.speculative.method
    if method not in SPEC_METHODS and method != pb.SPECULATIVE_METHOD_UNSPECIFIED:
        raise RequestError(ErrorKind.INVALID_REQUEST, f"unknown speculative method {method}")
    return GenerateParams(
        request_id=msg.request_id, prompt=prompt, messages=messages, continue_final_message=cont,
        max_tokens=msg.max_tokens,
        temperature=s.temperature if s.HasField("temperature") else None,
        top_p=s.top_p if s.HasField("top_p") else None, min_p=s.min_p if s.HasField("min_p") else None,
        top_k=s.top_k if s.HasField("top_k") else None,
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
        seed=s.seed if s.HasField("seed") else None, constraint=constraint_of(msg),
        spec_method=SPEC_METHODS.get(method), num_draft_tokens=msg.speculative.num_draft_tokens,
        tools=tools_of(msg), tool_choice=tool_choice_of(msg),
        thinking=thinking_of(msg) if msg.HasField("thinking") else None)


def finish_to_proto(ev: Finish) -> pb.Finish:
    """The public ``Finish`` message of an engine :class:`Finish` event."""
    f = pb.Finish(finish_reason=_FINISH[ev.finish_reason], usage=pb.Usage(
        prompt_tokens=ev.prompt_tokens, completion_tokens=ev.completion_tokens, draft_tokens=ev.draft_tokens,
        accepted_draft_tokens=ev.accepted_draft_tokens))
    c = ev.constraint
    if c is not None:
        f.constraint.CopyFrom(pb.ConstraintResult(
            kind=str(c.kind), complete=c.complete, terminated=c.terminated,
            cache=_CACHE.get(c.cache, pb.CACHE_STATUS_UNSPECIFIED), prepare_seconds=c.prepare_seconds,
            mask_positions=c.mask_positions, branch=c.branch))
    for call in ev.tool_calls:
        f.tool_calls.add(**call)
    if ev.reasoning is not None:
        f.reasoning = ev.reasoning
    if ev.error is not None:
        e = ev.error
        f.error.CopyFrom(pb.ErrorDetail(code=e.status.value, kind=str(e.kind), message=e.message,
                                        location=e.location))
    return f


def delta_to_proto(ev, with_channel: bool) -> pb.GenerateResponse:
    """A streamed :class:`~gpu_engine.core.request.Delta` (``with_channel``: the request has an output
    plan, so the channel / tool-call fields are set)."""
    resp = pb.GenerateResponse(text=ev.text, token_ids=ev.token_ids)
    if with_channel:
        resp.channel = CHANNELS[ev.channel]
        resp.tool_call_index = ev.call_index
        if ev.call is not None:
            resp.tool_call.CopyFrom(pb.ToolCall(**ev.call))
    return resp
