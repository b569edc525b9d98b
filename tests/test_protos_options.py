"""Protos are usable from other languages: package options set, google.rpc.Status shipped beside them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
SHIPPED_STATUS = PROTO / "google" / "rpc" / "status.proto"
# Options every client generator needs (buf's FILE_OPTIONS rules name the same ones).
REQUIRED = ("go_package", "java_package", "java_multiple_files", "java_outer_classname", "csharp_namespace",
            "objc_class_prefix", "php_namespace")


def _descriptors():
    from ninfer.constraint.v1 import constraint_pb2
    from ninfer.v1 import generation_pb2

    return {"generation": generation_pb2.DESCRIPTOR, "constraint": constraint_pb2.DESCRIPTOR}


@pytest.mark.parametrize("name", ["generation", "constraint"])
def test_language_package_options_are_set(name: str) -> None:
    opts = _descriptors()[name].GetOptions()
    missing = [o for o in REQUIRED if not opts.HasField(o)]
    assert not missing, f"{name}.proto lacks options {missing}"
    go_path, _, go_name = opts.go_package.partition(";")
    assert go_path.endswith(_descriptors()[name].package.replace(".", "/")), opts.go_package
    assert go_name and go_name.isidentifier(), f"go_package needs an explicit package name: {opts.go_package!r}"
    assert opts.java_package.endswith(_descriptors()[name].package.removeprefix("ninfer")), opts.java_package


def test_shipped_status_proto_is_googleapis_verbatim() -> None:
    """proto/google/rpc/status.proto is the googleapis file the Python runtime decodes the trailer with."""
    from google.rpc import status_pb2

    upstream = Path(status_pb2.__file__).with_name("status.proto")
    if not upstream.exists():
        pytest.skip("googleapis-common-protos installed without its .proto sources")
    assert SHIPPED_STATUS.read_bytes() == upstream.read_bytes(), "refresh proto/google/rpc/status.proto"


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_error_trailer_decodes_with_only_the_shipped_protos(tmp_path: Path) -> None:
    """A non-Python client holding only proto/ can decode google.rpc.Status{details: [ninfer.v1.ErrorDetail]}."""
    import grpc_tools
    from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    wkt = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto (any.proto) as protoc ships it
    rc = protoc.main(["protoc", f"-I{PROTO}", f"-I{wkt}", "--include_imports", f"--descriptor_set_out={out}",
                      "google/rpc/status.proto", "ninfer/v1/generation.proto"])
    assert rc == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    Status = message_factory.GetMessageClass(pool.FindMessageTypeByName("google.rpc.Status"))
    ErrorDetail = message_factory.GetMessageClass(pool.FindMessageTypeByName("ninfer.v1.ErrorDetail"))

    from ninfer.v1 import generation_pb2  # what the server puts in the trailer

    wire = any_pb2.Any()
    wire.Pack(generation_pb2.ErrorDetail(code="INVALID_ARGUMENT", kind="InvalidSchema", message="m", location="/a"))
    from google.rpc import status_pb2

    trailer = status_pb2.Status(code=3, message="m", details=[wire]).SerializeToString()
    st = Status.FromString(trailer)
    assert st.code == 3 and st.details[0].type_url.endswith("/ninfer.v1.ErrorDetail")
    det = ErrorDetail.FromString(st.details[0].value)
    assert (det.kind, det.location) == ("InvalidSchema", "/a")
