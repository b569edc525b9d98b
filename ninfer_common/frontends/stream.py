"""Per-request output stream: committed token ids -> channel deltas, forced reasoning close, final result
(seed 000 §OutputSession 发布, §thinking budget).

The engine owns one :class:`OutputStream` per chat request with an :class:`~.plan.OutputPlan`. After each
committed step it calls :meth:`OutputStream.commit` with the step's token ids (EOS included when sampled);
before the next step it asks :meth:`OutputStream.forced_close` whether the reasoning budget ran out, and if
so appends the returned ids (the canonical close, tokenized by the model's tokenizer) as a forced step
through the sidecar's preview/commit (no sampling, no RNG, counted in ``max_tokens``), then commits them
here like any other step. :meth:`OutputStream.finish` returns the last deltas and the result fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .decoder import TOOL_CALL, DecodedOutput, Delta, ToolCall
from .plan import OutputPlan, ReasoningBudget


@dataclass
class StreamResult:
    """Final fields of a turn: ``finish_reason`` (``tool_calls`` replaces ``stop`` when the turn ended in
    calls), ``reasoning`` (None without a thinking stage), ``content``, completed ``tool_calls``, ``branch``."""

    finish_reason: str
    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    branch: str = "undecided"


class OutputStream:
    """Decoding state of one request (engine worker thread only).

    Args:
        plan: the request's output plan.
        token_bytes: raw bytes per token id (``[V_tokenizer]``); control ids outside ``skip_ids``
            are never part of the output text.
        skip_ids: ids that produce no text (EOS, control tokens).
        encode: the model tokenizer's ``encode(text) -> ids`` with added-token parsing (for the close).
    """

    def __init__(self, plan: OutputPlan, token_bytes: Sequence[bytes], skip_ids: frozenset[int],
                 encode: Callable[[str], list[int]]) -> None:
        self.plan = plan
        self.decoder = plan.new_decoder()
        self._bytes = token_bytes
        self._skip = skip_ids
        self._encode = encode
        self.budget = ReasoningBudget(plan.budget_tokens) if plan.thinking and plan.budget_tokens > 0 else None
        self.num_forced_tokens = 0

    @property
    def in_reasoning(self) -> bool:
        return self.decoder.stage == "reasoning"

    def commit(self, token_ids: Sequence[int], forced: bool = False) -> list[Delta]:
        """Decodes one committed step.

        Args:
            token_ids: the step's committed ids in order (EOS last when sampled).
            forced: the ids are an injected close (counted in :attr:`num_forced_tokens`).
        Returns:
            The step's deltas.
        Raises:
            DecodeIntegrityError: a constrained call completed but does not decode.
        """
        data = b"".join(self._bytes[i] for i in token_ids if i not in self._skip and 0 <= i < len(self._bytes))
        was_reasoning = self.in_reasoning
        out = self.decoder.feed(data)
        if forced:
            self.num_forced_tokens += len(token_ids)
        if self.budget is not None and was_reasoning:
            self.budget.on_commit(len(token_ids), self.in_reasoning)
        return out

    def forced_close(self) -> list[int] | None:
        """The close's token ids when the reasoning budget is spent and the reasoning is still open, else
        None. The ids spell the canonical close exactly; the budget is then done.

        While the reasoning's bytes end inside a UTF-8 character (a byte-level token split a multi-byte
        character at the budget) the close waits: its first byte cannot continue the character, so the
        grammar would reject it (an integrity error that failed the request). The next sampled tokens
        finish the character (a constrained reasoning allows nothing else), and the close lands at the
        first character boundary after the budget."""
        if self.budget is None or not self.in_reasoning or not self.budget.must_close():
            return None
        if self.decoder.mid_character:
            return None
        self.budget.closed()
        assert self.plan.rules.thinking is not None
        return list(self._encode(self.plan.rules.thinking.close))

    def reasoning_budget_left(self) -> int | None:
        """Tokens the next step may still spend inside the reasoning (None = no budget); the engine caps
        a reasoning row's drafts with it so a forced close lands exactly at the budget."""
        if self.budget is None or not self.in_reasoning:
            return None
        return self.budget.remaining()

    def finish(self, finish_reason: str) -> tuple[list[Delta], StreamResult]:
        """Flushes and returns the last deltas and the :class:`StreamResult` (truncation keeps completed
        calls; ``stop`` after calls becomes ``tool_calls``)."""
        out, res = self.decoder.finish()
        reason = finish_reason
        if reason == "stop" and res.tool_calls:
            reason = "tool_calls"
        return out, _result(reason, res)


def _result(reason: str, res: DecodedOutput) -> StreamResult:
    return StreamResult(finish_reason=reason, reasoning=res.reasoning, content=res.content,
                        tool_calls=list(res.tool_calls), branch=res.branch)


__all__ = ["OutputStream", "StreamResult", "TOOL_CALL"]
