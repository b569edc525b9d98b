"""Tracing off costs nothing on the engine's hot path (issue 14 (9)): no step span, no span links."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpu_engine.engine import loop
from gpu_engine.engine.loop import Engine

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("from ninfer_common.telemetry import setup_tracing, tracing_active; a = tracing_active(); "
         "setup_tracing('probe'); print(a, tracing_active())")


@pytest.mark.parametrize("env,expected", [({}, "False False"), ({"NINFER_TRACE_CONSOLE": "1"}, "False True")])
def test_tracing_is_active_only_with_an_exporter(env, expected):
    """A fresh process: the default provider and setup_tracing's exporter-less one are inactive."""
    clean = {k: v for k, v in os.environ.items() if k not in ("NINFER_TRACE_CONSOLE", "OTEL_EXPORTER_OTLP_ENDPOINT")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, "PYTHONPATH": str(ROOT), **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split("\n")[0] == expected


def _rows():
    return [SimpleNamespace(trace_context=None), SimpleNamespace(trace_context=None)]


def test_step_builds_no_span_or_links_when_tracing_is_off(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("built with tracing off")

    monkeypatch.setattr(loop, "tracing_active", lambda: False)
    monkeypatch.setattr(loop, "links_to", boom)
    monkeypatch.setattr(loop, "_tracer", SimpleNamespace(start_as_current_span=boom))
    ran = []
    rows = _rows()
    Engine._traced_step_rows(SimpleNamespace(_step_rows=lambda rs, ahead=None: ran.append(rs)), rows)
    assert ran == [rows]


def test_step_span_links_its_rows_when_tracing_is_on(monkeypatch):
    from contextlib import nullcontext

    seen = {}

    def start(name, links):
        seen["name"], seen["links"] = name, links
        return nullcontext(SimpleNamespace(set_attribute=lambda k, v: seen.setdefault(k, v)))

    monkeypatch.setattr(loop, "tracing_active", lambda: True)
    monkeypatch.setattr(loop, "links_to", lambda ctxs: ["link"] * len(list(ctxs)))
    monkeypatch.setattr(loop, "_tracer", SimpleNamespace(start_as_current_span=start))
    ran = []
    rows = _rows()
    Engine._traced_step_rows(SimpleNamespace(_step_rows=lambda rs, ahead=None: ran.append(rs)), rows)
    assert ran == [rows] and seen == {"name": "engine.step", "links": ["link", "link"], "ninfer.batch_size": 2}
