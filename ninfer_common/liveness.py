"""Is the process that left a file behind provably dead? (Linux ``/proc``; issue 14 "locked-down IPC").

Used for the engine's leftovers after a SIGKILL: a shared-memory ring (``shared_memory.ring``) and the
private socket directory ``$TMPDIR/ninfer-sidecar-<pid>-XXXX`` (``gpu_engine.sidecar.client``).  Only a
*provably* dead creator makes a leftover removable: the pid does not exist, or the process now holding
it started after the leftover last changed (pid reuse).  Where the start time is unknown (no ``/proc``),
an existing pid counts as alive.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["PID_REUSE_SLACK_S", "creator_alive", "process_start_wall_s"]

#: A process that started more than this many seconds after a leftover's last change is not its creator.
PID_REUSE_SLACK_S = 0.1


def process_start_wall_s(pid: int) -> float | None:
    """Wall-clock start time of ``pid`` in seconds since the epoch (``/proc/<pid>/stat`` field 22,
    ~10 ms resolution), or None when unknown (no such process, no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; field 22 (starttime) is index 19
    start_ticks = int(fields[19])
    return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))


def creator_alive(pid: int, changed_wall_s: float) -> bool:
    """True when the process ``pid`` that created a leftover last changed at ``changed_wall_s``
    (seconds since the epoch, e.g. its ``st_ctime``) may still be alive.

    A process ``pid`` that exists but started after the leftover's last change cannot be its creator:
    the pid was reused (e.g. pid 1 of a restarted container, or this very process).
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    started = process_start_wall_s(pid)
    return started is None or started <= changed_wall_s + PID_REUSE_SLACK_S
