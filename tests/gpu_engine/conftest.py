"""Shared set-up for the engine tests.

* Loads ``oracle.py`` (the float64 reference) under a name no other test folder can
  shadow, so test modules can ``import ninfer_tests_gpu_engine_oracle as oracle``.
* Skips ``gpu``-marked tests where CUDA is unavailable (CI).
"""
import importlib.util
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
