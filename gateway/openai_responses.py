"""``POST /v1/responses`` (OpenAI Responses) <-> ``ninfer.v1.Generate``.

Response objects and stream events are the ``openai`` SDK's own models
(``Response``, ``ResponseCreatedEvent``, ``ResponseTextDeltaEvent``, ...); the
final response / ``response.completed`` event carries the NInfer extension field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

from openai.types.responses import (Response, ResponseCompletedEvent, ResponseContentPartAddedEvent,
                                    ResponseContentPartDoneEvent, ResponseCreatedEvent, ResponseIncompleteEvent,
                                    ResponseInProgressEvent, ResponseOutputItemAddedEvent,
                                    ResponseOutputItemDoneEvent, ResponseOutputMessage, ResponseOutputText,
                                    ResponseTextDeltaEvent, ResponseTextDoneEvent, ResponseUsage)

from ninfer.v1 import generation_pb2 as pb

from . import common as c
from . import tools
from .engine import ConstraintOrigin, EngineClient
from .errors import ApiError, invalid, not_supported, shown

ALLOWED = {"model", "input", "instructions", "text", "max_output_tokens", "temperature", "top_p", "stream",
           "tools", "tool_choice", "parallel_tool_calls", "reasoning", "store", "user", "structured_outputs",
           "seed"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_TYPES = ("input_text", "output_text")


@dataclass
class ResponsesRequest:
    """A translated Responses request plus the echo fields of the ``Response`` object."""

    request: pb.GenerateRequest
    origin: ConstraintOrigin | None
    stream: bool
    echo: dict


def _input(body: dict) -> list[dict]:
    msgs = []
    instructions = c.get_str(body, "instructions", "instructions")
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    inp = body.get("input")
    if inp is None:
        raise invalid("input", "is required")
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
        return msgs
    if not isinstance(inp, list) or not inp:
        raise invalid("input", "expected a string or a non-empty array of input items")
    for i, item in enumerate(inp):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(p, "expected an input item object")
        itype = item.get("type") or "message"
        if itype in ("function_call", "function_call_output"):
            tools.reject_tool_history(p)
        if itype == "reasoning":
            tools.require_engine_thinking(p)
        if itype != "message":
            raise not_supported(f"{p}.type", f"input item type {shown(itype)} is not supported yet by the NInfer "
                                             "engine API")
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{p}.role", f"expected system, developer, user or assistant, got {shown(role)}")
        c.reject_unknown(item, {"type", "role", "content", "id", "status"}, f"{p}.")
        text = c.text_of_parts(item.get("content"), f"{p}.content", TEXT_TYPES, hints=("annotations", "logprobs"))
        msgs.append({"role": ROLES[role], "content": text})
    return msgs


def _constraint(body: dict) -> tuple[dict | None, ConstraintOrigin | None, dict]:
    text = c.get_dict(body, "text", "text") or {}
    c.reject_unknown(text, {"format"}, "text.")
    fmt = c.get_dict(text, "format", "text.format")
    ext = c.structured_outputs(body, "text.format" if fmt is not None and fmt.get("type") != "text" else None)
    echo = {"format": fmt or {"type": "text"}}
    if ext is not None:
        return ext[0], ext[1], echo
    if fmt is None or fmt.get("type") == "text":
        if fmt is not None:
            c.reject_unknown(fmt, {"type"}, "text.format.")
        return None, None, echo
    ftype = fmt.get("type")
    if ftype == "json_object":
        c.reject_unknown(fmt, {"type"}, "text.format.")
        return {"json_object": True}, ConstraintOrigin("text.format"), echo
    if ftype == "json_schema":
        c.reject_unknown(fmt, {"type", "name", "schema", "strict", "description"}, "text.format.")
        c.get_str(fmt, "name", "text.format.name", required=True)
        c.get_bool(fmt, "strict", "text.format.strict")  # enforced either way
        constraint, origin = c.json_schema_constraint(fmt.get("schema"), "text.format.schema")
        return constraint, origin, echo
    raise invalid("text.format.type", f"expected text, json_object or json_schema, got {shown(ftype)}")


def parse(body: dict, served_model: str) -> ResponsesRequest:
    """Validates and translates a Responses body (see :func:`gateway.openai_chat.parse` for errors)."""
    c.reject_unknown(body, ALLOWED)
    c.check_model(body, served_model)
    policy = tools.responses_tools(body)
    if policy is not None:
        tools.require_engine_tools(policy)
    if body.get("reasoning") is not None:
        tools.require_engine_thinking("reasoning")
    if body.get("store") is True:
        raise not_supported("store", "store=true is not supported: the gateway keeps no response state")
    messages = _input(body)
    max_tokens = c.get_int(body, "max_output_tokens", "max_output_tokens", 1, 1 << 31)
    sampling = {"temperature": c.get_number(body, "temperature", "temperature", 0.0, 2.0),
                "top_p": c.get_number(body, "top_p", "top_p", 0.0, 1.0, lo_open=True),
                "seed": c.get_int(body, "seed", "seed", -(1 << 63), (1 << 64) - 1)}
    c.get_str(body, "user", "user")
    constraint, origin, text_echo = _constraint(body)
    req = c.build_request(messages, max_tokens=max_tokens, sampling=sampling, constraint=constraint)
    echo = {"instructions": body.get("instructions"), "max_output_tokens": max_tokens, "text": text_echo,
            "temperature": sampling["temperature"], "top_p": sampling["top_p"]}
    return ResponsesRequest(req, origin, c.get_bool(body, "stream", "stream"), echo)


def _response(rid: str, created: int, model: str, echo: dict, status: str, output: list, result=None) -> Response:
    kw: dict[str, Any] = {}
    if result is not None:
        p, n = result.usage["prompt_tokens"], result.usage["completion_tokens"]
        kw["usage"] = ResponseUsage(input_tokens=p, output_tokens=n, total_tokens=p + n,
                                    input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0},
                                    output_tokens_details={"reasoning_tokens": 0})
        if result.finish_reason == "length":
            kw["incomplete_details"] = {"reason": "max_output_tokens"}
    return Response(id=rid, object="response", created_at=created, model=model, status=status, output=output,
                    parallel_tool_calls=False, tool_choice="none", tools=[], **echo, **kw)


def _message(mid: str, text: str | None, status: str) -> ResponseOutputMessage:
    content = [] if text is None else [ResponseOutputText(type="output_text", text=text, annotations=[])]
    return ResponseOutputMessage(id=mid, type="message", role="assistant", status=status, content=content)


def _dump(resp: Response, result) -> dict:
    out = resp.model_dump(mode="json", exclude_none=True)
    if result is not None:
        out[c.EXTENSION_KEY] = c.extension(result)
    return out


def _status(result) -> tuple[str, str]:
    """(response status, message item status)."""
    return ("completed", "completed") if result.finish_reason == "stop" else ("incomplete", "incomplete")


async def complete(engine: EngineClient, rr: ResponsesRequest, model: str) -> dict:
    """Runs a non-streaming response and returns the ``Response`` JSON object."""
    call = await engine.start(rr.request, rr.origin)
    result = await call.collect()
    if result.finish_reason not in ("stop", "length"):
        raise c.runtime_error(result)
    status, item_status = _status(result)
    resp = _response(c.new_id("resp_"), c.now_s(), model, rr.echo, status,
                     [_message(c.new_id("msg_"), result.text, item_status)], result)
    return _dump(resp, result)


async def stream(engine: EngineClient, rr: ResponsesRequest, model: str) -> AsyncIterator[dict]:
    """Starts the generation (raising :class:`ApiError` first) and returns the SSE iterator with the
    Responses event types: ``response.created``, ``response.in_progress``, ``response.output_item.added``,
    ``response.content_part.added``, ``response.output_text.delta``…, ``response.output_text.done``,
    ``response.content_part.done``, ``response.output_item.done``, ``response.completed`` (or
    ``response.incomplete`` at the token limit, or ``error`` for a runtime failure)."""
    call = await engine.start(rr.request, rr.origin)

    async def events() -> AsyncIterator[dict]:
        rid, mid, created = c.new_id("resp_"), c.new_id("msg_"), c.now_s()
        seq = 0

        def ev(model_obj, extra: dict | None = None) -> dict:
            nonlocal seq
            data = model_obj.model_dump(mode="json", exclude_none=True)
            if extra:
                data.update(extra)
            seq += 1
            return {"event": data["type"], "data": json.dumps(data)}

        try:
            base = _response(rid, created, model, rr.echo, "in_progress", [])
            yield ev(ResponseCreatedEvent(type="response.created", response=base, sequence_number=seq))
            yield ev(ResponseInProgressEvent(type="response.in_progress", response=base, sequence_number=seq))
            yield ev(ResponseOutputItemAddedEvent(type="response.output_item.added", output_index=0,
                                                  item=_message(mid, None, "in_progress"), sequence_number=seq))
            empty = ResponseOutputText(type="output_text", text="", annotations=[])
            yield ev(ResponseContentPartAddedEvent(type="response.content_part.added", item_id=mid, output_index=0,
                                                   content_index=0, part=empty, sequence_number=seq))
            async for text in call.deltas():
                yield ev(ResponseTextDeltaEvent(type="response.output_text.delta", item_id=mid, output_index=0,
                                                content_index=0, delta=text, logprobs=[], sequence_number=seq))
            result = call.result
            if result.finish_reason not in ("stop", "length"):
                err = c.runtime_error(result)
                seq += 1
                yield {"event": "error", "data": json.dumps({"type": "error", "code": err.code,
                                                             "message": err.message, "param": None,
                                                             "sequence_number": seq})}
                return
            status, item_status = _status(result)
            part = ResponseOutputText(type="output_text", text=result.text, annotations=[])
            yield ev(ResponseTextDoneEvent(type="response.output_text.done", item_id=mid, output_index=0,
                                           content_index=0, text=result.text, logprobs=[], sequence_number=seq))
            yield ev(ResponseContentPartDoneEvent(type="response.content_part.done", item_id=mid, output_index=0,
                                                  content_index=0, part=part, sequence_number=seq))
            item = _message(mid, result.text, item_status)
            yield ev(ResponseOutputItemDoneEvent(type="response.output_item.done", output_index=0, item=item,
                                                 sequence_number=seq))
            final = _response(rid, created, model, rr.echo, status, [item], result)
            cls, etype = ((ResponseCompletedEvent, "response.completed") if status == "completed"
                          else (ResponseIncompleteEvent, "response.incomplete"))
            yield ev(cls(type=etype, response=final, sequence_number=seq),
                     {c.EXTENSION_KEY: c.extension(result)})
        finally:
            call.cancel()

    return events()


def count_request(body: dict, served_model: str) -> pb.CountTokensRequest:
    """``POST /v1/responses/input_tokens`` body -> ``CountTokensRequest`` (input + instructions)."""
    c.reject_unknown(body, {"model", "input", "instructions", "text", "tools", "tool_choice",
                            "parallel_tool_calls", "reasoning"})
    if body.get("model") is not None:
        c.check_model(body, served_model)
    policy = tools.responses_tools(body)
    if policy is not None:
        tools.require_engine_tools(policy)
    if body.get("reasoning") is not None:
        tools.require_engine_thinking("reasoning")
    return c.chat_count_request(_input(body))
