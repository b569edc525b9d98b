"""Mask-cost probe (``constraint_service.mask_probe``): a constraint that compiles but whose token masks are
too slow to serve is refused with ``GrammarTooExpensive`` at compile time, in the killable worker
(``isolate=True``, the sidecar's path) and on the build thread (``isolate=False``) alike; the refusal is
remembered; ordinary constraints pass; the probe walk is deterministic.

The slow grammar is ``root ::= ([a-z]+ " "?){0,200}`` (xgrammar evaluates the counted repetition of an
ambiguous group at match time). On the 20,000-word test vocabulary below its masks after the first token
took 0.09-0.21 s, 0.17-0.40 s after the second and keep growing (2-core dev box; 0.5-1.4 s on SmolLM2's
49k tokens); its first mask is fast (0.1 ms). The tests use a 20 ms limit: the walk is refused at its
second or third mask, a margin of 4-10x or more, and each fill is timed in thread CPU time, so a loaded
box does not make the ordinary grammars slow nor the slow one fast.
"""
from __future__ import annotations

import random

import pytest

from conftest import VOCAB
from constraint_service.compiler import ConstraintCompiler
from constraint_service.errors import ConstraintError
from constraint_service.mask_probe import (DEFAULT_MASK_PROBE_LIMIT_S, DEFAULT_MASK_PROBE_STEPS, check_mask_cost,
                                           probe_seed, probe_walk)
from constraint_service.types import ConstraintSpec
from constraint_service.vocab import Vocabulary
from ninfer_common.errors import CONSTRAINT_ERROR_KINDS, ErrorKind, Status

SLOW = ConstraintSpec("grammar", 'root ::= ([a-z]+ " "?){0,200}')
LIMIT_S = 0.02
STEPS = 8  # the slow walk is refused by its 3rd fill; a cap keeps a miss short

ORDINARY = [
    ConstraintSpec("json_schema", '{"type": "object", "properties": {"name": {"type": "string"}, '
                                  '"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}, '
                                  '"n": {"type": "integer", "minimum": 0}}, "required": ["name"]}'),
    ConstraintSpec("json_object"),
    ConstraintSpec("regex", r"([a-z]+ ){2,8}[a-z]+\."),
    ConstraintSpec("choice", choices=("yes", "no", "maybe")),
    ConstraintSpec("grammar", 'root ::= word (" " word)*\nword ::= [a-z]+'),
    ConstraintSpec("grammar", 'root ::= [a-z]+ (" " [a-z]+)* " "?'),  # the slow grammar, unambiguous
]
#: the slow grammar without its count: still ambiguous, 12 ms per mask on WORDS (17 on SmolLM2): under the
#: default limit, not under the tests' 20 ms
STAR = ConstraintSpec("grammar", 'root ::= ([a-z]+ " "?)*')


def make_word_vocab(n: int = 20000) -> Vocabulary:
    """All single bytes, EOS, then ``n`` random lowercase words (2-9 letters, half with a leading space):
    like a real tokenizer, many tokens match ``[a-z]+ " "?`` from many positions."""
    rng = random.Random(0)
    letters = b"abcdefghijklmnopqrstuvwxyz"
    words: set[bytes] = set()
    while len(words) < n:
        words.add((b" " if rng.random() < 0.5 else b"") + bytes(rng.choice(letters) for _ in range(rng.randint(2, 9))))
    toks = [bytes([i]) for i in range(256)] + [b"<eos>"] + sorted(words)
    return Vocabulary(vocab_size=len(toks) + 5, token_bytes=tuple(toks), eos_ids=(256,))


WORDS = make_word_vocab()


@pytest.fixture(scope="module")
def strict():
    """The sidecar's path (killable worker first) with a 20 ms limit."""
    c = ConstraintCompiler(WORDS, isolate=True, max_cold_compiles=1, compile_timeout_s=60.0,
                           mask_probe_limit_s=LIMIT_S, mask_probe_steps=STEPS)
    assert c.wait_workers(120), "no compile worker started"
    yield c
    c.close()


def _refused(c: ConstraintCompiler, spec: ConstraintSpec) -> ConstraintError:
    with pytest.raises(ConstraintError) as ei:
        c.compile(spec)
    return ei.value


def test_the_kind_is_a_constraint_error_of_status_invalid_argument():
    assert ErrorKind("GrammarTooExpensive") in CONSTRAINT_ERROR_KINDS
    err = ConstraintError("GrammarTooExpensive", "m")
    assert err.status is Status.INVALID_ARGUMENT and err.kind == "GrammarTooExpensive"


def test_slow_grammar_is_refused_in_the_worker_and_the_refusal_is_remembered(strict):
    err = _refused(strict, SLOW)
    assert err.kind == "GrammarTooExpensive" and err.status is Status.INVALID_ARGUMENT, err
    assert "(limit 20 ms) after" in err.message and "characters" in err.message, err.message
    assert "Counted repetitions of ambiguous groups are slow" in err.message
    # remembered like any deterministic compile failure: no second worker compile, no second probe
    prove = strict._pool.prove
    strict._pool.prove = lambda *a, **k: pytest.fail("a remembered refusal reached the compile worker")
    try:
        again = _refused(strict, SLOW)
    finally:
        strict._pool.prove = prove
    assert (again.kind, again.message) == (err.kind, err.message)


def test_slow_grammar_is_refused_in_thread_too():
    c = ConstraintCompiler(WORDS, compile_timeout_s=60.0, mask_probe_limit_s=LIMIT_S, mask_probe_steps=STEPS)
    err = _refused(c, SLOW)
    assert err.kind == "GrammarTooExpensive" and "(limit 20 ms)" in err.message, err
    assert c.stats.failures == 1 and c.stats.built == 0 and c.num_cached == 0  # refused: not cached
    c._build_grammar = lambda *a, **k: pytest.fail("a remembered refusal was built again")
    assert _refused(c, SLOW).kind == "GrammarTooExpensive" and c.stats.failures == 1


def test_in_thread_a_probe_past_the_deadline_is_a_compile_timeout_and_its_late_verdict_is_cached():
    """Without isolation the owner gives up at the deadline as for a slow compile (``CompileTimeout``); the
    abandoned build finishes its probe (bounded: it stops at the first slow fill) and its refusal is cached."""
    import time

    c = ConstraintCompiler(WORDS, compile_timeout_s=0.05, mask_probe_limit_s=LIMIT_S, mask_probe_steps=STEPS)
    assert c.backend is not None  # the vocabulary index now, not inside the 50 ms
    first = _refused(c, SLOW)  # the probe's slow fills take 0.1 s and more: past the 50 ms deadline
    assert first.kind in ("CompileTimeout", "GrammarTooExpensive"), first
    key = c.cache_key(SLOW)
    end = time.monotonic() + 120  # the abandoned build runs at nice 19: slow on a busy box
    while key not in c._failures and time.monotonic() < end:
        time.sleep(0.01)
    assert _refused(c, SLOW).kind == "GrammarTooExpensive" and c.num_cached == 0


def test_ordinary_constraints_pass_with_the_default_limit():
    c = ConstraintCompiler(WORDS, isolate=True, max_cold_compiles=1, compile_timeout_s=60.0)
    try:
        assert c.mask_probe_limit_s == DEFAULT_MASK_PROBE_LIMIT_S and c.mask_probe_steps == DEFAULT_MASK_PROBE_STEPS
        assert c.wait_workers(120), "no compile worker started"
        for spec in (*ORDINARY, STAR):
            c.compile(spec)
    finally:
        c.close()
    small = ConstraintCompiler(VOCAB)  # the unit tests' vocabulary, in-thread
    for spec in ORDINARY:
        small.compile(spec)


def test_ordinary_constraints_pass_the_strict_limit_too(strict):
    """Their masks are far below even 20 ms (they measure in microseconds: 0.08 ms at most on WORDS)."""
    for spec in ORDINARY:
        strict.compile(spec)


def test_with_the_probe_off_the_slow_grammar_compiles_as_before():
    c = ConstraintCompiler(WORDS, isolate=True, max_cold_compiles=1, compile_timeout_s=60.0,
                           mask_probe_limit_s=0, mask_probe_steps=STEPS)
    try:
        assert c.wait_workers(120), "no compile worker started"
        compiled, info = c.compile(SLOW)
        assert info.cache == "built" and compiled.new_matcher().accept_bytes(b"ab cd")
    finally:
        c.close()


def test_the_walk_is_deterministic_and_follows_the_grammar():
    c = ConstraintCompiler(WORDS, mask_probe_limit_s=0)
    compiled, _ = c.compile(STAR)
    seed = probe_seed(compiled.key)
    first = probe_walk(compiled, seed, steps=12)
    second = probe_walk(compiled, seed, steps=12)
    assert first.end == "steps" and len(first.tokens) == 12 and len(first.fill_seconds) == 13
    assert first.tokens == second.tokens
    # a fresh compile (another compiler: nothing shared) walks the same tokens
    again, _ = ConstraintCompiler(WORDS, mask_probe_limit_s=0).compile(STAR)
    assert probe_walk(again, probe_seed(again.key), steps=12).tokens == first.tokens
    assert probe_walk(compiled, seed + "x", steps=12).tokens != first.tokens  # the seed picks the tokens
    m = compiled.new_matcher()
    assert all(m.accept_token(t) for t in first.tokens) and all(t not in WORDS.eos_ids for t in first.tokens)


def test_the_walk_stops_at_the_limit_and_at_eos():
    c = ConstraintCompiler(WORDS, mask_probe_limit_s=0)
    slow, _ = c.compile(SLOW)
    walk = probe_walk(slow, probe_seed(slow.key), steps=STEPS, limit_s=LIMIT_S)
    assert walk.end == "over_limit" and walk.fill_seconds[-1] > LIMIT_S and max(walk.fill_seconds[:-1]) <= LIMIT_S, walk
    assert len(walk.tokens) == len(walk.fill_seconds) - 1
    done, _ = c.compile(ConstraintSpec("choice", choices=("yes",)))
    walk = probe_walk(done, probe_seed(done.key))
    assert walk.end == "eos_only" and b"".join(WORDS.token_bytes[t] for t in walk.tokens) == b"yes"
    assert check_mask_cost(done, "s", 1.0).end == "eos_only"
    assert check_mask_cost(slow, "s", 0.0) is None  # off


def test_the_sidecar_options_set_the_limit():
    from constraint_service.server import ConstraintServicer, SidecarOptions
    from ninfer.constraint.v1 import constraint_pb2 as pb

    assert SidecarOptions().mask_probe_limit_ms == 1000 * DEFAULT_MASK_PROBE_LIMIT_S
    for ms, want in ((20.0, 0.02), (0.0, 0.0)):
        sv = ConstraintServicer(SidecarOptions(isolate_compiles=False, mask_probe_limit_ms=ms))
        try:
            sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
                vocab_size=VOCAB.vocab_size, token_bytes=list(VOCAB.token_bytes),
                special_ids=list(VOCAB.special_ids), eos_ids=list(VOCAB.eos_ids)), None)
            assert sv._compiler.mask_probe_limit_s == pytest.approx(want)
        finally:
            sv.close()
