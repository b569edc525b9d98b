"""Python client for the NInfer ``ninfer.v1.Generation`` gRPC API.

Example::

    from clients import NInferClient

    with NInferClient("127.0.0.1:50051") as client:
        for event in client.generate("Once upon", max_tokens=32):
            print(event.text, end="", flush=True)
        result = client.generate_text(
            messages=[{"role": "user", "content": "Give a person as JSON"}],
            constraint={"json_schema": '{"type": "object"}'},
        )
        print(result.text, result.finish_reason, result.constraint)
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import grpc

from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc

from .errors import NInferError, RequestRejected, ServerError, exception_from_rpc_error

DEFAULT_TARGET = "127.0.0.1:50051"

#: Constraint kinds, read from the public proto (the ``OutputConstraint.kind`` oneof), so a kind
#: added to the proto needs no change here.
CONSTRAINT_KINDS = tuple(f.name for f in pb.OutputConstraint.DESCRIPTOR.oneofs_by_name["kind"].fields)

SPECULATIVE_METHODS = {
    "none": pb.SPECULATIVE_METHOD_NONE,
    "ngram": pb.SPECULATIVE_METHOD_NGRAM,
    "early-exit": pb.SPECULATIVE_METHOD_EARLY_EXIT,
    "early_exit": pb.SPECULATIVE_METHOD_EARLY_EXIT,
    "early-exit-sampled": pb.SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED,
    "early_exit_sampled": pb.SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED,
}

FINISH_REASONS = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ERROR: "error",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}

CHANNELS = {
    pb.CHANNEL_UNSPECIFIED: "content",
    pb.CHANNEL_CONTENT: "content",
    pb.CHANNEL_REASONING: "reasoning",
    pb.CHANNEL_TOOL_CALL: "tool_call",
}

TOOL_CHOICE_MODES = {
    "auto": pb.TOOL_CHOICE_MODE_AUTO,
    "none": pb.TOOL_CHOICE_MODE_NONE,
    "required": pb.TOOL_CHOICE_MODE_REQUIRED,
}

TOOL_CONSTRAINT_MODES = {
    "basic": pb.TOOL_CONSTRAINT_MODE_BASIC,
    "automatic": pb.TOOL_CONSTRAINT_MODE_AUTOMATIC,
}

CACHE_STATUS = {
    pb.CACHE_STATUS_HIT: "hit",
    pb.CACHE_STATUS_BUILT: "built",
    pb.CACHE_STATUS_WAITED: "waited",
}


def default_target() -> str:
    """The server address from env ``NINFER_SERVER``, else ``127.0.0.1:50051``."""
    return os.environ.get("NINFER_SERVER") or DEFAULT_TARGET


def _zero_usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "draft_tokens": 0, "accepted_draft_tokens": 0}


@dataclass
class GenerationResult:
    """The outcome of one generation.

    Attributes:
        text: the generated content text (all content deltas concatenated;
            reasoning and tool-call wire text excluded).
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``, ``"error"``
            or ``"cancelled"``.
        usage: ``{prompt_tokens, completion_tokens, draft_tokens, accepted_draft_tokens}``.
        constraint: ``{kind, complete, terminated, cache, prepare_seconds}`` or None
            when the request had no constraint.
        error: ``{code, kind, message, location}`` or None.
        reasoning: the reasoning text (thinking framing excluded), or None
            when the turn had no thinking stage.
        tool_calls: completed tool calls ``[{"id", "name", "arguments_json"}]``
            in order (kept when the turn was truncated).
        token_ids: the generated token ids (not part of :meth:`to_dict`).
        request_id: the request id sent to the server.
    """

    text: str = ""
    finish_reason: str = "error"
    usage: dict = field(default_factory=_zero_usage)
    constraint: dict | None = None
    error: dict | None = None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    request_id: str = ""

    @property
    def ok(self) -> bool:
        """True when generation finished normally (``stop``, ``length`` or ``tool_calls``)."""
        return self.finish_reason in ("stop", "length", "tool_calls")

    def to_dict(self) -> dict:
        """The CLI's ``--format json`` object:
        ``{"text", "reasoning", "tool_calls", "finish_reason", "usage", "constraint", "error"}``."""
        return {
            "text": self.text,
            "reasoning": self.reasoning,
            "tool_calls": [dict(c) for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": dict(self.usage),
            "constraint": dict(self.constraint) if self.constraint is not None else None,
            "error": dict(self.error) if self.error is not None else None,
        }


@dataclass
class GenerateEvent:
    """One streamed message.

    Attributes:
        text: new text since the previous event (may be empty), in ``channel``.
        token_ids: token ids committed since the previous event.
        finish: the final :class:`GenerationResult` on the last event, else None.
        raw: the underlying ``GenerateResponse``.
        channel: ``"content"``, ``"reasoning"`` or ``"tool_call"`` (the raw
            wire text of a call, framing included).
        tool_call_index: index of the call within the turn (``tool_call`` channel).
        tool_call: ``{"id", "name", "arguments_json"}`` on the event that
            completes a call, else None.
    """

    text: str
    token_ids: list[int]
    finish: GenerationResult | None = None
    raw: pb.GenerateResponse | None = None
    channel: str = "content"
    tool_call_index: int = 0
    tool_call: dict | None = None


@dataclass(frozen=True)
class TokenCount:
    """Result of :meth:`NInferClient.count_tokens`."""

    num_tokens: int
    max_context_tokens: int


def tool_call_dict(call: pb.ToolCall) -> dict:
    """``ToolCall`` -> ``{"id", "name", "arguments_json"}``."""
    return {"id": call.id, "name": call.name, "arguments_json": call.arguments_json}


def result_from_finish(finish: pb.Finish, text: str, token_ids: list[int], request_id: str = "") -> GenerationResult:
    """Builds a :class:`GenerationResult` from a ``Finish`` message.

    Args:
        finish: the final ``Finish`` message of the stream.
        text: the concatenated streamed text.
        token_ids: the concatenated streamed token ids.
        request_id: the request id.
    Returns:
        The result; an ERROR finish without ``error`` gets a generic
        ``INTERNAL`` error dict.
    """
    reason = FINISH_REASONS.get(finish.finish_reason, "error")
    u = finish.usage
    usage = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "draft_tokens": u.draft_tokens,
        "accepted_draft_tokens": u.accepted_draft_tokens,
    }
    constraint = None
    if finish.HasField("constraint"):
        c = finish.constraint
        constraint = {
            "kind": c.kind,
            "complete": c.complete,
            "terminated": c.terminated,
            "cache": CACHE_STATUS.get(c.cache),
            "prepare_seconds": c.prepare_seconds,
        }
        if c.branch:
            constraint["branch"] = c.branch
    error = None
    if finish.HasField("error"):
        e = finish.error
        error = {"code": e.code or "INTERNAL", "kind": e.kind, "message": e.message, "location": e.location}
    elif reason == "error":
        error = {
            "code": "INTERNAL",
            "kind": "UnknownError",
            "message": "the server reported an error without details",
            "location": "",
        }
    return GenerationResult(
        text=text,
        finish_reason=reason,
        usage=usage,
        constraint=constraint,
        error=error,
        reasoning=finish.reasoning if finish.HasField("reasoning") else None,
        tool_calls=[tool_call_dict(c) for c in finish.tool_calls],
        token_ids=list(token_ids),
        request_id=request_id,
    )


class GenerationStream(Iterator[GenerateEvent]):
    """An in-flight ``Generate`` call: iterate it for :class:`GenerateEvent`.

    After iteration ends, :attr:`result` holds the :class:`GenerationResult`
    (also given on the last event's ``finish``). :meth:`cancel` cancels the
    RPC; iteration then ends with a ``"cancelled"`` result.

    Iteration raises :class:`RequestRejected` / :class:`ServerUnavailable` /
    :class:`ServerError` when the RPC fails; :attr:`text` still holds the
    text received before the failure.
    """

    def __init__(self, call: Any, request_id: str = "") -> None:
        self._call = call
        self.request_id = request_id
        self._parts: list[str] = []
        self._reasoning_parts: list[str] = []
        self._tool_calls: list[dict] = []
        self._tokens: list[int] = []
        self._cancelled = False
        self.result: GenerationResult | None = None
        self._done = False

    @property
    def text(self) -> str:
        """Text received so far."""
        return "".join(self._parts)

    @property
    def reasoning(self) -> str:
        """Reasoning text received so far."""
        return "".join(self._reasoning_parts)

    @property
    def tool_calls(self) -> list[dict]:
        """Tool calls completed so far (``{"id", "name", "arguments_json"}``)."""
        return [dict(c) for c in self._tool_calls]

    @property
    def token_ids(self) -> list[int]:
        """Token ids received so far."""
        return list(self._tokens)

    def cancel(self) -> GenerationResult:
        """Cancels the RPC (idempotent) and returns the result: ``"cancelled"``
        with the text received so far, unless the stream already finished."""
        if self.result is None:
            self._cancelled = True
            try:
                self._call.cancel()
            except Exception:  # noqa: BLE001 - best effort
                pass
            self._finish_cancelled()
        return self.result  # type: ignore[return-value]

    def _finish_cancelled(self) -> None:
        self._done = True
        self.result = GenerationResult(
            text=self.text,
            finish_reason="cancelled",
            reasoning=self.reasoning if self._reasoning_parts else None,
            tool_calls=self.tool_calls,
            token_ids=list(self._tokens),
            request_id=self.request_id,
        )

    def _locally_cancelled(self) -> bool:
        """The call ended CANCELLED: cancelled on this side (e.g. gRPC's wait loop turned a
        Ctrl-C into a cancellation before we saw the KeyboardInterrupt)."""
        try:
            return self._call.code() == grpc.StatusCode.CANCELLED
        except Exception:  # noqa: BLE001 - a call object without a status
            return False

    def __iter__(self) -> "GenerationStream":
        return self

    def __next__(self) -> GenerateEvent:
        if self._done:
            raise StopIteration
        try:
            resp = next(self._call)
        except StopIteration:
            self._done = True
            if self._cancelled or self._locally_cancelled():
                self._finish_cancelled()
                raise
            if self.result is None:
                exc = ServerError("INTERNAL", "IncompleteStream", "the stream ended without a finish message")
                raise exc from None
            raise
        except grpc.RpcError as err:
            self._done = True
            # CANCELLED: this side cancelled the call — by cancel(), or by a Ctrl-C that
            # gRPC's own wait loop caught and turned into a cancellation.
            if self._cancelled or err.code() == grpc.StatusCode.CANCELLED:
                self._finish_cancelled()
                raise StopIteration from None
            raise exception_from_rpc_error(err) from None
        except KeyboardInterrupt:
            self.cancel()
            raise
        channel = CHANNELS.get(resp.channel, "content")
        if resp.text:
            if channel == "content":
                self._parts.append(resp.text)
            elif channel == "reasoning":
                self._reasoning_parts.append(resp.text)
        if resp.token_ids:
            self._tokens.extend(resp.token_ids)
        call = tool_call_dict(resp.tool_call) if resp.HasField("tool_call") else None
        if call is not None:
            self._tool_calls.append(call)
        event = GenerateEvent(
            text=resp.text,
            token_ids=list(resp.token_ids),
            raw=resp,
            channel=channel,
            tool_call_index=resp.tool_call_index,
            tool_call=call,
        )
        if resp.HasField("finish"):
            self.result = result_from_finish(resp.finish, self.text, self._tokens, self.request_id)
            event.finish = self.result
            self._done = True
        return event

    def collect(self) -> GenerationResult:
        """Consumes the rest of the stream and returns the result.

        Raises:
            NInferError: on RPC failure (see class docstring).
            KeyboardInterrupt: after cancelling the RPC.
        """
        for _ in self:
            pass
        assert self.result is not None
        return self.result


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    try:
        return err.code()
    except Exception:  # noqa: BLE001
        return None


def _trace_metadata() -> list[tuple[str, str]]:
    """W3C trace-context headers of the current OpenTelemetry context, if any."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return []
    carrier: dict[str, str] = {}
    try:
        propagate.inject(carrier)
    except Exception:  # noqa: BLE001 - tracing must never break requests
        return []
    return [(k.lower(), str(v)) for k, v in carrier.items()]


def _invalid(message: str) -> RequestRejected:
    return RequestRejected("INVALID_ARGUMENT", "InvalidRequest", message, "")


@contextlib.contextmanager
def _utf8_only() -> Iterator[None]:
    """Protobuf string fields take valid Unicode only: a lone surrogate (e.g. an undecodable byte of a
    command-line argument, kept by Python as U+DC80..U+DCFF) becomes RequestRejected, not a traceback."""
    try:
        yield
    except UnicodeEncodeError as e:
        bad = e.object[e.start:e.end] if isinstance(e.object, str) else ""
        code = f" U+{ord(bad[0]):04X}" if bad else ""
        raise _invalid(f"text is not valid Unicode: lone surrogate{code} at index {e.start} of a string argument "
                       "(undecodable bytes in the input?)") from None


def _in_range(name: str, value: int, lo: int, hi: int, rule: str) -> int:
    """``int(value)`` when ``lo <= value <= hi`` (the proto field's range), else RequestRejected
    ``"<name> must be <rule>, got <value>"`` (protobuf would raise a bare ValueError)."""
    v = int(value)
    if not lo <= v <= hi:
        raise _invalid(f"{name} must be {rule}, got {value}")
    return v


def build_constraint(constraint: Mapping[str, Any] | None) -> pb.OutputConstraint | None:
    """Converts a constraint dict to an ``OutputConstraint``.

    Args:
        constraint: exactly one of ``{"json_object": True}``,
            ``{"json_schema": "<json text>" | dict}``, ``{"grammar": "..."}``,
            ``{"regex": "..."}``, ``{"choice": ["a", "b"]}``; or None.
    Returns:
        The message, or None for no constraint.
    Raises:
        RequestRejected: (kind ``InvalidRequest``) for a malformed dict.
    """
    if constraint is None:
        return None
    if isinstance(constraint, pb.OutputConstraint):
        return constraint
    if not isinstance(constraint, Mapping):
        raise _invalid(f"constraint must be a dict, got {type(constraint).__name__}")
    keys = [k for k in constraint if k in CONSTRAINT_KINDS]
    unknown = [k for k in constraint if k not in CONSTRAINT_KINDS]
    if unknown:
        raise _invalid(f"unknown constraint key(s) {unknown}; expected one of {list(CONSTRAINT_KINDS)}")
    if len(keys) != 1:
        raise _invalid(f"exactly one constraint kind is allowed, got {keys}")
    kind = keys[0]
    value = constraint[kind]
    oc = pb.OutputConstraint()
    if kind == "json_object":
        if not value:
            return None
        oc.json_object.SetInParent()
    elif kind == "json_schema":
        if isinstance(value, (dict, list, bool)):
            value = json.dumps(value)
        if not isinstance(value, str):
            raise _invalid("json_schema must be JSON text or a dict")
        oc.json_schema = value
    elif pb.OutputConstraint.DESCRIPTOR.fields_by_name[kind].message_type is None:  # text source: grammar, regex, ...
        if not isinstance(value, str):
            raise _invalid(f"{kind} must be a string")
        setattr(oc, kind, value)
    else:  # choice
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise _invalid("choice must be a list of strings")
        options = list(value)
        if not all(isinstance(o, str) for o in options):
            raise _invalid("choice options must be strings")
        oc.choice.SetInParent()
        oc.choice.options.extend(options)
    return oc


def _tool_call_message(call: Any, where: str) -> pb.ToolCall:
    """An OpenAI-style call ``{"id", "type": "function", "function": {"name", "arguments"}}``
    or ``{"id", "name", "arguments_json"}`` -> ``ToolCall``."""
    if isinstance(call, pb.ToolCall):
        return call
    if not isinstance(call, Mapping):
        raise _invalid(f"{where}: a tool call must be an object, got {type(call).__name__}")
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else call
    name = fn.get("name")
    args = fn.get("arguments", fn.get("arguments_json", "{}"))
    if not isinstance(name, str) or not name:
        raise _invalid(f"{where}: a tool call needs a non-empty string name")
    if isinstance(args, (dict, list)):
        args = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    if not isinstance(args, str):
        raise _invalid(f"{where}: arguments must be JSON text or an object")
    return pb.ToolCall(id=str(call.get("id", "") or ""), name=name, arguments_json=args)


def build_tools(tools: Sequence[Any] | None) -> list[pb.Tool]:
    """Converts OpenAI-style function tools to ``Tool`` messages.

    Args:
        tools: a list of ``{"type": "function", "function": {"name",
            "description"?, "parameters"?, "strict"?}}`` (the bare inner
            ``{"name", ...}`` object is accepted too), or ``Tool`` messages.
            ``parameters`` is a JSON Schema dict or JSON text.
    Returns:
        The messages in order (empty list for None).
    Raises:
        RequestRejected: (kind ``InvalidRequest``, location ``/tools/i/...``)
            for a malformed entry. Schema checks happen on the server.
    """
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", "tools must be a list of function tools", "/tools")
    out: list[pb.Tool] = []
    for i, t in enumerate(tools):
        if isinstance(t, pb.Tool):
            out.append(t)
            continue
        loc = f"/tools/{i}"
        if not isinstance(t, Mapping):
            raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"tool {i} must be an object", loc)
        if "function" in t or "type" in t:
            if t.get("type", "function") != "function":
                raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest",
                                      f"tool {i}: only type 'function' is supported, got {t.get('type')!r}", loc + "/type")
            fn = t.get("function")
            loc += "/function"
            if not isinstance(fn, Mapping):
                raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"tool {i}: 'function' must be an object", loc)
        else:
            fn = t
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"tool {i}: name must be a non-empty string", loc + "/name")
        desc = fn.get("description", "")
        if not isinstance(desc, str):
            raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"tool {i}: description must be a string", loc + "/description")
        params = fn.get("parameters", None)
        if params is None:
            params_text = ""
        elif isinstance(params, str):
            params_text = params
        elif isinstance(params, (Mapping, bool)):
            params_text = json.dumps(params, ensure_ascii=False)
        else:
            raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest",
                                  f"tool {i}: parameters must be a JSON Schema object", loc + "/parameters")
        strict = fn.get("strict", False)
        if strict is None:
            strict = False
        if not isinstance(strict, bool):
            raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"tool {i}: strict must be a boolean", loc + "/strict")
        out.append(pb.Tool(name=name, description=desc, parameters_json=params_text, strict=strict))
    return out


def build_tool_choice(
    tool_choice: Any = None, parallel_tool_calls: bool | None = None, tool_constraints: str | None = None
) -> pb.ToolChoice | None:
    """Converts a tool choice to a ``ToolChoice``.

    Args:
        tool_choice: ``"auto" | "none" | "required"``, a tool name (named:
            REQUIRED + that name + parallel off), an OpenAI named choice
            ``{"type": "function", "function": {"name"}}``, a list of allowed
            names (REQUIRED among them), or None (server default AUTO).
        parallel_tool_calls: allow more than one call (None = default, on).
        tool_constraints: ``"basic"`` (default) or ``"automatic"``.
    Returns:
        The message, or None when every argument is None.
    Raises:
        RequestRejected: (kind ``InvalidRequest``) for malformed values.
    """
    if tool_choice is None and parallel_tool_calls is None and tool_constraints is None:
        return None
    if isinstance(tool_choice, pb.ToolChoice):
        return tool_choice
    tc = pb.ToolChoice()
    if tool_choice is None:
        pass
    elif isinstance(tool_choice, str):
        key = tool_choice.strip()
        if key.lower() in TOOL_CHOICE_MODES:
            tc.mode = TOOL_CHOICE_MODES[key.lower()]
        elif key:
            tc.mode = pb.TOOL_CHOICE_MODE_REQUIRED
            tc.allowed_names.append(key)
            tc.parallel = False
        else:
            raise _invalid("tool_choice must not be empty")
    elif isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid("a named tool_choice needs {'type': 'function', 'function': {'name': ...}}")
        tc.mode = pb.TOOL_CHOICE_MODE_REQUIRED
        tc.allowed_names.append(name)
        tc.parallel = False
    elif isinstance(tool_choice, Iterable):
        names = list(tool_choice)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise _invalid("allowed tool names must be a non-empty list of names")
        tc.mode = pb.TOOL_CHOICE_MODE_REQUIRED
        tc.allowed_names.extend(names)
    else:
        raise _invalid(f"bad tool_choice {tool_choice!r}")
    if parallel_tool_calls is not None:
        tc.parallel = bool(parallel_tool_calls)
    if tool_constraints is not None:
        key = str(tool_constraints).lower()
        if key not in TOOL_CONSTRAINT_MODES:
            raise _invalid(f"tool_constraints must be one of {sorted(TOOL_CONSTRAINT_MODES)}, got {tool_constraints!r}")
        tc.constraints = TOOL_CONSTRAINT_MODES[key]
    return tc


def build_chat(messages: Sequence[Any], continue_final_message: bool = False) -> pb.Chat:
    """Converts messages to a ``Chat``.

    Args:
        messages: dicts ``{"role", "content", "tool_calls"?, "tool_call_id"?,
            "name"?, "reasoning"?}`` (tool calls OpenAI-style or
            ``{"id", "name", "arguments_json"}``), ``(role, content)`` pairs or
            ``ChatMessage`` messages.
        continue_final_message: continue the last (assistant) message.
    Returns:
        The ``Chat`` message.
    Raises:
        RequestRejected: (kind ``InvalidRequest``) for a malformed message.
    """
    chat = pb.Chat(continue_final_message=bool(continue_final_message))
    for m in messages:
        if isinstance(m, pb.ChatMessage):
            chat.messages.append(m)
        elif isinstance(m, Mapping):
            msg = chat.messages.add(role=str(m.get("role", "")), content=str(m.get("content") or ""))
            i = len(chat.messages) - 1
            for j, call in enumerate(m.get("tool_calls") or ()):
                msg.tool_calls.append(_tool_call_message(call, f"message {i} tool call {j}"))
            for key in ("tool_call_id", "name", "reasoning"):
                if m.get(key):
                    setattr(msg, key, str(m[key]))
        elif isinstance(m, (tuple, list)) and len(m) == 2:
            chat.messages.add(role=str(m[0]), content=str(m[1]))
        else:
            raise _invalid(f"bad chat message {m!r}; expected {{'role', 'content'}}")
    return chat


class NInferClient:
    """A blocking client for one NInfer server.

    Args:
        target: ``host:port`` (default: env ``NINFER_SERVER`` or ``127.0.0.1:50051``).
        timeout_s: per-call deadline in seconds (None = no deadline).
        channel: an existing ``grpc.Channel`` to use instead of creating one
            (the client does not close it).
        options: extra channel options for ``grpc.insecure_channel``.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        target: str | None = None,
        timeout_s: float | None = None,
        *,
        channel: grpc.Channel | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self.target = target or default_target()
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self._channel = channel if channel is not None else grpc.insecure_channel(self.target, options=list(options or ()))
        self._stub = pb_grpc.GenerationStub(self._channel)

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Closes the channel (if the client created it)."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "NInferClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests --------------------------------------------------------
    @staticmethod
    @_utf8_only()  # a lone surrogate in any string argument: RequestRejected, not a UnicodeEncodeError
    def build_request(
        prompt: str | None = None,
        messages: Sequence[Any] | None = None,
        *,
        constraint: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        seed: int | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        speculative: str | int | None = None,
        num_draft_tokens: int | None = None,
        continue_final_message: bool = False,
        request_id: str | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        parallel_tool_calls: bool | None = None,
        tool_constraints: str | None = None,
        thinking: bool | str | None = None,
        thinking_budget: int | None = None,
    ) -> pb.GenerateRequest:
        """Builds a ``GenerateRequest`` (see :meth:`generate` for the arguments).

        Raises:
            RequestRejected: (kind ``InvalidRequest``) for invalid arguments.
        """
        if (prompt is None) == (messages is None):
            raise _invalid("give exactly one of prompt or messages")
        if continue_final_message and messages is None:
            raise _invalid("continue_final_message needs messages")
        req = pb.GenerateRequest(request_id=request_id or uuid.uuid4().hex)
        if prompt is not None:
            req.prompt = prompt
        else:
            req.chat.CopyFrom(build_chat(messages, continue_final_message))  # type: ignore[arg-type]
        if max_tokens is not None:
            req.max_tokens = _in_range("max_tokens", max_tokens, 0, (1 << 32) - 1, "in [0, 2**32 - 1]")
        s = req.sampling
        for name, value in (
            ("temperature", temperature),
            ("top_p", top_p),
            ("min_p", min_p),
            ("presence_penalty", presence_penalty),
            ("frequency_penalty", frequency_penalty),
        ):
            if value is not None:
                setattr(s, name, float(value))
        if top_k is not None:
            s.top_k = _in_range("top_k", top_k, -(1 << 31), (1 << 31) - 1, "a 32-bit integer")
        if seed is not None:
            s.seed = _in_range("seed", seed, 0, (1 << 64) - 1, "in [0, 2**64 - 1]")
        oc = build_constraint(constraint)
        if oc is not None:
            req.constraint.CopyFrom(oc)
        if speculative is not None or num_draft_tokens is not None:
            if speculative is None:
                method = pb.SPECULATIVE_METHOD_UNSPECIFIED
            elif isinstance(speculative, int):
                method = speculative
            else:
                key = str(speculative).lower()
                if key not in SPECULATIVE_METHODS:
                    raise _invalid(f"unknown speculative method {speculative!r}")
                method = SPECULATIVE_METHODS[key]
            req.speculative.method = method
            if num_draft_tokens is not None:
                req.speculative.num_draft_tokens = _in_range("num_draft_tokens", num_draft_tokens, 0, (1 << 32) - 1,
                                                             "in [0, 2**32 - 1]")
        req.tools.extend(build_tools(tools))
        tc = build_tool_choice(tool_choice, parallel_tool_calls, tool_constraints)
        if tc is not None:
            req.tool_choice.CopyFrom(tc)
        if thinking is not None:
            if isinstance(thinking, str):
                key = thinking.lower()
                if key not in ("on", "off", "true", "false"):
                    raise _invalid(f"thinking must be on/off, got {thinking!r}")
                thinking = key in ("on", "true")
            req.thinking.enabled = bool(thinking)
        if thinking_budget is not None:
            req.thinking.budget_tokens = _in_range("thinking_budget", thinking_budget, 0, (1 << 32) - 1,
                                                   "in [0, 2**32 - 1]")
        return req

    def generate(self, prompt: str | None = None, messages: Sequence[Any] | None = None, **kwargs: Any) -> GenerationStream:
        """Starts a streaming generation.

        Args:
            prompt: raw text prompt (no chat template). Exactly one of
                ``prompt`` / ``messages``.
            messages: chat messages (``{"role", "content"}`` dicts), rendered
                with the model's chat template.
            constraint: optional body constraint dict, one of
                ``{"json_object": True}``, ``{"json_schema": "<json>"}``,
                ``{"grammar": "<gbnf>"}``, ``{"regex": "<re>"}``,
                ``{"choice": ["a", "b"]}``.
            max_tokens: generated token limit (0/None = server default).
            temperature, top_p, top_k, min_p, seed, presence_penalty,
                frequency_penalty: sampling parameters (None = server default).
            speculative: ``"none" | "ngram" | "early-exit" | "early-exit-sampled"``
                (None = server default).
            num_draft_tokens: draft tokens per step (None = server default).
            continue_final_message: continue the final assistant message.
            request_id: id for logs/traces (default: a random hex id).
            tools: OpenAI-style function tools (see :func:`build_tools`).
            tool_choice: ``"auto" | "none" | "required" | NAME`` (see
                :func:`build_tool_choice`).
            parallel_tool_calls: allow several calls in the turn (default on).
            tool_constraints: ``"basic"`` (default) or ``"automatic"``.
            thinking: ``True``/``False`` (or ``"on"``/``"off"``); None = the
                model's default.
            thinking_budget: reasoning token budget (0/None = none).
        Returns:
            A :class:`GenerationStream` yielding :class:`GenerateEvent`; its
            last event carries ``finish`` (a :class:`GenerationResult`).
        Raises:
            RequestRejected: invalid arguments (raised here) or a request the
                server refused before queueing (raised on first iteration).
            ServerUnavailable: server unreachable or deadline exceeded
                (raised during iteration).
            ServerError: other RPC failures (raised during iteration).
        """
        req = self.build_request(prompt, messages, **kwargs)
        call = self._stub.Generate(req, timeout=self.timeout_s, metadata=_trace_metadata() or None)
        return GenerationStream(call, req.request_id)

    def generate_text(self, prompt: str | None = None, messages: Sequence[Any] | None = None, **kwargs: Any) -> GenerationResult:
        """Runs a generation to the end and returns the assembled result.

        Takes the same arguments as :meth:`generate`. A runtime error after
        generation started is *returned* (``finish_reason == "error"`` and
        ``error`` set), not raised.

        Returns:
            The :class:`GenerationResult`.
        Raises:
            RequestRejected: the request was refused before queueing (or the
                arguments are invalid).
            ServerUnavailable: server unreachable or deadline exceeded.
            ServerError: other RPC failures.
            KeyboardInterrupt: re-raised after cancelling the RPC.
        """
        return self.generate(prompt, messages, **kwargs).collect()

    def count_tokens(
        self,
        prompt: str | None = None,
        messages: Sequence[Any] | None = None,
        *,
        continue_final_message: bool = False,
    ) -> TokenCount:
        """Counts the tokens of a prompt or chat as the model sees it.

        Args:
            prompt: raw text (exactly one of ``prompt`` / ``messages``).
            messages: chat messages (rendered with a generation prompt).
            continue_final_message: render the last message as continued.
        Returns:
            :class:`TokenCount` ``(num_tokens, max_context_tokens)``.
        Raises:
            RequestRejected, ServerUnavailable, ServerError: as for :meth:`generate`.
        """
        if (prompt is None) == (messages is None):
            raise _invalid("give exactly one of prompt or messages")
        req = pb.CountTokensRequest()
        with _utf8_only():
            if prompt is not None:
                req.prompt = prompt
            else:
                req.chat.CopyFrom(build_chat(messages, continue_final_message))  # type: ignore[arg-type]
        try:
            resp = self._stub.CountTokens(req, timeout=self.timeout_s, metadata=_trace_metadata() or None)
        except grpc.RpcError as err:
            raise exception_from_rpc_error(err) from None
        return TokenCount(resp.num_tokens, resp.max_context_tokens)

    def health(self, service: str = "") -> str:
        """Checks server health with the standard ``grpc.health.v1`` service.

        Args:
            service: service name to check (``""`` = the whole server).
        Returns:
            The status name: ``"SERVING"``, ``"NOT_SERVING"``, ``"UNKNOWN"``
            or ``"SERVICE_UNKNOWN"``.
        Raises:
            ServerUnavailable: server unreachable or deadline exceeded.
            ServerError: other RPC failures (e.g. health service missing).
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout_s)
        except grpc.RpcError as err:
            exc = exception_from_rpc_error(err)
            if _code(err) == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise exc from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


__all__ = [
    "DEFAULT_TARGET",
    "GenerateEvent",
    "GenerationResult",
    "GenerationStream",
    "NInferClient",
    "NInferError",
    "TokenCount",
    "build_chat",
    "build_constraint",
    "build_tool_choice",
    "build_tools",
    "default_target",
    "result_from_finish",
    "tool_call_dict",
]
