"""End-to-end: the sidecar's Step work spread over shard worker processes (``--step-shards 3``).

Real engine, sidecar and shard worker processes, real gRPC, the real shared-memory ring (every shard
writes its own rows of one slot), the default model. 16 constrained streams (JSON Schema and regex, more
than the 8 lanes) must all end in their language; then a shard worker is SIGKILLed while they run: the
sidecar reports NOT_SERVING, the engine restarts it, re-prepares and replays, and nothing is lost.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from .conftest import Stack, metered_stack
from .test_supervision_e2e import Streams, _health, _metric, check_all_valid


def _shard_workers(stack: Stack) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(stack.sidecar_pid()), "-f", "constraint_service.shard_worker"],
                         capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


@pytest.fixture(scope="module")
def shard_stack():
    yield from metered_stack(["--step-shards", "3", "--sidecar-deadline", "5"])


def test_16_constrained_streams_over_three_step_shards_stay_in_their_language(shard_stack) -> None:
    from clients.client import NInferClient

    s, n = shard_stack, 16
    assert len(_shard_workers(s)) == 2
    with NInferClient(s.target) as c:
        streams = Streams(c, n)
        streams.join()
    check_all_valid(streams, n)


def test_a_killed_shard_worker_restarts_the_sidecar_and_loses_nothing(shard_stack) -> None:
    from clients.client import NInferClient

    s, n = shard_stack, 16
    restarts = _metric(s, "ninfer_sidecar_restarts_total")
    sidecar = s.sidecar_pid()
    with NInferClient(s.target) as c:
        streams = Streams(c, n)
        streams.wait_started(2)
        os.kill(_shard_workers(s)[0], signal.SIGKILL)
        streams.join()
    check_all_valid(streams, n)
    assert _metric(s, "ninfer_sidecar_restarts_total") - restarts == 1
    assert s.sidecar_pid() != sidecar
    end = time.monotonic() + 60
    while len(_shard_workers(s)) != 2 and time.monotonic() < end:  # the new sidecar has its own workers
        time.sleep(0.2)
    assert len(_shard_workers(s)) == 2
    assert _health(s.target) == {"": "SERVING", "ninfer.v1.Generation": "SERVING"}
