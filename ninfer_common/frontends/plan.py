"""Transport-free output plan of one generation request (seed 000 §准备, §thinking, §工具).

:func:`plan_output` validates the tool / thinking / body combination of a request against its model
family's rules before queueing and returns the :class:`OutputPlan` both sides work from: the engine
renders the prompt and decodes with it; the sidecar builds the grammar from the same plan
(:meth:`OutputPlan.grammar_spec`). :class:`ReasoningBudget` decides when the canonical close is forced.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from .decoder import OutputDecoder
from .errors import FrontendError
from .rules import OutputRules
from .tools import ToolChoice, ToolDef, ToolPolicy, resolve_policy


@dataclass(frozen=True)
class ThinkingRequest:
    """``enabled`` None = the family's default; ``budget_tokens`` 0 = no reasoning budget."""

    enabled: bool | None = None
    budget_tokens: int = 0


@dataclass(frozen=True)
class OutputPlan:
    """What one chat turn may output and how it is read.

    Attributes:
        rules: the family's output rules.
        policy: the resolved tool policy.
        thinking: the output starts inside the reasoning.
        budget_tokens: reasoning token budget (0 = none).
        body_kind, body_source: the body constraint (kind name and source text) or None.
    """

    rules: OutputRules
    policy: ToolPolicy
    thinking: bool = False
    budget_tokens: int = 0
    body_kind: str | None = None
    body_source: str | None = None

    @property
    def wrapped(self) -> bool:
        """The output language is more than the bare body: a thinking stage or an enforced tool part."""
        return self.thinking or (bool(self.policy.tools) and self.policy.constrained)

    @property
    def constrained(self) -> bool:
        """A grammar applies (wrapper or body); else the output is free and decoded leniently."""
        return self.wrapped or self.body_kind is not None

    def new_decoder(self) -> OutputDecoder:
        """A fresh decoder for this plan (one per request)."""
        return OutputDecoder(self.rules, self.policy, thinking=self.thinking,
                             body_constrained=self.body_kind is not None, constrained=self.constrained)

    def grammar_spec(self) -> dict:
        """The wrapper facts the sidecar needs, as plain JSON-able data (also the wrapper part of the
        compile-cache key: family, thinking, callable tools with strict schemas, call bounds, body kind).
        The body source travels as the ordinary constraint; non-strict tools contribute only names."""
        p = self.policy
        return {
            "family": self.rules.family,
            "thinking": self.thinking,
            "tools": [{"name": t.name, "strict": t.strict, "index": t.index,
                       "parameters": t.parameters if t.strict else None} for t in p.callable],
            "declared": len(p.tools),
            "min_calls": p.min_calls,
            "max_calls": p.max_calls,
            "content_allowed": p.content_allowed,
            "constrained": p.constrained,
            "body_kind": self.body_kind,
        }

    def grammar_key(self) -> str:
        """Canonical text of :meth:`grammar_spec` (declared key order kept inside schemas)."""
        return json.dumps(self.grammar_spec(), ensure_ascii=False, separators=(",", ":"))


def plan_output(rules: OutputRules, tools: Sequence[ToolDef], choice: ToolChoice | None,
                thinking: ThinkingRequest | None, body_kind: str | None = None, body_source: str | None = None,
                *, is_chat: bool = True, continue_final: bool = False) -> OutputPlan:
    """Validates and resolves a request's output plan (before queueing).

    Raises:
        FrontendError: InvalidRequest for tools / thinking on a raw prompt, thinking on a family
            without a thinking stage (message names the model), a budget without thinking, thinking
            on with a continued final assistant message (seed: continuation keeps thinking closed),
            and every error of :func:`~ninfer_common.frontends.tools.resolve_policy`.
    """
    thinking = thinking or ThinkingRequest()
    if not is_chat:
        if tools or choice is not None:
            raise FrontendError("InvalidRequest", "tools need chat input (a raw prompt has no tool declarations)", "/tools")
        if thinking.enabled or thinking.budget_tokens:
            raise FrontendError("InvalidRequest", "thinking needs chat input", "/thinking")
        return OutputPlan(rules, ToolPolicy(body_kind=body_kind), False, 0, body_kind, body_source)
    if thinking.budget_tokens < 0:
        raise FrontendError("InvalidRequest", f"thinking budget must be >= 0, got {thinking.budget_tokens}",
                            "/thinking/budget_tokens")
    if rules.thinking is None:
        if thinking.enabled or thinking.budget_tokens:
            raise FrontendError("InvalidRequest", f"{rules.display_name} has no thinking stage; thinking cannot be "
                                "enabled for this model", "/thinking")
        on = False
    elif continue_final:
        if thinking.enabled:
            raise FrontendError("InvalidRequest", "continuing a final assistant message needs thinking off "
                                "(the continued text is content after a closed reasoning)", "/thinking/enabled")
        on = False
    else:
        on = rules.thinking.default_enabled if thinking.enabled is None else thinking.enabled
    if thinking.budget_tokens and not on:
        raise FrontendError("InvalidRequest", "a thinking budget needs thinking on", "/thinking/budget_tokens")
    policy = resolve_policy(tools, choice, body_kind)
    return OutputPlan(rules, policy, on, thinking.budget_tokens, body_kind, body_source)


class ReasoningBudget:
    """Counts committed reasoning tokens and says when to force the canonical close.

    Args:
        budget_tokens: maximum generated tokens in the reasoning (> 0).

    Usage: after each committed step, ``on_commit(n, still_reasoning)``; when :meth:`must_close` is
    true the engine injects the close's token ids through the matcher's preview/commit (no sampling,
    no RNG, counted in ``max_tokens``) and calls :meth:`closed`.
    """

    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens <= 0:
            raise ValueError("budget_tokens must be > 0")
        self.budget_tokens = budget_tokens
        self.used = 0
        self.done = False

    def on_commit(self, num_tokens: int, still_reasoning: bool) -> None:
        """Adds ``num_tokens`` committed tokens; a step that left the reasoning ends the budget."""
        if self.done:
            return
        self.used += num_tokens
        if not still_reasoning:
            self.done = True

    def remaining(self) -> int:
        """Tokens the next step may still spend inside the reasoning (caps speculative drafts)."""
        return 0 if self.done else max(0, self.budget_tokens - self.used)

    def must_close(self) -> bool:
        return not self.done and self.used >= self.budget_tokens

    def closed(self) -> None:
        self.done = True
