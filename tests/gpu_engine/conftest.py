"""Shared set-up for the engine tests.

* Loads ``oracle.py`` (the float64 reference) under a name no other test folder can
  shadow, so test modules can ``import ninfer_tests_gpu_engine_oracle as oracle``.
* Skips ``gpu``-marked tests where CUDA is unavailable (CI).
* ``triton_interpreter``: runs a check script in a subprocess under ``TRITON_INTERPRET=1`` (Triton's CPU
  interpreter), so the CUDA kernels' indexing and arithmetic are checked in CI.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_ORACLE = "ninfer_tests_gpu_engine_oracle"
if _ORACLE not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_ORACLE, Path(__file__).with_name("oracle.py"))
    sys.modules[_ORACLE] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_ORACLE])


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def triton_interpreter():
    """``run(code, marker)``: run ``code`` (``{tests}`` replaced by this folder, so it can import the test
    modules' helpers) with ``TRITON_INTERPRET=1`` and the project on ``PYTHONPATH``; assert it printed
    ``marker`` (the failure shows the tails of its stdout and stderr)."""
    here = Path(__file__).parent
    root = here.parents[1]

    def run(code: str, marker: str) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1",
               "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        r = subprocess.run([sys.executable, "-c", code.format(tests=str(here))], env=env, capture_output=True,
                           text=True, timeout=300)
        assert marker in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]

    return run
