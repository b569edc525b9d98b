"""Geometry and header math of the mask ring (no shared memory touched)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shared_memory.layout import (
    BITMASK_DTYPE,
    HEADER_BYTES,
    HEADER_STRUCT_BYTES,
    LAYOUT_VERSION,
    MAGIC,
    PAGE_BYTES,
    STATUS_DEAD_END,
    STATUS_READY,
    STATUS_UNCONSTRAINED,
    STATUS_UNREACHABLE,
    RingGeometry,
    RingHeader,
    bitmask_words,
    last_word_mask,
)


@pytest.mark.parametrize(
    ("vocab_size", "words"),
    [(1, 1), (31, 1), (32, 1), (33, 2), (32000, 1000), (32001, 1001), (32011, 1001), (32032, 1001),
     (32033, 1002), (49152, 1536), (151936, 4748)],
    ids=lambda v: str(v),
)
def test_bitmask_words(vocab_size, words):
    assert bitmask_words(vocab_size) == words
    assert bitmask_words(vocab_size) * 32 >= vocab_size > (bitmask_words(vocab_size) - 1) * 32


def test_constants():
    assert BITMASK_DTYPE is np.uint32
    assert (STATUS_UNCONSTRAINED, STATUS_READY, STATUS_DEAD_END, STATUS_UNREACHABLE) == (0, 1, 2, 3)
    assert MAGIC == b"NINFRING" and LAYOUT_VERSION == 1


@pytest.mark.parametrize(
    ("vocab_size", "mask"),
    [(32000, 0xFFFFFFFF), (32001, 0x1), (32011, 0x7FF), (49152, 0xFFFFFFFF), (31, 0x7FFFFFFF)],
    ids=lambda v: str(v),
)
def test_last_word_mask(vocab_size, mask):
    assert last_word_mask(vocab_size) == mask
    # bit b of the last word is token (W-1)*32 + b: exactly the bits < V are set
    base = (bitmask_words(vocab_size) - 1) * 32
    assert [bool(mask >> b & 1) for b in range(32)] == [base + b < vocab_size for b in range(32)]


@pytest.mark.parametrize("vocab_size", [32000, 32001, 32011, 49152], ids=lambda v: f"V{v}")
@pytest.mark.parametrize(("lanes", "positions"), [(1, 1), (8, 5), (3, 7)], ids=lambda v: str(v))
def test_geometry_offsets(vocab_size, lanes, positions):
    g = RingGeometry(2, lanes, positions, vocab_size)
    words = (vocab_size + 31) // 32
    assert g.num_words == words
    assert g.bitmask_shape == (lanes, positions, words)
    assert g.status_shape == (lanes, positions)
    assert g.bitmask_bytes == lanes * positions * words * 4
    assert g.status_bytes == lanes * positions
    assert g.extent_bytes == lanes * 4
    # bitmask first (page-aligned slot base), status right behind it
    assert g.bitmask_offset == 0
    assert g.status_offset == g.bitmask_bytes
    assert g.extent_offset % 8 == 0 and g.extent_offset >= g.status_offset + g.status_bytes
    assert g.seq_offset % 64 == 0 and g.seq_offset >= g.extent_offset + g.extent_bytes
    assert g.seq_offset + 16 <= g.slot_stride_bytes
    assert g.slot_stride_bytes % PAGE_BYTES == 0
    assert g.slot_stride_bytes - (g.seq_offset + 16) < PAGE_BYTES + 64  # no gratuitous padding
    assert g.header_bytes == HEADER_BYTES == PAGE_BYTES
    assert [g.slot_offset(s) for s in range(2)] == [HEADER_BYTES, HEADER_BYTES + g.slot_stride_bytes]
    assert all(g.slot_offset(s) % PAGE_BYTES == 0 for s in range(2))
    assert g.total_bytes == HEADER_BYTES + 2 * g.slot_stride_bytes


def test_geometry_known_numbers():
    # 4 lanes, K+1 = 5, V = 32001: 4*5*1001*4 = 80080 bitmask bytes
    g = RingGeometry(2, 4, 5, 32001)
    assert (g.bitmask_bytes, g.status_offset, g.extent_offset, g.seq_offset) == (80080, 80080, 80104, 80128)
    assert g.slot_stride_bytes == 81920 and g.total_bytes == 4096 + 2 * 81920


def test_slot_offset_out_of_range():
    g = RingGeometry(2, 1, 1, 32)
    with pytest.raises(IndexError, match="expected 0..1, found 2"):
        g.slot_offset(2)
    with pytest.raises(IndexError):
        g.slot_offset(-1)


@pytest.mark.parametrize(
    "fields",
    [(0, 1, 1, 32), (2, 0, 1, 32), (2, 1, 0, 32), (2, 1, 1, 0), (2, -1, 1, 32), (2, 1, 1, 1 << 32),
     (2, True, 1, 32), (2, 1.0, 1, 32)],
    ids=["slots0", "lanes0", "positions0", "vocab0", "negative", "too_big", "bool", "float"],
)
def test_geometry_rejects_bad_fields(fields):
    with pytest.raises(ValueError, match="expected"):
        RingGeometry(*fields)


def test_geometry_is_frozen_and_hashable():
    g = RingGeometry(2, 4, 5, 32001)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.num_lanes = 3  # type: ignore[misc]
    assert g == RingGeometry(2, 4, 5, 32001) and hash(g) == hash(RingGeometry(2, 4, 5, 32001))


def test_header_roundtrip():
    g = RingGeometry(3, 8, 5, 32011)
    header = RingHeader.for_geometry(g, creator_pid=1234)
    packed = header.pack()
    assert len(packed) == HEADER_STRUCT_BYTES <= HEADER_BYTES
    assert packed[:8] == MAGIC
    assert int.from_bytes(packed[8:12], "little") == LAYOUT_VERSION
    back = RingHeader.unpack(packed + b"\0" * 100)
    assert back == header and back.geometry() == g
    assert back.slot_stride_bytes == g.slot_stride_bytes and back.total_bytes == g.total_bytes
