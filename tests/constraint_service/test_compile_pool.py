"""Killable compile workers (issue 14 defect 8): ``ConstraintCompiler(isolate=True)`` with real worker processes.

A cold compile is proven in a warm worker process and then compiled in-process; a timed-out compile's
worker is killed (nothing keeps burning CPU) and replaced; errors keep their kind and location; the
cache and the "CompileTimeout is never remembered" rule are unchanged; hits never reach a worker.
"""
from __future__ import annotations

import pickle

import psutil
import pytest

from conftest import VOCAB, make_big_vocab as _big_vocab, make_session, session_mask, tok
from constraint_service.compiler import ConstraintCompiler
from constraint_service.errors import ConstraintError
from constraint_service.types import ConstraintSpec


def _pathological(n: int = 12000, tag: str = "p") -> ConstraintSpec:
    """A rule chain whose compile takes seconds on the 5k-token vocabulary (linear in ``n``)."""
    rules = ["root ::= r0"] + [
        f'r{i} ::= [a-{chr(ord("c") + i % 20)}0-{i % 9}]* "{tag}{chr(97 + i % 26)}" r{i + 1}' for i in range(n)
    ] + [f'r{n} ::= ""']
    return ConstraintSpec("grammar", "\n".join(rules))


@pytest.fixture(scope="module")
def isolated():
    c = ConstraintCompiler(VOCAB, isolate=True, max_cold_compiles=2, compile_timeout_s=60.0)
    assert c.wait_workers(120), "no compile worker started"
    yield c
    pids = c.worker_pids
    c.close()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_isolated_compile_gives_the_same_language_and_caches(isolated):
    spec = ConstraintSpec("regex", "ab|ba")
    compiled, info = isolated.compile(spec)
    assert info.cache == "built"
    s = make_session(isolated, "regex", "ab|ba")
    assert tok(b"ab") in session_mask(s) and tok(b"aa") not in session_mask(s)
    plain = ConstraintCompiler(VOCAB)  # in-thread compile: same mask
    assert session_mask(make_session(plain, "regex", "ab|ba")) == session_mask(s)
    before = isolated.stats.built
    assert isolated.compile(spec)[1].cache == "hit" and isolated.stats.built == before


def test_isolated_builds_compile_on_the_compile_threads_in_thread_builds_on_one():
    assert ConstraintCompiler(VOCAB, compile_threads=4).compile_threads == 1  # may be abandoned: one thread
    c = ConstraintCompiler(VOCAB, isolate=True, max_cold_compiles=1, compile_timeout_s=60.0, compile_threads=3)
    try:
        assert c.wait_workers(120), "no compile worker started"
        assert pickle.loads(c._pool._blob)[1] == 3  # what each worker is told for its proof
        backend, seen = c.backend, []
        inner = backend.compile

        def recording(*args, **kwargs):
            seen.append(kwargs.get("threads"))
            return inner(*args, **kwargs)

        backend.compile = recording
        source = '{"type":"object","properties":{"a":{"type":"string","pattern":"^[a-c]+$"}},"required":["a"]}'
        compiled, info = c.compile(ConstraintSpec("json_schema", source))
        assert info.cache == "built" and seen == [3]
        plain = ConstraintCompiler(VOCAB)  # one thread, in-thread: the same masks
        for prefix in (b"", b'{"a":"', b'{"a":"ab'):
            s, p = make_session(c, "json_schema", source), make_session(plain, "json_schema", source)
            for b in prefix:
                s.preview([b]), s.commit(), p.preview([b]), p.commit()
            assert session_mask(s) == session_mask(p)
    finally:
        c.close()


@pytest.mark.parametrize("kind,source,err_kind,location", [
    ("grammar", 'root ::= "a" foo', "InvalidGrammar", "1:14"),
    ("regex", "(ab", "InvalidRegex", None),
    ("json_schema", '{"type": 5}', "InvalidSchema", "/type"),
])
def test_worker_errors_keep_kind_and_location_and_are_remembered(isolated, kind, source, err_kind, location):
    with pytest.raises(ConstraintError) as ei:
        isolated.compile(ConstraintSpec(kind, source))
    assert ei.value.kind == err_kind, ei.value
    if location is not None:
        assert ei.value.location == location, ei.value
    pids = isolated.worker_pids
    with pytest.raises(ConstraintError) as again:  # remembered: answered without a worker
        isolated.compile(ConstraintSpec(kind, source))
    assert again.value.kind == err_kind and isolated.worker_pids == pids


def test_timed_out_compile_kills_its_worker_and_the_next_compile_works():
    c = ConstraintCompiler(_big_vocab(), isolate=True, max_cold_compiles=1, compile_timeout_s=1.0)
    try:
        assert c.wait_workers(120)
        assert c.compile(ConstraintSpec("grammar", 'root ::= "warm"'))[1].cache == "built"
        (before,) = c.worker_pids
        with pytest.raises(ConstraintError) as ei:
            c.compile(_pathological())
        assert ei.value.kind == "CompileTimeout"
        assert not psutil.pid_exists(before), "the timed-out compile's worker process is still there"
        assert c.stats.killed == 1 and c.stats.timeouts == 1
        assert c.compiles_running == (0, 0)  # nothing abandoned
        # not remembered: once a replacement worker is warm, the same request is compiled again (and times
        # out again) ...
        assert c.wait_workers(120)
        with pytest.raises(ConstraintError) as ei2:
            c.compile(_pathological())
        assert ei2.value.kind == "CompileTimeout" and c.stats.killed == 2
        # ... and a new cold compile works once a replacement worker is warm (its deadline covers the start)
        c.compile_timeout_s = 120.0
        assert c.compile(ConstraintSpec("choice", choices=("yes", "no")))[1].cache == "built"
        assert c.compile(ConstraintSpec("grammar", 'root ::= "warm"'))[1].cache == "hit"
        assert len(c.worker_pids) == 1 and before not in c.worker_pids
    finally:
        c.close()


def test_flat_objects_are_limited_by_size_not_depth(isolated):
    """Issue 14 defect 8: a schema with 5,000 flat properties was refused as "nesting too deep".

    5,000 *required* properties compile (one sequence).  Optional ones are limited per object
    (``emit.MAX_OPTIONAL_PROPERTIES``; xgrammar's cost grows about as n^3 with them, see emit.py and
    bench/results/flat_objects.json): see the next test."""
    import json

    props = {f"p{i}": {"type": "integer"} for i in range(5000)}
    flat = json.dumps({"type": "object", "properties": props, "required": list(props),
                       "additionalProperties": False})
    compiled, info = isolated.compile(ConstraintSpec("json_schema", flat))
    assert info.cache == "built"
    body = ",".join(f'"p{i}":{i % 7 - 3}' for i in range(5000))
    m = compiled.new_matcher()
    assert m.accept_bytes(("{" + body + "}").encode()) and m.is_completed()
    m = compiled.new_matcher()
    assert m.accept_bytes(b'{"p0":1') and not m.accept_bytes(b"}")  # p1 .. p4999 are required
    # the limit that applies is the source size: the same shape past 1 MiB is refused as too large ...
    huge = json.dumps({"type": "object", "properties": {f"property_{i:07d}": {"type": "integer"}
                                                        for i in range(40000)}})
    with pytest.raises(ConstraintError) as ei:
        isolated.compile(ConstraintSpec("json_schema", huge))
    assert ei.value.kind == "InvalidSchema" and "bytes" in ei.value.message, ei.value
    # ... while real nesting still has a depth limit
    deep = '{"type":"array","items":' * 5000 + "{}" + "}" * 5000
    with pytest.raises(ConstraintError) as ei2:
        isolated.compile(ConstraintSpec("json_schema", deep))
    assert ei2.value.kind in ("InvalidSchema", "UnsupportedSchema") and "nest" in ei2.value.message, ei2.value


def test_optional_properties_have_a_located_limit_per_object(isolated):
    """Issue 14 defect 8: 5,000 optional properties ended in CompileTimeout; now a located
    UnsupportedSchema (JSON Pointer of the ``properties`` keyword) that names the limit, at once; exactly
    the limit still compiles and keeps its language (any in-order subset, nothing else)."""
    import json

    from constraint_service.json_schema.emit import MAX_OPTIONAL_PROPERTIES as LIMIT

    def obj(n: int, required=()) -> dict:
        return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
                "required": list(required), "additionalProperties": False}

    for schema, where in ((obj(5000), "/properties"),
                          ({"type": "object", "properties": {"inner": obj(LIMIT + 1)}}, "/properties/inner/properties"),
                          ({"allOf": [dict(obj(LIMIT), additionalProperties=True),  # merged: LIMIT + 1 optional
                                      {"properties": {"extra": {"type": "string"}}}]}, "/allOf/0/properties")):
        with pytest.raises(ConstraintError) as ei:
            isolated.compile(ConstraintSpec("json_schema", json.dumps(schema)))
        e = ei.value
        assert e.kind == "UnsupportedSchema" and e.location == where and str(LIMIT) in e.message, e
    # required properties do not count: LIMIT optional + 1,000 required compile
    compiled, info = isolated.compile(ConstraintSpec("json_schema", json.dumps(
        obj(LIMIT + 1000, required=[f"p{i}" for i in range(LIMIT, LIMIT + 1000)]))))
    assert info.cache == "built"
    compiled, _ = isolated.compile(ConstraintSpec("json_schema", json.dumps(obj(LIMIT))))
    m = compiled.new_matcher()
    assert m.accept_bytes(b'{"p3":1,"p' + str(LIMIT - 1).encode() + b'":2}') and m.is_completed()
    m = compiled.new_matcher()
    assert m.accept_bytes(b'{"p3":1,') and not m.accept_bytes(b'"p2"')  # declared order
    m = compiled.new_matcher()
    assert m.accept_bytes(b"{") and not m.accept_bytes(b'"p' + str(LIMIT).encode() + b'"')  # undeclared


def test_a_worker_dying_mid_compile_fails_that_request_only_and_is_not_remembered():
    import os
    import signal
    import threading

    c = ConstraintCompiler(_big_vocab(), isolate=True, max_cold_compiles=1, compile_timeout_s=300.0)
    try:
        assert c.wait_workers(120)
        (pid,) = c.worker_pids
        spec = _pathological(tag="k")
        threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()  # e.g. the OOM killer
        with pytest.raises(ConstraintError) as ei:
            c.compile(spec)
        assert ei.value.kind == "InvalidGrammar" and "died" in ei.value.message, ei.value
        assert c.cache_key(spec) not in c._failures  # a crash may depend on load: not remembered
        assert c.wait_workers(120) and pid not in c.worker_pids  # replaced
        assert c.compile(ConstraintSpec("regex", "[0-9]+"))[1].cache == "built"
    finally:
        c.close()
