"""``python -m ninfer_cli`` runs the ``ninfer`` console script."""

from ninfer_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
