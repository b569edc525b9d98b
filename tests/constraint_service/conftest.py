"""Tiny synthetic byte-level vocabulary and helpers for constraint_service tests."""

from __future__ import annotations

import numpy as np
import pytest

from constraint_service.compiler import ConstraintCompiler
from constraint_service.session import OutputSession
from constraint_service.types import ConstraintSpec, bitmask_words
from constraint_service.vocab import Vocabulary

# Multi-byte tokens crossing punctuation, rule and UTF-8 boundaries.
MULTI = [
    b"ab", b"abc", b"ba", b'{"', b'":', b'",', b'"}', b"12", b"1.", b"0}", b"ok", b"er", b"error",
    b"status=", b"=o", b"k\n", b"\xc3\xa9", b"\xa9x", b"\xe4\xb8", b"\xad!", b"\xc3", b"e\xcc",
    b"true", b"null", b"{}", b'"a"', b"  ", b", ", b"aa", b"aaa", b"-1", b"yes", b"ye", b"s",
]
EOS_TEXT = b"<eos>"
SPECIAL_TEXT = b"<|im_end|>"


def make_vocab(vocab_size: int = 300) -> Vocabulary:
    """All 256 single bytes, then MULTI, then EOS and a special token; V > tokenizer size."""
    toks = [bytes([i]) for i in range(256)] + MULTI + [EOS_TEXT, SPECIAL_TEXT]
    eos = len(toks) - 2
    special = len(toks) - 1
    assert len(toks) < vocab_size and vocab_size % 32
    return Vocabulary(vocab_size=vocab_size, token_bytes=tuple(toks),
                      special_ids=frozenset({special}), eos_ids=(eos,))


def make_big_vocab() -> Vocabulary:
    """All single bytes, EOS, then 5,000 random 2-8 letter tokens: real compiles take measurable time."""
    import random

    rng = random.Random(0)
    letters = b"abcdefghijklmnopqrstuvwxyz0123456789"
    toks = [bytes([i]) for i in range(256)] + [b"<eos>"] + [
        bytes(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(5000)
    ]
    return Vocabulary(vocab_size=len(toks) + 3, token_bytes=tuple(toks), eos_ids=(256,))


VOCAB = make_vocab()
EOS = VOCAB.eos_ids[0]
SPECIAL = next(iter(VOCAB.special_ids))
W = bitmask_words(VOCAB.vocab_size)


@pytest.fixture(scope="session")
def vocab() -> Vocabulary:
    return VOCAB


@pytest.fixture(scope="session")
def compiler() -> ConstraintCompiler:
    return ConstraintCompiler(VOCAB)


def allowed_ids(words: np.ndarray) -> set[int]:
    """Ids whose bit is set in one ``[W]`` uint32 row (all 32*W bits, not only < V)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    return set(np.nonzero(bits)[0].tolist())


def session_mask(session: OutputSession) -> set[int]:
    bm = np.zeros((1, W), np.uint32)
    st = np.zeros(1, np.uint8)
    session.fill_lookahead([], bm, st)
    return allowed_ids(bm[0])


def tok(b: bytes) -> int:
    return VOCAB.token_bytes.index(b)


def make_session(compiler: ConstraintCompiler, kind: str, source: str = "", choices=(), prefix=b""):
    compiled, _ = compiler.compile(ConstraintSpec(kind, source, tuple(choices)))
    return OutputSession(compiled, prefix)


_EMPTY_VOCAB_COMPILER = None


def language_checker(ebnf: str):
    """``accepts(text) -> bool``: whether the EBNF grammar's language holds ``text`` (xgrammar, empty vocabulary)."""
    import xgrammar as xgr

    global _EMPTY_VOCAB_COMPILER
    if _EMPTY_VOCAB_COMPILER is None:
        _EMPTY_VOCAB_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1)
    compiled = _EMPTY_VOCAB_COMPILER.compile_grammar(xgr.Grammar.from_ebnf(ebnf))

    def accepts(text: str) -> bool:
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return m.accept_string(text.encode("utf-8")) and m.is_completed()

    return accepts


def warm_every_shard(sv, constraint) -> None:
    """Compile ``constraint`` (a ``pb.Constraint``) on every Step shard worker of the servicer ``sv`` now, as
    its background ``warm`` would: later sessions of it are placed by load alone (tests that need sessions
    on the workers)."""
    spec = ConstraintSpec(kind=constraint.kind or None, source=constraint.source, choices=tuple(constraint.choices),
                          wrapper=constraint.wrapper)
    compiled, _ = sv._compiler.compile(spec)
    for shard in sv._remote:
        with sv._lock:
            sv._warming[shard.index] = compiled.key
        sv._warm(sv._epoch, shard, compiled.key, constraint.kind or None, sv._grammar_text(compiled))
        assert compiled.key in sv._compiled_on[shard.index]
