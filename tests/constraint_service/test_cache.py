"""Compile cache: keys, sharing, cold-compile slots, budget, deadline (seed 000 §编译与缓存)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from conftest import VOCAB, make_big_vocab as _big_vocab, make_vocab
from constraint_service.compiler import SMALL_SOURCE_BYTES, ConstraintCompiler
from constraint_service.registry import canonical_json
from constraint_service.errors import ConstraintError
from constraint_service.session import OutputSession
from constraint_service.types import ConstraintSpec


def G(src: str) -> ConstraintSpec:
    return ConstraintSpec("grammar", src)


class GatedCompiler(ConstraintCompiler):
    """Builds block on a per-source gate; records concurrency."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gates: dict[str, threading.Event] = {}
        self.calls: list[str] = []
        self.running = 0
        self.max_running = 0
        self._mu = threading.Lock()

    def _build_grammar(self, backend, kind, canon, key):
        with self._mu:
            self.calls.append(canon)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            gate = self.gates.get(canon)
            if gate is not None:
                gate.wait(10)
            return super()._build_grammar(backend, kind, canon, key)
        finally:
            with self._mu:
                self.running -= 1


def run_threads(fn, n):
    out = [None] * n

    def body(i):
        try:
            out[i] = fn(i)
        except Exception as exc:  # noqa: BLE001
            out[i] = exc

    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    return ts, out


def test_index_is_lazy_and_built_once():
    c = ConstraintCompiler(VOCAB)
    assert not c.index_built
    c.cache_key(G('root ::= "x"'))
    assert not c.index_built
    _, info = c.compile(G('root ::= "x"'))
    assert c.index_built and info.cache == "built" and info.seconds > 0
    b = c.backend
    _, info = c.compile(G('root ::= "x"'))
    assert info.cache == "hit" and c.backend is b


def test_keys_canonical_forms():
    c = ConstraintCompiler(VOCAB)
    k = c.cache_key
    assert k(ConstraintSpec("json_schema", '{"type": "object",\n "properties": {"a": {}}}')) == \
        k(ConstraintSpec("json_schema", '{"type":"object","properties":{"a":{}}}'))
    # property order is part of the identity
    assert k(ConstraintSpec("json_schema", '{"properties":{"a":{},"b":{}}}')) != \
        k(ConstraintSpec("json_schema", '{"properties":{"b":{},"a":{}}}'))
    # numbers as written, duplicates kept
    assert canonical_json('{"a": 1.0, "a": 1e2, "b": "\\u00e9"}') == '{"a":1.0,"a":1e2,"b":"é"}'
    # choice: de-duplicated set, order independent; kind is part of the key
    assert k(ConstraintSpec("choice", choices=("b", "a", "b"))) == k(ConstraintSpec("choice", choices=("a", "b")))
    assert k(ConstraintSpec("choice", choices=("a",))) != k(ConstraintSpec("choice", choices=("a", "")))
    assert k(ConstraintSpec("regex", "a")) != k(G("a"))
    # vocabulary is part of the key
    other = ConstraintCompiler(make_vocab(301))
    assert other.cache_key(G("root ::= \"a\"")) != k(G("root ::= \"a\""))
    with pytest.raises(ConstraintError) as ei:
        k(ConstraintSpec("json_schema", "{bad"))
    assert ei.value.kind == "InvalidSchema"
    with pytest.raises(ValueError):
        k(ConstraintSpec("yaml", "x"))


def test_concurrent_prepares_of_one_key_share_one_build():
    c = GatedCompiler(VOCAB)
    src = 'root ::= "shared" [0-9]*'
    gate = c.gates[src] = threading.Event()
    ts, out = run_threads(lambda i: c.compile(G(src)), 6)
    deadline = time.time() + 5
    while c.stats.built == 0 and len(c.calls) == 0 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # let the other five reach the wait
    gate.set()
    for t in ts:
        t.join(10)
    infos = sorted(o[1].cache for o in out)
    assert infos == ["built"] + ["waited"] * 5
    assert len(c.calls) == 1 and len({id(o[0]) for o in out}) == 1


def test_cold_compile_limit_and_hits_take_no_slot():
    c = GatedCompiler(VOCAB, max_cold_compiles=2)
    c.compile(G('root ::= "hot"'))  # cached
    srcs = [f'root ::= "k{i}"' for i in range(4)]
    gates = {s: threading.Event() for s in srcs}
    c.gates.update(gates)
    ts, out = run_threads(lambda i: c.compile(G(srcs[i])), 4)
    time.sleep(0.3)
    assert c.max_running == 2 and c.compiles_running == (2, 0)
    # a hit takes no compile slot: it completes while both slots stay held by gated builds
    hit = []
    t = threading.Thread(target=lambda: hit.append(c.compile(G('root ::= "hot"'))[1].cache))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and hit == ["hit"]
    assert c.compiles_running == (2, 0)
    for g in gates.values():
        g.set()
    for t in ts:
        t.join(10)
    assert all(o[1].cache == "built" for o in out) and c.max_running == 2


def test_budget_eviction_keeps_held_entries_and_evicted_grammar_stays_usable():
    c = ConstraintCompiler(VOCAB)
    a, _ = c.compile(G('root ::= "a"+'))
    c.cache_bytes = a.memory_size_bytes * 2 + 10  # room for about two grammars
    held = OutputSession(a)
    b, _ = c.compile(G('root ::= "b"+'))
    d, _ = c.compile(G('root ::= "d"+'))
    # "a" is least recently used but held: "b" is evicted instead
    assert c.compile(G('root ::= "a"+'))[1].cache == "hit"
    assert c.compile(G('root ::= "d"+'))[1].cache == "hit"
    assert c.stats.evictions >= 1
    assert c.cached_bytes <= c.cache_bytes or a.num_holders > 0
    # b was evicted while a reference exists: it still works
    s = OutputSession(b)
    assert s.preview([ord("b"), ord("b")]).complete
    _, info = c.compile(G('root ::= "b"+'))
    assert info.cache == "built"
    held.close()  # releasing "a" lets the cache fall back under budget
    assert c.cached_bytes <= c.cache_bytes


def test_failures_are_reported_to_every_request():
    c = ConstraintCompiler(VOCAB)
    for _ in range(2):
        with pytest.raises(ConstraintError) as ei:
            c.compile(G("root ::= ("))
        assert ei.value.kind == "InvalidGrammar" and ei.value.location == "1:11"


def test_timeout_moves_slot_to_abandoned_pool():
    c = GatedCompiler(VOCAB, max_cold_compiles=1, max_abandoned_compiles=1, compile_timeout_s=2.0)
    slow1, slow2 = 'root ::= "slow1"', 'root ::= "slow2"'
    g1 = c.gates[slow1] = threading.Event()
    g2 = c.gates[slow2] = threading.Event()
    with pytest.raises(ConstraintError) as ei:
        c.compile(G(slow1))
    assert ei.value.kind == "CompileTimeout"
    assert c.compiles_running == (0, 1)
    tid = c._inflight[c.cache_key(G(slow1))].native_id  # abandoned: lowest CPU priority
    if os.path.exists(f"/proc/self/task/{tid}/stat"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[16]) == 19  # field 19: nice
    # the one normal slot is free again: a new cold compile is not blocked (a blocked one would
    # wait for the slot until its own deadline and fail with CompileTimeout)
    assert c.compile(G('root ::= "fast"'))[1].cache == "built"
    # the same request again waits for the abandoned build (own deadline), no duplicate compile
    with pytest.raises(ConstraintError) as ei:
        c.compile(G(slow1))
    assert ei.value.kind == "CompileTimeout"
    assert c.calls.count(slow1) == 1
    # abandoned pool full: the next timed-out build still gives its slot back ...
    with pytest.raises(ConstraintError):
        c.compile(G(slow2))
    assert c.compiles_running == (0, 2)
    # ... so small compiles are not starved (they used to wait for an abandoned build to end)
    assert c.compile(G('root ::= "queued"'))[1].cache == "built"
    # a large source waits for the pool to drain, but only until its deadline
    big = 'root ::= "' + "x" * (SMALL_SOURCE_BYTES + 10) + '"'
    with pytest.raises(ConstraintError) as ei:
        c.compile(G(big))
    assert ei.value.kind == "CompileTimeout"
    assert big not in c.calls
    g2.set()
    g1.set()
    deadline = time.time() + 5
    while c.compiles_running != (0, 0) and time.time() < deadline:
        time.sleep(0.01)
    assert c.compiles_running == (0, 0)
    time.sleep(0.05)
    # the late results were cached; timeouts were not remembered as failures
    assert c.compile(G(slow1))[1].cache == "hit"
    assert c.compile(G(slow2))[1].cache == "hit"
    assert c.compile(G(big))[1].cache == "built"


def test_compile_timeout_is_not_remembered():
    """A timeout caused by load must not make the key fail forever (QA: `[a-z ]{1,400}`)."""
    c = GatedCompiler(VOCAB, max_cold_compiles=1, compile_timeout_s=0.2)
    c._acquire_slot()  # the server is busy: the only slot is taken
    out = {}

    def first():
        try:
            c.compile(G('root ::= "b"'))
        except ConstraintError as exc:
            out["err"] = exc

    t = threading.Thread(target=first, daemon=True)
    t.start()
    t.join(3)
    assert out["err"].kind == "CompileTimeout"
    with c._slot_cv:  # load goes away
        c._running -= 1
        c._slot_cv.notify_all()
    assert c.compile(G('root ::= "b"'))[1].cache == "built"


def test_deterministic_failures_still_remembered():
    c = GatedCompiler(VOCAB)
    for _ in range(2):
        with pytest.raises(ConstraintError) as ei:
            c.compile(G('root ::= "a" root'))
        assert ei.value.kind == "InvalidGrammar"
    assert c.calls.count('root ::= "a" root') == 1




def test_real_pathological_compile_times_out_while_others_proceed():
    c = ConstraintCompiler(_big_vocab(), compile_timeout_s=0.4)
    c.compile(G('root ::= "warm"'))  # index built, entry cached
    n = 4000
    rules = ["root ::= r0"] + [
        f'r{i} ::= [a-{chr(ord("c") + i % 20)}0-{i % 9}]* "{chr(97 + i % 26)}" r{i + 1}' for i in range(n)
    ] + [f'r{n} ::= ""']
    patho = G("\n".join(rules))
    result = {}

    def slow():
        t0 = time.perf_counter()
        try:
            c.compile(patho)
        except ConstraintError as exc:
            result["err"] = exc
        result["t"] = time.perf_counter() - t0

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    assert c.compile(G('root ::= "warm"'))[1].cache == "hit"
    assert c.compile(G('root ::= "other" [0-9]'))[1].cache == "built"
    others = time.perf_counter() - t0
    t.join(10)
    assert result["err"].kind == "CompileTimeout"
    assert others < result["t"]
    deadline = time.time() + 20  # let the abandoned compile finish before other tests
    while c.compiles_running != (0, 0) and time.time() < deadline:
        time.sleep(0.05)


def test_timed_out_big_compiles_do_not_starve_small_ones():
    """QA repro (bug 1) on a real xgrammar compile: after the abandoned pool filled with
    pathological builds, a tiny choice waited ~140 s for one of them to end."""
    c = ConstraintCompiler(_big_vocab(), max_cold_compiles=1, max_abandoned_compiles=1, compile_timeout_s=1.0)
    c.compile(G('root ::= "warm"'))
    n = 12000  # ~4.5 s of compile on one core

    def patho(tag):
        rules = ["root ::= r0"] + [
            f'r{i} ::= [a-{chr(ord("c") + i % 20)}0-{i % 9}]* "{tag}{chr(97 + i % 26)}" r{i + 1}' for i in range(n)
        ] + [f'r{n} ::= ""']
        return G("\n".join(rules))

    for tag in ("p", "q"):
        with pytest.raises(ConstraintError) as ei:
            c.compile(patho(tag))
        assert ei.value.kind == "CompileTimeout"
    # before the fix this waited for an abandoned compile to end and failed with CompileTimeout
    _, info = c.compile(ConstraintSpec("choice", choices=("yes", "no")))
    assert info.cache == "built"
    assert c.compile(G('root ::= "warm"'))[1].cache == "hit"
    deadline = time.time() + 60  # let the abandoned compile finish before other tests
    while c.compiles_running != (0, 0) and time.time() < deadline:
        time.sleep(0.05)


# -- the canonical-form memo (a cache-hit Prepare no longer re-parses its schema) ---------------------

def test_canonical_memo_hits_by_content_not_identity():
    from constraint_service.compiler import _CanonicalMemo

    c = ConstraintCompiler(VOCAB)
    src = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    first = c.cache_key(ConstraintSpec("json_schema", src))
    copy = "".join(list(src))  # equal text, another object
    assert copy is not src
    again = c.cache_key(ConstraintSpec("json_schema", copy))
    assert again is first  # served from the memo
    assert again == c._canonicalise(ConstraintSpec("json_schema", src))[0]
    # every field is part of the memo key: a different kind or wrapper is canonicalised on its own
    assert c.cache_key(ConstraintSpec("grammar", 'root ::= "a"')) != c.cache_key(ConstraintSpec("regex", 'root ::= "a"'))
    w = c.cache_key(ConstraintSpec("json_schema", src, wrapper='{"thinking":true}'))
    assert w != first and w[3] == '{"thinking":true}'
    assert isinstance(c._canonical, _CanonicalMemo) and len(c._canonical) == 4


def test_canonical_memo_keeps_no_failures():
    c = ConstraintCompiler(VOCAB)
    for _ in range(2):  # checked again each time: an error is never served from the memo
        with pytest.raises(ConstraintError) as ei:
            c.cache_key(ConstraintSpec("json_schema", "{bad"))
        assert ei.value.kind == "InvalidSchema"
    assert len(c._canonical) == 0


def test_canonical_memo_is_bounded_least_recently_used():
    import sys

    from constraint_service.compiler import _CanonicalMemo, _held_bytes

    f = [("regex", s, (), "") for s in ("aa", "bb", "cc", "dd")]
    one = _held_bytes(*f[0][1:])
    assert one == sys.getsizeof("aa") + sys.getsizeof(()) + sys.getsizeof("")
    m = _CanonicalMemo(max_bytes=10 * one, max_entries=3)
    for x in f[:3]:
        m.put(x, (x[1],))
    assert m.get(f[0]) == ("aa",)  # f[0] now most recent
    m.put(f[3], ("dd",))  # 4 entries > 3: the least recently used (f[1]) goes
    assert m.get(f[1]) is None and m.get(f[0]) == ("aa",) and m.get(f[3]) == ("dd",) and len(m) == 3
    m.put(("regex", "big", (), ""), ("big",), extra_bytes=7 * one)  # 3 + 8 entries' worth > 10: the two oldest go
    assert m.get(("regex", "big", (), "")) == ("big",) and m._bytes <= m.max_bytes and len(m) == 2
    m.put(("regex", "huge", (), ""), ("huge",), extra_bytes=10 * one)  # more than the whole budget: not kept
    assert m.get(("regex", "huge", (), "")) is None and len(m) == 2
    # object headers and tuple slots count: 5000 empty choice options are not free
    many = ("choice", "", ("",) * 5000, "")
    assert _held_bytes(*many[1:]) >= 8 * 5000
    m.put(many, ("c",))
    assert m.get(many) is None  # larger than the budget
    assert sum(c for _, c in m._entries.values()) == m._bytes
    # a budget or entry count of 0 (or less) keeps nothing
    for z in (_CanonicalMemo(max_bytes=0), _CanonicalMemo(max_entries=-1)):
        z.put(f[0], ("aa",))
        assert len(z) == 0 and z.get(f[0]) is None


def test_canonical_memo_takes_any_choice_sequence():
    c = ConstraintCompiler(VOCAB)
    k = c.cache_key(ConstraintSpec("choice", choices=["b", "a"]))  # a list (not hashable): still keyed
    assert k == c.cache_key(ConstraintSpec("choice", choices=("a", "b")))
    assert c._canonicalise(ConstraintSpec("choice", choices=["x"]))[0] == c.cache_key(ConstraintSpec("choice", choices=("x",)))


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=12),
       st.sampled_from([None, 0, 2]))
def test_canonical_memo_matches_a_fresh_canonicalisation(value, indent):
    """Property: whatever the schema text's spelling, the memoised key equals the key a fresh compiler
    (empty memo) computes, and texts differing in content never share a key."""
    import json as _json

    schema = {"type": "object", "default": value}
    text = _json.dumps(schema, indent=indent)
    c = ConstraintCompiler(VOCAB)
    spec = ConstraintSpec("json_schema", text)
    k1, k2 = c.cache_key(spec), c.cache_key(ConstraintSpec("json_schema", text))
    fresh = ConstraintCompiler(VOCAB).cache_key(spec)
    assert k1 == k2 == fresh
    other = ConstraintSpec("json_schema", _json.dumps({"type": "object", "default": [value]}))
    assert c.cache_key(other) != k1
