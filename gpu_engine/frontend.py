"""Frontend: prompt rendering and tokenization for the served model."""
from __future__ import annotations

from typing import Any

from .errors import RequestError


class Frontend:
    """Chat template + tokenizer of one model.

    Args:
        tokenizer: a :class:`gpu_engine.model.tokenizer.NInferTokenizer`.
        chat_renderer: callable ``(messages, add_generation_prompt) -> str`` or None
            when the model has no chat template.
    """

    def __init__(self, tokenizer: Any, chat_renderer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.chat_renderer = chat_renderer

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a raw prompt (BOS added when the model wants one)."""
        return self.tokenizer.encode(text, add_special=True)

    def encode_chat(self, messages: list[dict[str, str]], continue_final: bool = False) -> list[int]:
        """Token ids of a chat rendered with the model's template.

        With ``continue_final`` the last (assistant) message is left open: the
        conversation before it is rendered with a generation prompt and the
        assistant text is appended verbatim, so generation continues it.

        Raises:
            RequestError: the model has no chat template, or the template failed.
        """
        if self.chat_renderer is None:
            raise RequestError("InvalidRequest", "the served model has no chat template; send `prompt` instead")
        try:
            if continue_final:
                text = self.chat_renderer(messages[:-1], True) + messages[-1]["content"]
            else:
                text = self.chat_renderer(messages, True)
        except Exception as e:  # noqa: BLE001 - template errors are request errors
            raise RequestError("InvalidRequest", f"chat template failed: {e}") from None
        return self.tokenizer.encode(text, add_special=False)
