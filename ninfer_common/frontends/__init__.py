"""Model frontends as data: output rules per family, the ToolChoice contract and the output decoder.

Imported by the engine (prompt rendering, decoding, forced thinking close) and by the constraint
sidecar (tool/thinking grammar), so both sides read one set of rules (seed 000 §模型 Frontend).
"""
from .decoder import CONTENT, REASONING, TOOL_CALL, DecodedOutput, Delta, OutputDecoder, ToolCall
from .errors import DecodeIntegrityError, FrontendError
from .rules import CANONICAL_THINK_CLOSE, FAMILIES, QWEN3, QWEN3_5, SMOLLM2, OutputRules, ThinkingRules, ToolCallFormat, rules_for
from .tools import ToolChoice, ToolDef, ToolPolicy, param_encodings, parse_tools, resolve_policy, tool_pointer

__all__ = [
    "CANONICAL_THINK_CLOSE", "CONTENT", "DecodeIntegrityError", "DecodedOutput", "Delta", "FAMILIES",
    "FrontendError", "OutputDecoder", "OutputRules", "QWEN3", "QWEN3_5", "REASONING", "SMOLLM2", "TOOL_CALL",
    "ThinkingRules", "ToolCall", "ToolCallFormat", "ToolChoice", "ToolDef", "ToolPolicy", "param_encodings",
    "parse_tools", "resolve_policy", "rules_for", "tool_pointer",
]
