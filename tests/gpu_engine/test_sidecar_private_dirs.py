"""Stale private socket directories (issue 14): only a provably dead engine's directory is swept.

Real processes stand in for engines (a SIGKILLed one and a live one); the end-to-end version (a real
engine SIGKILLed, another started) is in tests/e2e/test_errors_and_lifecycle_e2e.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from gpu_engine.sidecar.client import PRIVATE_DIR_PREFIX, sweep_stale_private_dirs


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_only_dead_owners_directories_are_removed(tmp_path):
    dead, live = _sleeper(), _sleeper()
    try:
        dead_dir = tmp_path / f"{PRIVATE_DIR_PREFIX}{dead.pid}-abc"
        live_dir = tmp_path / f"{PRIVATE_DIR_PREFIX}{live.pid}-def"
        mine = tmp_path / f"{PRIVATE_DIR_PREFIX}{os.getpid()}-ghi"
        legacy = tmp_path / f"{PRIVATE_DIR_PREFIX}x1y2z3"  # no pid in the name: not provably stale
        for d in (dead_dir, live_dir, mine, legacy):
            d.mkdir(mode=0o700)
            (d / "constraint.sock").write_bytes(b"")
        not_a_dir = tmp_path / f"{PRIVATE_DIR_PREFIX}{dead.pid}-file"
        not_a_dir.write_bytes(b"")
        link = tmp_path / f"{PRIVATE_DIR_PREFIX}{dead.pid}-link"
        link.symlink_to(live_dir)
        other = tmp_path / f"other-{dead.pid}-abc"
        other.mkdir()
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert sweep_stale_private_dirs(str(tmp_path)) == [str(dead_dir)]
        assert not dead_dir.exists()
        for kept in (live_dir, mine, legacy, not_a_dir, link, other):
            assert os.path.lexists(kept), kept
        assert (live_dir / "constraint.sock").exists()  # the link was not followed
        assert sweep_stale_private_dirs(str(tmp_path)) == []
    finally:
        for p in (dead, live):
            p.kill()
            p.wait()


def test_a_reused_pid_does_not_keep_a_leftover_alive():
    """A live process that started after the leftover last changed cannot be its creator (pid reuse);
    one that started before may be."""
    import time

    from ninfer_common.liveness import creator_alive, process_start_wall_s

    p = _sleeper()
    try:
        started = process_start_wall_s(p.pid)
        assert started is not None and abs(started - time.time()) < 60
        assert not creator_alive(p.pid, changed_wall_s=started - 3600)  # reused pid
        assert creator_alive(p.pid, changed_wall_s=time.time())
    finally:
        p.kill()
        p.wait()
    assert not creator_alive(p.pid, changed_wall_s=time.time())  # gone
