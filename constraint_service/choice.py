"""Finite string choice (seed 000 §Choice).

Options are matched byte-exactly (case, whitespace, Unicode preserved).  The
list must be non-empty; the empty string is a legal option; duplicates are
removed and order does not matter (the cache key is the sorted set).  A short
option that prefixes a longer one leaves both EOS and continuation legal --
that follows from the language being the plain union of literals.
"""

from __future__ import annotations

from typing import Sequence

from .errors import ConstraintError

__all__ = ["choice_to_ebnf", "ebnf_literal", "normalize_choices"]

_SIMPLE_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def normalize_choices(choices: Sequence[str]) -> tuple[str, ...]:
    """Validate and canonicalise options: de-duplicated, sorted by code points.

    Raises:
        ConstraintError: ``InvalidChoice`` for an empty list, a non-string
            option, or an option that is not valid Unicode text (lone surrogate).
    """
    if isinstance(choices, (str, bytes)) or not choices:
        raise ConstraintError("InvalidChoice", "choice needs a non-empty list of strings (got an empty list)")
    for idx, option in enumerate(choices):
        if not isinstance(option, str):
            raise ConstraintError("InvalidChoice", f"option {idx} is {type(option).__name__}, expected a string")
        try:
            option.encode("utf-8")
        except UnicodeEncodeError:
            raise ConstraintError(
                "InvalidChoice", f"option {idx} is not valid Unicode text (lone surrogate)"
            ) from None
    return tuple(sorted(set(choices)))


def ebnf_literal(text: str) -> str:
    """An xgrammar EBNF sequence matching exactly the UTF-8 bytes of ``text``.

    Quotes, backslashes and control characters are escaped; other characters
    (any Unicode) are written as themselves.  NUL is emitted as the class
    ``[\\x00]`` because xgrammar 0.2.9 truncates string literals at NUL.
    Returns ``'""'`` for the empty string.
    """
    parts: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch == "\x00":
            if buf:
                parts.append('"' + "".join(buf) + '"')
                buf = []
            parts.append("[\\x00]")
            continue
        esc = _SIMPLE_ESCAPES.get(ch)
        if esc is None and (ord(ch) < 0x20 or ord(ch) == 0x7F):
            esc = f"\\x{ord(ch):02x}"
        buf.append(esc if esc is not None else ch)
    if buf or not parts:
        parts.append('"' + "".join(buf) + '"')
    return " ".join(parts)


def choice_to_ebnf(options: Sequence[str]) -> str:
    """EBNF (entry rule ``root``) for the union of ``options`` (already normalised)."""
    alts = [f"({ebnf_literal(o)})" for o in options]
    return "root ::= " + " | ".join(alts) + "\n"
