"""The committed stubs under ninfer/ must equal a fresh generation from proto/."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_protos
    finally:
        sys.path.pop(0)
    written = gen_protos.generate(tmp_path)
    assert written, "generator wrote nothing"
    stale = []
    for fresh in written:
        rel = fresh.relative_to(tmp_path)
        committed = ROOT / rel
        if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
            stale.append(str(rel))
    assert not stale, f"stale generated stubs (run `python tools/gen_protos.py`): {stale}"
