"""The mask ring over real POSIX shared memory, across real processes."""

from __future__ import annotations

import gc
import itertools
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import posix_ipc
import pytest

from _ring_child import expected_slot
from shared_memory import (
    STATUS_READY,
    STATUS_UNCONSTRAINED,
    MaskRing,
    RingError,
    RingGeometry,
    RingHeader,
    StaleSlotError,
    TornSlotError,
    default_ring_name,
    last_word_mask,
    remove_segment,
)
from shared_memory.layout import HEADER_STRUCT_BYTES

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("_ring_child.py")
SHM_DIR = Path("/dev/shm")
GEOMETRY = RingGeometry(2, 4, 5, 32011)  # K = 4, ragged last word
_counter = itertools.count()

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs Linux /dev/shm")


@pytest.fixture
def ring_name():
    name = f"ninfer-t{os.getpid()}-{next(_counter)}"
    remove_segment(name)
    yield name
    remove_segment(name)


def _child(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(CHILD), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _poke_header(name: str, **fields) -> None:
    """Overwrite header fields of an existing segment (simulates another build)."""
    shm = posix_ipc.SharedMemory("/" + name)
    with mmap.mmap(shm.fd, shm.size) as mm:
        header = RingHeader.unpack(mm)
        packed = RingHeader(**{**header.__dict__, **fields}).pack()
        mm[:len(packed)] = packed
    shm.close_fd()


def _mapped(name: str) -> bool:
    return f"/dev/shm/{name}" in Path("/proc/self/maps").read_text()


# ---------------------------------------------------------------- cross-process

@pytest.mark.parametrize("vocab_size", [32001, 49152], ids=lambda v: f"V{v}")
def test_attached_process_writes_masks_creator_reads_bit_exact(ring_name, vocab_size):
    geometry = RingGeometry(2, 3, 5, vocab_size)
    with MaskRing.create(ring_name, geometry) as ring:
        ring.bitmask(0)[...] = 0xDEADBEEF  # slot 0 must stay untouched
        with pytest.raises(StaleSlotError):
            ring.check_slot(1, 7)
        proc = _child("write", ring_name, "1", "7", "11")
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
        ring.check_slot(1, 7)
        bitmask, status, extent = expected_slot(geometry, 11)
        np.testing.assert_array_equal(ring.bitmask(1), bitmask)
        np.testing.assert_array_equal(ring.status(1), status)
        np.testing.assert_array_equal(ring.extent(1), extent)
        assert (ring.status(1) == STATUS_READY).any()
        assert not (ring.bitmask(1)[..., -1] & ~np.uint32(last_word_mask(vocab_size))).any()  # bits >= V zero
        assert (ring.bitmask(0) == 0xDEADBEEF).all()
        assert ring.read_seq(0) == (0, 0)
    assert not (SHM_DIR / ring_name).exists()


@pytest.mark.parametrize("mode", ["close", "no-close", "tracker"])
def test_attaching_process_exit_does_not_remove_segment(ring_name, mode):
    # Py3.11 multiprocessing.shared_memory would unlink the segment when the attacher exits.
    with MaskRing.create(ring_name, GEOMETRY) as ring:
        proc = _child("attach-exit", ring_name, mode)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
        assert "leaked shared_memory" not in proc.stderr
        assert (SHM_DIR / ring_name).exists()
        assert ring.bitmask(0)[0, 0, 0] == 0xA5A5A5A5
        MaskRing.attach(ring_name).close()  # still attachable by name


def test_sigkilled_creator_leaves_segment_and_create_cleans_it_up(ring_name):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, str(CHILD), "create-hang", ring_name, "2", "3", "32000"],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == "ready", proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert (SHM_DIR / ring_name).exists()  # nobody cleaned up after the dead engine
    with MaskRing.attach(ring_name) as stale:
        assert stale.geometry == RingGeometry(2, 2, 3, 32000)
        stale.check_slot(0, 1)
    # a restarted engine reuses the name: the stale segment is replaced, new geometry, zeroed slots
    with MaskRing.create(ring_name, GEOMETRY) as ring:
        assert ring.geometry == GEOMETRY
        with MaskRing.attach(ring_name) as attached:
            assert attached.geometry == GEOMETRY
        assert ring.read_seq(0) == (0, 0)
        assert not ring.bitmask(0).any()
        assert os.stat(SHM_DIR / ring_name).st_size == GEOMETRY.total_bytes
    assert not (SHM_DIR / ring_name).exists()


# ---------------------------------------------------------------- seqlock

def test_seqlock_stale_and_torn(ring_name):
    with MaskRing.create(ring_name, GEOMETRY) as writer, MaskRing.attach(ring_name) as reader:
        with pytest.raises(StaleSlotError, match="expected seq_end 1, found 0"):
            reader.check_slot(0, 1)
        writer.begin_write(0, 1)
        with pytest.raises(StaleSlotError) as info:  # begun, not finished
            reader.check_slot(0, 1)
        assert (info.value.slot, info.value.expected, info.value.seq_begin, info.value.seq_end) == (0, 1, 1, 0)
        writer.end_write(0, 1)
        reader.check_slot(0, 1)
        with pytest.raises(StaleSlotError):
            reader.check_slot(1, 1)  # other slot untouched
        writer.begin_write(0, 3)  # overwrite started while the reader still wants seq 1
        with pytest.raises(TornSlotError, match="expected seq_begin 1, found 3") as info:
            reader.check_slot(0, 1)
        assert (info.value.seq_begin, info.value.seq_end) == (3, 1)
        with pytest.raises(StaleSlotError):
            reader.check_slot(0, 3)
        writer.end_write(0, 3)
        reader.check_slot(0, 3)
        with pytest.raises(StaleSlotError, match="overwritten"):
            reader.check_slot(0, 1)
        assert reader.read_seq(0) == (3, 3)
        big = (1 << 64) - 1
        writer.begin_write(1, big)
        writer.end_write(1, big)
        reader.check_slot(1, big)


def test_begin_write_resets_status_and_extent_not_words(ring_name):
    with MaskRing.create(ring_name, GEOMETRY) as ring:
        ring.begin_write(1, 1)
        ring.status(1)[...] = STATUS_READY
        ring.extent(1)[...] = 5
        ring.bitmask(1)[...] = 0x12345678
        ring.end_write(1, 1)
        ring.begin_write(1, 2)
        assert (ring.status(1) == STATUS_UNCONSTRAINED).all()
        assert (ring.extent(1) == 0).all()
        assert (ring.bitmask(1) == 0x12345678).all()


def test_write_protocol_misuse(ring_name):
    with MaskRing.create(ring_name, GEOMETRY) as ring:
        with pytest.raises(ValueError, match="found 0"):
            ring.begin_write(0, 0)
        with pytest.raises(ValueError):
            ring.begin_write(0, 1 << 64)
        ring.begin_write(0, 4)
        with pytest.raises(RingError, match="expected seq_begin 5, found 4"):
            ring.end_write(0, 5)
        for call in (ring.bitmask, ring.status, ring.extent, ring.read_seq):
            with pytest.raises(IndexError):
                call(2)
            with pytest.raises(IndexError):
                call(-1)


# ---------------------------------------------------------------- views and layout

def test_views_are_zero_copy_aligned_and_disjoint(ring_name):
    with MaskRing.create(ring_name, GEOMETRY) as ring, MaskRing.attach(ring_name) as other:
        g = GEOMETRY
        base = ring.buffer_address()
        assert base % 4096 == 0 and ring.nbytes == g.total_bytes == os.stat(SHM_DIR / ring_name).st_size
        for slot in range(g.num_slots):
            bm, st, ex = ring.bitmask(slot), ring.status(slot), ring.extent(slot)
            assert (bm.shape, bm.dtype, bm.flags.c_contiguous) == (g.bitmask_shape, np.uint32, True)
            assert (st.shape, st.dtype) == (g.status_shape, np.uint8)
            assert (ex.shape, ex.dtype) == ((g.num_lanes,), np.int32)
            assert bm.ctypes.data == base + ring.slot_bitmask_offset(slot)
            assert (base + ring.slot_bitmask_offset(slot)) % 4096 == 0
            assert st.ctypes.data == base + ring.slot_status_offset(slot) == bm.ctypes.data + bm.nbytes
            assert ring.bitmask(slot) is bm  # no allocation per call
        # a write through one mapping is seen through the other, and only in that slot/lane/position
        ring.bitmask(1)[2, 3, -1] = 0x7FF
        ring.status(1)[2, 3] = STATUS_READY
        assert other.bitmask(1)[2, 3, -1] == 0x7FF and other.status(1)[2, 3] == STATUS_READY
        assert np.count_nonzero(other.bitmask(1)) == 1 and not other.bitmask(0).any()
        assert np.count_nonzero(other.status(1)) == 1 and not other.status(0).any()


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], ids=lambda m: f"umask{m:03o}")
def test_segment_mode_is_0600(ring_name, umask):
    old = os.umask(umask)
    try:
        ring = MaskRing.create(ring_name, GEOMETRY)
    finally:
        os.umask(old)
    with ring:
        st = os.stat(SHM_DIR / ring_name)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()


def test_close_and_unlink_leave_nothing(ring_name):
    fds_before = len(os.listdir("/proc/self/fd"))
    ring = MaskRing.create(ring_name, GEOMETRY)
    attached = MaskRing.attach(ring_name)
    assert _mapped(ring_name)
    # Python's mmap keeps one dup of the shm fd per mapping (3.11 has no trackfd=False)
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2
    assert attached.close() is True and ring.close() is True
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert ring.close() is True  # idempotent
    assert not _mapped(ring_name)
    assert (SHM_DIR / ring_name).exists()  # close does not remove
    assert ring.unlink() is True
    assert not (SHM_DIR / ring_name).exists()
    assert remove_segment(ring_name) is False and ring.unlink() is False
    with pytest.raises(RingError, match="closed"):
        ring.bitmask(0)
    with pytest.raises(RingError, match="closed"):
        ring.buffer_address()


def test_context_manager_owner_unlinks_attacher_does_not(ring_name):
    with MaskRing.create(ring_name, GEOMETRY) as ring:
        with MaskRing.attach(ring_name) as attached:
            assert not attached.owner
        assert attached.closed and (SHM_DIR / ring_name).exists()
        assert ring.owner
    assert ring.closed and not (SHM_DIR / ring_name).exists()


def test_close_with_live_view_defers_unmap(ring_name):
    with MaskRing.create(ring_name, GEOMETRY) as ring:
        view = ring.bitmask(0)
        view[0, 0, 0] = 42
        assert ring.close() is False  # never unmapped under a live view
        assert view[0, 0, 0] == 42 and _mapped(ring_name)
    del view
    gc.collect()
    assert not _mapped(ring_name)


def test_create_refuses_a_ring_whose_creator_is_alive(ring_name):
    """Issue 14 (1): a second server must not replace a live server's ring as "stale"."""
    old = MaskRing.create(ring_name, RingGeometry(2, 1, 1, 64))  # creator: this (live) process
    old.bitmask(0)[...] = 9
    with pytest.raises(RingError, match=f"belongs to the live process {os.getpid()}"):
        MaskRing.create(ring_name, GEOMETRY)
    assert MaskRing.attach(ring_name).geometry == RingGeometry(2, 1, 1, 64)  # untouched
    assert old.bitmask(0)[0, 0, 0] == 9
    old.close()
    old.unlink()  # the owner removes it; the name is free again
    with MaskRing.create(ring_name, GEOMETRY) as new:
        assert not new.bitmask(0).any()


def test_create_refuses_a_segment_it_cannot_prove_stale(ring_name):
    seg = posix_ipc.SharedMemory("/" + ring_name, posix_ipc.O_CREX, mode=0o600, size=8192)
    os.pwrite(seg.fd, b"not a ring header", 0)
    seg.close_fd()
    try:
        with pytest.raises(RingError, match="not a readable NInfer ring"):
            MaskRing.create(ring_name, GEOMETRY)
        assert (SHM_DIR / ring_name).exists()
    finally:
        posix_ipc.unlink_shared_memory("/" + ring_name)


# ---------------------------------------------------------------- attach validation

def test_attach_missing_segment(ring_name):
    with pytest.raises(RingError, match="no ring segment named"):
        MaskRing.attach(ring_name)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layout_version": 7}, "expected layout version 1, found 7"),
        ({"magic": b"NOTARING"}, r"expected magic b'NINFRING', found b'NOTARING'"),
        ({"num_words": 1000}, "num_words: expected 1001"),
        ({"slot_stride_bytes": 4096}, "slot_stride_bytes: expected"),
        ({"status_offset": 0}, "status_offset: expected"),
        ({"num_lanes": 0}, "invalid geometry"),
        ({"num_lanes": 5}, "slot_stride_bytes: expected 102400 .*found 81920"),
        # a self-consistent header for more lanes than the segment was sized for
        (RingHeader.for_geometry(RingGeometry(2, 5, 5, 32011)).__dict__, "expected a segment of >= 208896"),
    ],
    ids=["version", "magic", "num_words", "stride", "status_offset", "zero_lanes", "lanes", "too_small"],
)
def test_attach_rejects_bad_header(ring_name, fields, message):
    with MaskRing.create(ring_name, GEOMETRY):
        _poke_header(ring_name, **fields)
        with pytest.raises(RingError, match=message):
            MaskRing.attach(ring_name)


def test_attach_rejects_short_segment_and_uninitialised(ring_name):
    shm = posix_ipc.SharedMemory("/" + ring_name, posix_ipc.O_CREX, mode=0o600, size=16)
    shm.close_fd()
    with pytest.raises(RingError, match="header bytes, found 16"):
        MaskRing.attach(ring_name)
    remove_segment(ring_name)
    shm = posix_ipc.SharedMemory("/" + ring_name, posix_ipc.O_CREX, mode=0o600, size=8192)
    shm.close_fd()  # zero-filled: creator has not written the header yet
    with pytest.raises(RingError, match="expected magic"):
        MaskRing.attach(ring_name)


def test_attach_truncated_segment(ring_name):
    with MaskRing.create(ring_name, GEOMETRY):
        shm = posix_ipc.SharedMemory("/" + ring_name)
        os.ftruncate(shm.fd, GEOMETRY.total_bytes - 4096)
        shm.close_fd()
        with pytest.raises(RingError, match=f"expected a segment of >= {GEOMETRY.total_bytes} bytes"):
            MaskRing.attach(ring_name)


def test_attach_expected_geometry(ring_name):
    with MaskRing.create(ring_name, GEOMETRY):
        MaskRing.attach(ring_name, expected=GEOMETRY).close()
        with pytest.raises(RingError, match="expected geometry"):
            MaskRing.attach(ring_name, expected=RingGeometry(2, 4, 5, 32000))


# ---------------------------------------------------------------- names

def test_default_ring_name():
    assert default_ring_name("0") == "ninfer-0"
    assert default_ring_name("gpu3.a_b") == "ninfer-gpu3.a_b"
    long_a, long_b = "x" * 40 + "a", "x" * 40 + "b"
    for instance in (long_a, "pod/with spaces:and:colons", "ünïcode"):
        name = default_ring_name(instance)
        assert name.startswith("ninfer-") and len(name) <= 30 and "/" not in name
        assert name.isascii() and name == default_ring_name(instance)
    assert default_ring_name(long_a) != default_ring_name(long_b)
    assert default_ring_name("a/b") != default_ring_name("a_b")
    with pytest.raises(ValueError):
        default_ring_name("")


def test_default_name_is_usable_and_leading_slash_accepted():
    name = default_ring_name(f"t{os.getpid()}-" + "y" * 40)
    try:
        with MaskRing.create("/" + name, RingGeometry(2, 1, 1, 32)) as ring:
            assert ring.name == name and (SHM_DIR / name).exists()
            MaskRing.attach(name).close()
    finally:
        remove_segment(name)


@pytest.mark.parametrize("bad", ["", "/", "a/b", "x" * 256, ".."], ids=["empty", "slash", "inner_slash", "long", "dotdot"])
def test_invalid_names(bad):
    with pytest.raises(RingError, match="ring name"):
        MaskRing.create(bad, GEOMETRY)
    with pytest.raises(RingError, match="ring name"):
        remove_segment(bad)


def test_create_removes_a_ring_whose_creator_pid_was_reused(ring_name):
    """A restarted container's engine often gets the dead engine's pid (pid 1): a process that
    started after the segment was made cannot be its creator, so the ring is stale and replaced."""
    import subprocess as sp

    old = MaskRing.create(ring_name, GEOMETRY)  # ctime = now; writes through the mapping keep it
    time.sleep(0.3)
    child = sp.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live pid, started later
    try:
        old._mmap[:HEADER_STRUCT_BYTES] = RingHeader.for_geometry(GEOMETRY, creator_pid=child.pid).pack()
        with MaskRing.create(ring_name, GEOMETRY) as new:  # not refused: the child is not the creator
            assert RingHeader.unpack(new._mmap[:HEADER_STRUCT_BYTES]).creator_pid == os.getpid()
    finally:
        child.kill()
        child.wait()
        old.close()
