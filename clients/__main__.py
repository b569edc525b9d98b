"""``python -m clients`` runs the ``ninfer`` CLI."""

from clients.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
