"""Generate the Python protobuf/gRPC stubs under ``ninfer/`` from ``proto/``.

Usage: ``python tools/gen_protos.py [--out DIR]`` (default: the repo root).
The test ``tests/test_protos_fresh.py`` regenerates into a temp dir and fails
when the committed stubs differ.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ["ninfer/v1/generation.proto", "ninfer/constraint/v1/constraint.proto"]


def generate(out: Path) -> list[Path]:
    """Run protoc (grpc_tools) for every proto; returns the files written."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for rel in PROTOS:
        rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--python_out={out}", f"--pyi_out={out}",
                          f"--grpc_python_out={out}", str(ROOT / "proto" / rel)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {rel} (exit {rc})")
        stem = rel[: -len(".proto")]
        written += [out / f"{stem}_pb2.py", out / f"{stem}_pb2.pyi", out / f"{stem}_pb2_grpc.py"]
    for pkg in {p.parent for p in written} | {out / "ninfer", out / "ninfer" / "constraint"}:
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated protobuf stubs (tools/gen_protos.py)."""\n' if pkg != out / "ninfer" else "")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    for p in generate(args.out):
        print(p.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
