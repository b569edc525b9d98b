"""CI-fast sample of the JSON Schema benchmark: >= 500 dev schemas across all subsets plus the whole
JSON Schema Test Suite file; 0 soundness violations (the dataset's invalid instances and, issue 13, invalid
instances derived by mutation from the valid ones, judged by `jsonschema`) and no internal errors; a fuzz
sample (random walks through the masks of the real SmolLM2 vocabulary) with 0 failures."""
import collections
import json
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "..", "shared", "data")
DEV = os.path.join(DATA, "jsonschemabench-maskbench-dev.jsonl.gz")
SUITE = os.path.join(DATA, "json-schema-test-suite.jsonl.gz")

sys.path.insert(0, ROOT)
from bench.jsonschema_bench import Fuzzer, evaluate_record, load_records, subset_of  # noqa: E402
from constraint_service.json_schema import json_schema_to_ebnf  # noqa: E402

MUTATIONS = 20  # derived instances per valid instance
MODEL = os.path.expanduser("~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def _stratified(recs, n, seed=0):
    by = collections.defaultdict(list)
    for r in recs:
        by[subset_of(r)].append(r)
    rng = random.Random(seed)
    out = []
    per = max(1, n // len(by))
    for s in sorted(by):
        items = by[s]
        out.extend(rng.sample(items, min(per, len(items))))
    rest = [r for r in recs if r not in out]
    out.extend(rng.sample(rest, max(0, n - len(out))))
    return out


def _check(rows):
    errors = [r for r in rows if r["status"] == "error"]
    assert not errors, errors[:3]
    viol = [(r["id"], r["violations"]) for r in rows if r.get("invalid_accepted") or r.get("mutants_accepted")]
    assert not viol, viol[:3]


@pytest.fixture(scope="module")
def dev_sample():
    recs = _stratified(load_records(DEV), 520)
    return recs, [evaluate_record(r, mutations=MUTATIONS)[0] for r in recs]


@pytest.mark.skipif(not os.path.exists(DEV), reason="shared data not present")
def test_dev_sample_sound(dev_sample):
    recs, rows = dev_sample
    assert len(recs) >= 500
    assert len({subset_of(r) for r in recs}) == len({subset_of(r) for r in load_records(DEV)})
    _check(rows)
    assert sum(r["status"] == "accepted" for r in rows) > 0
    # the mutation check must have teeth: many derived instances that the oracle calls invalid
    assert sum(r.get("mutants_invalid", 0) for r in rows) >= 1000


@pytest.mark.skipif(not (os.path.exists(DEV) and os.path.exists(MODEL)), reason="shared data or model not present")
def test_dev_fuzz_sample(dev_sample):
    """50 accepted schemas x 1 walk (256 tokens): every completed output validates with `jsonschema`."""
    recs, rows = dev_sample
    acc = [r for r, row in zip(recs, rows) if row["status"] == "accepted"]
    picked = random.Random(7).sample(acc, 50)
    fz = Fuzzer(MODEL, 256, seed=0)
    total = collections.Counter()
    bad = []
    for r in picked:
        ebnf = json_schema_to_ebnf(json.dumps(r["schema"], ensure_ascii=False), expand_repetitions=True)
        res = fz.walks(r["schema"], ebnf, 1, key=r["id"])
        total.update({k: v for k, v in res.items() if isinstance(v, int)})
        if res["failures"]:
            bad.append((r["id"], res.get("examples")))
    assert not bad, bad[:3]
    assert total["walks"] == 50 and total["completed"] >= 25, dict(total)


@pytest.mark.skipif(not os.path.exists(SUITE), reason="shared data not present")
def test_whole_test_suite_sound():
    rows = [evaluate_record(r, mutations=MUTATIONS)[0] for r in load_records(SUITE)]
    _check(rows)
    assert sum(r.get("mutants_invalid", 0) for r in rows) > 0
    over = [(r["id"], r.get("misses")) for r in rows if r.get("valid_accepted", 0) < r.get("valid_total", 0)]
    assert not over, over[:3]  # no over-constrained schema (issue 13)


def test_harness_format_classes():
    """Dataset-valid instances that the contract deliberately refuses are classified from the data with
    `jsonschema`, never counted as misses or passes: `format` valid only as an annotation (2020-12 default),
    hostname A-labels (outside the generation form); leap seconds are valid for the oracle."""
    def row(schema, data):
        return evaluate_record({"file": "t/x.json", "description": "d", "schema": schema,
                                "tests": [{"data": data, "valid": True}]}, mutations=0)[0]
    r = row({"format": "email"}, "2962")
    assert (r["valid_format_asserted"], r["valid_total"], r["invalid_accepted"]) == (1, 0, 0)
    r = row({"type": "string", "format": "hostname"}, "xn--qmbc")
    assert (r["valid_outside_form"], r["valid_total"]) == (1, 0)
    r = row({"type": "string", "format": "hostname"}, "xn")
    assert (r["valid_outside_form"], r["valid_total"], r["valid_accepted"]) == (0, 1, 1)
    for ok, t in [(True, "23:59:60Z"), (True, "15:59:60.5-08:00"), (False, "23:58:60Z"), (False, "23:59:60+01:00")]:
        r = row({"type": "string", "format": "time"}, t)
        assert (r["valid_total"], r["valid_accepted"], r["valid_format_asserted"]) == ((1, 1, 0) if ok else (0, 0, 1))


def test_mutation_check_catches_a_loose_grammar():
    """The mutation check on its own: a grammar that ignores a declared property's type (the issue-13
    failure mode) is caught through mutants the dataset's instances would not have exercised."""
    import xgrammar as xgr
    from bench.jsonschema_bench import mutation_soundness
    schema = {"type": "object", "properties": {"complexity": {"type": "object", "additionalProperties": {
        "type": "object", "properties": {"threshold": {"type": "integer"}}}}}}
    loose = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1).compile_builtin_json_grammar()
    res = mutation_soundness(schema, loose, [{"complexity": {"LargeClass": {}}}], 200, "t")
    assert res["mutants_accepted"] > 0
    exact = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1).compile_grammar(
        json_schema_to_ebnf(json.dumps(schema)))
    res = mutation_soundness(schema, exact, [{"complexity": {"LargeClass": {}}}], 200, "t")
    assert res["mutants_invalid"] > 0 and res["mutants_accepted"] == 0
