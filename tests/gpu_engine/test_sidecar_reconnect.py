"""A broken Step stream to a sidecar child that still runs is repaired by a restart (real sidecar process).

Before: ``Sidecar.alive()`` looked only at the process, so after a Step stream broke while the child kept
running (e.g. RESOURCE_EXHAUSTED on an oversized answer) ``ensure_started`` never reconnected and every later
constrained request failed with the same "Step stream broke" until the engine was restarted.

Every test runs on both Step transports: the local step socket (the default) and the gRPC ``Step`` RPC.
"""
from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from gpu_engine.engine.stats import ring_geometry
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.sidecar.client import RowStatus, Sidecar, SidecarUnavailable, StepRow
from shared_memory.ring import MaskRing

V, EOS = 64, 63


@pytest.fixture(params=["socket", "grpc"])
def sidecar(request):
    vocab = TokenVocabulary(V, tuple(bytes([65 + i % 26]) for i in range(V - 1)) + (b"",), frozenset({EOS}), (EOS,))
    geo = ring_geometry(4, 0, V)
    ring = MaskRing.create(f"ninfer-test-reconnect-{os.getpid()}-{uuid.uuid4().hex[:8]}", geo)
    sc = Sidecar(None, vocab, dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots,
                                   num_lanes=geo.num_lanes, num_positions=geo.num_positions,
                                   num_words=geo.num_words), step_transport=request.param)
    try:
        sc.start()
        assert sc.step_stream_transport == request.param
        yield sc
    finally:
        sc.stop()
        ring.close()
        ring.unlink()


def _step_ok(sc: Sidecar, rid: str, seq: int) -> bool:
    sc.prepare(rid, "regex", "[A-C]+", [], b"")
    sc.send_step(seq, 0, [StepRow(rid, 0, [], [])])
    results, _ = sc.recv_step(seq)
    return [(r.request_id, r.status) for r in results] == [(rid, RowStatus.OK)]


def test_broken_step_stream_restarts_a_live_sidecar(sidecar):
    assert _step_ok(sidecar, "a", 1)
    first_pid, first_gen = sidecar.pid, sidecar.generation
    if sidecar.step_stream_transport == "grpc":
        sidecar._channel.close()  # the Step stream breaks; the child process keeps running
    else:
        sidecar._stream._shut.shutdown(socket.SHUT_RDWR)  # the connection drops; the child keeps running
    with pytest.raises(SidecarUnavailable):
        sidecar.send_step(2, 1, [StepRow("a", 0, [], [])])
        sidecar.recv_step(2)
    assert not sidecar.alive()
    sidecar.ensure_started()
    assert sidecar.alive() and sidecar.generation == first_gen + 1 and sidecar.pid != first_pid
    assert _step_ok(sidecar, "b", 1)


def test_a_hung_sidecar_misses_the_step_deadline_and_is_replaced(sidecar):
    """SIGSTOP: the Step answer never comes; ``recv_step`` gives up after the deadline instead of blocking the
    engine thread forever, and the restart SIGKILLs the stopped child."""
    sidecar.step_deadline_s = 1.0
    sidecar.restart("a shorter deadline for this test")
    assert _step_ok(sidecar, "a", 1)
    hung = sidecar.pid
    os.kill(hung, signal.SIGSTOP)
    tasks = Path(f"/proc/{hung}/task")
    while {(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()} != {"T"}:
        time.sleep(0.01)  # the stop is asynchronous: a running thread stops at its next kernel entry
    try:
        sidecar.send_step(2, 1, [StepRow("a", 0, [], [])])
        with pytest.raises(SidecarUnavailable, match="no Step answer within 1 s"):
            sidecar.recv_step(2)
        assert not sidecar.alive() and sidecar.check_health(1.0)
        sidecar.ensure_started()
    finally:
        try:
            os.kill(hung, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert sidecar.pid != hung and not sidecar.check_health(5.0)
    assert _step_ok(sidecar, "b", 1)
