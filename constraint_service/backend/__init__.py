"""Grammar backends behind one narrow seam (STYLE "A narrow interface, one class per backend").

* :mod:`.base` -- the :class:`Backend` / :class:`Matcher` Protocols and the
  backend-neutral :class:`CompiledConstraint` (shared, reference-counted).
* :mod:`.xgrammar_backend` -- xgrammar, the one implementation
  (:class:`XGrammarBackend`, :class:`XGrammarMatcher`).

Only this package imports xgrammar (``gbnf.py`` aside, see its docstring).
"""

from __future__ import annotations

from .base import Backend, CompiledConstraint, Grammar, Matcher
from .xgrammar_backend import XGrammarBackend, XGrammarMatcher, exclude_surrogates, translate_xgrammar_error

__all__ = [
    "Backend",
    "CompiledConstraint",
    "Grammar",
    "Matcher",
    "XGrammarBackend",
    "XGrammarMatcher",
    "exclude_surrogates",
    "translate_xgrammar_error",
]
