"""Kubernetes manifests (deploy/k8s), validated offline.

Schema: ``kubernetes-validate`` (PyPI; bundles the Kubernetes OpenAPI schemas, strict mode rejects
unknown fields) against the first release with sidecar containers on by default (1.29) and the newest
it knows. Semantics: several replicas behind the Services, the sidecar as a restartable init container
sharing memory-backed ``/dev/shm`` and its socket directory with the engine, gRPC probes, non-root.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def resources() -> dict[tuple[str, str], dict]:
    out = {}
    for p in MANIFESTS:
        for doc in yaml.safe_load_all(p.read_text()):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def pod_spec() -> dict:
    return resources()[("Deployment", "ninfer")]["spec"]["template"]["spec"]


def containers() -> tuple[dict, dict]:
    """(sidecar, engine) container specs."""
    spec = pod_spec()
    (sidecar,) = [c for c in spec.get("initContainers", []) if c["name"] == "constraint-sidecar"]
    (engine,) = [c for c in spec["containers"] if c["name"] == "engine"]
    return sidecar, engine


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_manifests_pass_strict_schema_validation(version: str) -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a test dependency")
    import kubernetes_validate.utils as kv

    if version == "latest":
        version = kv.latest_version()
    assert MANIFESTS, "no manifests under deploy/k8s"
    p = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--no-warn", "-k", version,
                        *map(str, MANIFESTS)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_kustomization_builds_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == [p.name for p in MANIFESTS]
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed (the resource list was still checked)")
    p = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(p.stdout) if d}
    assert built == set(resources())


def test_several_replicas_behind_services_that_select_them() -> None:
    res = resources()
    dep = res[("Deployment", "ninfer")]
    assert dep["spec"]["replicas"] >= 2
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    _, engine = containers()
    port_names = {p["name"]: p["containerPort"] for p in engine["ports"]}
    services = [d for (kind, _), d in res.items() if kind == "Service"]
    assert any(s["spec"].get("clusterIP") == "None" for s in services), "a headless Service for round_robin"
    for s in services:
        assert s["spec"]["selector"].items() <= labels.items(), s["metadata"]["name"]
        for p in s["spec"]["ports"]:
            assert p["targetPort"] in port_names or p["targetPort"] in port_names.values(), p
    pdb = res[("PodDisruptionBudget", "ninfer")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_sidecar_is_a_sidecar_container_sharing_shm_and_socket_with_the_engine() -> None:
    spec = pod_spec()
    sidecar, engine = containers()
    assert sidecar.get("restartPolicy") == "Always", "the sidecar must be a restartable init container"
    volumes = {v["name"]: v for v in spec["volumes"]}

    def mounts(c: dict) -> dict[str, str]:
        return {m["mountPath"]: m["name"] for m in c["volumeMounts"]}

    for c in (sidecar, engine):
        shm = mounts(c).get("/dev/shm")
        assert shm and volumes[shm]["emptyDir"].get("medium") == "Memory", f"{c['name']}: /dev/shm not in memory"
    assert mounts(sidecar)["/dev/shm"] == mounts(engine)["/dev/shm"], "engine and sidecar need one /dev/shm"
    sock = flag(sidecar["command"] + sidecar.get("args", []), "--socket")
    sock_dir = str(Path(sock).parent)
    assert mounts(sidecar).get(sock_dir) and mounts(sidecar)[sock_dir] == mounts(engine).get(sock_dir), sock_dir
    assert "emptyDir" in volumes[mounts(sidecar)[sock_dir]]
    assert flag(engine["command"] + engine["args"], "--sidecar-socket") == sock, "engine must use the sidecar's socket"


def test_probes_run_as_non_root_and_config_comes_from_the_configmap() -> None:
    spec = pod_spec()
    sidecar, engine = containers()
    grpc_port = next(p["containerPort"] for p in engine["ports"] if p["name"] == "grpc")
    assert grpc_port == int(flag(engine["args"], "--port"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["grpc"]["port"] == grpc_port, probe
    for probe in ("startupProbe", "livenessProbe"):
        cmd = sidecar[probe]["exec"]["command"]
        assert "grpc_health.v1" in cmd[-1] and f"unix://{flag(sidecar['args'], '--socket')}" in cmd[-1], cmd
    sc = spec["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] != 0
    for c in (sidecar, engine):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert "ALL" in c["securityContext"]["capabilities"]["drop"]
        refs = {e["configMapRef"]["name"] for e in c.get("envFrom", [])}
        assert refs and all(("ConfigMap", r) in resources() for r in refs), c["name"]
    metrics = next(p["containerPort"] for p in engine["ports"] if p["name"] == "metrics")
    assert metrics == int(flag(engine["args"], "--metrics-port"))
    annotations = resources()[("Deployment", "ninfer")]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics)


def _serve_parser():
    try:
        from gpu_engine.serve import build_parser
    except ImportError:  # the engine's api package after the issue-9 layout
        from gpu_engine.api.serve import build_parser
    return build_parser()


def test_engine_accepts_the_deployments_arguments() -> None:
    _, engine = containers()
    assert engine["command"][:2] == ["ninfer", "serve"]
    args = _serve_parser().parse_args(engine["args"])
    assert args.port == int(flag(engine["args"], "--port"))
