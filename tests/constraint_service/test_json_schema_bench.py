"""CI-fast sample of the JSON Schema benchmark: >= 500 dev schemas across all subsets plus the whole
JSON Schema Test Suite file; 0 soundness violations and no internal errors."""
import collections
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "..", "shared", "data")
DEV = os.path.join(DATA, "jsonschemabench-maskbench-dev.jsonl.gz")
SUITE = os.path.join(DATA, "json-schema-test-suite.jsonl.gz")

sys.path.insert(0, ROOT)
from bench.jsonschema_bench import evaluate_record, load_records, subset_of  # noqa: E402


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
    viol = [(r["id"], r["violations"]) for r in rows if r.get("invalid_accepted")]
    assert not viol, viol[:3]


@pytest.mark.skipif(not os.path.exists(DEV), reason="shared data not present")
def test_dev_sample_sound():
    recs = _stratified(load_records(DEV), 520)
    assert len(recs) >= 500
    assert len({subset_of(r) for r in recs}) == len({subset_of(r) for r in load_records(DEV)})
    rows = [evaluate_record(r)[0] for r in recs]
    _check(rows)
    assert sum(r["status"] == "accepted" for r in rows) > 0


@pytest.mark.skipif(not os.path.exists(SUITE), reason="shared data not present")
def test_whole_test_suite_sound():
    rows = [evaluate_record(r)[0] for r in load_records(SUITE)]
    _check(rows)
