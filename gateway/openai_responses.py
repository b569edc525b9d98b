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
                                    ResponseContentPartDoneEvent, ResponseCreatedEvent,
                                    ResponseFunctionCallArgumentsDeltaEvent, ResponseFunctionCallArgumentsDoneEvent,
                                    ResponseFunctionToolCall, ResponseIncompleteEvent, ResponseInProgressEvent,
                                    ResponseOutputItemAddedEvent, ResponseOutputItemDoneEvent, ResponseOutputMessage,
                                    ResponseOutputText, ResponseReasoningItem, ResponseReasoningTextDeltaEvent,
                                    ResponseReasoningTextDoneEvent, ResponseTextDeltaEvent, ResponseTextDoneEvent,
                                    ResponseUsage)
from openai.types.responses.response_reasoning_item import Content as ReasoningContent

from ninfer.v1 import generation_pb2 as pb

from . import common as c
from . import tools
from .engine import ConstraintOrigin, EngineClient
from .errors import invalid, not_supported, shown

ALLOWED = {"model", "input", "instructions", "text", "max_output_tokens", "temperature", "top_p", "stream",
           "tools", "tool_choice", "parallel_tool_calls", "reasoning", "store", "user", "structured_outputs",
           "seed", "thinking", "chat_template_kwargs"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_TYPES = ("input_text", "output_text")
FINISHED = ("stop", "length", "tool_calls")


@dataclass
class ResponsesRequest:
    """A translated Responses request plus the echo fields of the ``Response`` object."""

    request: pb.GenerateRequest
    origin: ConstraintOrigin | None
    stream: bool
    echo: dict


def _input(body: dict) -> list[dict]:
    """``instructions`` + ``input`` -> build_chat dicts. ``function_call`` items join the preceding
    assistant turn as tool calls, ``function_call_output`` items become ``tool`` messages, a
    ``reasoning`` item's text becomes the reasoning of the next assistant turn."""
    msgs: list[dict] = []
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
    names: dict[str, str] = {}
    reasoning: list[str] = []

    def assistant_turn() -> dict:
        if not msgs or msgs[-1]["role"] != "assistant" or msgs[-1].get("_closed"):
            msgs.append({"role": "assistant", "content": ""})
        turn = msgs[-1]
        if reasoning:
            turn["reasoning"] = turn.get("reasoning", "") + "".join(reasoning)
            reasoning.clear()
        return turn

    for i, item in enumerate(inp):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(p, "expected an input item object")
        raw_type = item.get("type") or "message"
        itype = raw_type if isinstance(raw_type, str) else None  # a non-string type matches no item kind
        if itype == "function_call":
            c.reject_unknown(item, {"type", "id", "call_id", "name", "arguments", "status"}, f"{p}.")
            cid = c.get_str(item, "call_id", f"{p}.call_id", required=True)
            name = c.get_str(item, "name", f"{p}.name", required=True)
            names[cid] = name
            turn = assistant_turn()
            turn.setdefault("tool_calls", []).append(
                {"id": cid, "name": name, "arguments_json": tools.arguments_text(item.get("arguments"),
                                                                               f"{p}.arguments")})
            continue
        if itype == "function_call_output":
            c.reject_unknown(item, {"type", "id", "call_id", "output", "status"}, f"{p}.")
            cid = c.get_str(item, "call_id", f"{p}.call_id", required=True)
            output = item.get("output")
            if output is None:
                raise invalid(f"{p}.output", "is required")
            msg = {"role": "tool", "tool_call_id": cid,
                   "content": c.text_of_parts(output, f"{p}.output", ("input_text", "output_text"))}
            if cid in names:
                msg["name"] = names[cid]
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1]["_closed"] = True
            msgs.append(msg)
            continue
        if itype == "reasoning":
            c.reject_unknown(item, {"type", "id", "summary", "content", "status"}, f"{p}.")
            if item.get("encrypted_content") is not None:
                raise not_supported(f"{p}.encrypted_content")
            parts = item.get("content") or item.get("summary") or []
            key = "content" if item.get("content") else "summary"
            reasoning.append(c.text_of_parts(parts, f"{p}.{key}", ("reasoning_text", "summary_text")))
            continue
        if itype != "message":
            raise not_supported(f"{p}.type", f"input item type {shown(raw_type)} is not supported yet by the NInfer "
                                             "engine API")
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{p}.role", f"expected system, developer, user or assistant, got {shown(role)}")
        c.reject_unknown(item, {"type", "role", "content", "id", "status"}, f"{p}.")
        text = c.text_of_parts(item.get("content"), f"{p}.content", TEXT_TYPES, hints=("annotations", "logprobs"))
        if ROLES[role] == "assistant":
            turn = assistant_turn()
            if turn.get("tool_calls"):  # text after calls: a new turn
                msgs.append({"role": "assistant", "content": text})
            else:
                turn["content"] += text
        else:
            msgs.append({"role": ROLES[role], "content": text})
    if reasoning:
        raise invalid(f"input[{len(inp) - 1}]", "a reasoning item must be followed by an assistant message or "
                                                "function_call")
    for m in msgs:
        m.pop("_closed", None)
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
    if body.get("reasoning") is not None:
        raise not_supported("reasoning", "is not supported: use the NInfer extension "
                                         "thinking: {type: enabled, budget_tokens: N} or "
                                         "chat_template_kwargs.enable_thinking")
    thinking = tools.openai_thinking(body)
    if body.get("store") is True:
        raise not_supported("store", "store=true is not supported: the gateway keeps no response state")
    messages = _input(body)
    max_tokens = c.get_int(body, "max_output_tokens", "max_output_tokens", 1, 1 << 31)
    sampling = {"temperature": c.get_number(body, "temperature", "temperature", 0.0, 2.0),
                "top_p": c.get_number(body, "top_p", "top_p", 0.0, 1.0, lo_open=True),
                "seed": c.get_int(body, "seed", "seed", -(1 << 63), (1 << 64) - 1)}
    c.get_str(body, "user", "user")
    constraint, origin, text_echo = _constraint(body)
    req = c.build_request(messages, max_tokens=max_tokens, sampling=sampling, constraint=constraint,
                          policy=policy, thinking=thinking)
    echo = {"instructions": body.get("instructions"), "max_output_tokens": max_tokens, "text": text_echo,
            "temperature": sampling["temperature"], "top_p": sampling["top_p"],
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False}
    return ResponsesRequest(req, c.error_origin(origin, policy, thinking), c.get_bool(body, "stream", "stream"), echo)


def _response(rid: str, created: int, model: str, echo: dict, status: str, output: list, result=None) -> Response:
    kw: dict[str, Any] = {}
    if result is not None:
        p, n = result.usage["prompt_tokens"], result.usage["completion_tokens"]
        kw["usage"] = ResponseUsage(input_tokens=p, output_tokens=n, total_tokens=p + n,
                                    input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0},
                                    output_tokens_details={"reasoning_tokens": 0})  # not counted apart
        if result.finish_reason == "length":
            kw["incomplete_details"] = {"reason": "max_output_tokens"}
    return Response(id=rid, object="response", created_at=created, model=model, status=status, output=output,
                    **echo, **kw)


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
    if result.finish_reason in ("stop", "tool_calls"):
        return "completed", "completed"
    return "incomplete", "incomplete"


def _reasoning(rid: str, text: str | None, status: str) -> ResponseReasoningItem:
    content = [] if text is None else [ReasoningContent(type="reasoning_text", text=text)]
    return ResponseReasoningItem(id=rid, type="reasoning", summary=[], content=content, status=status)


def _function_call(fid: str, cid: str, call: dict, arguments: str, status: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(id=fid, call_id=cid, type="function_call", name=call["name"],
                                    arguments=arguments, status=status)


def _output(result) -> list:
    """Output items in order: a ``reasoning`` item, the ``message`` (when there is text or no call),
    one ``function_call`` item per call."""
    _, item_status = _status(result)
    out: list = []
    if result.reasoning is not None:
        out.append(_reasoning(c.new_id("rs_"), result.reasoning, "completed"))
    if result.text or not result.tool_calls:
        out.append(_message(c.new_id("msg_"), result.text, item_status))
    out.extend(_function_call(c.new_id("fc_"), tools.call_id(), call, call["arguments_json"], "completed")
               for call in result.tool_calls)
    return out


async def complete(engine: EngineClient, rr: ResponsesRequest, model: str) -> dict:
    """Runs a non-streaming response and returns the ``Response`` JSON object."""
    call = await engine.start(rr.request, rr.origin)
    result = await call.collect()
    if result.finish_reason not in FINISHED:
        raise c.runtime_error(result)
    status, _ = _status(result)
    resp = _response(c.new_id("resp_"), c.now_s(), model, rr.echo, status, _output(result), result)
    return _dump(resp, result)


async def stream(engine: EngineClient, rr: ResponsesRequest, model: str) -> AsyncIterator[dict]:
    """Starts the generation (raising :class:`ApiError` first) and returns the SSE iterator with the
    Responses event types: ``response.created``, ``response.in_progress``, then per output item
    ``response.output_item.added`` … ``response.output_item.done`` — a ``reasoning`` item
    (``response.reasoning_text.delta``/``.done``), a ``message`` item (``response.content_part.added``,
    ``response.output_text.delta``…, ``response.output_text.done``, ``response.content_part.done``),
    a ``function_call`` item per call (one ``response.function_call_arguments.delta`` with the whole
    arguments once the engine has decoded the call, ``response.function_call_arguments.done``) —
    then ``response.completed`` (or ``response.incomplete`` at the token limit, or ``error`` for a
    runtime failure)."""
    call = await engine.start(rr.request, rr.origin)

    async def events() -> AsyncIterator[dict]:
        rid, created = c.new_id("resp_"), c.now_s()
        seq = 0
        items: list = []  # finished output items
        cur: dict = {}  # the open item: kind, id, parts

        def ev(model_obj, extra: dict | None = None) -> dict:
            nonlocal seq
            data = model_obj.model_dump(mode="json", exclude_none=True)
            if extra:
                data.update(extra)
            seq += 1
            return {"event": data["type"], "data": json.dumps(data)}

        def close(item_status: str = "completed") -> list[dict]:
            if not cur:
                return []
            kind, iid, idx, text = cur["kind"], cur["id"], len(items), "".join(cur["parts"])
            out = []
            if kind == "reasoning":
                out.append(ev(ResponseReasoningTextDoneEvent(type="response.reasoning_text.done", item_id=iid,
                                                             output_index=idx, content_index=0, text=text,
                                                             sequence_number=seq)))
                item = _reasoning(iid, text, "completed")
            else:
                part = ResponseOutputText(type="output_text", text=text, annotations=[])
                out.append(ev(ResponseTextDoneEvent(type="response.output_text.done", item_id=iid, output_index=idx,
                                                    content_index=0, text=text, logprobs=[], sequence_number=seq)))
                out.append(ev(ResponseContentPartDoneEvent(type="response.content_part.done", item_id=iid,
                                                           output_index=idx, content_index=0, part=part,
                                                           sequence_number=seq)))
                item = _message(iid, text, item_status)
            out.append(ev(ResponseOutputItemDoneEvent(type="response.output_item.done", output_index=idx, item=item,
                                                      sequence_number=seq)))
            items.append(item)
            cur.clear()
            return out

        def open_item(kind: str) -> list[dict]:
            out = close()
            iid, idx = c.new_id("rs_" if kind == "reasoning" else "msg_"), len(items)
            cur.update(kind=kind, id=iid, parts=[])
            if kind == "reasoning":
                out.append(ev(ResponseOutputItemAddedEvent(type="response.output_item.added", output_index=idx,
                                                           item=_reasoning(iid, None, "in_progress"),
                                                           sequence_number=seq)))
            else:
                out.append(ev(ResponseOutputItemAddedEvent(type="response.output_item.added", output_index=idx,
                                                           item=_message(iid, None, "in_progress"),
                                                           sequence_number=seq)))
                empty = ResponseOutputText(type="output_text", text="", annotations=[])
                out.append(ev(ResponseContentPartAddedEvent(type="response.content_part.added", item_id=iid,
                                                            output_index=idx, content_index=0, part=empty,
                                                            sequence_number=seq)))
            return out

        def function_call(d) -> list[dict]:
            out = close()
            fid, cid, idx, args = c.new_id("fc_"), tools.call_id(), len(items), d.tool_call["arguments_json"]
            out.append(ev(ResponseOutputItemAddedEvent(
                type="response.output_item.added", output_index=idx,
                item=_function_call(fid, cid, d.tool_call, "", "in_progress"), sequence_number=seq)))
            out.append(ev(ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta", item_id=fid, output_index=idx, delta=args,
                sequence_number=seq)))
            out.append(ev(ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done", item_id=fid, output_index=idx, arguments=args,
                sequence_number=seq)))
            item = _function_call(fid, cid, d.tool_call, args, "completed")
            out.append(ev(ResponseOutputItemDoneEvent(type="response.output_item.done", output_index=idx, item=item,
                                                      sequence_number=seq)))
            items.append(item)
            return out

        try:
            base = _response(rid, created, model, rr.echo, "in_progress", [])
            yield ev(ResponseCreatedEvent(type="response.created", response=base, sequence_number=seq))
            yield ev(ResponseInProgressEvent(type="response.in_progress", response=base, sequence_number=seq))
            async for d in call.deltas():
                if d.channel == "tool_call":
                    for e in function_call(d):
                        yield e
                    continue
                kind = "reasoning" if d.channel == "reasoning" else "message"
                if cur.get("kind") != kind:
                    for e in open_item(kind):
                        yield e
                cur["parts"].append(d.text)
                idx = len(items)
                if kind == "reasoning":
                    yield ev(ResponseReasoningTextDeltaEvent(type="response.reasoning_text.delta", item_id=cur["id"],
                                                             output_index=idx, content_index=0, delta=d.text,
                                                             sequence_number=seq))
                else:
                    yield ev(ResponseTextDeltaEvent(type="response.output_text.delta", item_id=cur["id"],
                                                    output_index=idx, content_index=0, delta=d.text, logprobs=[],
                                                    sequence_number=seq))
            result = call.result
            if result.finish_reason not in FINISHED:
                err = c.runtime_error(result)
                seq += 1
                yield {"event": "error", "data": json.dumps({"type": "error", "code": err.code,
                                                             "message": err.message, "param": None,
                                                             "sequence_number": seq})}
                return
            status, item_status = _status(result)
            if not items and not cur:  # nothing generated: one empty message
                for e in open_item("message"):
                    yield e
            for e in close(item_status):
                yield e
            final = _response(rid, created, model, rr.echo, status, items, result)
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
                            "parallel_tool_calls", "thinking", "chat_template_kwargs"})
    if body.get("model") is not None:
        c.check_model(body, served_model)
    tools.responses_tools(body)  # validated; CountTokensRequest carries no tools
    tools.openai_thinking(body)
    return c.chat_count_request(_input(body))
