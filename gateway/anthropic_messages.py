"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages) <-> ``ninfer.v1``.

Response objects and stream events are the ``anthropic`` SDK's own models
(``Message``, ``RawMessageStartEvent``, ``RawContentBlockDeltaEvent``, ...); the
``message_delta`` and final ``message_stop`` events carry the NInfer extension field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator

from anthropic.types import (InputJSONDelta, Message, MessageDeltaUsage, RawContentBlockDeltaEvent,
                             RawContentBlockStartEvent, RawContentBlockStopEvent, RawMessageDeltaEvent,
                             RawMessageStartEvent, RawMessageStopEvent, SignatureDelta, TextBlock, TextDelta,
                             ThinkingBlock, ThinkingDelta, ToolUseBlock, Usage)
from anthropic.types.raw_message_delta_event import Delta

from ninfer.v1 import generation_pb2 as pb

from . import common as c
from . import tools
from .engine import ConstraintOrigin, EngineClient
from .errors import invalid, not_supported, shown

ALLOWED = {"model", "max_tokens", "messages", "system", "temperature", "top_p", "top_k", "stream", "metadata",
           "cache_control",
           "output_config", "tools", "tool_choice", "thinking", "structured_outputs", "stop_sequences"}
STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
HINTS = ("cache_control", "citations")


@dataclass
class MessagesRequest:
    """A translated Messages request."""

    request: pb.GenerateRequest
    origin: ConstraintOrigin | None
    stream: bool


def _blocks(content, p: str, role: str, names: dict[str, str]) -> list[dict]:
    """One Messages message -> build_chat dicts. Assistant: text + ``thinking`` (-> reasoning) +
    ``tool_use`` (-> tool_calls). User: ``tool_result`` blocks become ``tool`` messages (first, in
    order), the text blocks one user message."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(p, f"expected a string or an array of content blocks, got {type(content).__name__}")
    text, reasoning, calls, results = [], [], [], []
    for j, block in enumerate(content):
        q = f"{p}[{j}]"
        if not isinstance(block, dict):
            raise invalid(q, "expected a content block object")
        btype = block.get("type")
        if btype == "text":
            c.reject_unknown(block, {"type", "text", *HINTS}, f"{q}.")
            text.append(c.get_str(block, "text", f"{q}.text", required=True))
        elif btype == "thinking" and role == "assistant":
            c.reject_unknown(block, {"type", "thinking", "signature"}, f"{q}.")
            reasoning.append(c.get_str(block, "thinking", f"{q}.thinking", required=True))
        elif btype == "tool_use" and role == "assistant":
            c.reject_unknown(block, {"type", "id", "name", "input", *HINTS}, f"{q}.")
            name = c.get_str(block, "name", f"{q}.name", required=True)
            tid = c.get_str(block, "id", f"{q}.id", required=True)
            names[tid] = name
            calls.append({"id": tid, "name": name,
                          "arguments_json": tools.arguments_text(block.get("input", {}), f"{q}.input")})
        elif btype == "tool_result" and role == "user":
            c.reject_unknown(block, {"type", "tool_use_id", "content", "is_error", *HINTS}, f"{q}.")
            tid = c.get_str(block, "tool_use_id", f"{q}.tool_use_id", required=True)
            body = block.get("content")
            out = "" if body is None else c.text_of_parts(body, f"{q}.content", ("text",), HINTS)
            if c.get_bool(block, "is_error", f"{q}.is_error"):
                out = f"Error: {out}"  # seen by the model as the tool's output; nothing hidden is added
            msg = {"role": "tool", "content": out, "tool_call_id": tid}
            if tid in names:
                msg["name"] = names[tid]
            results.append(msg)
        else:
            raise not_supported(f"{q}.type", f"content block type {btype!r} is not supported in a {role} "
                                             "message by the NInfer engine API")
    if role == "user":
        return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])
    msg = {"role": "assistant", "content": "".join(text)}
    if calls:
        msg["tool_calls"] = calls
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    return [msg]


def _messages(body: dict) -> list[dict]:
    out = []
    system = body.get("system")
    if system is not None:
        text = c.text_of_parts(system, "system", ("text",), HINTS)
        if text:
            out.append({"role": "system", "content": text})
    msgs = c.get_list(body, "messages", "messages", required=True)
    names: dict[str, str] = {}
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(p, "expected a message object")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"{p}.role", f"expected user or assistant, got {shown(role)}")
        c.reject_unknown(m, {"role", "content"}, f"{p}.")
        out.extend(_blocks(m.get("content"), f"{p}.content", role, names))
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


def _tools_and_thinking(body: dict) -> tuple[tools.ToolPolicy | None, tools.Thinking | None]:
    policy = tools.anthropic_tools(body)
    thinking = None
    if body.get("thinking") is not None:
        thinking = tools.thinking_object(body["thinking"], "thinking", budget_required=True)
        mt = body.get("max_tokens")
        if thinking.budget_tokens and isinstance(mt, int) and thinking.budget_tokens >= mt:
            raise invalid("thinking.budget_tokens", f"must be less than max_tokens ({mt})")
    return policy, thinking


def parse(body: dict, served_model: str) -> MessagesRequest:
    """Validates and translates a Messages body.

    Raises:
        ApiError: 400 naming the field (rendered as ``invalid_request_error``), 404 for another model.
    """
    c.reject_unknown(body, ALLOWED)
    c.check_model(body, served_model)
    policy, thinking = _tools_and_thinking(body)
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
    req = c.build_request(messages, max_tokens=max_tokens, sampling=sampling, constraint=constraint,
                          policy=policy, thinking=thinking)
    return MessagesRequest(req, c.error_origin(origin, policy, thinking), c.get_bool(body, "stream", "stream"))


def count_request(body: dict, served_model: str) -> pb.CountTokensRequest:
    """``/v1/messages/count_tokens`` body -> ``CountTokensRequest``."""
    c.reject_unknown(body, {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"})
    c.check_model(body, served_model)
    _tools_and_thinking(body)  # validated; CountTokensRequest carries neither
    return c.chat_count_request(_messages(body))


async def complete(engine: EngineClient, mr: MessagesRequest, model: str) -> dict:
    """Runs a non-streaming request and returns the ``Message`` JSON object."""
    call = await engine.start(mr.request, mr.origin)
    result = await call.collect()
    if result.finish_reason not in STOP:
        raise c.runtime_error(result)
    content: list = []
    if result.reasoning is not None:
        content.append(ThinkingBlock(type="thinking", thinking=result.reasoning, signature=""))
    if result.text or not result.tool_calls:
        content.append(TextBlock(type="text", text=result.text))
    content.extend(_tool_use(call) for call in result.tool_calls)
    msg = Message(id=c.new_id("msg_"), type="message", role="assistant", model=model,
                  content=content, stop_reason=STOP[result.finish_reason],
                  stop_sequence=None, usage=Usage(input_tokens=result.usage["prompt_tokens"],
                                                  output_tokens=result.usage["completion_tokens"]))
    out = msg.model_dump(mode="json", exclude_none=True)
    out["stop_sequence"] = None
    out[c.EXTENSION_KEY] = c.extension(result)
    return out


def _tool_use(call: dict) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id=tools.call_id("toolu_"), name=call["name"],
                        input=json.loads(call["arguments_json"]))


async def stream(engine: EngineClient, mr: MessagesRequest, model: str) -> AsyncIterator[dict]:
    """Starts the generation (raising :class:`ApiError` first) and returns the SSE iterator with the
    Messages event types: ``message_start``, ``ping``, then per content block (``thinking`` with
    ``thinking_delta``, ``text`` with ``text_delta``, ``tool_use`` with one ``input_json_delta`` once the
    engine has decoded the call) ``content_block_start`` / ``content_block_delta``… /
    ``content_block_stop``, then ``message_delta`` (stop_reason, usage), ``message_stop`` (or ``error``)."""
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
            yield {"event": "ping", "data": json.dumps({"type": "ping"})}
            index, open_kind = -1, None  # the open content block: "thinking" | "text" | None

            def close() -> list[dict]:
                nonlocal open_kind
                out = []
                if open_kind == "thinking":  # no signature: NInfer reasoning is not signed
                    out.append(ev(RawContentBlockDeltaEvent(type="content_block_delta", index=index,
                                                            delta=SignatureDelta(type="signature_delta",
                                                                                 signature=""))))
                if open_kind is not None:
                    out.append(ev(RawContentBlockStopEvent(type="content_block_stop", index=index)))
                open_kind = None
                return out

            def open_block(kind: str, block) -> list[dict]:
                nonlocal index, open_kind
                out = close()
                index += 1
                open_kind = kind
                out.append(ev(RawContentBlockStartEvent(type="content_block_start", index=index,
                                                        content_block=block)))
                return out

            async for d in call.deltas():
                if d.channel == "reasoning":
                    if open_kind != "thinking":
                        for e in open_block("thinking", ThinkingBlock(type="thinking", thinking="", signature="")):
                            yield e
                    delta = ThinkingDelta(type="thinking_delta", thinking=d.text)
                elif d.channel == "content":
                    if open_kind != "text":
                        for e in open_block("text", TextBlock(type="text", text="")):
                            yield e
                    delta = TextDelta(type="text_delta", text=d.text)
                else:  # a complete tool call: start (input {}), one input_json_delta, stop
                    block = _tool_use(d.tool_call)
                    for e in open_block("tool_use", block.model_copy(update={"input": {}})):
                        yield e
                    delta = InputJSONDelta(type="input_json_delta", partial_json=d.tool_call["arguments_json"])
                yield ev(RawContentBlockDeltaEvent(type="content_block_delta", index=index, delta=delta))
            result = call.result
            if result.finish_reason not in STOP:
                yield {"event": "error", "data": json.dumps(c.runtime_error(result).anthropic_body())}
                return
            if index < 0:  # nothing was generated: one empty text block
                for e in open_block("text", TextBlock(type="text", text="")):
                    yield e
            for e in close():
                yield e
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
