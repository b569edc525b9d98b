"""Model frontends: the prompt and chat rendering of the served model (chat template, tokenization).

Per-model-family frontends (reasoning, tool calls) go here, next to :mod:`~gpu_engine.frontend.prompt`.
"""
from gpu_engine.frontend.prompt import CHAT_ROLES, Frontend, validate_messages

__all__ = ["CHAT_ROLES", "Frontend", "validate_messages"]
