"""Chat prompts per model family with tools and thinking (seed 000 §模型 Frontend; issue 10).

:class:`FamilyChat` renders a conversation with the model's OWN chat template (jinja2, the
``transformers`` surface of :mod:`gpu_engine.frontend.template`), passing ``tools=`` and ``enable_thinking=``
as ``apply_chat_template`` does, then fixes the start stage of the output from the family's
:class:`~ninfer_common.frontends.OutputRules`:

* thinking on: the prompt ends with the open string ``<think>\\n`` (appended when the template did not
  write it), so generation starts inside the reasoning and no text can precede it;
* thinking off (families with a thinking stage): the prompt ends with the empty reasoning block
  ``<think>\\n\\n</think>\\n\\n`` (the template's own form for ``enable_thinking=False``);
* SmolLM2: its GGUF template has no tool section, so the tool declarations go into the system prompt
  the way the model's published function-calling example does (:func:`render_tools_system_prompt`),
  past calls are rendered in the same ``<tool_call>`` wire format the grammar enforces, and tool
  results are ``tool`` turns.

``QWEN3_TEMPLATE`` and ``QWEN3_5_TEMPLATE`` are NInfer's renditions of the published Qwen3 and
Qwen3.5/3.6 templates' tool and thinking sections, for random-weight test models that carry no template
of their own; a real GGUF's ``tokenizer.chat_template`` always wins.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from ninfer_common.frontends import FrontendError, OutputRules, ToolDef

from .template import ChatTemplate

QWEN3_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + message.content }}
{%- for tool_call in message.tool_calls or [] %}
{%- if (loop.first and message.content) or not loop.first %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

QWEN3_5_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + message.content }}
{%- for tool_call in message.tool_calls or [] %}
{%- if (loop.first and message.content) or not loop.first %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
{%- for name, value in tool_call.arguments.items() %}
{{- '<parameter=' + name + '>\n' }}
{%- if value is string %}{{- value }}{%- else %}{{- value | tojson }}{%- endif %}
{{- '\n</parameter>\n' }}
{%- endfor %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- else %}{{- '<think>\n' }}{%- endif %}
{%- endif %}"""

#: SmolLM2's function-calling system prompt (its published example: the tool list in the system
#: prompt, calls as ``<tool_call>`` + JSON name/arguments); ``{tools}`` is the JSON list.
SMOLLM2_TOOLS_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out and refuse to answer.\n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>"
)


def render_tools_system_prompt(tools: Sequence[ToolDef], system: str | None = None) -> str:
    """SmolLM2: the system message text carrying the tool declarations (after the caller's own
    system text, if any)."""
    listing = json.dumps([t.to_openai()["function"] for t in tools], ensure_ascii=False)
    text = SMOLLM2_TOOLS_PROMPT.replace("{tools}", listing).replace("{{", "{").replace("}}", "}")
    return f"{system}\n\n{text}" if system else text


def _call_wire(rules: OutputRules, name: str, arguments: Any) -> str:
    fmt = rules.tools
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return fmt.call_open + fmt.json_name_prefix + name + fmt.json_args_infix + args + fmt.json_suffix + fmt.call_close


class FamilyChat:
    """Prompt rendering of one model family.

    Args:
        rules: the family's output rules.
        template: the model's chat template.
    """

    def __init__(self, rules: OutputRules, template: ChatTemplate) -> None:
        self.rules = rules
        self.template = template

    def thinking_enabled(self, requested: bool | None) -> bool:
        """The thinking state of a request (None = family default).

        Raises:
            FrontendError: InvalidRequest when thinking is asked of a family without a thinking stage
                (the message names the model).
        """
        if self.rules.thinking is None:
            if requested:
                raise FrontendError("InvalidRequest", f"{self.rules.display_name} has no thinking stage; "
                                    "thinking cannot be enabled for this model", "/thinking/enabled")
            return False
        return self.rules.thinking.default_enabled if requested is None else bool(requested)

    def render(self, messages: list[dict[str, Any]], tools: Sequence[ToolDef] = (), *, thinking: bool = False,
               add_generation_prompt: bool = True) -> str:
        """The prompt text: ``messages`` (``role`` system/user/assistant/tool, ``content``, optional
        ``tool_calls`` ``[{"name", "arguments"}]``) + declared ``tools``, ending in the output's start
        stage (see the module docstring).

        Raises:
            FrontendError: InvalidRequest for thinking on a family without it.
            gpu_engine.frontend.template.ChatTemplateError: the template failed.
        """
        msgs = [dict(m) for m in messages]
        if thinking and self.rules.thinking is None:
            self.thinking_enabled(True)
        kwargs: dict[str, Any] = {}
        if self.rules.tools_in_template:
            for m in msgs:
                if m.get("tool_calls"):
                    m["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": (
                        json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"])}}
                        for c in m["tool_calls"]]
            if tools:
                kwargs["tools"] = [t.to_openai() for t in tools]
        else:
            for m in msgs:
                if m.get("tool_calls"):
                    calls = self.rules.tools.separator.join(_call_wire(self.rules, c["name"], c["arguments"])
                                                            for c in m.pop("tool_calls"))
                    m["content"] = (m.get("content") or "") + ("\n" if m.get("content") else "") + calls
            if tools:
                if msgs and msgs[0]["role"] == "system":
                    msgs[0]["content"] = render_tools_system_prompt(tools, msgs[0]["content"])
                else:
                    msgs.insert(0, {"role": "system", "content": render_tools_system_prompt(tools)})
        if self.rules.thinking is not None:
            kwargs["enable_thinking"] = thinking
        text = self.template.render(msgs, add_generation_prompt=add_generation_prompt, **kwargs)
        th = self.rules.thinking
        if add_generation_prompt and th is not None:
            if thinking and not text.endswith(th.open):
                text += th.open
            elif not thinking and th.disabled_suffix and not text.endswith(th.disabled_suffix):
                text += th.disabled_suffix
        return text
