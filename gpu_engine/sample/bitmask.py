"""Token bitmasks on the torch side: unpack, apply, pack.

Convention (seed 000 §mask, docs/INTERNALS.md "Bitmask convention"):
``ceil(V / 32)`` 32-bit words per position; token ``i`` is allowed iff bit
``i % 32`` of word ``i // 32`` is 1 (least significant bit = smaller id);
bits at or past ``V`` are 0. ``V`` is the logits width of the model.

The ring stores ``numpy.uint32``; torch has no usable uint32 arithmetic, so
the torch side reinterprets the same bytes as ``torch.int32``
(``torch.from_numpy(words_u32.view(numpy.int32))``). Bit extraction with an
arithmetic right shift followed by ``& 1`` is correct for negative words.

All functions are pure tensor code: no ``.item()``, no host syncs, static
shapes, so they can run inside a captured CUDA graph on any device.
"""
from __future__ import annotations

import torch

from shared_memory.layout import bitmask_words  # the one width helper (docs/INTERNALS.md)


__all__ = [
    "bitmask_words",
    "unpack_bitmask",
    "apply_bitmask_",
    "pack_bitmask",
    "words_from_numpy",
]


def _bit_shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(32, dtype=torch.int32, device=device)


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Expand packed words into a boolean allowed-set.

    Args:
        words: ``[..., W]`` int32 (any device), ``W >= bitmask_words(V)``.
        vocab_size: ``V``, the logits width.

    Returns:
        ``[..., V]`` bool on ``words.device``; ``True`` = token allowed.
    """
    if words.dtype != torch.int32:
        raise TypeError(f"bitmask words must be torch.int32, got {words.dtype}")
    w = bitmask_words(vocab_size)
    bits = (words[..., :w].unsqueeze(-1) >> _bit_shifts(words.device)) & 1  # [..., W, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()


def apply_bitmask_(
    logits: torch.Tensor, words: torch.Tensor, enabled: torch.Tensor | None = None
) -> torch.Tensor:
    """Set disallowed logits to ``-inf`` in place, only on enabled rows.

    Args:
        logits: ``[N, V]`` floating (any float dtype), modified in place.
        words: ``[N, W]`` int32 packed bitmask per row.
        enabled: ``[N]`` bool; ``False`` rows (unconstrained rows of a mixed
            batch) are left untouched and their words are ignored. ``None``
            means every row is enabled.

    Returns:
        ``logits`` (the same tensor).
    """
    allowed = unpack_bitmask(words, logits.shape[-1])
    if enabled is not None:
        allowed = allowed | ~enabled.unsqueeze(-1)
    return logits.masked_fill_(~allowed, float("-inf"))


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a boolean allowed-set ``[..., V]`` into int32 words ``[..., W]``.

    The inverse of :func:`unpack_bitmask`; bits past ``V`` are 0. Meant for
    tests and host-side tools (the sidecar packs masks itself).
    """
    v = allowed.shape[-1]
    w = bitmask_words(v)
    pad = w * 32 - v
    bits = torch.nn.functional.pad(allowed.to(torch.int64), (0, pad))
    bits = bits.unflatten(-1, (w, 32))
    shifts = torch.arange(32, dtype=torch.int64, device=allowed.device)
    u32 = (bits << shifts).sum(-1)  # [..., W] in [0, 2**32)
    return torch.where(u32 >= 2**31, u32 - 2**32, u32).to(torch.int32)


def words_from_numpy(words_u32) -> torch.Tensor:
    """torch.int32 view (CPU) of a numpy uint32 bitmask array; zero-copy when contiguous."""
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(words_u32).view(np.int32))
