"""Chat turns with tools and/or a thinking stage: prompt + output plan (seed 000 §模型 Frontend, §准备).

:class:`ChatOutputFrontend` binds a model's tokenizer, its own chat template and its family's
:class:`~ninfer_common.frontends.OutputRules`. :meth:`ChatOutputFrontend.prepare` validates the turn's
tools / tool_choice / thinking / body combination, renders the prompt (declarations in the prompt, the
output's start stage at its end) and returns the :class:`~ninfer_common.frontends.plan.OutputPlan` the
engine decodes with and whose ``grammar_key()`` the sidecar compiles around the body constraint.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from ninfer_common.errors import RequestError
from ninfer_common.frontends import QWEN3, QWEN3_5, SMOLLM2, OutputRules, ToolChoice, ToolDef
from ninfer_common.frontends.plan import OutputPlan, ThinkingRequest, plan_output
from ninfer_common.frontends.stream import OutputStream

from .families import FamilyChat
from .prompt import Frontend
from .template import ChatTemplate


def family_rules(arch: str, template_source: str) -> OutputRules:
    """The output rules of a served model: Qwen3 architecture -> Qwen3 (Qwen3.5/3.6 when its template
    writes ``<function=`` calls); other chat models -> SmolLM2's (no thinking stage, tools in the system
    prompt, JSON calls in ``<tool_call>``)."""
    if arch == "qwen3":
        return QWEN3_5 if "<function=" in (template_source or "") else QWEN3
    return SMOLLM2


class ChatOutputFrontend:
    """Prompt rendering + output planning of one served model.

    Args:
        frontend: the model's :class:`Frontend` (tokenizer; contents are tokenized as plain text).
        rules: the family's output rules.
        template: the model's chat template.
    """

    def __init__(self, frontend: Frontend, rules: OutputRules, template: ChatTemplate) -> None:
        self.frontend = frontend
        self.rules = rules
        self.chat = FamilyChat(rules, template)
        vocab = frontend.tokenizer.vocab
        self._control = sorted({vocab.token_bytes[i].decode("utf-8", "replace") for i in vocab.special_ids
                                if i < len(vocab.token_bytes) and vocab.token_bytes[i]}, key=len, reverse=True)

    def needs_plan(self, tools: Sequence[ToolDef], choice: ToolChoice | None, thinking: ThinkingRequest,
                   messages: Sequence[dict]) -> bool:
        """The turn leaves the plain path: tools, a choice, a thinking request, tool turns, or a family
        whose default has a thinking stage."""
        return bool(tools) or choice is not None or thinking != ThinkingRequest() or self.rules.thinking is not None \
            or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)

    def _check_text(self, text: str, where: str) -> None:
        for sp in self._control:
            if sp and sp in text:
                raise RequestError("InvalidRequest", f"{where} contains the control token {sp!r}, which the chat "
                                   "template would turn into a control token", where)

    def prepare(self, messages: list[dict[str, Any]], tools: Sequence[ToolDef], choice: ToolChoice | None,
                thinking: ThinkingRequest, body_kind: str | None, body_source: str | None,
                continue_final: bool = False) -> tuple[list[int], OutputPlan]:
        """Prompt token ids and the output plan of a chat turn.

        Raises:
            RequestError: every plan rejection (FrontendError, located), a control-token spelling inside a
                tool declaration or a past call (they are rendered as template text), template failures.
        """
        plan = plan_output(self.rules, tools, choice, thinking, body_kind, body_source, is_chat=True,
                           continue_final=continue_final)
        for t in tools:
            self._check_text(json.dumps(t.to_openai(), ensure_ascii=False), f"/tools/{t.index}/function")
        for i, m in enumerate(messages):
            for j, c in enumerate(m.get("tool_calls") or ()):
                self._check_text(c["name"] + str(c["arguments"]), f"/chat/messages/{i}/tool_calls/{j}")

        def render(msgs: list[dict[str, Any]], add_generation_prompt: bool) -> str:
            return self.chat.render(msgs, plan.policy.tools, thinking=plan.thinking,
                                    add_generation_prompt=add_generation_prompt)

        ids = Frontend(self.frontend.tokenizer, render).encode_chat(messages, continue_final=continue_final)
        return ids, plan

    def new_stream(self, plan: OutputPlan) -> OutputStream:
        """The request's :class:`OutputStream` (decoder + forced-close budget)."""
        tok = self.frontend.tokenizer
        vocab = tok.vocab
        return OutputStream(plan, vocab.token_bytes, vocab.special_ids | frozenset(vocab.eos_ids),
                            lambda text: tok.encode(text, parse_special=True))
