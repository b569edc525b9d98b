"""bench/convert_bench.py: both trees convert the same schemas in worker processes, and a result that differs
between them is reported (a stand-in baseline tree whose converter returns one fixed grammar)."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCHEMAS = [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
           {"type": "string", "pattern": "^[a-c]{2,4}$"},
           {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
           {"type": "string", "format": "email", "minLength": 5, "maxLength": 40}]


def test_a_differing_baseline_is_reported(tmp_path):
    data = tmp_path / "d.jsonl.gz"
    with gzip.open(data, "wt") as f:
        for i, s in enumerate(SCHEMAS):
            f.write(json.dumps({"id": f"s{i}", "schema": s}) + "\n")
    fake = tmp_path / "fake" / "constraint_service"
    (fake / "json_schema").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "errors.py").write_text("class ConstraintError(Exception):\n    pass\n")
    (fake / "json_schema" / "__init__.py").write_text(
        "def json_schema_to_ebnf(src):\n    return 'root ::= \"x\"' if 'email' not in src else 'root ::= \"@\"'\n")
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "convert_bench.py"), "--data", str(data), "--chunk", "3",
                        "--baseline-tree", str(tmp_path / "fake"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["differing"] == ["s0", "s1", "s2", "s3"]
    assert r["trees"]["this"]["n"] == r["trees"]["baseline"]["n"] == 4
    assert len(r["per_schema_ms"]["this"]) == 4 and out.with_suffix(".png").exists()
