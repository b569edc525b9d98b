"""Chat templates: the model's Jinja template rendered like Hugging Face does.

Sandboxed environment with ``trim_blocks``/``lstrip_blocks``, the
``raise_exception`` global, a ``tojson`` filter that keeps non-ASCII, and
``strftime_now`` — the same surface as ``transformers``' ``apply_chat_template``.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: Used when a model has no template: ChatML (what SmolLM2/Qwen use).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template raised (``raise_exception``) or failed to render; ``str()`` says why."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference.

    Attributes:
        source: the Jinja source.
        bos_token, eos_token: spellings passed to the template as variables.
    """

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML_TEMPLATE
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = _compile(self.source)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render a conversation to the prompt text.

        Args:
            messages: ``[{"role": "system"|"user"|"assistant", "content": str}, …]``.
            add_generation_prompt: append the assistant header so the model answers.
            kwargs: extra template variables (``tools``, ``documents``, …).

        Raises:
            ChatTemplateError: the template rejected the conversation or failed.
        """
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, KeyError, AttributeError) as e:
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e

    __call__ = render


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                template: str | ChatTemplate | None = None, **kwargs: Any) -> str:
    """Render ``messages`` with ``template`` (source or :class:`ChatTemplate`; ``None`` = ChatML).

    Raises:
        ChatTemplateError: see :meth:`ChatTemplate.render`.
    """
    t = template if isinstance(template, ChatTemplate) else ChatTemplate(template)
    return t.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
