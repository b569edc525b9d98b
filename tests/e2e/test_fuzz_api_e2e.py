"""Reduced fuzz run of the public gRPC API (issue 14 acceptance; the 10,000-case run is ``tools/fuzz_api.py``,
results in ``bench/results/fuzz_api_*.json``).

About 200 hypothesis-generated cases against the real stack (engine + sidecar processes): random bytes as
the serialized Generate / CountTokens request, messages with hostile fields (NaN / huge / negative numbers,
invalid UTF-8, broken regex / GBNF / JSON Schema / tool schemas, deep nesting, bad roles), requests built to
be invalid, and valid ones. Every invalid one must get INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a size
limit) with a structured ErrorDetail, every valid one must succeed, nothing may time out, and the server
must stay alive and healthy. The big cases (huge enums, 5,000 properties) are left out here.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))


@pytest.mark.timeout(900)
def test_reduced_fuzz_run_keeps_the_contract(stack):
    import fuzz_api

    tally = fuzz_api.run(stack.target, n=200, seed=0, deadline_s=120.0, heavy=False)
    assert tally.cases >= 150, tally.by_label
    assert not tally.failures, "\n".join(f"{f['label']} {f['rpc']} {f['outcome']}: {f['problem']}"
                                         for f in tally.failures[:20])
    assert stack.proc.poll() is None and fuzz_api.healthy(stack.target)
    # every family was exercised, and both outcomes were seen
    assert all(tally.by_label[k] for k in ("raw_bytes", "hostile_fields", "valid_generate")), tally.by_label
    assert tally.outcomes["invalid:INVALID_ARGUMENT"] and tally.outcomes["valid:OK"], tally.outcomes
