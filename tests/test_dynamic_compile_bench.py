"""bench/dynamic_compile_bench.py: the three walks cover every trajectory token, a mask that differs from the
eager one is counted, and bench_common.with_deadline reports results, errors and timeouts."""
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

RECORDS = [
    {"id": "A---1", "schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                               "required": ["a"]}, "tests": [{"data": {"a": 12, "b": "xy"}, "valid": True}]},
    {"id": "B---1", "schema": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
     "tests": [{"data": 5, "valid": False}, {"data": ["y", "x"], "valid": True}]},
    {"id": "C---1", "schema": {"type": "string", "pattern": "^[a-c]{2,4}$"}, "tests": [{"data": "abca", "valid": True}]},
]


def test_walks_cover_every_token_and_masks_agree(tmp_path):
    data = tmp_path / "d.jsonl.gz"
    with gzip.open(data, "wt") as f:
        for r in RECORDS:
            f.write(json.dumps(r) + "\n")
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "dynamic_compile_bench.py"), "--data", str(data),
                        "--limit", "3", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert sorted(row["id"] for row in r["rows"]) == ["A---1", "B---1", "C---1"]
    for row in r["rows"]:
        assert row["tokens"] >= 2
        assert len(row["first_ns"]) == len(row["second_ns"]) == len(row["eager_ns"]) == row["tokens"]
        assert row["mask_diffs"] == 0 and row["eager_error"] is None
    s = r["summary"]
    assert s["mask_diffs"] == 0 and s["cold_dynamic_ms"]["n"] == 3
    assert s["fill_us"]["eager"]["n"] == sum(row["tokens"] for row in r["rows"])


def test_walk_counts_a_differing_mask():
    torch = pytest.importorskip("torch")
    xgr = pytest.importorskip("xgrammar")
    from dynamic_compile_bench import walk

    info = xgr.TokenizerInfo(["a", "b", "</s>"], stop_token_ids=[2])
    g = xgr.GrammarCompiler(info, max_threads=1).compile_grammar('root ::= "a" "b"')
    bm = torch.zeros((1, 1), dtype=torch.int32)
    m = xgr.GrammarMatcher(g)
    masks = []
    for t in (0, 1, 2):
        m.fill_next_token_bitmask(bm, 0)
        masks.append(bm[0].numpy().copy())
        assert m.accept_token(t)
    _, diffs = walk(xgr, g, [0, 1, 2], bm, masks)
    assert diffs == 0
    masks[1] = masks[1] ^ 1  # token "a" flipped at the second position
    _, diffs = walk(xgr, g, [0, 1, 2], bm, masks)
    assert diffs == 1


def test_with_deadline():
    from bench_common import with_deadline

    assert with_deadline(lambda: 7, 5.0)[0::2] == (7, None)
    r, _, err = with_deadline(lambda: 1 / 0, 5.0)
    assert r is None and err.startswith("ZeroDivisionError")
    r, t, err = with_deadline(lambda: time.sleep(3), 0.2)
    assert (r, t, err) == (None, 0.2, "timeout")
