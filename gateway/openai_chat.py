"""``POST /v1/chat/completions`` (OpenAI Chat Completions) <-> ``ninfer.v1.Generate``.

Response objects are the ``openai`` SDK's own models (``ChatCompletion``,
``ChatCompletionChunk``), dumped to JSON, plus the NInfer extension field
``"ninfer": {"constraint": ...}`` on the final response / final chunks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator

from openai.types import CompletionUsage
from openai.types.chat import (ChatCompletion, ChatCompletionChunk, ChatCompletionMessage,
                               ChatCompletionMessageToolCall)
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction
from openai.types.chat.chat_completion_message_tool_call import Function
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from ninfer.v1 import generation_pb2 as pb

from . import common as c
from . import tools
from .engine import ConstraintOrigin, EngineClient
from .errors import invalid, not_supported, shown

ALLOWED = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
           "presence_penalty", "frequency_penalty", "stream", "stream_options", "response_format",
           "structured_outputs", "n", "user", "tools", "tool_choice", "parallel_tool_calls",
           "reasoning_effort", "thinking", "chat_template_kwargs"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


@dataclass
class ChatRequest:
    """A translated chat request: the engine request plus what the response needs."""

    request: pb.GenerateRequest
    origin: ConstraintOrigin | None
    stream: bool
    include_usage: bool


def _history_calls(m: dict, p: str, names: dict[str, str]) -> list[dict]:
    calls = c.get_list(m, "tool_calls", f"{p}.tool_calls") or []
    out = []
    for j, call in enumerate(calls):
        q = f"{p}.tool_calls[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise invalid(q, "expected {\"type\": \"function\", \"id\", \"function\": {\"name\", \"arguments\"}}")
        c.reject_unknown(call, {"id", "type", "function"}, f"{q}.")
        fn = c.get_dict(call, "function", f"{q}.function")
        if fn is None:
            raise invalid(f"{q}.function", "is required")
        c.reject_unknown(fn, {"name", "arguments"}, f"{q}.function.")
        name = c.get_str(fn, "name", f"{q}.function.name", required=True)
        cid = c.get_str(call, "id", f"{q}.id") or ""
        args = tools.arguments_text(fn.get("arguments", "{}"), f"{q}.function.arguments")
        names[cid] = name
        out.append({"id": cid, "name": name, "arguments_json": args})
    return out


def _messages(body: dict) -> list[dict]:
    """Chat messages -> :func:`clients.client.build_chat` dicts: assistant ``tool_calls`` (and
    ``reasoning_content``, the vLLM/SGLang field) and ``tool`` messages (``tool_call_id``; the
    tool's name is taken from the call it answers)."""
    msgs = c.get_list(body, "messages", "messages", required=True)
    out = []
    names: dict[str, str] = {}
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(p, "expected a message object")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{p}.role", f"expected system, developer, user, assistant or tool, got {shown(role)}")
        allowed = {"role", "content", "refusal"}
        if role == "assistant":
            allowed |= {"tool_calls", "reasoning_content"}
        if role == "tool":
            allowed = {"role", "content", "tool_call_id"}
        c.reject_unknown(m, allowed, f"{p}.")
        if m.get("refusal") is not None:
            raise not_supported(f"{p}.refusal")
        msg: dict = {"role": ROLES[role]}
        content = m.get("content")
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _history_calls(m, p, names)
            content = "" if content is None else content
        if role == "assistant" and m.get("reasoning_content") is not None:
            msg["reasoning"] = c.get_str(m, "reasoning_content", f"{p}.reasoning_content")
        if role == "tool":
            cid = c.get_str(m, "tool_call_id", f"{p}.tool_call_id", required=True)
            msg["tool_call_id"] = cid
            if cid in names:
                msg["name"] = names[cid]
        if content is None:
            raise invalid(f"{p}.content", "is required")
        msg["content"] = c.text_of_parts(content, f"{p}.content", ("text",))
        out.append(msg)
    return out


def _constraint(body: dict) -> tuple[dict | None, ConstraintOrigin | None]:
    rf = c.get_dict(body, "response_format", "response_format")
    ext = c.structured_outputs(body, "response_format" if rf is not None else None)
    if ext is not None:
        return ext
    if rf is None:
        return None, None
    rtype = rf.get("type")
    if rtype == "text":
        c.reject_unknown(rf, {"type"}, "response_format.")
        return None, None
    if rtype == "json_object":
        c.reject_unknown(rf, {"type"}, "response_format.")
        return {"json_object": True}, ConstraintOrigin("response_format")
    if rtype == "json_schema":
        js = c.get_dict(rf, "json_schema", "response_format.json_schema")
        if js is None:
            raise invalid("response_format.json_schema", "is required")
        c.reject_unknown(rf, {"type", "json_schema"}, "response_format.")
        c.reject_unknown(js, {"name", "description", "schema", "strict"}, "response_format.json_schema.")
        c.get_str(js, "name", "response_format.json_schema.name", required=True)
        c.get_bool(js, "strict", "response_format.json_schema.strict")  # enforced either way
        return c.json_schema_constraint(js.get("schema"), "response_format.json_schema.schema")
    raise invalid("response_format.type", f"expected text, json_object or json_schema, got {shown(rtype)}")


def parse(body: dict, served_model: str) -> ChatRequest:
    """Validates and translates a Chat Completions body.

    Raises:
        ApiError: 400 naming the field for anything malformed or not carried by the engine API
            (tool schemas the engine rejects come back located at ``tools[i].function.parameters…``);
            404 for another model.
    """
    c.reject_unknown(body, ALLOWED)
    c.check_model(body, served_model)
    policy = tools.openai_chat_tools(body)
    if body.get("reasoning_effort") is not None:
        raise not_supported("reasoning_effort", "is not supported: use the NInfer extension "
                                                "thinking: {type: enabled, budget_tokens: N} or "
                                                "chat_template_kwargs.enable_thinking")
    thinking = tools.openai_thinking(body)
    messages = _messages(body)
    if c.get_int(body, "n", "n", 1, 128) not in (None, 1):
        raise not_supported("n", "n > 1 is not supported yet by the NInfer engine API")
    mct = c.get_int(body, "max_completion_tokens", "max_completion_tokens", 1, 1 << 31)
    mt = c.get_int(body, "max_tokens", "max_tokens", 1, 1 << 31)
    if mct is not None and mt is not None and mct != mt:
        raise invalid("max_tokens", "conflicts with max_completion_tokens; give one of them")
    sampling = {
        "temperature": c.get_number(body, "temperature", "temperature", 0.0, 2.0),
        "top_p": c.get_number(body, "top_p", "top_p", 0.0, 1.0, lo_open=True),
        "presence_penalty": c.get_number(body, "presence_penalty", "presence_penalty", -2.0, 2.0),
        "frequency_penalty": c.get_number(body, "frequency_penalty", "frequency_penalty", -2.0, 2.0),
        "seed": c.get_int(body, "seed", "seed", -(1 << 63), (1 << 64) - 1),
    }
    c.get_str(body, "user", "user")
    stream = c.get_bool(body, "stream", "stream")
    so = c.get_dict(body, "stream_options", "stream_options")
    include_usage = False
    if so is not None:
        if not stream:
            raise invalid("stream_options", "is only allowed when stream is true")
        c.reject_unknown(so, {"include_usage"}, "stream_options.")
        include_usage = c.get_bool(so, "include_usage", "stream_options.include_usage")
    constraint, origin = _constraint(body)
    req = c.build_request(messages, max_tokens=mct if mct is not None else mt, sampling=sampling,
                          constraint=constraint, policy=policy, thinking=thinking)
    return ChatRequest(req, c.error_origin(origin, policy, thinking), stream, include_usage)


def _usage(result) -> CompletionUsage:
    p, n = result.usage["prompt_tokens"], result.usage["completion_tokens"]
    return CompletionUsage(prompt_tokens=p, completion_tokens=n, total_tokens=p + n)


async def complete(engine: EngineClient, cr: ChatRequest, model: str) -> dict:
    """Runs a non-streaming completion and returns the ``ChatCompletion`` JSON object."""
    call = await engine.start(cr.request, cr.origin)
    result = await call.collect()
    if result.finish_reason not in FINISH:
        raise c.runtime_error(result)
    calls = [_tool_call(call) for call in result.tool_calls]
    message = ChatCompletionMessage(role="assistant", content=result.text if result.text or not calls else None,
                                    **({"tool_calls": calls} if calls else {}))
    resp = ChatCompletion(
        id=c.new_id("chatcmpl-"), object="chat.completion", created=c.now_s(), model=model,
        choices=[Choice(index=0, finish_reason=FINISH[result.finish_reason], message=message)],
        usage=_usage(result))
    out = resp.model_dump(mode="json", exclude_unset=True)
    out["choices"][0]["message"]["content"] = message.content
    if result.reasoning is not None:
        out["choices"][0]["message"]["reasoning_content"] = result.reasoning
    out[c.EXTENSION_KEY] = c.extension(result)
    return out


def _tool_call(call: dict) -> ChatCompletionMessageToolCall:
    return ChatCompletionMessageToolCall(id=tools.call_id(), type="function",
                                         function=Function(name=call["name"], arguments=call["arguments_json"]))


def _chunk(cid: str, created: int, model: str, delta: ChoiceDelta | None, finish: str | None,
           include_usage: bool, usage: CompletionUsage | None = None) -> dict:
    choices = [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish)]
    chunk = ChatCompletionChunk(id=cid, object="chat.completion.chunk", created=created, model=model,
                                choices=choices, usage=usage)
    out = chunk.model_dump(mode="json", exclude_none=True)
    if delta is not None:
        out["choices"][0]["finish_reason"] = finish
    if include_usage:
        out["usage"] = usage.model_dump(mode="json") if usage is not None else None
    return out


async def stream(engine: EngineClient, cr: ChatRequest, model: str) -> AsyncIterator[dict]:
    """Starts the generation (raising :class:`ApiError` before any byte is sent) and returns
    the SSE event iterator: role chunk, content / ``reasoning_content`` / ``tool_calls`` delta
    chunks (each tool call whole, once the engine has decoded it), finish chunk (+ NInfer extension),
    the usage chunk when ``stream_options.include_usage``, then ``[DONE]``. A runtime error
    after the stream started is sent as an OpenAI ``{"error": ...}`` event."""
    call = await engine.start(cr.request, cr.origin)

    async def events() -> AsyncIterator[dict]:
        cid, created = c.new_id("chatcmpl-"), c.now_s()
        try:
            yield {"data": json.dumps(_chunk(cid, created, model, ChoiceDelta(role="assistant", content=""), None,
                                             cr.include_usage))}
            async for d in call.deltas():
                if d.channel == "content":
                    data = _chunk(cid, created, model, ChoiceDelta(content=d.text), None, cr.include_usage)
                elif d.channel == "reasoning":  # vLLM / SGLang: delta.reasoning_content
                    data = _chunk(cid, created, model, ChoiceDelta(), None, cr.include_usage)
                    data["choices"][0]["delta"]["reasoning_content"] = d.text
                else:  # a complete call: id, name and the whole arguments text in one delta
                    tc = ChoiceDeltaToolCall(index=d.tool_call_index, id=tools.call_id(), type="function",
                                             function=ChoiceDeltaToolCallFunction(
                                                 name=d.tool_call["name"], arguments=d.tool_call["arguments_json"]))
                    data = _chunk(cid, created, model, ChoiceDelta(tool_calls=[tc]), None, cr.include_usage)
                yield {"data": json.dumps(data)}
            result = call.result
            if result.finish_reason not in FINISH:
                yield {"data": json.dumps(c.runtime_error(result).openai_body())}
                return
            final = _chunk(cid, created, model, ChoiceDelta(), FINISH[result.finish_reason], cr.include_usage)
            final[c.EXTENSION_KEY] = c.extension(result)
            yield {"data": json.dumps(final)}
            if cr.include_usage:
                last = _chunk(cid, created, model, None, None, True, _usage(result))
                last[c.EXTENSION_KEY] = c.extension(result)
                yield {"data": json.dumps(last)}
            yield {"data": "[DONE]"}
        finally:
            call.cancel()

    return events()
