"""Host-to-device copies that do not block the host."""
from __future__ import annotations

import torch


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without blocking the host.

    ``torch.tensor(list, device="cuda")`` copies from pageable memory, which makes the host
    wait until everything already queued on the stream has run (a prefill launched behind a
    decode graph would wait for it, and the next launches for the prefill). Pinned memory and
    ``non_blocking`` keep the host free (torch's pinned-memory cache keeps the buffer alive
    until the copy is done).
    """
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
