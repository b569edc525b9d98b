"""QA regressions: deep nesting, size caps, GBNF scalar values, empty languages (constraint sidecar)."""

from __future__ import annotations

import pytest

from conftest import VOCAB
from constraint_service.compiler import ConstraintCompiler
from constraint_service.registry import MAX_CHOICE_OPTION_BYTES
from constraint_service.errors import ConstraintError
from constraint_service.types import ConstraintSpec


@pytest.fixture()
def comp():
    return ConstraintCompiler(VOCAB)


def _err(comp, spec) -> ConstraintError:
    with pytest.raises(ConstraintError) as ei:
        comp.compile(spec)
    return ei.value


@pytest.mark.parametrize("spec,kind", [
    (ConstraintSpec("regex", "(" * 20000 + "a" + ")" * 20000), "InvalidRegex"),
    (ConstraintSpec("json_schema", '{"enum":[' + "[" * 50000 + "]" * 50000 + "]}"), "InvalidSchema"),
])
def test_deep_nesting_is_a_request_error(comp, spec, kind):
    e = _err(comp, spec)
    assert e.kind == kind
    assert "nesting too deep" in e.message
    # still serving
    assert comp.compile(ConstraintSpec("choice", choices=("yes", "no")))[1].cache == "built"


def test_regex_nested_300_deep_never_a_server_fault(comp):
    # compiles when the recursion limit allows it (json_schema raises it process-wide), else a request error
    try:
        comp.compile(ConstraintSpec("regex", "(" * 300 + "a" + ")" * 300))
    except ConstraintError as e:
        assert e.kind == "InvalidRegex" and "nesting too deep" in e.message


def test_choice_size_limits(comp):
    e = _err(comp, ConstraintSpec("choice", choices=("x" * (MAX_CHOICE_OPTION_BYTES + 1),)))
    assert e.kind == "InvalidChoice" and "per option" in e.message
    e = _err(comp, ConstraintSpec("choice", choices=tuple(f"{i:05d}" + "x" * 995 for i in range(4096))))
    assert e.kind == "InvalidChoice" and "in all" in e.message


def test_source_size_limit(comp):
    e = _err(comp, ConstraintSpec("grammar", 'root ::= "a"' + " " * (1 << 20)))
    assert e.kind == "InvalidGrammar" and "bytes" in e.message


@pytest.mark.parametrize("src,loc", [
    (r'root ::= "\ud800"', "1:11"),
    (r'root ::= [\ud800-\udfff]', "1:11"),
    ('root ::= "a"\n  | "\\U00110000"', "2:6"),
    (r'root ::= "ok" [a\uDFFF]', "1:17"),
])
def test_gbnf_rejects_non_scalar_code_points(comp, src, loc):
    e = _err(comp, ConstraintSpec("grammar", src))
    assert e.kind == "InvalidGrammar" and e.location == loc
    assert "Unicode scalar" in e.message


def test_gbnf_scalar_edges_still_accepted(comp):
    comp.compile(ConstraintSpec("grammar", r'root ::= "\uD7FF" | "\uE000" | [\U0010FFFF]'))


@pytest.mark.parametrize("src", [
    'root ::= "a" root',
    'root ::= x\nx ::= "a" x',
    'root ::= x{1,3}\nx ::= "a" x',
    'root ::= (x)+\nx ::= "q" x | x "r"',
])
def test_gbnf_empty_language_rejected(comp, src):
    e = _err(comp, ConstraintSpec("grammar", src))
    assert e.kind == "InvalidGrammar"
    assert "rule root derives no finite string" in e.message
    assert e.location == "1:1"


@pytest.mark.parametrize("src", [
    'root ::= "a" root | ""',
    'root ::= x{0,3} "c"\nx ::= "a" x | "b"',
    'root ::= ("a")+ "b"* [c]?',
    'root ::= x\nx ::= y "a"\ny ::= "b" | x',
    'root ::= "a" | b c\nb ::= "x"\nc ::= "y" c',  # only the "a" branch is finite
])
def test_gbnf_finite_derivations_accepted(comp, src):
    comp.compile(ConstraintSpec("grammar", src))


def test_gbnf_raw_lone_surrogate_rejected(comp):
    e = _err(comp, ConstraintSpec("grammar", 'root ::= "a\ud800"'))
    assert e.kind == "InvalidGrammar" and e.location == "1:12"


@pytest.mark.parametrize("kind,src,prefix", [
    ("grammar", r"root ::= [^a]", b""),
    ("grammar", r"root ::= [\ud7ff-\ue000]*", b""),
    ("grammar", r"root ::= [\u0080-\U0010FFFF]", b""),
    ("json_object", "", b'{"'),
])
def test_classes_never_match_surrogates(comp, kind, src, prefix):
    compiled, _ = comp.compile(ConstraintSpec(kind, src))
    m = compiled.new_matcher()
    assert m.accept_bytes(prefix + b"\xed\x9f\xbf")  # U+D7FF still allowed
    for surrogate in (b"\xed\xa0\x80", b"\xed\xbf\xbf"):  # U+D800, U+DFFF (not UTF-8)
        m = compiled.new_matcher()
        assert not m.accept_bytes(prefix + surrogate)


def test_server_prepare_maps_deep_nesting_to_invalid_argument(monkeypatch):
    grpc = pytest.importorskip("grpc")
    from ninfer.constraint.v1 import constraint_pb2 as pb
    from constraint_service.server import ConstraintServicer

    class Aborted(Exception):
        pass

    class Ctx:
        status = None

        def abort_with_status(self, status):
            self.status = status
            raise Aborted

    sv = ConstraintServicer()  # compiles in the killable worker processes, as in the sidecar
    sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
        vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes),
        special_ids=list(VOCAB.special_ids), eos_ids=list(VOCAB.eos_ids)), Ctx())
    for kind, source, want in [("regex", "(" * 20000 + "a" + ")" * 20000, "InvalidRegex"),
                               ("json_schema", '{"enum":[' + "[" * 50000 + "]" * 50000 + "]}", "InvalidSchema")]:
        ctx = Ctx()
        with pytest.raises(Aborted):
            sv.Prepare(pb.PrepareRequest(request_id="r", constraint=pb.Constraint(kind=kind, source=source)), ctx)
        assert ctx.status.code == grpc.StatusCode.INVALID_ARGUMENT
        assert want.encode() in ctx.status.trailing_metadata[0][1]
    # a RecursionError escaping the compiler is still a request error
    monkeypatch.setattr(sv._compiler, "compile", lambda spec: (_ for _ in ()).throw(RecursionError("deep")))
    ctx = Ctx()
    with pytest.raises(Aborted):
        sv.Prepare(pb.PrepareRequest(request_id="r", constraint=pb.Constraint(kind="grammar", source="x")), ctx)
    assert ctx.status.code == grpc.StatusCode.INVALID_ARGUMENT
    sv.close()
