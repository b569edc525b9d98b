"""The constraint-kind registry and the backend seam (issue 9 item 4)."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

from conftest import VOCAB, W, allowed_ids, tok
from constraint_service.backend import Backend, Matcher, XGrammarBackend
from constraint_service.compiler import ConstraintCompiler
from constraint_service.errors import CONSTRAINT_ERROR_KINDS, ConstraintError
from constraint_service.registry import REGISTRY, kind_entry
from constraint_service.session import OutputSession
from constraint_service.types import CacheStatus, ConstraintKind, ConstraintSpec
from ninfer_common.errors import ErrorKind, RequestError, RowError

PKG = pathlib.Path(__file__).resolve().parents[2] / "constraint_service"


def test_one_entry_per_kind():
    assert set(REGISTRY) == set(ConstraintKind)
    for kind, entry in REGISTRY.items():
        assert entry.kind is kind
        assert entry.error_kind in CONSTRAINT_ERROR_KINDS
        assert kind_entry(kind.value) is entry
    with pytest.raises(TypeError):
        REGISTRY[ConstraintKind.REGEX] = REGISTRY[ConstraintKind.GRAMMAR]  # read-only


def test_kind_is_an_enum():
    spec = ConstraintSpec("regex", "a")
    assert spec.kind is ConstraintKind.REGEX and f"{spec.kind}" == "regex"
    assert ConstraintSpec(ConstraintKind.CHOICE, choices=("a",)).kind is ConstraintKind.CHOICE
    for bad in ("yaml", "Regex", ""):
        with pytest.raises(ValueError, match="expected one of"):
            ConstraintSpec(bad, "x")
        with pytest.raises(ValueError):
            kind_entry(bad)


def test_errors_are_in_the_project_hierarchy():
    with pytest.raises(ConstraintError) as ei:
        ConstraintCompiler(VOCAB).compile(ConstraintSpec("regex", "("))
    e = ei.value
    assert isinstance(e, RequestError) and e.kind is ErrorKind.INVALID_REGEX and e.location == "1:1"
    from constraint_service.errors import IntegrityError
    ie = IntegrityError("row 3: bad")
    assert isinstance(ie, RowError) and ie.kind is ErrorKind.INTEGRITY_ERROR and str(ie) == "row 3: bad"
    with pytest.raises(ValueError):
        ConstraintError("IntegrityError", "not a constraint error kind")


class RecordingBackend:
    """The real xgrammar backend, recording which Backend methods the compiler calls."""

    def __init__(self, vocab, *, fill_threads=1):
        self._inner = XGrammarBackend(vocab, fill_threads=fill_threads)
        self.calls: list[tuple] = []
        for name in ("vocab", "vocab_size", "num_words", "tail_mask", "eos_ids"):
            setattr(self, name, getattr(self._inner, name))

    def parse_ebnf(self, source, *, kind="InvalidGrammar"):
        self.calls.append(("parse_ebnf", str(kind)))
        return self._inner.parse_ebnf(source, kind=kind)

    def concat(self, grammars):
        self.calls.append(("concat", len(grammars)))
        return self._inner.concat(grammars)

    def grammar_to_text(self, grammar):
        self.calls.append(("grammar_to_text",))
        return self._inner.grammar_to_text(grammar)

    def grammar_from_text(self, text):
        self.calls.append(("grammar_from_text",))
        return self._inner.grammar_from_text(text)

    def compile(self, grammar, *, kind, key, error_kind="InvalidGrammar", threads=1):
        self.calls.append(("compile", kind, str(error_kind)))
        compiled = self._inner.compile(grammar, kind=kind, key=key, error_kind=error_kind, threads=threads)
        compiled.backend = self  # matchers come from this backend
        return compiled

    def new_matcher(self, compiled):
        self.calls.append(("new_matcher",))
        return self._inner.new_matcher(compiled)

    def batch_accept(self, matchers, tokens):
        self.calls.append(("batch_accept", len(matchers)))
        return self._inner.batch_accept(matchers, tokens)

    def batch_fill(self, matchers, bitmask, indices):
        self.calls.append(("batch_fill", len(matchers)))
        self._inner.batch_fill(matchers, bitmask, indices)


@pytest.mark.parametrize("spec,parse,error_kind", [
    (ConstraintSpec("json_object"), ("parse_ebnf", "InvalidGrammar"), "InvalidGrammar"),
    (ConstraintSpec("json_schema", '{"type":"integer"}'), ("parse_ebnf", "InvalidSchema"), "InvalidSchema"),
    (ConstraintSpec("grammar", 'root ::= "ab"'), None, "InvalidGrammar"),  # gbnf.parse_gbnf
    (ConstraintSpec("regex", "ab|ba"), ("parse_ebnf", "InvalidRegex"), "InvalidRegex"),
    (ConstraintSpec("choice", choices=("ab", "ba")), ("parse_ebnf", "InvalidChoice"), "InvalidChoice"),
])
def test_compiler_goes_through_the_entry_and_the_backend_seam(spec, parse, error_kind):
    comp = ConstraintCompiler(VOCAB, backend_factory=RecordingBackend)
    compiled, info = comp.compile(spec)
    backend = comp.backend
    assert isinstance(backend, RecordingBackend) and isinstance(backend, Backend)
    assert info.cache is CacheStatus.BUILT and compiled.kind is spec.kind
    # the compile, then the mask-cost probe's walk (constraint_service.mask_probe) on a matcher of the seam
    assert backend.calls == [c for c in (parse, ("compile", spec.kind, error_kind), ("new_matcher",)) if c]
    session = OutputSession(compiled)
    assert isinstance(session._matcher, Matcher)
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    session.fill_lookahead([], bm, st)
    assert bm.any() and backend.calls.count(("new_matcher",)) == 2
    assert comp.compile(spec)[1].cache is CacheStatus.HIT


def test_backend_compile_error_has_the_entry_error_kind():
    b = XGrammarBackend(VOCAB, fill_threads=1)
    grammar = b.parse_ebnf('root ::= [\\ud800-\\udfff]')
    with pytest.raises(ConstraintError) as ei:
        b.compile(grammar, kind=ConstraintKind.REGEX, key=("t",), error_kind=kind_entry("regex").error_kind)
    assert ei.value.kind == "InvalidRegex"
    assert isinstance(b, Backend)
    ab = b.concat([b.parse_ebnf('root ::= "a"'), b.parse_ebnf('root ::= "b" | ""')])
    m = b.new_matcher(b.compile(ab, kind="grammar", key=("t2",))._compiled)
    t = torch.zeros((1, W), dtype=torch.int32)
    m.fill_bitmask(t, 0)
    assert allowed_ids(t.numpy().view(np.uint32)[0]) == {tok(b"a"), tok(b"ab")}  # "a" then ("b" | "")
    assert m.accept_bytes(b"a") and m.is_completed()
    assert m.accept_bytes(b"b") and m.is_completed() and not m.accept_bytes(b"b")


def _imports(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_backend_imports_xgrammar():
    # gbnf.py walks xgrammar's parsed grammar for its checks (owned by the GBNF dialect work)
    allowed = {PKG / "backend" / "xgrammar_backend.py", PKG / "gbnf.py"}
    importers = {p for p in PKG.rglob("*.py") if "xgrammar" in _imports(p)}
    assert importers and importers <= allowed, sorted(str(p) for p in importers - allowed)
