"""POSIX shared-memory mask ring between the GPU engine and the constraint sidecar.

Only numpy views and byte layout live here: no torch, no xgrammar.
See :mod:`shared_memory.layout` for the byte layout and :mod:`shared_memory.ring`
for create/attach and the per-slot seqlock.
"""

from shared_memory.errors import RingError, SlotSequenceError, StaleSlotError, TornSlotError
from shared_memory.layout import (
    BITMASK_DTYPE,
    DEFAULT_NUM_SLOTS,
    EXTENT_DTYPE,
    LAYOUT_VERSION,
    MAGIC,
    STATUS_DEAD_END,
    STATUS_DTYPE,
    STATUS_NAMES,
    STATUS_READY,
    STATUS_UNCONSTRAINED,
    STATUS_UNREACHABLE,
    RingGeometry,
    RingHeader,
    bitmask_words,
    last_word_mask,
)
from shared_memory.ring import MaskRing
from shared_memory.segment import default_ring_name, remove_segment

__all__ = [
    "BITMASK_DTYPE",
    "DEFAULT_NUM_SLOTS",
    "EXTENT_DTYPE",
    "LAYOUT_VERSION",
    "MAGIC",
    "STATUS_DEAD_END",
    "STATUS_DTYPE",
    "STATUS_NAMES",
    "STATUS_READY",
    "STATUS_UNCONSTRAINED",
    "STATUS_UNREACHABLE",
    "MaskRing",
    "RingError",
    "RingGeometry",
    "RingHeader",
    "SlotSequenceError",
    "StaleSlotError",
    "TornSlotError",
    "bitmask_words",
    "default_ring_name",
    "last_word_mask",
    "remove_segment",
]
