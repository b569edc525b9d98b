"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages) <-> ``ninfer.v1``.

Response objects and stream events are the ``anthropic`` SDK's own models
(``Message``, ``RawMessageStartEvent``, ``RawContentBlockDeltaEvent``, ...); the
``message_delta`` and final ``message_stop`` events carry the NInfer extension field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator

from anthropic.types import (Message, MessageDeltaUsage, RawContentBlockDeltaEvent, RawContentBlockStartEvent,
                             RawContentBlockStopEvent, RawMessageDeltaEvent, RawMessageStartEvent,
                             RawMessageStopEvent, TextBlock, TextDelta, Usage)
from anthropic.types.raw_message_delta_event import Delta

from ninfer.v1 import generation_pb2 as pb

from . import common as c
from . import tools
from .engine import ConstraintOrigin, EngineClient
from .errors import ApiError, invalid, not_supported, shown

ALLOWED = {"model", "max_tokens", "messages", "system", "temperature", "top_p", "top_k", "stream", "metadata",
           "cache_control",
           "output_config", "tools", "tool_choice", "thinking", "structured_outputs", "stop_sequences"}
STOP = {"stop": "end_turn", "length": "max_tokens"}
HINTS = ("cache_control", "citations")


@dataclass
class MessagesRequest:
    """A translated Messages request."""

    request: pb.GenerateRequest
    origin: ConstraintOrigin | None
    stream: bool


def _messages(body: dict) -> list[dict]:
    out = []
    system = body.get("system")
    if system is not None:
        text = c.text_of_parts(system, "system", ("text",), HINTS)
        if text:
            out.append({"role": "system", "content": text})
    msgs = c.get_list(body, "messages", "messages", required=True)
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(p, "expected a message object")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"{p}.role", f"expected user or assistant, got {shown(role)}")
        c.reject_unknown(m, {"role", "content"}, f"{p}.")
        content = m.get("content")
        if isinstance(content, list):
            for j, block in enumerate(content):
                btype = block.get("type") if isinstance(block, dict) else None
                if btype in ("tool_use", "tool_result", "server_tool_use"):
                    tools.reject_tool_history(f"{p}.content[{j}]")
                if btype in ("thinking", "redacted_thinking"):
                    tools.require_engine_thinking(f"{p}.content[{j}]")
        out.append({"role": role, "content": c.text_of_parts(content, f"{p}.content", ("text",), HINTS)})
    return out


def _constraint(body: dict) -> tuple[dict | None, ConstraintOrigin | None]:
    oc = c.get_dict(body, "output_config", "output_config")
    fmt = None
    if oc is not None:
        c.reject_unknown(oc, {"format"}, "output_config.")
        fmt = c.get_dict(oc, "format", "output_config.format")
    ext = c.structured_outputs(body, "output_config.format" if fmt is not None else None)
    if ext is not None:
        return ext
    if fmt is None:
        return None, None
    if fmt.get("type") != "json_schema":
        raise invalid("output_config.format.type", f"expected json_schema, got {shown(fmt.get('type'))}")
    c.reject_unknown(fmt, {"type", "schema"}, "output_config.format.")
    return c.json_schema_constraint(fmt.get("schema"), "output_config.format.schema")


def _tools_and_thinking(body: dict) -> None:
    policy = tools.anthropic_tools(body)
    if policy is not None:
        tools.require_engine_tools(policy)
    thinking = c.get_dict(body, "thinking", "thinking")
    if thinking is not None and thinking.get("type") != "disabled":
        tools.require_engine_thinking("thinking")


def parse(body: dict, served_model: str) -> MessagesRequest:
    """Validates and translates a Messages body.

    Raises:
        ApiError: 400 naming the field (rendered as ``invalid_request_error``), 404 for another model.
    """
    c.reject_unknown(body, ALLOWED)
    c.check_model(body, served_model)
    _tools_and_thinking(body)
    if body.get("stop_sequences"):
        raise not_supported("stop_sequences", "is not supported yet by the NInfer engine API (and never with an "
                                              "output constraint: seed 000 §completion)")
    meta = c.get_dict(body, "metadata", "metadata")
    if meta is not None:
        c.reject_unknown(meta, {"user_id"}, "metadata.")
    messages = _messages(body)
    max_tokens = c.get_int(body, "max_tokens", "max_tokens", 1, 1 << 31, required=True)
    sampling = {"temperature": c.get_number(body, "temperature", "temperature", 0.0, 1.0),
                "top_p": c.get_number(body, "top_p", "top_p", 0.0, 1.0, lo_open=True),
                "top_k": c.get_int(body, "top_k", "top_k", 0, 1 << 31)}
    constraint, origin = _constraint(body)
    req = c.build_request(messages, max_tokens=max_tokens, sampling=sampling, constraint=constraint)
    return MessagesRequest(req, origin, c.get_bool(body, "stream", "stream"))


def count_request(body: dict, served_model: str) -> pb.CountTokensRequest:
    """``/v1/messages/count_tokens`` body -> ``CountTokensRequest``."""
    c.reject_unknown(body, {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"})
    c.check_model(body, served_model)
    _tools_and_thinking(body)
    return c.chat_count_request(_messages(body))


async def complete(engine: EngineClient, mr: MessagesRequest, model: str) -> dict:
    """Runs a non-streaming request and returns the ``Message`` JSON object."""
    call = await engine.start(mr.request, mr.origin)
    result = await call.collect()
    if result.finish_reason not in STOP:
        raise c.runtime_error(result)
    msg = Message(id=c.new_id("msg_"), type="message", role="assistant", model=model,
                  content=[TextBlock(type="text", text=result.text)], stop_reason=STOP[result.finish_reason],
                  stop_sequence=None, usage=Usage(input_tokens=result.usage["prompt_tokens"],
                                                  output_tokens=result.usage["completion_tokens"]))
    out = msg.model_dump(mode="json", exclude_none=True)
    out["stop_sequence"] = None
    out[c.EXTENSION_KEY] = c.extension(result)
    return out


async def stream(engine: EngineClient, mr: MessagesRequest, model: str) -> AsyncIterator[dict]:
    """Starts the generation (raising :class:`ApiError` first) and returns the SSE iterator with the
    Messages event types: ``message_start``, ``content_block_start``, ``ping``, ``content_block_delta``…,
    ``content_block_stop``, ``message_delta`` (stop_reason, usage), ``message_stop`` (or ``error``)."""
    call = await engine.start(mr.request, mr.origin)

    async def events() -> AsyncIterator[dict]:
        def ev(obj, extra: dict | None = None) -> dict:
            data = obj.model_dump(mode="json", exclude_none=True)
            if extra:
                data.update(extra)
            return {"event": data["type"], "data": json.dumps(data)}

        try:
            start = Message(id=c.new_id("msg_"), type="message", role="assistant", model=model, content=[],
                            stop_reason=None, stop_sequence=None,
                            usage=Usage(input_tokens=0, output_tokens=0))
            yield ev(RawMessageStartEvent(type="message_start", message=start))
            yield ev(RawContentBlockStartEvent(type="content_block_start", index=0,
                                               content_block=TextBlock(type="text", text="")))
            yield {"event": "ping", "data": json.dumps({"type": "ping"})}
            async for text in call.deltas():
                yield ev(RawContentBlockDeltaEvent(type="content_block_delta", index=0,
                                                   delta=TextDelta(type="text_delta", text=text)))
            result = call.result
            if result.finish_reason not in STOP:
                yield {"event": "error", "data": json.dumps(c.runtime_error(result).anthropic_body())}
                return
            yield ev(RawContentBlockStopEvent(type="content_block_stop", index=0))
            ext = {c.EXTENSION_KEY: c.extension(result)}
            usage = MessageDeltaUsage(input_tokens=result.usage["prompt_tokens"],
                                      output_tokens=result.usage["completion_tokens"])
            yield ev(RawMessageDeltaEvent(type="message_delta", usage=usage,
                                          delta=Delta(stop_reason=STOP[result.finish_reason], stop_sequence=None)),
                     ext)
            yield ev(RawMessageStopEvent(type="message_stop"), ext)
        finally:
            call.cancel()

    return events()
