"""Model-free random walks through a schema grammar's token masks (issue 13 fuzz regressions).

The vocabulary is every printable ASCII character as one token plus a stop token, so the walk sees the
grammar byte by byte: a state where no token is allowed before completion is a dead end, and every
completed output must be one JSON document that `jsonschema` accepts, with no repeated key."""
from __future__ import annotations

import json
import random

import jsonschema
import xgrammar as xgr

from constraint_service.json_schema import json_schema_to_ebnf

VOCAB = [bytes([c]) for c in range(32, 127)] + [b""]
EOS = len(VOCAB) - 1
_INFO = xgr.TokenizerInfo(VOCAB, vocab_type=xgr.VocabType.RAW, vocab_size=len(VOCAB), stop_token_ids=[EOS])
_COMPILER = xgr.GrammarCompiler(_INFO, max_threads=1, cache_enabled=False)
_CLOSING = [i for i, t in enumerate(VOCAB) if t and t in b'"}]0']


def oracle(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _loads_unique(text: str):
    def hook(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), ("repeated key", text)
        return dict(pairs)
    return json.loads(text, object_pairs_hook=hook)


def walk_schema(schema, walks: int = 50, max_steps: int = 200, seed: int = 0) -> int:
    """Random walks; raises AssertionError on a dead end, an output `jsonschema` refuses, or a repeated
    key. Returns how many walks completed (each completion is checked)."""
    compiled = _COMPILER.compile_grammar(json_schema_to_ebnf(json.dumps(schema)))
    v = oracle(schema)
    bm = xgr.allocate_token_bitmask(1, len(VOCAB))
    rng = random.Random(seed)
    done = 0
    for _ in range(walks):
        m = xgr.GrammarMatcher(compiled)
        out = bytearray()
        for step in range(max_steps):
            m.fill_next_token_bitmask(bm)
            allowed = [i for i in range(len(VOCAB)) if (int(bm[0, i // 32]) >> (i % 32)) & 1]
            assert allowed, ("dead end", out.decode())
            if EOS in allowed and step > max_steps // 4:
                tok = EOS
            elif step > max_steps // 2 and any(i in allowed for i in _CLOSING) and rng.random() < 0.8:
                tok = rng.choice([i for i in _CLOSING if i in allowed])
            else:
                tok = rng.choice(allowed)
            assert m.accept_token(tok)
            if tok == EOS:
                value = _loads_unique(out.decode())
                assert v.is_valid(value), ("invalid output", out.decode())
                done += 1
                break
            out += VOCAB[tok]
    return done
