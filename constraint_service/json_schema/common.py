"""Constants and JSON Pointer helpers shared by the schema reducer (reduce.py) and its mixins."""
from __future__ import annotations

MAX_DEPENDENCIES = 6      # dependencies expand to 2^k object alternatives
MAX_MERGES = 16_384
MAX_VALUE_DEPTH = 256
MAX_COMPLEMENT_DEPTH = 8   # `not` / oneOf / if: nesting of complemented object properties
DEFAULT_BASE = "https://ninfer.invalid/schema.json"
# where subschemas (and so identifiers) live: keyword -> {name: schema}, [schema], or one schema
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
SCHEMA_ONE = {"additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contentSchema"}
ALL_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def _regex_literal(text: str) -> str:
    """ECMAScript pattern matching exactly `text` (syntax characters escaped)."""
    return "".join("\\" + c if c in "^$\\.*+?()[]{}|/" else c for c in text)


def esc(tok: str) -> str:
    return tok.replace("~", "~0").replace("/", "~1")


def unesc(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")
