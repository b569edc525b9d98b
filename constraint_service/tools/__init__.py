"""Tool-call and thinking grammars (seed 000 §工具与 ToolChoice, §thinking): the strict tool contract and
the grammar builder. Rules come from :mod:`ninfer_common.frontends` (shared with the engine's decoder)."""
from .contract import StrictTool, reduce_tool
from .grammar import build_from_spec, build_output_ebnf, excluding, policy_from_spec, thinking_prefix_ebnf

__all__ = ["StrictTool", "build_from_spec", "build_output_ebnf", "policy_from_spec", "excluding", "reduce_tool", "thinking_prefix_ebnf"]
