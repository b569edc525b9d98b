"""Names and lifetime of POSIX shm segments (no layout knowledge here)."""

from __future__ import annotations

import hashlib
import re

import posix_ipc

from shared_memory.errors import RingError

SEGMENT_MODE = 0o600
MAX_DEFAULT_NAME_CHARS = 30  # macOS allows 31 incl. the leading slash; Linux 255
_NAME_PREFIX = "ninfer-"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def default_ring_name(instance: str) -> str:
    """Short shm name for an engine instance: ``"ninfer-<instance>"``.

    The result has at most 30 characters, only ``[A-Za-z0-9_.-]`` and no
    slash. An instance id that is too long or has other characters is
    shortened/sanitised and suffixed with 8 hex digits of its SHA-1, so
    distinct ids stay distinct.

    Raises:
        ValueError: ``instance`` is empty.
    """
    if not instance:
        raise ValueError("instance: expected a non-empty string, found ''")
    name = _NAME_PREFIX + instance
    if _SAFE_NAME.fullmatch(instance) and len(name) <= MAX_DEFAULT_NAME_CHARS:
        return name
    digest = hashlib.sha1(instance.encode("utf-8")).hexdigest()[:8]
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", instance)
    keep = MAX_DEFAULT_NAME_CHARS - len(_NAME_PREFIX) - 1 - len(digest)
    return f"{_NAME_PREFIX}{clean[:keep]}-{digest}"


def normalize_name(name: str) -> str:
    """``name`` without a leading slash; raises RingError if unusable for shm_open."""
    bare = name[1:] if name.startswith("/") else name
    if not bare or "/" in bare or "\x00" in bare or len(bare) > 255 or bare in (".", ".."):
        raise RingError(f"ring name: expected 1..255 chars without '/' or NUL, found {name!r}")
    return bare


def remove_segment(name: str) -> bool:
    """Unlink the shm segment ``name`` (with or without leading slash).

    Processes that still map it keep their mapping; the name is gone at once.

    Returns:
        True if a segment was removed, False if none existed.
    Raises:
        RingError: the name is invalid, or unlinking failed (e.g. permissions).
    """
    bare = normalize_name(name)
    try:
        posix_ipc.unlink_shared_memory("/" + bare)
    except posix_ipc.ExistentialError:
        return False
    except (posix_ipc.Error, OSError) as exc:
        raise RingError(f"cannot remove ring segment {bare!r}: {exc}") from exc
    return True
