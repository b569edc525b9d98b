"""The transport-free generation request every front door converts into (seed 000 §接口, §采样).

The gRPC servicer builds a :class:`GenerateParams` from the protobuf
(:func:`gpu_engine.api.convert.params_from_proto`); an HTTP gateway or a chat
frontend builds the same object from its own wire format. :meth:`GenerateParams.validate`
checks everything that needs no model or server state; admission
(:mod:`gpu_engine.core.admission`) then renders, tokenises and prepares it.
All failures are :class:`ninfer_common.errors.RequestError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ninfer_common.constraint_kind import ConstraintKind
from ninfer_common.errors import ErrorKind, RequestError

from gpu_engine.core.request import SpecMethod


__all__ = ["CHAT_ROLES", "MAX_CHOICES", "MAX_CONSTRAINT_SOURCE_BYTES", "ChatMessage", "ConstraintParams",
           "GenerateParams"]

MAX_CONSTRAINT_SOURCE_BYTES = 1 << 20  # 1 MiB of schema / grammar / regex text
MAX_CHOICES = 4096
#: request_id limit: the id travels in every sidecar Step row, span and log line; a 5 MB id broke the
#: engine<->sidecar Step stream (gRPC 4 MiB message limit) for every constrained request.
MAX_REQUEST_ID_BYTES = 256
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn: ``role`` in :data:`CHAT_ROLES`, ``content`` plain text."""

    role: str
    content: str
    tool_calls: tuple[dict, ...] = ()  # assistant: past calls [{"id", "name", "arguments"}] (arguments JSON text)
    tool_call_id: str = ""  # tool: the call this result answers
    name: str = ""  # tool: the tool's name

    def as_template_dict(self) -> dict:
        """The message as a chat-template dict (``tool_calls`` etc. only when set)."""
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [dict(c) for c in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        return d


@dataclass(frozen=True)
class ConstraintParams:
    """The body constraint of a request.

    Attributes:
        kind: the :class:`ConstraintKind`.
        source: schema JSON / GBNF / regex text; ``""`` for json_object and choice.
        choices: the options of ``choice``; ``()`` otherwise.
    """

    kind: ConstraintKind
    source: str = ""
    choices: tuple[str, ...] = ()


@dataclass
class GenerateParams:
    """A generation request, independent of any transport.

    Exactly one of ``prompt`` / ``messages`` is set. Unset optional sampling fields
    (None) take the documented defaults (temperature 1, top_p 1, min_p 0, top_k 0 = off).

    Attributes:
        request_id: caller's id, ``""`` = the server assigns one.
        prompt: raw prompt text (control-token spellings parsed as control tokens).
        messages: chat turns rendered with the model's template.
        continue_final_message: continue the final assistant message instead of starting a new turn.
        max_tokens: output budget in tokens; 0 = the server default.
        temperature, top_p, min_p, top_k: sampling filters (None = default).
        presence_penalty, frequency_penalty: additive penalties in [-2, 2].
        seed: uint64 seed, None = derived from the request id.
        constraint: the body constraint or None.
        spec_method: speculative method, None = the server default.
        num_draft_tokens: K, 0 = the server default.
    """

    request_id: str = ""
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    continue_final_message: bool = False
    max_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    min_p: float | None = None
    top_k: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    constraint: ConstraintParams | None = None
    spec_method: SpecMethod | None = None
    num_draft_tokens: int = 0
    tools: tuple = ()  # ninfer_common.frontends.ToolDef, declared tools (chat only)
    tool_choice: Any = None  # ninfer_common.frontends.ToolChoice or None
    thinking: Any = None  # ninfer_common.frontends.plan.ThinkingRequest or None (the model's default)
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Checks the request without model or server state.

        Raises:
            RequestError: ``InvalidRequest`` (input, sampling ranges, chat roles, source size),
                ``InvalidChoice`` (too many options); message says expected vs actual.
        """
        n_id = len(self.request_id.encode())
        if n_id > MAX_REQUEST_ID_BYTES:
            raise RequestError(ErrorKind.INVALID_REQUEST, f"request_id is {n_id} bytes; at most "
                               f"{MAX_REQUEST_ID_BYTES} bytes")
        if any(ch < " " or ch == "\x7f" for ch in self.request_id):
            raise RequestError(ErrorKind.INVALID_REQUEST, "request_id must not contain control characters")
        if (self.prompt is None) == (self.messages is None):
            raise RequestError(ErrorKind.INVALID_REQUEST, "expected one of `prompt` or `chat`, got "
                               + ("neither" if self.prompt is None else "both"))
        if self.messages is not None:
            validate_messages(self.messages)
            if self.continue_final_message and self.messages[-1].role != "assistant":
                raise RequestError(ErrorKind.INVALID_REQUEST, "continue_final_message needs a final assistant "
                                   f"message, got role {self.messages[-1].role!r}")
        t, p, m, k = self.sampling_values()
        if not (math.isfinite(t) and t >= 0):
            raise RequestError(ErrorKind.INVALID_REQUEST, f"temperature must be a finite number >= 0, got {t}",
                               "/temperature")
        if not (0 < p <= 1):
            raise RequestError(ErrorKind.INVALID_REQUEST, f"top_p must be in (0, 1], got {p}", "/top_p")
        if not (0 <= m <= 1):
            raise RequestError(ErrorKind.INVALID_REQUEST, f"min_p must be in [0, 1], got {m}", "/min_p")
        if k < 0:
            raise RequestError(ErrorKind.INVALID_REQUEST, f"top_k must be >= 0, got {k}", "/top_k")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -2.0 <= v <= 2.0):
                raise RequestError(ErrorKind.INVALID_REQUEST, f"{name} must be in [-2, 2], got {v}",
                                   f"/{name}")
        c = self.constraint
        if c is not None:
            if len(c.choices) > MAX_CHOICES:
                raise RequestError(ErrorKind.INVALID_CHOICE, f"expected at most {MAX_CHOICES} options, "
                                   f"got {len(c.choices)}")
            n = len(c.source.encode())
            if n > MAX_CONSTRAINT_SOURCE_BYTES:
                raise RequestError(ErrorKind.INVALID_REQUEST, f"constraint source too large: {n} bytes "
                                   f"(limit {MAX_CONSTRAINT_SOURCE_BYTES})")

    def sampling_values(self) -> tuple[float, float, float, int]:
        """``(temperature, top_p, min_p, top_k)`` with defaults applied."""
        return (1.0 if self.temperature is None else self.temperature, 1.0 if self.top_p is None else self.top_p,
                0.0 if self.min_p is None else self.min_p, 0 if self.top_k is None else self.top_k)


def validate_messages(messages: list[ChatMessage]) -> None:
    """Raises :class:`RequestError` (``InvalidRequest``) for an empty chat or an unknown role."""
    if not messages:
        raise RequestError(ErrorKind.INVALID_REQUEST, "chat has no messages")
    for msg in messages:
        if msg.role not in CHAT_ROLES:
            raise RequestError(ErrorKind.INVALID_REQUEST,
                               f"unknown chat role {msg.role!r} (expected system, user, assistant or tool)")
