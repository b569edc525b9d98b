"""Conversion is a pure function of the schema text (issue 13): no cache keyed by object identity.

The reducer used to memoise `allOf`/`$ref` merges under `id()` of temporary nodes that were then freed;
a reused id handed one node another node's merge, so repeated conversions in one process gave
different grammars, some accepting instances with a wrongly typed property."""
import gc
import gzip
import hashlib
import json
import os

import pytest
import xgrammar as xgr

from constraint_service.errors import ConstraintError
from constraint_service.json_schema import json_schema_to_ebnf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV = os.path.join(ROOT, "..", "shared", "data", "jsonschemabench-maskbench-dev.jsonl.gz")
_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)


def _digest(src: str) -> str:
    try:
        return hashlib.sha256(json_schema_to_ebnf(src).encode("utf-8")).hexdigest()
    except ConstraintError as e:  # a rejection must be deterministic too (kind, pointer, message)
        return f"{e.kind}|{e.location}|{e.message}"


def _garbage(seed: int):
    """Allocate and free many small objects so that freed ids are reused by the next conversion."""
    junk = [{"k": [seed, i], "v": (i, str(i))} for i in range(2000)]
    del junk
    gc.collect()


def _coffeelint_like() -> dict:
    """A draft-04 linter config in the shape of coffeelint's schema: many rules `allOf: [$ref base]`,
    some adding typed properties (the shape that produced 2-3 grammars in 3 conversions)."""
    rules = {}
    for i in range(40):
        rule = {"description": f"rule {i}", "allOf": [{"$ref": "#/definitions/base"}]}
        if i % 3 == 0:
            rule["properties"] = {"value": {"type": "integer"}}
        rules[f"rule_{i}"] = rule
    rules["complexity"] = {
        "type": "object",
        "additionalProperties": {"allOf": [{"$ref": "#/definitions/base"}],
                                 "properties": {"threshold": {"type": "integer"}}},
    }
    return {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
            "additionalProperties": True,
            "definitions": {"base": {"type": "object", "properties": {
                "level": {"type": "string", "enum": ["error", "warn", "ignore"]}}}},
            "properties": rules}


def _accepts(ebnf: str, text: str) -> bool:
    m = xgr.GrammarMatcher(_COMPILER.compile_grammar(ebnf), terminate_without_stop_token=True)
    return bool(m.accept_string(text.encode("utf-8"))) and m.is_completed()


def test_coffeelint_like_typed_property_refused_every_time():
    src = json.dumps(_coffeelint_like())
    digests = set()
    for i in range(6):
        _garbage(i)
        ebnf = json_schema_to_ebnf(src)
        digests.add(hashlib.sha256(ebnf.encode()).hexdigest())
        assert not _accepts(ebnf, '{"complexity":{"LargeClass":{"threshold":"not-an-int"}}}')
        assert not _accepts(ebnf, '{"rule_3":{"value":"x"}}')
        assert _accepts(ebnf, '{"complexity":{"LargeClass":{"threshold":7,"level":"warn"}}}')
    assert len(digests) == 1


def _dev_sources():
    with gzip.open(DEV, "rt", encoding="utf-8") as f:
        return {r["id"]: json.dumps(r["schema"], ensure_ascii=False) for r in map(json.loads, f)}


@pytest.mark.skipif(not os.path.exists(DEV), reason="shared data not present")
@pytest.mark.parametrize("rid", ["JsonSchemaStore---coffeelint", "JsonSchemaStore---nswag", "Github_hard---o77317"])
def test_issue_schemas_convert_identically(rid):
    """The dev schemas named in issue 13 (2-3 different grammars in 3 conversions before the fix)."""
    src = _dev_sources()[rid]
    digests = set()
    for i in range(6):
        _garbage(i)
        digests.add(_digest(src))
    assert len(digests) == 1


def _two_passes(shard: tuple[int, int]) -> list[int]:
    """In ONE process: convert every schema of shard ``k`` of ``n`` once, make garbage (so freed ids are
    reused), convert them all again; return the indices whose grammar (or rejection) differed."""
    k, n = shard
    sources = list(_dev_sources().values())[k::n]
    first = []
    for i, src in enumerate(sources):
        first.append(_digest(src))
        if i % 200 == 0:
            _garbage(i)
    _garbage(-1)
    return [k + n * i for i, src in enumerate(sources) if _digest(src) != first[i]]


@pytest.mark.skipif(not os.path.exists(DEV), reason="shared data not present")
@pytest.mark.timeout(2400)  # ~5 min on an idle 2-core CI box; far longer when the box is shared
def test_every_dev_schema_converts_identically_twice():
    """Every dev schema converted twice in one process, with garbage in between: the same grammar
    (or the same located rejection). The set is split over worker processes (one per core, at most
    2 on CI) only for wall time; each schema's two conversions happen in the same process."""
    import multiprocessing as mp

    n = max(1, min(2, os.cpu_count() or 1))
    with mp.get_context("spawn").Pool(n) as pool:
        differing = sorted(i for part in pool.map(_two_passes, [(k, n) for k in range(n)]) for i in part)
    sources = list(_dev_sources().values())
    assert not differing, [json.loads(sources[k]).get("title", k) for k in differing[:5]]
