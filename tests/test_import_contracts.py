"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and a deliberate violation breaks them.

``make test`` (and so ``.ci/run``) runs ``lint-imports`` before pytest; this test shows the
check is live: on a temporary copy of the packages with one wrong-way import added, it fails.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ninfer", "ninfer_common", "ninfer_cli", "clients", "gpu_engine", "constraint_service", "shared_memory")
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install -e .[test])")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=600)


def _copy(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyi"))
    return tmp_path


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return _copy(tmp_path_factory.mktemp("contracts"))


def test_contracts_hold(tree):
    r = _lint(tree)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("clients/cli.py", "import gpu_engine.engine.loop", "The client library depends only on"),
    ("gpu_engine/engine/__init__.py", "import constraint_service.server", "never import each other"),
    ("ninfer_common/errors.py", "import xgrammar", "Only the constraint sidecar imports xgrammar"),
    ("shared_memory/ring.py", "import clients", "imports the client library"),
])
def test_a_deliberate_violation_fails(tmp_path, module, line, contract):
    root = _copy(tmp_path)
    path = root / module
    if not path.exists():  # layout moved: put the bad import in the package's __init__
        path = root / module.split("/")[0] / "__init__.py"
    path.write_text(path.read_text() + f"\n{line}  # deliberate violation\n")
    r = _lint(root)
    assert r.returncode != 0
    broken = [ln for ln in r.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(contract in ln for ln in broken), r.stdout[-4000:]
