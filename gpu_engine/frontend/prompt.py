"""Frontend: prompt rendering and tokenization for the served model."""
from __future__ import annotations

from typing import Any

from ninfer_common.errors import RequestError

from gpu_engine.core.params import CHAT_ROLES



def validate_messages(messages: list[dict[str, str]]) -> None:
    """Raise :class:`RequestError` for an empty chat or an unknown role."""
    if not messages:
        raise RequestError("InvalidRequest", "chat has no messages")
    for m in messages:
        if m["role"] not in CHAT_ROLES:
            raise RequestError("InvalidRequest", f"unknown chat role {m['role']!r} (expected system, user, assistant or tool)")


class Frontend:
    """Chat template + tokenizer of one model.

    Message contents are tokenized as plain text: a user who writes the
    spelling of a control token (``<|im_end|>``) gets those characters, never
    the control token, so no turn can be forged from inside a message. Only the
    chat template's own markup becomes control tokens.

    Args:
        tokenizer: a :class:`gpu_engine.model.tokenizer.NInferTokenizer`.
        chat_renderer: callable ``(messages, add_generation_prompt) -> str`` or None
            when the model has no chat template.
    """

    def __init__(self, tokenizer: Any, chat_renderer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.chat_renderer = chat_renderer

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a raw prompt (BOS added when the model wants one).

        Raw prompts are the caller's full model input, so control-token spellings in
        them are parsed as control tokens (as in OpenAI-style completion APIs).
        """
        return self.tokenizer.encode(text, add_special=True)

    def _render(self, messages: list[dict[str, str]], continue_final: bool) -> str:
        if continue_final:
            return self.chat_renderer(messages[:-1], True) + messages[-1]["content"]
        return self.chat_renderer(messages, True)

    def encode_chat(self, messages: list[dict[str, str]], continue_final: bool = False) -> list[int]:
        """Token ids of a chat rendered with the model's template.

        The template is rendered with a private-use sentinel in place of each
        content; template text is tokenized with control tokens, contents as
        plain text. With ``continue_final`` the last (assistant) message is left
        open: the conversation before it is rendered with a generation prompt and
        the assistant text is appended verbatim, so generation continues it.

        Raises:
            RequestError: no chat template, the template failed, or the template
                rewrites message contents so they cannot be located (and a content
                holds a control-token spelling).
        """
        if self.chat_renderer is None:
            raise RequestError("InvalidRequest", "the served model has no chat template; send `prompt` instead")
        validate_messages(messages)
        sentinels = [f"\ue000{i}\ue001" for i in range(len(messages))]
        masked = [{**m, "content": s} for m, s in zip(messages, sentinels)]
        try:
            text = self._render(masked, continue_final)
        except Exception as e:  # noqa: BLE001 - template errors are request errors
            raise RequestError("InvalidRequest", f"chat template failed: {e}") from None
        tok = self.tokenizer
        ids: list[int] = []
        pos = 0
        for m, s in zip(messages, sentinels):
            j = text.find(s, pos)
            if j < 0 or text.count(s) != 1:
                return self._encode_chat_unmasked(messages, continue_final)
            ids += tok.encode(text[pos:j], add_special=False)
            ids += tok.encode(m["content"], add_special=False, parse_special=False)
            pos = j + len(s)
        ids += tok.encode(text[pos:], add_special=False)
        return ids

    def _encode_chat_unmasked(self, messages: list[dict[str, str]], continue_final: bool) -> list[int]:
        """Fallback for templates that transform contents: refuse control-token spellings in them."""
        vocab = self.tokenizer.vocab
        spellings = {vocab.token_bytes[i].decode("utf-8", "replace") for i in vocab.special_ids
                     if i < len(vocab.token_bytes) and vocab.token_bytes[i]}
        for m in messages:
            for sp in spellings:
                if sp and sp in m["content"]:
                    raise RequestError("InvalidRequest", f"message content contains the control token {sp!r}, which "
                                       "this model's chat template cannot carry as plain text")
        try:
            return self.tokenizer.encode(self._render(messages, continue_final), add_special=False)
        except Exception as e:  # noqa: BLE001
            raise RequestError("InvalidRequest", f"chat template failed: {e}") from None
