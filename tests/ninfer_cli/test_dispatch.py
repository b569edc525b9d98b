"""The ``ninfer`` console script (ninfer_cli): server commands dispatched lazily, the rest to clients.cli."""
from __future__ import annotations

import io
import sys
import types

import ninfer_cli


def test_serve_forwards_argv(monkeypatch):
    seen = {}
    mod = types.ModuleType("gpu_engine.api.serve")

    def serve_main(argv):
        seen["argv"] = argv
        return 0

    mod.serve_main = serve_main
    # `ninfer serve` goes through ninfer_cli.serve (which adds the optional HTTP gateway) to the engine's
    # serve_main; without --http-port the argv reaches the engine unchanged
    monkeypatch.setitem(sys.modules, "gpu_engine.api.serve", mod)
    argv = ["--port", "50051", "--device", "cpu", "--max-lanes", "4", "--help"]
    assert ninfer_cli.main(["serve", *argv]) == 0
    assert seen["argv"] == argv


def test_serve_entry_point_exists():
    import importlib

    cmd = ninfer_cli.SERVER_COMMANDS["serve"]
    assert callable(getattr(importlib.import_module(cmd.module), cmd.function))


def test_client_commands_go_to_the_client_cli_and_help_lists_serve(capsys):
    out, err = io.StringIO(), io.StringIO()
    assert ninfer_cli.main(["generate", "--regex", "a", "--choice", "b"], stdout=out, stderr=err) == 2
    assert "not allowed with argument" in capsys.readouterr().err  # argparse writes usage errors to sys.stderr
    assert ninfer_cli.main(["nope"], stdout=out, stderr=err) == 2
    usage = capsys.readouterr().err
    assert "serve" in usage and "generate" in usage


def test_client_cli_never_imports_the_server():
    import subprocess

    code = ("import sys, clients.cli; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('gpu_engine', 'constraint_service', 'torch', 'xgrammar')]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
