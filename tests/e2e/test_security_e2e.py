"""End-to-end: TLS, mutual TLS and bearer-token auth on the public port (real stack, real certificates).

Certificates come from the ``openssl`` command (a throwaway CA, a server certificate for 127.0.0.1
and a client certificate); the test skips only where openssl is absent.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ninfer.v1 import generation_pb2 as pb
from ninfer.v1 import generation_pb2_grpc as pb_grpc

from .conftest import MODEL, Stack, free_port

API_KEY = "test-key-0123456789"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl command not installed")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=ninfer-test-ca",
             cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=ninfer-test-{name}",
                 cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory):
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL})")
    d = tmp_path_factory.mktemp("pki")
    make_pki(d)
    s = Stack(free_port(), extra=["--tls-cert", str(d / "server.pem"), "--tls-key", str(d / "server.key"),
                                  "--tls-client-ca", str(d / "ca.pem"), "--api-key", API_KEY])
    s.pki = d
    s.start()
    yield s
    s.stop()


def channel(stack, *, client_cert: bool = True) -> grpc.Channel:
    d = stack.pki
    creds = grpc.ssl_channel_credentials(
        root_certificates=(d / "ca.pem").read_bytes(),
        private_key=(d / "client.key").read_bytes() if client_cert else None,
        certificate_chain=(d / "client.pem").read_bytes() if client_cert else None)
    return grpc.secure_channel(stack.target, creds)


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def test_mutual_tls_with_the_key_serves_constrained_generation(tls_stack) -> None:
    with channel(tls_stack) as ch:
        stub = pb_grpc.GenerationStub(ch)
        n = stub.CountTokens(pb.CountTokensRequest(prompt="hello there"), metadata=bearer(API_KEY), timeout=60)
        assert n.num_tokens > 0
        req = pb.GenerateRequest(prompt="Pick one:", max_tokens=8,
                                 constraint=pb.OutputConstraint(choice=pb.Choice(options=["yes", "no"])))
        msgs = list(stub.Generate(req, metadata=bearer(API_KEY), timeout=300))
    text = "".join(m.text for m in msgs)
    assert msgs[-1].finish.finish_reason == pb.FINISH_REASON_STOP and text in ("yes", "no"), msgs[-1]


@pytest.mark.parametrize("metadata", [None, bearer("wrong-key"), [("authorization", API_KEY)]],
                         ids=["no-key", "wrong-key", "no-bearer-scheme"])
def test_missing_or_wrong_key_is_unauthenticated_on_every_rpc(tls_stack, metadata) -> None:
    with channel(tls_stack) as ch:
        stub = pb_grpc.GenerationStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.CountTokens(pb.CountTokensRequest(prompt="hi"), metadata=metadata, timeout=60)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.Generate(pb.GenerateRequest(prompt="hi", max_tokens=2), metadata=metadata, timeout=60))
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_checks_need_no_key(tls_stack) -> None:
    with channel(tls_stack) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60)
    assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_clients_without_a_certificate_or_without_tls_are_refused(tls_stack) -> None:
    for ch in (channel(tls_stack, client_cert=False), grpc.insecure_channel(tls_stack.target)):
        with ch:
            with pytest.raises(grpc.RpcError) as ei:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=20)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
