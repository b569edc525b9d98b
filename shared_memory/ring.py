"""The mask ring: a POSIX shared-memory segment of double-buffered bitmask slots.

The GPU engine creates the ring (:meth:`MaskRing.create`), the constraint
sidecar attaches to it (:meth:`MaskRing.attach`), fills a slot between
:meth:`MaskRing.begin_write` and :meth:`MaskRing.end_write`, and tells the
engine over gRPC; the engine checks the slot's sequence number
(:meth:`MaskRing.check_slot`) and copies the slot to the GPU.

Implementation choice: ``posix_ipc.SharedMemory`` + :mod:`mmap`, not
``multiprocessing.shared_memory``. On Python <= 3.12 the latter registers
every segment, even one merely attached, with the multiprocessing resource
tracker, which unlinks it when the attaching process exits — the sidecar
would delete the engine's ring. posix_ipc has no tracker: nothing is ever
unlinked behind our back. The cost is that a SIGKILLed creator leaves its
segment in ``/dev/shm``; :meth:`MaskRing.create` removes a stale segment of
the same name before creating a new one.

Memory-ordering assumption (seqlock): the writer stores ``seq_begin``, then
the data, then ``seq_end``; the reader loads ``seq_end``, then ``seq_begin``.
Each store/load is a separate numpy call on an aligned 8-byte word, so the
compiler cannot reorder them and each is a single atomic access; on x86-64
(TSO: stores are not reordered with stores, loads not with loads) that is
enough for a same-host reader. Weakly-ordered CPUs (ARM, POWER) would need
explicit fences and are not supported.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from pathlib import Path
from types import TracebackType

import numpy
import posix_ipc

from ninfer_common.liveness import creator_alive
from shared_memory.errors import RingError, StaleSlotError, TornSlotError
from shared_memory.layout import (
    BITMASK_DTYPE,
    EXTENT_DTYPE,
    HEADER_STRUCT_BYTES,
    LAYOUT_VERSION,
    MAGIC,
    SEQ_DTYPE,
    STATUS_DTYPE,
    STATUS_UNCONSTRAINED,
    RingGeometry,
    RingHeader,
)
from shared_memory.segment import SEGMENT_MODE, default_ring_name, normalize_name, remove_segment

logger = logging.getLogger(__name__)

__all__ = ["MaskRing", "default_ring_name", "remove_segment"]


def _validate_header(header: RingHeader, mapped_bytes: int, name: str) -> RingGeometry:
    if header.magic != MAGIC:
        raise RingError(
            f"ring {name!r}: expected magic {MAGIC!r}, found {header.magic!r} "
            "(not a NInfer mask ring, or its creator has not finished initialising it)"
        )
    if header.layout_version != LAYOUT_VERSION:
        raise RingError(
            f"ring {name!r}: expected layout version {LAYOUT_VERSION}, found {header.layout_version} "
            "(engine and sidecar are built from different NInfer versions)"
        )
    try:
        geometry = header.geometry()
    except ValueError as exc:
        raise RingError(f"ring {name!r}: invalid geometry in header: {exc}") from exc
    want = RingHeader.for_geometry(geometry, creator_pid=header.creator_pid)
    for field in ("header_bytes", "num_words", "slot_stride_bytes", "total_bytes",
                  "bitmask_offset", "status_offset", "extent_offset", "seq_offset"):
        if getattr(header, field) != getattr(want, field):
            raise RingError(
                f"ring {name!r}: {field}: expected {getattr(want, field)} for {geometry}, "
                f"found {getattr(header, field)}"
            )
    if mapped_bytes < geometry.total_bytes:
        raise RingError(
            f"ring {name!r}: expected a segment of >= {geometry.total_bytes} bytes, found {mapped_bytes}"
        )
    return geometry


class MaskRing:
    """A mapped mask ring. Build it with :meth:`create` or :meth:`attach`.

    Per slot (``0 <= slot < num_slots``), zero-copy numpy views:

    * ``bitmask(slot)``: ``[num_lanes, num_positions, num_words]`` uint32
    * ``status(slot)``:  ``[num_lanes, num_positions]`` uint8 (``STATUS_*``)
    * ``extent(slot)``:  ``[num_lanes]`` int32, valid positions written per lane

    Views stay valid until :meth:`close`. Not thread-safe: one writer
    (the sidecar) and one reader (the engine) per slot at a time. An open
    ring holds one file descriptor (Python's mmap keeps a dup of the shm fd),
    released by :meth:`close`.
    """

    def __init__(self, name: str, mapping: mmap.mmap, geometry: RingGeometry, *, owner: bool):
        """Private: use :meth:`create` or :meth:`attach`."""
        self._name = name
        self._mmap: mmap.mmap | None = mapping
        self._geometry = geometry
        self._owner = owner
        self._u8 = numpy.frombuffer(mapping, dtype=numpy.uint8, count=geometry.total_bytes)
        self._address = int(self._u8.ctypes.data)
        g = geometry
        self._bitmask, self._status, self._extent, self._seq = [], [], [], []
        for slot in range(g.num_slots):
            base = g.slot_offset(slot)
            self._bitmask.append(self._u8[base + g.bitmask_offset: base + g.status_offset]
                                 .view(BITMASK_DTYPE).reshape(g.bitmask_shape))
            self._status.append(self._u8[base + g.status_offset: base + g.status_offset + g.status_bytes]
                                .view(STATUS_DTYPE).reshape(g.status_shape))
            self._extent.append(self._u8[base + g.extent_offset: base + g.extent_offset + g.extent_bytes]
                                .view(EXTENT_DTYPE))
            self._seq.append(self._u8[base + g.seq_offset: base + g.seq_offset + 16].view(SEQ_DTYPE))

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, name: str, geometry: RingGeometry) -> "MaskRing":
        """Create the segment (engine side), mode 0600, zero-filled, header written.

        A segment already named ``name`` is removed only when its creator is
        provably dead (left by a SIGKILLed engine: its header names a
        ``creator_pid`` that no longer exists); one owned by a live process,
        or whose header cannot be read, is refused (issue 14: a second
        server must never take a live server's ring).

        Args:
            name: shm name, e.g. ``"ninfer-0"`` (a leading slash is accepted).
            geometry: ring shape; the segment is ``geometry.total_bytes`` bytes.
        Raises:
            RingError: invalid name, the name is taken by a live (or unknown)
                owner, or the segment cannot be created/mapped.
        """
        bare = normalize_name(name)
        _remove_if_stale(bare)
        size = geometry.total_bytes
        try:
            shm = posix_ipc.SharedMemory("/" + bare, posix_ipc.O_CREX, mode=SEGMENT_MODE, size=size)
        except (posix_ipc.Error, OSError, ValueError) as exc:
            raise RingError(f"cannot create ring segment {bare!r} of {size} bytes: {exc}") from exc
        try:
            os.fchmod(shm.fd, SEGMENT_MODE)  # the umask may only have narrowed it; make it exact
            mapping = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            shm.close_fd()
            remove_segment(bare)
            raise RingError(f"cannot map ring segment {bare!r} of {size} bytes: {exc}") from exc
        shm.close_fd()  # the mapping keeps the memory alive
        # ftruncate zero-fills the new segment; write the header with the magic last
        packed = RingHeader.for_geometry(geometry, creator_pid=os.getpid()).pack()
        mapping[len(MAGIC):len(packed)] = packed[len(MAGIC):]
        mapping[:len(MAGIC)] = packed[:len(MAGIC)]
        return cls(bare, mapping, geometry, owner=True)

    @classmethod
    def attach(cls, name: str, expected: RingGeometry | None = None) -> "MaskRing":
        """Map an existing ring (sidecar side), reading its geometry from the header.

        Attaching never registers the segment for removal: the attaching
        process may exit (normally or not) and the segment stays.

        Args:
            name: shm name used by the creator.
            expected: if given, the header's geometry must equal it.
        Raises:
            RingError: no such segment; bad magic; layout version mismatch;
                inconsistent header; segment smaller than the header says;
                geometry differs from ``expected``.
        """
        bare = normalize_name(name)
        try:
            shm = posix_ipc.SharedMemory("/" + bare)
        except posix_ipc.ExistentialError as exc:
            raise RingError(f"no ring segment named {bare!r} (has the engine created it?)") from exc
        except (posix_ipc.Error, OSError) as exc:
            raise RingError(f"cannot open ring segment {bare!r}: {exc}") from exc
        try:
            size = shm.size
            if size < HEADER_STRUCT_BYTES:
                raise RingError(
                    f"ring {bare!r}: expected a segment of >= {HEADER_STRUCT_BYTES} header bytes, found {size}"
                )
            mapping = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise RingError(f"cannot map ring segment {bare!r}: {exc}") from exc
        finally:
            shm.close_fd()
        try:
            geometry = _validate_header(RingHeader.unpack(mapping), size, bare)
            if expected is not None and geometry != expected:
                raise RingError(f"ring {bare!r}: expected geometry {expected}, found {geometry}")
        except BaseException:
            mapping.close()
            raise
        return cls(bare, mapping, geometry, owner=False)

    def close(self) -> bool:
        """Unmap the segment (does not remove it). Idempotent.

        Returns:
            True if unmapped now; False if views obtained from this ring are
            still alive elsewhere — the mapping is then released when the
            last of them is garbage-collected (never unmapped under a view).
        """
        mapping, self._mmap = self._mmap, None
        if mapping is None:
            return True
        self._bitmask, self._status, self._extent, self._seq = [], [], [], []
        self._u8 = None
        try:
            mapping.close()
        except BufferError:
            return False
        return True

    def unlink(self) -> bool:
        """Remove the segment's name (normally only the creator does). See :func:`remove_segment`."""
        return remove_segment(self._name)

    def __enter__(self) -> "MaskRing":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close; the creator (``owner``) also unlinks the segment."""
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        role = "owner" if self._owner else "attached"
        return f"MaskRing({self._name!r}, {self._geometry}, {role}, {state})"

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        """shm name without leading slash (``/dev/shm/<name>`` on Linux)."""
        return self._name

    @property
    def geometry(self) -> RingGeometry:
        return self._geometry

    @property
    def owner(self) -> bool:
        """True for the creator (whose context-manager exit unlinks the segment)."""
        return self._owner

    @property
    def closed(self) -> bool:
        return self._mmap is None

    @property
    def nbytes(self) -> int:
        """Size of the mapping in bytes (``geometry.total_bytes``), for cudaHostRegister."""
        return self._geometry.total_bytes

    def buffer_address(self) -> int:
        """Base address of the mapping in this process (page-aligned), for cudaHostRegister.

        Unregister from CUDA before :meth:`close`. Raises RingError if closed.
        """
        self._require_open()
        return self._address

    def slot_offset(self, slot: int) -> int:
        """Byte offset of ``slot``'s base from the mapping base (4096-aligned). Raises IndexError."""
        return self._geometry.slot_offset(slot)

    def slot_bitmask_offset(self, slot: int) -> int:
        """Byte offset of ``slot``'s bitmask region from the mapping base (4096-aligned).

        The region is ``geometry.bitmask_bytes`` long, immediately followed by
        the status region (``geometry.status_bytes``). Raises IndexError.
        """
        return self._geometry.slot_offset(slot) + self._geometry.bitmask_offset

    def slot_status_offset(self, slot: int) -> int:
        """Byte offset of ``slot``'s status region from the mapping base. Raises IndexError."""
        return self._geometry.slot_offset(slot) + self._geometry.status_offset

    # ------------------------------------------------------------------ views
    def _require_open(self) -> None:
        if self._mmap is None:
            raise RingError(f"ring {self._name!r} is closed")

    def _check_slot_index(self, slot: int) -> None:
        if self._mmap is None:
            raise RingError(f"ring {self._name!r} is closed")
        if not 0 <= slot < self._geometry.num_slots:
            raise IndexError(f"slot: expected 0..{self._geometry.num_slots - 1}, found {slot}")

    def bitmask(self, slot: int) -> numpy.ndarray:
        """Zero-copy view ``[num_lanes, num_positions, num_words]`` uint32 of ``slot``'s bitmasks.

        Raises:
            IndexError: bad slot. RingError: ring closed.
        """
        self._check_slot_index(slot)
        return self._bitmask[slot]

    def status(self, slot: int) -> numpy.ndarray:
        """Zero-copy view ``[num_lanes, num_positions]`` uint8 of ``slot``'s status bytes.

        Raises:
            IndexError: bad slot. RingError: ring closed.
        """
        self._check_slot_index(slot)
        return self._status[slot]

    def extent(self, slot: int) -> numpy.ndarray:
        """Zero-copy view ``[num_lanes]`` int32: positions written per lane in ``slot``.

        Reset to 0 by :meth:`begin_write`; the writer sets it per lane it fills.
        Raises IndexError / RingError as :meth:`bitmask`.
        """
        self._check_slot_index(slot)
        return self._extent[slot]

    # ------------------------------------------------------------------ seqlock
    def read_seq(self, slot: int) -> tuple[int, int]:
        """``(seq_begin, seq_end)`` of ``slot`` (0, 0 for a never-written slot)."""
        self._check_slot_index(slot)
        seq = self._seq[slot]
        end = int(seq[1])
        begin = int(seq[0])
        return begin, end

    def begin_write(self, slot: int, seq: int) -> None:
        """Writer: start writing ``slot`` for sequence number ``seq`` (>= 1).

        Stores ``seq_begin = seq``, then sets all statuses to
        ``STATUS_UNCONSTRAINED`` and all extents to 0. Bitmask words are
        not cleared (the writer fills the positions it marks READY and
        zero-fills DEAD_END / UNREACHABLE ones).

        Raises:
            ValueError: ``seq`` not in ``[1, 2**64 - 1]``. IndexError / RingError as :meth:`bitmask`.
        """
        self._check_slot_index(slot)
        if not 1 <= seq < 1 << 64:
            raise ValueError(f"seq: expected 1..2**64-1, found {seq}")
        self._seq[slot][0] = seq
        self._status[slot].fill(STATUS_UNCONSTRAINED)
        self._extent[slot].fill(0)

    def end_write(self, slot: int, seq: int) -> None:
        """Writer: publish ``slot`` for ``seq`` by storing ``seq_end = seq``.

        Raises:
            RingError: ``begin_write(slot, seq)`` was not the last begin on this slot.
            IndexError: bad slot.
        """
        self._check_slot_index(slot)
        begin = int(self._seq[slot][0])
        if begin != seq:
            raise RingError(f"end_write(slot={slot}): expected seq_begin {seq}, found {begin}")
        self._seq[slot][1] = seq

    def check_slot(self, slot: int, seq: int) -> None:
        """Reader: verify ``slot`` holds a complete write for ``seq``.

        Reads ``seq_end`` then ``seq_begin``. For the full seqlock guarantee
        call it before reading the slot (or know from the protocol that the
        write completed) and again after the data were copied out.

        Raises:
            StaleSlotError: ``seq_end != seq`` (not yet written, or already overwritten).
            TornSlotError: ``seq_end == seq`` but ``seq_begin != seq`` (a newer write started).
            IndexError / RingError as :meth:`bitmask`.
        """
        self._check_slot_index(slot)
        view = self._seq[slot]
        end = int(view[1])
        begin = int(view[0])
        if end != seq:
            why = "not yet written" if end < seq else "overwritten by a later step"
            raise StaleSlotError(
                f"slot {slot}: expected seq_end {seq}, found {end} ({why})",
                slot=slot, expected=seq, seq_begin=begin, seq_end=end)
        if begin != end:
            raise TornSlotError(
                f"slot {slot}: expected seq_begin {seq}, found {begin} (a newer write started: torn)",
                slot=slot, expected=seq, seq_begin=begin, seq_end=end)


def _remove_if_stale(bare: str) -> None:
    """Unlink segment ``bare`` if it exists and its creator is dead; raise if its creator may be alive.

    Raises:
        RingError: the segment exists and its owner is alive, or its header is unreadable
            (not provably stale: remove ``/dev/shm/<name>`` by hand if you know it is).
    """
    try:
        shm = posix_ipc.SharedMemory("/" + bare)
    except posix_ipc.ExistentialError:
        return
    except (posix_ipc.Error, OSError) as exc:
        raise RingError(f"ring segment /dev/shm/{bare} exists and cannot be opened: {exc}") from exc
    try:
        data = os.pread(shm.fd, HEADER_STRUCT_BYTES, 0)
        ctime_s = os.fstat(shm.fd).st_ctime
    finally:
        shm.close_fd()
    header = RingHeader.unpack(data) if len(data) == HEADER_STRUCT_BYTES else None
    if header is None or header.magic != MAGIC:
        raise RingError(f"ring segment /dev/shm/{bare} exists but is not a readable NInfer ring; refusing to "
                        "remove it (delete it by hand if no server uses it)")
    if creator_alive(header.creator_pid, ctime_s):
        raise RingError(f"ring segment /dev/shm/{bare} belongs to the live process {header.creator_pid} "
                        "(is another server running on this port?)")
    if remove_segment(bare):
        logger.warning("removed stale mask ring segment /dev/shm/%s of dead process %d", bare, header.creator_pid)
