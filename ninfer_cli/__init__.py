"""The ``ninfer`` console script: a thin dispatcher over the packages that own each command.

Server commands are looked up in :data:`SERVER_COMMANDS` and imported lazily
(so ``ninfer generate`` never imports torch); everything else goes to the
client CLI (:func:`clients.cli.main`). A new front door adds one entry here
(e.g. ``"gateway": ServerCommand("gateway.serve", "main", "...")``).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Sequence, TextIO

__all__ = ["SERVER_COMMANDS", "ServerCommand", "main"]


@dataclass(frozen=True)
class ServerCommand:
    """A subcommand run in this process by ``module.function(argv) -> exit code``."""

    module: str
    function: str
    help: str


#: Subcommands that start a server, by name.
SERVER_COMMANDS: dict[str, ServerCommand] = {
    "serve": ServerCommand("gpu_engine.api.serve", "serve_main",
                           "start the constraint sidecar and the engine (see `ninfer serve --help`)"),
}


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None,
         stdin: TextIO | None = None) -> int:
    """Runs ``ninfer``.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
        stdout, stderr, stdin: streams for the client commands (default the ``sys`` ones).
    Returns:
        The exit code: 0 success, 2 rejected request / usage error, 1 other failure.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SERVER_COMMANDS:
        cmd = SERVER_COMMANDS[argv[0]]
        try:
            fn = getattr(importlib.import_module(cmd.module), cmd.function)
        except ImportError as e:
            print(f"error: cannot start `ninfer {argv[0]}` ({e}); install the full `ninfer` package",
                  file=stderr if stderr is not None else sys.stderr)
            return 1
        return int(fn(argv[1:]) or 0)
    from clients.cli import main as client_main

    return client_main(argv, stdout=stdout, stderr=stderr, stdin=stdin,
                       extra_commands={name: c.help for name, c in SERVER_COMMANDS.items()})
