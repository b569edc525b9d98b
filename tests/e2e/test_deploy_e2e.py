"""End-to-end checks of the deployment files against real processes.

* The health-check one-liner of the Dockerfile / compose file, run against the real engine.
* The sidecar container's exec probe (Kubernetes), run against a real constraint sidecar.
* Every metric the Grafana dashboard queries is exported by the real engine's ``/metrics`` after real
  traffic, except the ones listed in ``PENDING`` (named by the dashboard, exported by the telemetry
  work of issue 14); a pending name the engine already exports fails the test so the list shrinks.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from .conftest import ROOT, free_port

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")

PENDING: set[str] = set()  # dashboard metrics not exported yet (none now)
# Exported only by a server started with speculative decoding (the session stack has none).
NEEDS_SPECULATIVE_SERVER = {"ninfer_draft_tokens_total", "ninfer_accepted_draft_tokens_total"}


def compose_health_command() -> list[str]:
    test = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["ninfer-cpu"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


def sidecar_probe_command() -> list[str]:
    dep = yaml.safe_load((ROOT / "deploy" / "k8s" / "deployment.yaml").read_text())
    (sidecar,) = [c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == "constraint-sidecar"]
    return sidecar["livenessProbe"]["exec"]["command"]


def run_probe(cmd: list[str], old: str, new: str) -> int:
    assert cmd[0] == "python" and old in cmd[-1], cmd
    argv = [sys.executable, *cmd[1:-1], cmd[-1].replace(old, new)]
    return subprocess.run(argv, capture_output=True, timeout=60).returncode


def test_compose_health_check_passes_on_a_serving_engine_and_fails_on_a_dead_port(stack) -> None:
    cmd = compose_health_command()
    assert run_probe(cmd, "127.0.0.1:50051", stack.target) == 0
    assert run_probe(cmd, "127.0.0.1:50051", f"127.0.0.1:{free_port()}") != 0


def test_sidecar_exec_probe_follows_the_real_sidecar(tmp_path) -> None:
    sock = tmp_path / "c.sock"
    cmd = sidecar_probe_command()
    proc = subprocess.Popen([sys.executable, "-m", "constraint_service", "--socket", str(sock),
                             "--log-level", "WARNING"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while run_probe(cmd, "/run/ninfer/constraint.sock", str(sock)) != 0:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "sidecar never passed its probe"
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert run_probe(cmd, "/run/ninfer/constraint.sock", str(sock)) != 0, "probe passes with the sidecar gone"


def scrape(stack) -> set[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=30).read().decode()
    families = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            name, kind = m.groups()
            families.add(name + ("_total" if kind == "counter" and not name.endswith("_total") else ""))
    return families


def dashboard_metrics() -> set[str]:
    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "ninfer.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"\bninfer_[a-z0-9_]+", e)}


def test_dashboard_queries_metrics_the_engine_exports(stack, client) -> None:
    from clients.errors import RequestRejected

    fresh = uuid.uuid4().hex[:8]  # a grammar no earlier test compiled: the compile histogram gets a sample
    client.generate_text(prompt="Pick:", max_tokens=8, constraint={"choice": [fresh, "other"]}, seed=1)
    client.generate_text(prompt="One two three", max_tokens=8)
    with pytest.raises(RequestRejected):
        client.generate_text(prompt="x", max_tokens=4, constraint={"regex": "(a"})
    exported = scrape(stack)
    used = dashboard_metrics()
    missing = sorted(used - exported - PENDING - NEEDS_SPECULATIVE_SERVER)
    assert not missing, f"dashboard queries metrics the engine does not export: {missing}"
    landed = sorted(PENDING & exported)
    assert not landed, f"now exported, remove from PENDING: {landed}"
    assert NEEDS_SPECULATIVE_SERVER <= used
    assert PENDING <= used, f"PENDING names the dashboard no longer uses: {sorted(PENDING - used)}"
