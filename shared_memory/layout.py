"""Byte layout of the mask ring (pure numpy + stdlib, no torch).

Segment layout (all offsets in bytes, little-endian, x86-64 host)::

    0                      header (HEADER_BYTES = 4096, see RingHeader)
    HEADER_BYTES           slot 0   (slot_stride_bytes, multiple of 4096)
    HEADER_BYTES + stride  slot 1
    ...

Slot layout (offsets relative to the slot base, which is 4096-aligned)::

    bitmask_offset = 0     bitmask  [num_lanes, num_positions, num_words] uint32
    status_offset          status   [num_lanes, num_positions] uint8
    extent_offset          extent   [num_lanes] int32 (8-aligned)
    seq_offset             seq      [2] uint64: seq_begin, seq_end (64-aligned)
    ... zero padding up to slot_stride_bytes

The bitmask is first in the slot so that it is page-aligned (the engine
registers the whole segment with ``cudaHostRegister`` and copies slot
regions to the GPU); the status bytes follow it directly, so
``bitmask + status`` is also one contiguous range.

Bitmask convention: token ``i`` is allowed iff bit ``i % 32`` of word
``i // 32`` is 1; bits ``>= vocab_size`` are 0. ``vocab_size`` is the width
of the model's logits.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy

BITMASK_DTYPE = numpy.uint32  # torch side: torch.int32 view of the same bytes
STATUS_DTYPE = numpy.uint8
EXTENT_DTYPE = numpy.int32
SEQ_DTYPE = numpy.uint64

# Per-position status bytes (stored as uint8 in the status region).
class PositionStatus(enum.IntEnum):
    """Status byte of one (row, position) of a ring slot; the ring is the one place a dead end is reported."""

    UNCONSTRAINED = 0  # row has no grammar (mask disabled, words not read)
    READY = 1  # mask written for this position
    DEAD_END = 2  # the hypothetical prefix has no legal next token (words zero)
    UNREACHABLE = 3  # an earlier draft was illegal or EOS was accepted (words zero)


STATUS_UNCONSTRAINED = PositionStatus.UNCONSTRAINED
STATUS_READY = PositionStatus.READY
STATUS_DEAD_END = PositionStatus.DEAD_END
STATUS_UNREACHABLE = PositionStatus.UNREACHABLE
STATUS_NAMES = {
    STATUS_UNCONSTRAINED: "UNCONSTRAINED",
    STATUS_READY: "READY",
    STATUS_DEAD_END: "DEAD_END",
    STATUS_UNREACHABLE: "UNREACHABLE",
}

MAGIC = b"NINFRING"
LAYOUT_VERSION = 1
PAGE_BYTES = 4096
HEADER_BYTES = PAGE_BYTES  # the header occupies the first page
SEQ_ALIGN_BYTES = 64  # seq words sit on their own cache line
DEFAULT_NUM_SLOTS = 2  # double-buffered
_U32_MAX = 0xFFFF_FFFF


def bitmask_words(vocab_size: int) -> int:
    """Number of uint32 words per bitmask position: ``(vocab_size + 31) // 32``."""
    return (vocab_size + 31) // 32


def last_word_mask(vocab_size: int) -> int:
    """Bits of the last bitmask word that belong to real tokens (as a Python int).

    ``0xFFFFFFFF`` when ``vocab_size`` is a multiple of 32, else the low
    ``vocab_size % 32`` bits. Bits outside this mask must be zero.
    """
    rem = vocab_size % 32
    return _U32_MAX if rem == 0 else (1 << rem) - 1


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class RingGeometry:
    """Shape of the ring; every byte offset is derived from these four numbers.

    Args:
        num_slots: number of slots (2 = double-buffered), >= 1.
        num_lanes: resident batch lanes (rows) per slot, >= 1.
        num_positions: lookahead positions per lane (K + 1), >= 1.
        vocab_size: V, the logits width of the model, >= 1.

    Raises:
        ValueError: a field is not an int in ``[1, 2**32 - 1]``.
    """

    num_slots: int
    num_lanes: int
    num_positions: int
    vocab_size: int

    def __post_init__(self) -> None:
        for field in ("num_slots", "num_lanes", "num_positions", "vocab_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{field}: expected int, found {type(value).__name__}")
            if not 1 <= value <= _U32_MAX:
                raise ValueError(f"{field}: expected 1..{_U32_MAX}, found {value}")

    # ---- per-position / per-slot sizes (bytes) ----
    @property
    def num_words(self) -> int:
        """uint32 words per position: ``bitmask_words(vocab_size)``."""
        return bitmask_words(self.vocab_size)

    @property
    def bitmask_shape(self) -> tuple[int, int, int]:
        """``(num_lanes, num_positions, num_words)``."""
        return (self.num_lanes, self.num_positions, self.num_words)

    @property
    def status_shape(self) -> tuple[int, int]:
        """``(num_lanes, num_positions)``."""
        return (self.num_lanes, self.num_positions)

    @property
    def bitmask_bytes(self) -> int:
        """Bytes of one slot's bitmask region."""
        return self.num_lanes * self.num_positions * self.num_words * numpy.dtype(BITMASK_DTYPE).itemsize

    @property
    def status_bytes(self) -> int:
        """Bytes of one slot's status region."""
        return self.num_lanes * self.num_positions * numpy.dtype(STATUS_DTYPE).itemsize

    @property
    def extent_bytes(self) -> int:
        """Bytes of one slot's extent region (one int32 per lane)."""
        return self.num_lanes * numpy.dtype(EXTENT_DTYPE).itemsize

    # ---- offsets inside a slot (bytes, relative to the slot base) ----
    @property
    def bitmask_offset(self) -> int:
        """Offset of the bitmask region in a slot: 0 (slot bases are 4096-aligned)."""
        return 0

    @property
    def status_offset(self) -> int:
        """Offset of the status region in a slot: right after the bitmask."""
        return self.bitmask_offset + self.bitmask_bytes

    @property
    def extent_offset(self) -> int:
        """Offset of the extent region in a slot (8-aligned)."""
        return _align(self.status_offset + self.status_bytes, 8)

    @property
    def seq_offset(self) -> int:
        """Offset of the two uint64 seq words (seq_begin, seq_end) in a slot (64-aligned)."""
        return _align(self.extent_offset + self.extent_bytes, SEQ_ALIGN_BYTES)

    @property
    def slot_stride_bytes(self) -> int:
        """Distance between slot bases (multiple of 4096)."""
        return _align(self.seq_offset + SEQ_ALIGN_BYTES, PAGE_BYTES)

    # ---- whole segment ----
    @property
    def header_bytes(self) -> int:
        """Bytes reserved for the header at offset 0 (one page)."""
        return HEADER_BYTES

    def slot_offset(self, slot: int) -> int:
        """Byte offset of slot ``slot``'s base from the start of the segment.

        Raises:
            IndexError: ``slot`` is not in ``[0, num_slots)``.
        """
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot: expected 0..{self.num_slots - 1}, found {slot}")
        return self.header_bytes + slot * self.slot_stride_bytes

    @property
    def total_bytes(self) -> int:
        """Size of the whole segment in bytes (header + all slots)."""
        return self.header_bytes + self.num_slots * self.slot_stride_bytes


# ---- header (offset 0) ----

_HEADER_STRUCT = struct.Struct("<8sIIIIIIIIQQQQQQ")
_HEADER_FIELDS = (
    "magic",
    "layout_version",
    "header_bytes",
    "num_slots",
    "num_lanes",
    "num_positions",
    "vocab_size",
    "num_words",
    "creator_pid",
    "slot_stride_bytes",
    "total_bytes",
    "bitmask_offset",
    "status_offset",
    "extent_offset",
    "seq_offset",
)
HEADER_STRUCT_BYTES = _HEADER_STRUCT.size
assert HEADER_STRUCT_BYTES <= HEADER_BYTES


@dataclass(frozen=True)
class RingHeader:
    """The fields stored at offset 0 of the segment (little-endian).

    ``magic`` is written last by the creator, so a reader that sees the
    magic sees a complete header. The derived fields (``num_words``,
    ``slot_stride_bytes``, offsets, ``total_bytes``) are stored so that a
    reader built from different code detects a layout drift even when the
    version number was not bumped.
    """

    magic: bytes
    layout_version: int
    header_bytes: int
    num_slots: int
    num_lanes: int
    num_positions: int
    vocab_size: int
    num_words: int
    creator_pid: int
    slot_stride_bytes: int
    total_bytes: int
    bitmask_offset: int
    status_offset: int
    extent_offset: int
    seq_offset: int

    @classmethod
    def for_geometry(cls, geometry: RingGeometry, creator_pid: int = 0) -> "RingHeader":
        """The header a creator writes for ``geometry``."""
        return cls(
            magic=MAGIC,
            layout_version=LAYOUT_VERSION,
            header_bytes=geometry.header_bytes,
            num_slots=geometry.num_slots,
            num_lanes=geometry.num_lanes,
            num_positions=geometry.num_positions,
            vocab_size=geometry.vocab_size,
            num_words=geometry.num_words,
            creator_pid=creator_pid,
            slot_stride_bytes=geometry.slot_stride_bytes,
            total_bytes=geometry.total_bytes,
            bitmask_offset=geometry.bitmask_offset,
            status_offset=geometry.status_offset,
            extent_offset=geometry.extent_offset,
            seq_offset=geometry.seq_offset,
        )

    def pack(self) -> bytes:
        """``HEADER_STRUCT_BYTES`` bytes, magic first."""
        return _HEADER_STRUCT.pack(*(getattr(self, f) for f in _HEADER_FIELDS))

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> "RingHeader":
        """Parse the first ``HEADER_STRUCT_BYTES`` bytes of ``data`` (no validation)."""
        return cls(*_HEADER_STRUCT.unpack_from(data, 0))

    def geometry(self) -> RingGeometry:
        """The geometry the header describes (raises ValueError if a field is out of range)."""
        return RingGeometry(self.num_slots, self.num_lanes, self.num_positions, self.vocab_size)
