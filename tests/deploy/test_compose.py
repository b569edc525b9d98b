"""The compose stack, its Dockerfile, Prometheus config and Grafana provisioning, checked offline.

The compose file is validated against the Compose Specification's JSON schema (vendored by
check-jsonschema), and with ``docker compose config`` where the compose plugin exists; the
operational rules (loopback ports, non-root, restart policy, health checks, pinned CPU torch, GPU
reservation, scrape target = metrics port) are asserted on the parsed YAML.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
ENGINES = ("ninfer-cpu", "ninfer-gpu")
LOOPBACK_PORT = re.compile(r"^127\.0\.0\.1:\d+:\d+$")  # HOST_IP:HOST_PORT:CONTAINER_PORT after interpolation


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate_defaults(value: str) -> str:
    """``${VAR:-default}`` -> ``default``: the value compose uses when nothing is configured."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", value)


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def dockerfile_instructions(keyword: str) -> list[str]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [ln.split(None, 1)[1] for ln in text.splitlines() if ln.upper().startswith(keyword + " ")]


def test_compose_file_matches_the_compose_spec() -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is a test dependency")
    p = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                        str(COMPOSE)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_docker_compose_config_accepts_each_profile(profile: str) -> None:
    try:
        ok = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("the docker compose plugin is not installed (the schema test above still runs)")
    p = subprocess.run(["docker", "compose", "--profile", profile, "config", "--quiet"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_every_published_port_is_loopback_unless_configured() -> None:
    for name, svc in compose()["services"].items():
        for port in svc.get("ports", []):
            assert isinstance(port, str) and LOOPBACK_PORT.match(interpolate_defaults(port)), \
                f"{name} publishes {port!r} beyond loopback by default"


def test_every_service_restarts_and_engines_run_unprivileged_with_health_checks() -> None:
    services = compose()["services"]
    assert set(ENGINES) <= set(services)
    for name, svc in services.items():
        assert svc.get("restart") in ("unless-stopped", "always", "on-failure"), f"{name}: no restart policy"
    for name in ENGINES:
        svc = services[name]
        uid = str(svc.get("user", "0")).split(":")[0]
        assert uid not in ("", "0", "root"), f"{name} runs as root"
        assert "ALL" in svc.get("cap_drop", []), name
        test = svc["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"] and "grpc_health.v1" in test[3], test
        assert "ninfer" in svc["networks"]["default"]["aliases"], name
    assert services["ninfer-cpu"]["profiles"] == ["cpu"] and services["ninfer-gpu"]["profiles"] == ["gpu"]
    assert (ROOT / ".env").read_text().count("COMPOSE_PROFILES=cpu") == 1, "plain `docker compose up` = CPU"


def test_cpu_profile_pins_the_cpu_torch_wheel_and_gpu_profile_reserves_a_gpu() -> None:
    services = compose()["services"]
    cpu_args = services["ninfer-cpu"]["build"]["args"]
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+\+cpu", cpu_args["TORCH_SPEC"]), cpu_args
    assert cpu_args["TORCH_INDEX_URL"].rstrip("/").endswith("/cpu"), cpu_args
    assert flag(services["ninfer-cpu"]["command"], "--device") == "cpu"
    gpu = services["ninfer-gpu"]
    assert flag(gpu["command"], "--device") == "cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), devices
    # The Dockerfile's default build is the same pinned CPU wheel (a plain `docker build` never pulls CUDA).
    defaults = dict(a.split("=", 1) for a in dockerfile_instructions("ARG") if "=" in a)
    assert defaults["TORCH_SPEC"].strip('"') == cpu_args["TORCH_SPEC"]
    assert defaults["TORCH_INDEX_URL"].strip('"') == cpu_args["TORCH_INDEX_URL"]


def test_dockerfile_runs_unprivileged_and_checks_health_like_compose() -> None:
    users = dockerfile_instructions("USER")
    assert users and not users[-1].startswith(("root", "0")), users
    hc = dockerfile_instructions("HEALTHCHECK")
    assert len(hc) == 1
    exec_form = json.loads(hc[0][hc[0].index("CMD") + 3:].strip())
    assert exec_form == compose()["services"]["ninfer-cpu"]["healthcheck"]["test"][1:]
    cmd = json.loads(dockerfile_instructions("CMD")[-1])
    assert flag(cmd, "--port") == "50051"


def test_prometheus_scrapes_the_engines_metrics_port() -> None:
    services = compose()["services"]
    prom = yaml.safe_load(PROMETHEUS.read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    for name in ENGINES:
        port = flag(services[name]["command"], "--metrics-port")
        assert f"ninfer:{port}" in targets, (name, port, targets)
        assert port in [str(p) for p in services[name]["expose"]]
    mount = services["prometheus"]["volumes"][0].split(":")
    assert (ROOT / mount[0]).resolve() == PROMETHEUS and mount[1] in shlex.join(services["prometheus"]["command"])


def test_grafana_provisions_the_dashboard_and_its_data_source() -> None:
    svc = compose()["services"]["grafana"]
    mounts = {(ROOT / v.split(":")[0]).resolve(): v.split(":")[1] for v in svc["volumes"]}
    assert mounts[(GRAFANA / "provisioning").resolve()] == "/etc/grafana/provisioning"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dashboards.yml").read_text())["providers"]
    assert mounts[(GRAFANA / "dashboards").resolve()] in {p["options"]["path"] for p in providers}
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "datasources.yml").read_text())
    uids = {d["uid"]: d for d in sources["datasources"]}
    assert uids["prometheus"]["url"] == "http://prometheus:9090"
    dash = json.loads((GRAFANA / "dashboards" / "ninfer.json").read_text())
    assert dash["uid"] and dash["title"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels:
        assert p["datasource"]["uid"] in uids and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] in uids and t["expr"].count("(") == t["expr"].count(")"), t


def dashboard_metrics() -> set[str]:
    """Metric families the dashboard queries (``_bucket`` etc. stripped)."""
    dash = json.loads((GRAFANA / "dashboards" / "ninfer.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    names = {m for e in exprs for m in re.findall(r"\bninfer_[a-z0-9_]+", e)}
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_dashboard_covers_the_operator_questions() -> None:
    """Throughput, TTFT/ITL, queue, mask wait, cache outcomes, rejections by kind, sidecar restarts."""
    used = dashboard_metrics()
    for needed in ("ninfer_generated_tokens_total", "ninfer_time_to_first_token_seconds",
                   "ninfer_inter_token_latency_seconds", "ninfer_queue_depth", "ninfer_sidecar_wait_seconds",
                   "ninfer_constraint_cache_total", "ninfer_requests_rejected_total", "ninfer_sidecar_restarts_total"):
        assert needed in used, f"dashboard lacks {needed}"
    dash = json.loads((GRAFANA / "dashboards" / "ninfer.json").read_text())
    rejected = [t for p in dash["panels"] for t in p.get("targets", []) if "requests_rejected" in t["expr"]]
    assert any("by (kind)" in t["expr"] for t in rejected), "rejections must be broken down by kind"
