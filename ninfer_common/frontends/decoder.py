"""Output decoder: committed output bytes -> reasoning / content / tool calls (seed 000 §OutputSession).

Built from the same :class:`~ninfer_common.frontends.rules.OutputRules` and
:class:`~ninfer_common.frontends.tools.ToolPolicy` as the grammar
(``constraint_service.tools.grammar``), so both read the output the same way:

* thinking on: the output starts inside the reasoning; reasoning ends at the
  canonical close ``\\n</think>\\n\\n`` (framing, in no channel); the content
  bytes after it are published as-is.
* body: with calls possible, the first content byte decides the branch when a
  JSON body constraint stands beside the tools (JSON bypasses tool parsing, so
  ``<tool_call>`` inside a JSON string stays text); without a body constraint,
  content runs until the call tag, then only calls (separated by the
  family's separator) follow.
* a call is published (channel ``tool_call``, raw wire text) as it arrives and
  decoded when its closing tag is committed; a constrained call that does not
  decode raises :class:`DecodeIntegrityError`.

Incremental: :meth:`OutputDecoder.feed` takes committed bytes (any split, also
inside a UTF-8 sequence) and returns :class:`Delta` objects; text is only
released once it cannot be the start of a framing string, and only as whole
UTF-8 characters. :meth:`OutputDecoder.finish` flushes and returns the
:class:`DecodedOutput`.
"""
from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field

from .errors import DecodeIntegrityError
from .rules import OutputRules
from .tools import JSON, RAW, ToolPolicy, param_encodings

REASONING = "reasoning"
CONTENT = "content"
TOOL_CALL = "tool_call"


@dataclass
class ToolCall:
    """A decoded call: ``id`` (``call_<index>``), ``name``, ``arguments_json`` (compact JSON object text)."""

    id: str
    name: str
    arguments_json: str
    index: int = 0


@dataclass
class Delta:
    """One stream event: ``text`` in ``channel`` (``reasoning``/``content``/``tool_call``); ``call_index``
    for tool-call text; ``call`` set on the delta that completes a call."""

    channel: str
    text: str = ""
    call_index: int = 0
    call: ToolCall | None = None


@dataclass
class DecodedOutput:
    """The final split. ``reasoning`` is None when the turn had no thinking stage; ``branch`` is
    ``"undecided"``, ``"content"`` or ``"tools"``; ``reasoning_closed`` says the close was seen;
    ``pending_call`` is the raw text of an unfinished call (truncation: it yields no call)."""

    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    branch: str = "undecided"
    reasoning_closed: bool = False
    pending_call: str = ""


def _partial_suffix(buf: str, pattern: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``pattern``."""
    for k in range(min(len(buf), len(pattern) - 1), 0, -1):
        if pattern.startswith(buf[-k:]):
            return k
    return 0


class OutputDecoder:
    """Incremental decoder of one request's output (not thread-safe; one per request).

    Args:
        rules: the family's output rules.
        policy: the resolved tool policy (no tools: ``ToolPolicy()``).
        thinking: the output starts inside the reasoning (the prompt ended with ``rules.thinking.open``).
        body_constrained: a body constraint owns the content language (disables tag extraction in
            content; with calls possible it makes the first content byte pick the branch).
        constrained: the tool part is grammar-enforced: an undecodable complete call raises
            :class:`DecodeIntegrityError` instead of staying text.
    """

    def __init__(self, rules: OutputRules, policy: ToolPolicy | None = None, *, thinking: bool = False,
                 body_constrained: bool = False, constrained: bool = True) -> None:
        self.rules = rules
        self.policy = policy or ToolPolicy()
        if thinking and rules.thinking is None:
            raise ValueError(f"{rules.display_name} has no thinking stage")
        self.fmt = rules.tools
        self.body_constrained = body_constrained
        self.constrained = constrained
        # Free text (unconstrained content or reasoning of a real or random model) may hold invalid UTF-8:
        # it is published with U+FFFD, as the plain path's detokenizer does; a grammar-constrained output
        # is valid UTF-8 by construction, so this never changes a constrained result.
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._stage = REASONING if thinking else "body"
        self._thinking = thinking
        self._buf = ""           # undecided text of the current stage
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._call_text = ""     # raw text of the call being read
        self.branch = "undecided"
        self.reasoning_closed = False
        self._encodings = {t.name: param_encodings(t) for t in self.policy.callable}

    # ---- public ------------------------------------------------------------------------------
    @property
    def mid_character(self) -> bool:
        """True while the committed bytes end inside a UTF-8 character (a byte-level token split it)."""
        return bool(self._utf8.getstate()[0])

    @property
    def stage(self) -> str:
        """``reasoning``, ``body`` (before/inside content) or ``calls``."""
        return self._stage

    def feed(self, data: bytes) -> list[Delta]:
        """Decodes committed output bytes.

        Args:
            data: the bytes of newly committed tokens (EOS excluded), any split.
        Returns:
            The deltas they complete, in order.
        Raises:
            DecodeIntegrityError: a constrained call completed but does not decode.
        """
        text = self._utf8.decode(data, final=False)
        out: list[Delta] = []
        if text:
            self._buf += text
            self._advance(out, final=False)
        return out

    def finish(self) -> tuple[list[Delta], DecodedOutput]:
        """Flushes held-back text (the output ended: EOS, length, cancel) and returns the last
        deltas and the final :class:`DecodedOutput`. An unfinished call yields no call."""
        out: list[Delta] = []
        tail = self._utf8.decode(b"", final=False)
        self._buf += tail
        self._advance(out, final=True)
        if self._buf:
            if self._stage == REASONING:
                self._emit(out, REASONING, self._buf)
            elif self._stage == "body":
                self._emit(out, CONTENT, self._buf)
            self._buf = ""
        result = DecodedOutput(
            reasoning="".join(self._reasoning) if self._thinking else None,
            content="".join(self._content),
            tool_calls=list(self._calls),
            branch=self.branch,
            reasoning_closed=self.reasoning_closed,
            pending_call=self._call_text,
        )
        return out, result

    # ---- stages ------------------------------------------------------------------------------
    def _emit(self, out: list[Delta], channel: str, text: str, call_index: int = 0, call: ToolCall | None = None) -> None:
        if not text and call is None:
            return
        if channel == REASONING:
            self._reasoning.append(text)
        elif channel == CONTENT:
            self._content.append(text)
            if self.branch == "undecided":
                self.branch = "content"
        if out and out[-1].channel == channel and out[-1].call is None and channel != TOOL_CALL:
            out[-1].text += text
        else:
            out.append(Delta(channel, text, call_index, call))

    def _advance(self, out: list[Delta], final: bool) -> None:
        while True:
            before = (self._stage, len(self._buf))
            if self._stage == REASONING:
                self._reasoning_step(out, final)
            elif self._stage == "body":
                self._body_step(out, final)
            else:
                self._calls_step(out, final)
            if (self._stage, len(self._buf)) == before:
                return

    def _reasoning_step(self, out: list[Delta], final: bool) -> None:
        th = self.rules.thinking
        assert th is not None
        j = self._buf.find(th.close) if self.constrained else self._buf.find(th.close_tag)
        if j >= 0:
            if self.constrained:
                self._emit(out, REASONING, self._buf[:j])
                self._buf = self._buf[j + len(th.close):]
            else:  # lenient: strip the framing newlines around the tag
                self._emit(out, REASONING, self._buf[:j].removesuffix("\n"))
                rest = self._buf[j + len(th.close_tag):]
                self._buf = rest[2:] if rest.startswith("\n\n") else rest.lstrip("\n")
            self._stage = "body"
            self.reasoning_closed = True
            return
        keep = 0 if final else max(_partial_suffix(self._buf, th.close), _partial_suffix(self._buf, th.close_tag))
        self._emit(out, REASONING, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep:]

    def _body_step(self, out: list[Delta], final: bool) -> None:
        tag = self.fmt.call_tag
        if not self.policy.calls_possible:
            self._emit(out, CONTENT, self._buf)
            self._buf = ""
            return
        if self.body_constrained:
            # union: the first content byte picks the branch; a JSON body never starts with '<'
            if self.branch == "undecided":
                if not self._buf:
                    return
                if self._buf[0] == tag[0]:
                    self._stage, self.branch = "calls", "tools"
                    return
            self._emit(out, CONTENT, self._buf)
            self._buf = ""
            return
        j = self._buf.find(tag)
        if j >= 0:
            self._emit(out, CONTENT, self._buf[:j])
            self._buf = self._buf[j:]
            self._stage, self.branch = "calls", "tools"
            return
        keep = 0 if final else _partial_suffix(self._buf, tag)
        self._emit(out, CONTENT, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep:]

    def _calls_step(self, out: list[Delta], final: bool) -> None:
        fmt = self.fmt
        index = len(self._calls)
        if not self._call_text:
            # between calls: the separator, then the next call tag
            if self._calls and self._buf.startswith(fmt.separator):
                self._buf = self._buf[len(fmt.separator):]
            if not self._buf:
                return
        whole = self._call_text + self._buf
        end = self._call_end(whole)
        if end is None:
            self._emit(out, TOOL_CALL, self._buf, index)
            self._call_text += self._buf
            self._buf = ""
            return
        piece = whole[len(self._call_text):end]
        call = self._decode_call(whole[:end], index)
        self._buf = whole[end:]
        self._call_text = ""
        if call is None:  # lenient route: malformed text stays content
            self._emit(out, CONTENT, whole[:end])
            return
        self._calls.append(call)
        out.append(Delta(TOOL_CALL, piece, index, call))

    def _call_end(self, text: str) -> int | None:
        """End offset of the first complete call at the start of ``text`` (None: not complete yet).
        JSON wire: the first ``call_close`` (compact JSON holds no raw newline). XML wire: walks the
        parameters, since a raw value may hold ``</tool_call>`` but never the raw terminator."""
        fmt = self.fmt
        if fmt.wire == "json":
            j = text.find(fmt.call_close, len(fmt.call_open))
            return None if j < 0 else j + len(fmt.call_close)
        pos = len(fmt.call_open)
        if not text.startswith(fmt.call_open + fmt.function_open):
            return None
        k = text.find(fmt.function_open_end, pos)
        if k < 0:
            return None
        pos = k + len(fmt.function_open_end)
        tail = fmt.function_close + fmt.call_close
        while True:
            if text.startswith(tail, pos):
                return pos + len(tail)
            if not text.startswith(fmt.param_open, pos):
                return None
            e = text.find(fmt.param_open_end, pos)
            if e < 0:
                return None
            v = text.find(fmt.raw_terminator, e + len(fmt.param_open_end))
            if v < 0 or not text.startswith(fmt.param_close, v):
                return None
            pos = v + len(fmt.param_close)

    # ---- call decoding -----------------------------------------------------------------------
    def _bad(self, text: str, why: str) -> None:
        if self.constrained:
            raise DecodeIntegrityError(f"a grammar-complete tool call does not decode ({why}): {text!r}")
        return None

    def _decode_call(self, text: str, index: int) -> ToolCall | None:
        fmt = self.fmt
        if not (text.startswith(fmt.call_open) and text.endswith(fmt.call_close)):
            return self._bad(text, "framing")
        body = text[len(fmt.call_open): len(text) - len(fmt.call_close)]
        if fmt.wire == "json":
            try:
                obj = json.loads(body)
            except ValueError as e:
                return self._bad(text, f"JSON: {e}")
            if not isinstance(obj, dict) or set(obj) != {"name", "arguments"} or not isinstance(obj["arguments"], dict):
                return self._bad(text, "expected {\"name\", \"arguments\": {...}}")
            name, args = obj["name"], obj["arguments"]
        else:
            parsed = self._decode_xml(body)
            if parsed is None:
                return self._bad(text, "XML framing")
            name, args = parsed
        if self.policy.tool(name) is None:
            return self._bad(text, f"{name!r} is not a callable tool")
        return ToolCall(id=f"call_{index}", name=name,
                        arguments_json=json.dumps(args, ensure_ascii=False, separators=(",", ":")), index=index)

    def _decode_xml(self, body: str) -> tuple[str, dict] | None:
        fmt = self.fmt
        if not body.startswith(fmt.function_open) or not body.endswith(fmt.function_close):
            return None
        k = body.find(fmt.function_open_end)
        if k < 0:
            return None
        name = body[len(fmt.function_open):k]
        rest = body[k + len(fmt.function_open_end): len(body) - len(fmt.function_close)]
        tool = self.policy.tool(name)
        enc = self._encodings.get(name, {})
        args: dict = {}
        term = fmt.raw_terminator
        while rest:
            if not rest.startswith(fmt.param_open):
                return None
            e = rest.find(fmt.param_open_end)
            if e < 0:
                return None
            pname = rest[len(fmt.param_open):e]
            vstart = e + len(fmt.param_open_end)
            vend = rest.find(term, vstart)
            if vend < 0 or not rest.startswith(fmt.param_close, vend):
                return None
            raw = rest[vstart:vend]
            rest = rest[vend + len(fmt.param_close):]
            mode = enc.get(pname, JSON)
            if mode == RAW:
                value = raw
            else:
                try:
                    value = json.loads(raw)
                except ValueError:
                    if tool is not None and tool.strict:
                        return None
                    value = raw  # basic language: an undeclared/unknown value stays a string
            if tool is not None and tool.strict and pname in args:
                return None  # strict arguments never repeat
            args[pname] = value  # basic language: the last value wins, first position kept
        return name, args
