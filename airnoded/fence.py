"""The fence keeper: a small process of its own that stops every run on this node once the node
daemon has not heard from the controller for fence_timeout_s.

The node daemon fences itself too, but a daemon that is frozen (SIGSTOP, a long pause) or dead
cannot: its jobs' processes run on while the controller, after node_timeout_s, starts the same
jobs elsewhere. The keeper is not frozen with the daemon and outlives it. The daemon writes the
lease (the CLOCK_BOOTTIME second at which its last answered call to the controller began) to
SPOOL/lease; the keeper reads it a few times a second, and once it is older than the fence it
sends SIGTERM to each run's process groups (the batch script's and its steps' ranks', recorded by
the daemon in the run's folder) and to its cgroup, then SIGKILL after the grace, which ends before
the controller's node timeout.

    python -m airnoded.fence SPOOL FENCE_AFTER_S GRACE_S
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from airnoded import jobfiles

log = logging.getLogger("airnoded.fence")

LEASE = "lease"
KEEPER_PID = "fence.pid"
GROUPS = "groups"     # in a run's folder: the process groups of its batch script and ranks, one a line
CGROUP = "cgroup"     # in a run's folder: the run's cgroup, when it has one
CHECK_EVERY_S = 0.2


def now() -> float:
    """Seconds that also run while the host or a process is suspended."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def renew(spool: Path, began: float) -> None:
    jobfiles.write_root_file(spool, LEASE, f"{began!r}\n".encode(), 0o600)


def lease(spool: Path) -> float | None:
    try:
        return float(jobfiles.read_root_file(spool, LEASE, 64))
    except (OSError, ValueError, jobfiles.UnsafeFile):
        return None


def record_groups(folder: Path, pgids) -> None:
    jobfiles.write_root_file(folder, GROUPS, "".join(f"{p}\n" for p in sorted(set(pgids))).encode(), 0o600)


def _groups(folder: Path) -> list[int]:
    try:
        text = jobfiles.read_root_file(folder, GROUPS, 1 << 20).decode()
    except (OSError, jobfiles.UnsafeFile):
        return []
    return [int(p) for p in text.split() if p.isdigit() and int(p) > 1]


def _cgroup_pids(folder: Path) -> list[int]:
    try:
        path = jobfiles.read_root_file(folder, CGROUP, 4096).decode().strip()
        return [int(p) for p in (Path(path) / "cgroup.procs").read_text().split()]
    except (OSError, ValueError, jobfiles.UnsafeFile):
        return []


def stop_runs(spool: Path, sig: int, only: set[str] | None = None) -> list[str]:
    """Send `sig` to every run folder's process groups and cgroup; the names of the runs signalled."""
    done = []
    for entry in os.scandir(spool):
        if jobfiles.parse_job_dir(entry.name) is None or (only is not None and entry.name not in only):
            continue
        folder = Path(entry.path)
        targets = _groups(folder)
        for pgid in targets:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in _cgroup_pids(folder):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        done.append(entry.name)
    return done


def keep(spool: Path, after: float, grace: float) -> None:
    """The keeper's loop."""
    fenced_at: dict[str, float] = {}   # run folder -> when it got SIGTERM
    while spool.is_dir():   # a spool taken away (a local cluster removed) leaves nothing to guard
        time.sleep(CHECK_EVERY_S)
        began = lease(spool)
        if began is None or now() - began < after:
            fenced_at.clear()
            continue
        t = now()
        runs = {e.name for e in os.scandir(spool) if jobfiles.parse_job_dir(e.name) is not None}
        for name in stop_runs(spool, signal.SIGTERM, only=runs - set(fenced_at)):
            fenced_at[name] = t
            log.warning("fence: no word from the controller for %.1f s; stopping run %s", t - began, name)
        overdue = {name for name, at in fenced_at.items() if t - at >= grace}
        if overdue:
            stop_runs(spool, signal.SIGKILL, only=overdue)


def start(spool: Path, after: float, grace: float) -> int:
    """Start this node's keeper (a new session: it outlives the daemon), replacing an earlier one; it
    writes to the daemon's standard error (the journal, or the local cluster's log)."""
    stop_keeper(spool)
    proc = subprocess.Popen([sys.executable, "-m", "airnoded.fence", str(spool), repr(after), repr(grace)],
                            stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    jobfiles.write_root_file(spool, KEEPER_PID, f"{proc.pid}\n".encode(), 0o600)
    return proc.pid


def stop_keeper(spool: Path) -> None:
    """End the keeper an earlier daemon started (only if that pid still is a keeper of this spool)."""
    try:
        pid = int(jobfiles.read_root_file(spool, KEEPER_PID, 64))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except (OSError, ValueError, jobfiles.UnsafeFile):
        return
    if b"airnoded.fence" in cmdline and str(spool).encode() in cmdline:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s airnoded-fence %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a daemon's stop (systemctl) leaves the keeper on guard
    keep(Path(args[0]), float(args[1]), float(args[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
