"""Start-up pieces of the sidecar's supervision (:class:`gpu_engine.sidecar.client.Sidecar`): the engine's private
socket directories and the wait for a freshly started sidecar to answer as our child and be ``SERVING``."""
from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat as st
import subprocess
import tempfile
import time
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ninfer_common.liveness import creator_alive

from gpu_engine.sidecar.stream import peer_mismatch

__all__ = ["PRIVATE_DIR_PREFIX", "STEP_SWITCH_INTERVAL_S", "SidecarUnavailable", "socket_served_by", "sweep_stale_private_dirs",
           "wait_until_serving"]

log = logging.getLogger("ninfer.engine.sidecar")

# GIL switch interval of the engine process while a Step stream is open. A Step message is put
# on a queue and sent by gRPC's request-consumer thread, which needs the GIL; with CPython's
# default 5 ms interval the engine thread (launching the forward, building inputs) keeps it so
# long that the message leaves only when the engine blocks in ``recv_step`` — the sidecar then
# starts late and its work is exposed. 0.5 ms lets the message go out while the forward is
# launched (measured: answer ready 0.09 ms after 3 ms of engine work instead of 1.2 ms / 7.5 ms max).
STEP_SWITCH_INTERVAL_S = 0.0005


class SidecarUnavailable(Exception):
    """The sidecar process is gone or not answering."""


#: ``$TMPDIR/ninfer-sidecar-<engine pid>-<random>``: the engine's private socket directory (0700).
PRIVATE_DIR_PREFIX = "ninfer-sidecar-"


def sweep_stale_private_dirs(tmpdir: str | None = None) -> list[str]:
    """Remove the private socket directories that SIGKILLed engines left behind; returns the paths removed.

    Only directories named ``ninfer-sidecar-<pid>-<random>`` (directories, not links), owned by our uid,
    whose creator ``pid`` is provably dead (:func:`ninfer_common.liveness.creator_alive` against the
    directory's ``st_ctime``: no such process, or one started after the directory last changed) are
    removed; a live engine's directory, another user's, and names without a pid (before this scheme)
    are left alone.  Errors (a directory removed meanwhile by another engine) are ignored.
    """
    base = tmpdir or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    pattern = re.compile(re.escape(PRIVATE_DIR_PREFIX) + r"(\d+)-[^/]+")
    for name in names:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not st.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if creator_alive(int(m.group(1)), info.st_ctime):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
            log.info("removed the stale sidecar directory %s (its engine pid %s is gone)", path, m.group(1))
    return removed


def wait_until_serving(probe: grpc.Channel, proc: subprocess.Popen | None, trusted: Callable[[], bool],
                       timeout_s: float) -> None:
    """Poll a starting sidecar until its health service says ``SERVING``.

    Nothing is sent before ``trusted()`` (the ``SO_PEERCRED`` check that the socket's peer is our child, or the
    external sidecar's uid) holds. ``probe`` is a plain channel: the first checks fail by design while the sidecar
    boots and must not export ERROR spans (issue 14 (9)). Polls every 50 ms.

    Raises:
        SidecarUnavailable: ``proc`` exited, or no trusted socket / no ``SERVING`` within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    health = health_pb2_grpc.HealthStub(probe)
    ok = False
    while True:
        if proc is not None and proc.poll() is not None:
            raise SidecarUnavailable(f"sidecar exited with code {proc.returncode} during start-up")
        if not ok:  # nothing is sent before the peer is known to be our child
            ok = trusted()
            if not ok:
                if time.monotonic() > deadline:
                    raise SidecarUnavailable("sidecar did not open its socket in time")
                time.sleep(0.05)
                continue
        try:
            r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            if r.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise SidecarUnavailable("sidecar did not become healthy in time")
        time.sleep(0.05)


def socket_served_by(socket_path: str, expected_pid: int | None) -> bool:
    """True once ``socket_path`` is served by ``expected_pid`` (any pid if None) under our uid (``SO_PEERCRED``).

    Returns False while nothing listens yet.

    Raises:
        SidecarUnavailable: another process (or user) serves the socket.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(1.0)
        try:
            conn.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError, TimeoutError):
            return False
        why = peer_mismatch(conn, expected_pid)
    if why:
        raise SidecarUnavailable(f"the sidecar socket {socket_path} is {why}; refusing to use it")
    return True
