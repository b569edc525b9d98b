"""The constraint kinds the sidecar knows: one :class:`KindEntry` per :class:`ConstraintKind`.

Seed 000 §正文约束 (the five kinds), §编译与缓存 (canonical forms, size caps),
§错误 (error kinds).  An entry says, for its kind:

* ``canonicalise`` -- validate the request's fields and return the canonical
  text that goes into the cache key, the value the converter compiles, and the
  source size in bytes (for compile admission).  JSON sources keep property
  order (parsed with ``object_pairs_hook``, numbers kept as written,
  re-serialised compactly -- never sorted); choice lists are de-duplicated and
  sorted.
* ``to_grammar`` -- the converter: canonical value -> the backend's grammar
  (the kind's own module emits EBNF text that :meth:`Backend.parse_ebnf`
  parses; ``grammar`` goes through ``gbnf.parse_gbnf``).
* ``error_kind`` -- the :class:`~ninfer_common.errors.ErrorKind` of a malformed
  source of this kind (oversized, unparsable, rejected by the backend, or an
  unexpected exception while converting it).
* ``compile_options`` -- how the kind is compiled; part of the cache key.

Adding a kind: a member of :class:`~ninfer_common.constraint_kind.ConstraintKind`,
its converter module, its entry in :data:`REGISTRY`, and the public proto's
``oneof`` field (``proto/ninfer/v1/generation.proto``).  The compile cache
(``compiler.py``) knows no kind.

Source size caps: :data:`MAX_SOURCE_BYTES` (1 MiB, the public server's cap)
for grammar/regex/schema text and for the total bytes of a choice list,
:data:`MAX_CHOICE_OPTION_BYTES` per choice option.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

from ninfer_common.errors import ErrorKind

from .backend.base import Backend, Grammar
from .choice import choice_to_ebnf, normalize_choices
from .errors import ConstraintError
from .json_object import JSON_OBJECT_MAX_WS, json_object_ebnf
from .types import ConstraintKind, ConstraintSpec

__all__ = ["Canonical", "KindEntry", "MAX_CHOICE_OPTION_BYTES", "MAX_SOURCE_BYTES", "REGISTRY",
           "canonical_json", "kind_entry", "user_input_error"]

#: Largest grammar / regex / schema source and largest total choice list, UTF-8 bytes.
MAX_SOURCE_BYTES = 1 << 20
#: Largest single choice option, UTF-8 bytes.
MAX_CHOICE_OPTION_BYTES = 64 << 10


class Canonical(NamedTuple):
    """A validated, canonicalised constraint.

    Attributes:
        text: the canonical source text in the cache key.
        value: what the kind's converter compiles (the text, or a tuple of choice options).
        size: source size in UTF-8 bytes (compile admission, ``compiler.SMALL_SOURCE_BYTES``).
    """

    text: str
    value: Any
    size: int


@dataclass(frozen=True)
class KindEntry:
    """Everything kind-specific about one constraint kind (see the module docstring).

    Attributes:
        kind: the kind.
        error_kind: the ``ConstraintError`` kind of a malformed source of this kind.
        compile_options: compile settings, part of the cache key.
        canonicalise: ``spec -> Canonical``; raises ``ConstraintError`` (``error_kind``)
            for bad content and ``ValueError`` for fields that do not belong to the kind.
        to_grammar: ``(backend, Canonical.value) -> grammar``; raises ``ConstraintError``.
        name: ``kind.value``, the kind's spelling in the cache key.
    """

    kind: ConstraintKind
    error_kind: ErrorKind
    compile_options: tuple[str, ...]
    canonicalise: Callable[[ConstraintSpec], Canonical]
    to_grammar: Callable[[Backend, Any], Grammar]
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.kind.value)


def user_input_error(kind: ConstraintKind, exc: BaseException) -> ConstraintError:
    """Map an unexpected exception raised while handling user input to a request error.

    ``RecursionError`` (e.g. a regex nested 300 deep) -> "nesting too deep",
    ``MemoryError`` -> "too large", anything else -> "could not process"; the
    error kind is the kind's ``error_kind``, location ``""``.
    """
    ek = REGISTRY[kind].error_kind if kind in REGISTRY else ErrorKind.INVALID_GRAMMAR
    if isinstance(exc, RecursionError):
        return ConstraintError(ek, f"nesting too deep (the {kind} source exceeds the supported nesting depth)", "")
    if isinstance(exc, MemoryError):
        return ConstraintError(ek, f"the {kind} source is too large to process", "")
    return ConstraintError(ek, f"could not process the {kind} source ({type(exc).__name__}: {exc})", "")


# -- canonical JSON (json_schema) ---------------------------------------------------

class _RawNumber(str):
    """A JSON number kept exactly as written."""


class _Pairs(list):
    """A JSON object as its ordered (key, value) pairs (duplicates kept)."""


def _dump_canonical(value) -> str:
    if isinstance(value, _RawNumber):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, _Pairs):
        return "{" + ",".join(
            json.dumps(k, ensure_ascii=False) + ":" + _dump_canonical(v) for k, v in value
        ) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump_canonical(v) for v in value) + "]"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    raise TypeError(type(value))  # pragma: no cover


def canonical_json(text: str) -> str:
    """Compact, order-preserving re-serialisation of JSON text.

    Property order and duplicate keys are kept, numbers are kept as written,
    strings are re-escaped canonically, insignificant whitespace is dropped.

    Raises:
        ConstraintError: ``InvalidSchema`` (location ``""``) if ``text`` is not JSON.
    """
    try:
        value = json.loads(
            text,
            object_pairs_hook=_Pairs,
            parse_float=_RawNumber,
            parse_int=_RawNumber,
            parse_constant=lambda s: (_ for _ in ()).throw(ValueError(f"{s} is not JSON")),
        )
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {exc.lineno}, column {exc.colno})" if line else ""
        msg = getattr(exc, "msg", str(exc))
        raise ConstraintError("InvalidSchema", f"schema is not valid JSON: {msg}{where}", "") from None
    return _dump_canonical(value)


# -- canonicalisers -------------------------------------------------------------------

def _text_size(spec: ConstraintSpec) -> int:
    """Checks shared by the text kinds: no ``choices``, source within :data:`MAX_SOURCE_BYTES`."""
    kind = spec.kind
    if spec.choices:
        raise ValueError(f"{kind} constraints take no `choices`")
    size = len(spec.source.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise ConstraintError(
            REGISTRY[kind].error_kind,
            f"the {kind} source is {size} bytes; at most {MAX_SOURCE_BYTES} bytes",
        )
    return size


def _canon_text(spec: ConstraintSpec) -> Canonical:
    """grammar / regex: the source as written."""
    return Canonical(spec.source, spec.source, _text_size(spec))


def _canon_json_object(spec: ConstraintSpec) -> Canonical:
    size = _text_size(spec)
    if spec.source:
        raise ValueError("json_object takes no source")
    return Canonical("", "", size)


def _canon_json_schema(spec: ConstraintSpec) -> Canonical:
    size = _text_size(spec)
    try:
        text = canonical_json(spec.source)
    except ConstraintError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on [[[[...]]]]
        raise user_input_error(spec.kind, exc) from None
    return Canonical(text, text, size)


def _canon_choice(spec: ConstraintSpec) -> Canonical:
    if spec.source:
        raise ValueError("choice constraints carry options in `choices`, not `source`")
    options = normalize_choices(spec.choices)
    size = 0
    for option in options:
        n = len(option.encode("utf-8"))
        if n > MAX_CHOICE_OPTION_BYTES:
            raise ConstraintError(
                "InvalidChoice",
                f"choice option is {n} bytes; at most {MAX_CHOICE_OPTION_BYTES} bytes per option",
            )
        size += n
    if size > MAX_SOURCE_BYTES:
        raise ConstraintError(
            "InvalidChoice",
            f"choice options total {size} bytes; at most {MAX_SOURCE_BYTES} bytes in all",
        )
    return Canonical(json.dumps(list(options), ensure_ascii=False), options, size)


# -- converters (canonical value -> backend grammar) ------------------------------------

def _json_object_grammar(backend: Backend, _value: str) -> Grammar:
    return backend.parse_ebnf(json_object_ebnf())


def _json_schema_grammar(backend: Backend, schema_text: str) -> Grammar:
    """JSON Schema -> EBNF through our schema contract (``constraint_service.json_schema``).

    Raises:
        ConstraintError: ``InvalidSchema`` / ``UnsupportedSchema`` / ``UnsatisfiableSchema`` with a JSON Pointer.
    """
    from .json_schema import json_schema_to_ebnf

    return backend.parse_ebnf(json_schema_to_ebnf(schema_text), kind="InvalidSchema")


def _gbnf_grammar(backend: Backend, source: str) -> Grammar:
    """A user's GBNF (``constraint_service.gbnf``; its checks walk xgrammar's parsed grammar,
    so a second backend would bring its own GBNF parse here).

    Raises:
        ConstraintError: ``InvalidGrammar`` / ``InvalidTokenReference`` with ``line:col``.
    """
    from .gbnf import parse_gbnf

    return parse_gbnf(source, backend.vocab)


def _regex_grammar(backend: Backend, regex: str) -> Grammar:
    """Full-match ECMAScript-subset regex -> EBNF (``constraint_service.regex``).

    Raises:
        ConstraintError: ``InvalidRegex`` with ``line:col``.
    """
    from .regex import regex_to_ebnf

    return backend.parse_ebnf(regex_to_ebnf(regex), kind="InvalidRegex")


def _choice_grammar(backend: Backend, options: tuple[str, ...]) -> Grammar:
    return backend.parse_ebnf(choice_to_ebnf(options), kind="InvalidChoice")


# -- the registry -----------------------------------------------------------------------

_ENTRIES: dict[ConstraintKind, KindEntry] = {
    e.kind: e for e in (
        KindEntry(ConstraintKind.JSON_OBJECT, ErrorKind.INVALID_GRAMMAR, (f"max_ws={JSON_OBJECT_MAX_WS}",),
                  _canon_json_object, _json_object_grammar),
        KindEntry(ConstraintKind.JSON_SCHEMA, ErrorKind.INVALID_SCHEMA, ("separators=,:", "declared-order"),
                  _canon_json_schema, _json_schema_grammar),
        KindEntry(ConstraintKind.GRAMMAR, ErrorKind.INVALID_GRAMMAR, (), _canon_text, _gbnf_grammar),
        KindEntry(ConstraintKind.REGEX, ErrorKind.INVALID_REGEX, ("fullmatch",), _canon_text, _regex_grammar),
        KindEntry(ConstraintKind.CHOICE, ErrorKind.INVALID_CHOICE, (), _canon_choice, _choice_grammar),
    )
}
#: One entry per :class:`ConstraintKind` (read-only).
REGISTRY: Mapping[ConstraintKind, KindEntry] = MappingProxyType(_ENTRIES)


def kind_entry(kind: ConstraintKind | str) -> KindEntry:
    """The registry entry of ``kind`` (a member or its wire spelling).

    Raises:
        ValueError: not a constraint kind.
    """
    entry = _ENTRIES.get(kind)  # a StrEnum member and its spelling hash alike
    return entry if entry is not None else REGISTRY[ConstraintKind.parse(kind)]
