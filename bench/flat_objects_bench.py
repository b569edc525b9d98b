"""Compile time of flat objects by property count: optional vs required (issue 14 defect 8).

For each size n, a schema ``{"type":"object","properties":{"p0".."p<n-1>": integer}}`` (all optional, or
all ``required``) is converted with the emitter's optional-property limit lifted
(``emit.MAX_OPTIONAL_PROPERTIES``) and compiled with xgrammar against the SmolLM2 vocabulary, each size in
its own child process killed after ``--limit`` seconds (``null`` = did not end).  The child also creates
one matcher and accepts a document with every 7th property, and reports the growth of its peak RSS
(``ru_maxrss``) over the compile and that match (0 while below the earlier peak of loading the vocabulary).  This is what ``MAX_OPTIONAL_PROPERTIES`` rests on.

Usage::

    nice -n 10 python bench/flat_objects_bench.py [--optional 250,500,1000,2000] [--required 1000,5000]
        [--limit 60] [--out bench/results/flat_objects.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_common import results_path, run_header  # noqa: E402

MODEL = "~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def child(n: int, required: bool, model: str) -> dict:
    """Compile + one match in this process; returns seconds and peak-RSS growth (MiB)."""
    import resource
    import time

    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.json_schema import emit
    from constraint_service.types import ConstraintSpec
    from constraint_service.vocab import Vocabulary
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    emit.MAX_OPTIONAL_PROPERTIES = 10 ** 9
    vocab = Vocabulary.from_any(load_vocabulary_from_gguf(str(Path(model).expanduser())))
    c = ConstraintCompiler(vocab, compile_timeout_s=10 ** 6)
    c.compile(ConstraintSpec("grammar", 'root ::= "warm"'))  # vocabulary index built outside the timing
    props = {f"p{i}": {"type": "integer"} for i in range(n)}
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = list(props)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    compiled, _ = c.compile(ConstraintSpec("json_schema", json.dumps(schema)))
    t1 = time.perf_counter()
    step = 1 if required else 7
    doc = "{" + ",".join(f'"p{i}":{i % 5}' for i in range(0, n, step)) + "}"
    m = compiled.new_matcher()
    ok = m.accept_bytes(doc.encode()) and m.is_completed()
    t2 = time.perf_counter()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(compile_s=round(t1 - t0, 3), match_s=round(t2 - t1, 3), match_ok=ok,
                peak_rss_growth_mib=round((rss1 - rss0) / 1024, 1), grammar_bytes=compiled.memory_size_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optional", default="250,500,1000,2000")
    ap.add_argument("--required", default="1000,5000")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds per size before the child is killed")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        n, req = a.child.split(":")
        print(json.dumps(child(int(n), req == "required", a.model)))
        return
    rows = []
    for mode, sizes in (("optional", a.optional), ("required", a.required)):
        for n in [int(x) for x in sizes.split(",") if x]:
            cmd = [sys.executable, __file__, "--child", f"{n}:{mode}", "--model", a.model]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.limit, check=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = dict(compile_s=None, note=f"did not end within {a.limit:g} s (killed)")
            rows.append(dict(mode=mode, properties=n, **row))
            print(json.dumps(rows[-1]), flush=True)
    res = dict(**run_header("cpu", model=a.model, limit_s=a.limit), results=rows)
    p = results_path("flat_objects", "cpu", a.out)
    p.write_text(json.dumps(res, indent=1) + "\n")
    print(p)


if __name__ == "__main__":
    main()
