"""Output rules of each model family, as plain data (seed 000 §模型 Frontend, §thinking, §工具).

One :class:`OutputRules` object per family is the single source of truth for
both the tool/thinking grammar (``constraint_service.tools``) and the output
decoder (:mod:`ninfer_common.frontends.decoder`): control strings, the
canonical reasoning close, the tool-call wire format and the separator
between calls. Nothing here imports torch or xgrammar.

Families:

* ``smollm2`` (SmolLM2-Instruct): no thinking stage; its GGUF chat template has
  no tool section, so tool declarations go into the system prompt the way its
  published function-calling example does, and calls are
  ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`` (plain text
  tags, not control tokens).
* ``qwen3`` (Qwen3, ChatML): ``<think>…</think>`` reasoning, JSON calls inside
  ``<tool_call>`` exactly as its chat template renders past calls.
* ``qwen3.5`` (Qwen3.5 / Qwen3.6): reasoning as Qwen3; XML calls
  ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n…</function>\\n</tool_call>``;
  a string parameter is a raw value, others are JSON text; the raw value may not
  contain the terminator ``\\n</parameter>``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: Canonical reasoning close (seed 000 §thinking: "受约束路线采用 Qwen 已有的 canonical reasoning close").
CANONICAL_THINK_CLOSE = "\n</think>\n\n"


@dataclass(frozen=True)
class ThinkingRules:
    """The reasoning stage of a family.

    Attributes:
        open: appended to the prompt after the assistant header when thinking is
            on, so generation starts inside the reasoning (no text can precede
            the reasoning tag).
        close: the canonical close; the grammar requires exactly this text and a
            forced close (thinking budget) injects it.
        close_tag: the tag that may not appear inside free reasoning (a second
            spelling of the close would split grammar and decoder).
        disabled_suffix: appended to the prompt when thinking is off (the
            template's own empty reasoning block), "" if none.
        default_enabled: thinking state when the request does not say.
    """

    open: str = "<think>\n"
    close: str = CANONICAL_THINK_CLOSE
    close_tag: str = "</think>"
    disabled_suffix: str = "<think>\n\n</think>\n\n"
    default_enabled: bool = True


@dataclass(frozen=True)
class ToolCallFormat:
    """Wire format of tool calls.

    Attributes:
        wire: ``"json"`` (``{"name": …, "arguments": {…}}``) or ``"xml"``
            (``<function=…><parameter=…>``).
        call_open, call_close: framing of one call.
        separator: text between two calls (seed: "调用间使用单个换行").
        json_name_prefix, json_args_infix, json_suffix: (json) the text around
            the name and the arguments object: ``prefix NAME infix ARGS suffix``.
        function_open, function_open_end, function_close: (xml)
            ``<function=`` NAME ``>\\n`` … ``</function>``.
        param_open, param_open_end, param_close: (xml) ``<parameter=`` ARG
            ``>\\n`` VALUE ``\\n</parameter>\\n``; ``param_close`` minus its final
            newline is the raw-value terminator.
    """

    wire: str = "json"
    call_open: str = "<tool_call>\n"
    call_close: str = "\n</tool_call>"
    separator: str = "\n"
    json_name_prefix: str = '{"name": "'
    json_args_infix: str = '", "arguments": '
    json_suffix: str = "}"
    function_open: str = "<function="
    function_open_end: str = ">\n"
    function_close: str = "</function>"
    param_open: str = "<parameter="
    param_open_end: str = ">\n"
    param_close: str = "\n</parameter>\n"

    @property
    def call_tag(self) -> str:
        """The text that starts a call (content may not contain it where calls are possible)."""
        return self.call_open.rstrip("\n")

    @property
    def raw_terminator(self) -> str:
        """(xml) the raw string terminator ``\\n</parameter>`` (excluded from raw values)."""
        return self.param_close[:-1] if self.param_close.endswith("\n") else self.param_close


@dataclass(frozen=True)
class OutputRules:
    """Everything a family says about its output.

    Attributes:
        family: ``"smollm2"``, ``"qwen3"`` or ``"qwen3.5"``.
        display_name: for error messages.
        thinking: the reasoning stage, or None (the family has none: a thinking
            request is ``InvalidRequest``).
        tools: the tool-call wire format.
        eos: EOS spellings (the engine resolves them to ids).
        tools_in_template: the model's chat template renders ``tools=`` itself;
            False = render the declarations into the system prompt
            (:func:`gpu_engine.frontend.families.render_tools_system_prompt`).
        tool_name_max_len: longest accepted tool name.
    """

    family: str
    display_name: str
    thinking: ThinkingRules | None
    tools: ToolCallFormat = field(default_factory=ToolCallFormat)
    eos: tuple[str, ...] = ("<|im_end|>",)
    tools_in_template: bool = True
    tool_name_max_len: int = 64


SMOLLM2 = OutputRules(family="smollm2", display_name="SmolLM2-Instruct", thinking=None,
                      eos=("<|im_end|>", "<|endoftext|>"), tools_in_template=False)
QWEN3 = OutputRules(family="qwen3", display_name="Qwen3", thinking=ThinkingRules(),
                    eos=("<|im_end|>", "<|endoftext|>"))
QWEN3_5 = OutputRules(family="qwen3.5", display_name="Qwen3.5/3.6", thinking=ThinkingRules(),
                      tools=ToolCallFormat(wire="xml"), eos=("<|im_end|>", "<|endoftext|>"))

FAMILIES: dict[str, OutputRules] = {r.family: r for r in (SMOLLM2, QWEN3, QWEN3_5)}


def rules_for(family: str) -> OutputRules:
    """The rules of a family name (``smollm2``, ``qwen3``, ``qwen3.5``; ``qwen3.6`` = ``qwen3.5``).

    Raises:
        KeyError: unknown family.
    """
    key = family.lower()
    if key == "qwen3.6":
        key = "qwen3.5"
    return FAMILIES[key]
