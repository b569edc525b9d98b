"""Child process for the ring tests (run as a script; not collected by pytest).

Usage:
    _ring_child.py write NAME SLOT SEQ SEED      attach, fill SLOT for SEQ, close, print "ok"
    _ring_child.py attach-exit NAME MODE         attach, check, exit; MODE = close | no-close | tracker
    _ring_child.py create-hang NAME L P V        create, publish slot 0 seq 1, print "ready", sleep
"""

from __future__ import annotations

import sys
import time

import numpy as np

from shared_memory import (
    STATUS_DEAD_END,
    STATUS_READY,
    STATUS_UNCONSTRAINED,
    STATUS_UNREACHABLE,
    MaskRing,
    RingGeometry,
    last_word_mask,
)

_STATUS_CYCLE = np.array([STATUS_READY, STATUS_READY, STATUS_DEAD_END, STATUS_UNREACHABLE,
                          STATUS_UNCONSTRAINED], dtype=np.uint8)


def expected_slot(geometry: RingGeometry, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic slot contents for ``seed``.

    Returns bitmask [L, P, W] uint32 (bits >= V zero; non-READY positions zero),
    status [L, P] uint8, extent [L] int32.
    """
    rng = np.random.default_rng(seed)
    lanes, positions, words = geometry.bitmask_shape
    bitmask = rng.integers(0, 1 << 32, size=(lanes, positions, words), dtype=np.uint64).astype(np.uint32)
    bitmask[..., -1] &= np.uint32(last_word_mask(geometry.vocab_size))
    status = _STATUS_CYCLE[(np.arange(lanes)[:, None] + np.arange(positions)[None, :] + seed) % len(_STATUS_CYCLE)]
    bitmask[status != STATUS_READY] = 0
    extent = ((np.arange(lanes) + seed) % (positions + 1)).astype(np.int32)
    return bitmask, status.astype(np.uint8), extent


def main(argv: list[str]) -> int:
    cmd, name = argv[0], argv[1]
    if cmd == "write":
        slot, seq, seed = (int(x) for x in argv[2:5])
        ring = MaskRing.attach(name)
        bitmask, status, extent = expected_slot(ring.geometry, seed)
        ring.begin_write(slot, seq)
        ring.bitmask(slot)[...] = bitmask
        ring.status(slot)[...] = status
        ring.extent(slot)[...] = extent
        ring.end_write(slot, seq)
        ring.close()
        print("ok", flush=True)
    elif cmd == "attach-exit":
        mode = argv[2]
        if mode == "tracker":  # a process with a live multiprocessing resource tracker
            from multiprocessing import resource_tracker
            resource_tracker.ensure_running()
        ring = MaskRing.attach(name)
        ring.bitmask(0)[0, 0, 0] = 0xA5A5A5A5  # the segment is really shared and writable
        if mode == "close":
            ring.close()
        print("ok", flush=True)
    elif cmd == "create-hang":
        lanes, positions, vocab = (int(x) for x in argv[2:5])
        ring = MaskRing.create(name, RingGeometry(2, lanes, positions, vocab))
        ring.begin_write(0, 1)
        ring.bitmask(0)[...] = 0xFFFFFFFF
        ring.end_write(0, 1)
        print("ready", flush=True)
        time.sleep(60)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
