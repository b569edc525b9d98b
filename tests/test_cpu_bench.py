"""bench/cpu_bench.py's bookkeeping: baseline row names per threads and dtype, and per-repeat ratios against
each baseline row (the numbers themselves come from a run on the machine, not from tests)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import cpu_bench as cb  # noqa: E402


def test_baseline_rows_are_named_by_threads_and_dtype() -> None:
    assert cb.hf_kind(0) == "transformers"
    assert cb.hf_kind(1) == "transformers_1t"
    assert cb.hf_kind(0, "bfloat16") == "transformers_bf16"
    assert cb.hf_kind(1, "bfloat16") == "transformers_1t_bf16"
    assert len({cb.hf_kind(n, d) for n in (0, 1, 2) for d in ("float32", "bfloat16", "float16")}) == 9


def test_ratios_are_per_repeat_against_each_baseline_row() -> None:
    def row(kind, rep, tps):
        return {"batch": 8, "kind": kind, "repeat": rep, "tokens_per_s": tps, "loadavg_1min": [1.0, 1.0]}

    rows = [row("transformers", 0, 50.0), row("transformers", 1, 100.0),
            row("transformers_bf16", 0, 80.0), row("transformers_bf16", 1, 40.0),
            row("unconstrained", 0, 100.0), row("unconstrained", 1, 100.0)]
    kinds = ["transformers", "transformers_bf16", "unconstrained"]
    unc = next(s for s in cb.summarise(rows, [8], kinds) if s["kind"] == "unconstrained")
    # per repeat: 100/50 = 2.0 and 100/100 = 1.0 (median 1.5); vs bf16: 1.25 and 2.5 (median 1.875)
    assert unc["ratio_vs_transformers"] == 1.5
    assert unc["ratio_vs_transformers_bf16"] == 1.875
    assert unc["ratio_vs_transformers_bf16_spread"]["min"] == 1.25


def test_engine_dtype_is_read_by_the_engines_own_parser() -> None:
    assert cb.engine_dtype([]) == "float32"  # auto on the CPU
    assert cb.engine_dtype(["--dtype", "bfloat16"]) == "bfloat16"
    assert cb.engine_dtype(["--cpu-threads", "2", "--dtype=bfloat16"]) == "bfloat16"
