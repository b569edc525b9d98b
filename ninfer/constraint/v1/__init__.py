"""Generated protobuf stubs (tools/gen_protos.py)."""
