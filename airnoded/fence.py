"""The fence keeper: a small process of its own that stops every run on this node once the node
daemon has not heard from the controller for fence_timeout_s.

The node daemon fences itself too, but a daemon that is frozen (SIGSTOP, a long pause) or dead
cannot: its jobs' processes run on while the controller, after node_timeout_s, starts the same
jobs elsewhere. The keeper is not frozen with the daemon and outlives it. The daemon writes the
lease (the CLOCK_BOOTTIME second at which its last answered call to the controller began) to
SPOOL/lease; the keeper reads it a few times a second, and once it is older than the fence it
sends SIGTERM to each run's process groups (the batch script's and its steps' ranks', as their
shepherds recorded them in the run's folder) and to its cgroup, then SIGKILL after the grace, which ends before
the controller's node timeout.

    python -m air.airnoded.fence SPOOL FENCE_AFTER_S GRACE_S
    python -m air.airnoded.fence --kill-runs SPOOL     # SIGKILL every run there (a local cluster taken down)
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from air.airnoded import jobfiles, shepherding

log = logging.getLogger("airnoded.fence")

LEASE = "lease"
KEEPER_PID = "fence.pid"
CGROUP = "cgroup"     # in a run's folder: the run's cgroup, when it has one
FENCED = "fenced"     # in a run's folder: written before a fence signals the run
KEEPER_FENCED = "keeper-fenced."   # in the spool, a file each: a keeper's fence of runs the daemon had not
MAX_KEEPER_RECORD = 1 << 16
MAX_KEEPER_RECORDS = 100          # taken at a time
CHECK_EVERY_S = 0.2
KILLS = 25            # SIGKILLs sent to a fenced run at most (never a signal loop on recycled numbers)
LEASE_WIDTH = 32      # the lease is rewritten in place, a fixed width: no new inode on a full disk


def now() -> float:
    """Seconds that also run while the host or a process is suspended."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Lease:
    """The daemon's side: SPOOL/lease, created once and then overwritten in place (pwrite of a fixed
    width), so renewing needs no free block or inode. A renewal that cannot be written is no renewal."""

    def __init__(self, spool: Path):
        """A daemon starts with the lease an earlier daemon left (runs it left are not to outlive it),
        else with none (0: the keeper waits for the first renewal). A lease from the future is from
        before a reboot: none."""
        earlier = lease(spool)
        self.value = earlier if earlier is not None and 0 < earlier <= now() else 0.0
        path = spool / LEASE
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.pwrite(self.fd, f"{self.value!r}".ljust(LEASE_WIDTH - 1).encode() + b"\n", 0)

    def renew(self, began: float) -> bool:
        try:
            return os.pwrite(self.fd, f"{began!r}".ljust(LEASE_WIDTH - 1).encode() + b"\n", 0) == LEASE_WIDTH
        except OSError as e:
            log.warning("lease not renewed: %s", e.strerror)
            return False


def lease(spool: Path) -> float | None:
    try:
        value = float(jobfiles.read_root_file(spool, LEASE, 64))
    except (OSError, ValueError, jobfiles.UnsafeFile):
        return None
    return value or None


def mark_fenced(folder: Path) -> bool:
    """Mark the run fenced, before it is signalled; whether this was the first mark. The first mark
    stays as it was (created once, empty): its time is when the fence began (fenced_before_end),
    whoever marks the run again later (the keeper's later rounds, the daemon as it wakes)."""
    try:
        os.close(os.open(folder / FENCED, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600))
        return True
    except FileExistsError:
        return False
    except OSError:   # (no folder: nothing of the run to mark)
        return False


def was_fenced(folder: Path) -> bool:
    return (folder / FENCED).exists()


def fenced_before_end(folder: Path, tag: str) -> bool:
    """Whether a fence marked the run before its shepherd TAG recorded its last event (a child's
    exit): an exit recorded before the mark is the run's own. A fence that came later found it ended
    (a script that ended while its daemon was frozen or down, and the daemon's fence on waking, or the
    keeper's for processes it left behind): the run's result is its exit, not the node's failure.
    (File times are the kernel's clock ticks: a mark within the tick of the exit counts as before. A
    step's record holds all its ranks' ends: its time is the last one's.)"""
    try:
        mark = os.stat(folder / FENCED, follow_symlinks=False).st_mtime_ns
    except OSError:
        return False
    try:
        end = os.stat(folder / f"{tag}.record", follow_symlinks=False).st_mtime_ns
    except OSError:
        return True
    return mark <= end


def recorded_cgroup(folder: Path) -> Path | None:
    """The run's cgroup as its folder records it, if it exists: in CGROUP (a step's own group on a node
    where only ranks run, or the launcher's in earlier versions), else in its shepherds' records
    (shepherding.recorded_group)."""
    try:
        text = jobfiles.read_root_file(folder, CGROUP, 4096)
    except FileNotFoundError:
        text = shepherding.recorded_group(folder)
    except (OSError, jobfiles.UnsafeFile):
        return None
    try:
        group = Path(text.decode().strip())
    except UnicodeDecodeError:
        return None
    return group if group.is_absolute() and group.is_dir() else None


def _cgroup_pids(folder: Path) -> list[int]:
    group = recorded_cgroup(folder)
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()] if group is not None else []
    except (OSError, ValueError):
        return []


def stop_runs(spool: Path, sig: int, only: set[str] | None = None, first: list[str] | None = None) -> list[str]:
    """Send `sig` to every run folder's process groups and cgroup, marked fenced first; the names of
    the runs signalled (those no fence had marked before, also appended to `first`). A run with
    nothing alive is left as it is."""
    done = []
    for entry in _entries(spool):
        if jobfiles.parse_job_dir(entry.name) is None or (only is not None and entry.name not in only):
            continue
        folder = Path(entry.path)
        targets, members = shepherding.live_groups(folder), _cgroup_pids(folder)
        if not targets and not members:   # ended on its own (its daemon away): its exit is its own, not a fence's
            continue
        if mark_fenced(folder) and first is not None:
            first.append(entry.name)
        for pgid in targets:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in members:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        done.append(entry.name)
    return done


def _entries(spool: Path) -> list[os.DirEntry]:
    """The spool's entries; none once it is gone (a local cluster removed while its keeper looked)."""
    try:
        return list(os.scandir(spool))
    except FileNotFoundError:
        return []


def keep(spool: Path, after: float, grace: float) -> None:
    """The keeper's loop. SIGTERM once the lease is `after` old, SIGKILL once it is `after + grace`
    old, both counted from the lease: a keeper that was itself frozen or started late kills at once."""
    termed: set[str] = set()
    kills: dict[str, int] = {}
    while spool.is_dir():   # a spool taken away (a local cluster removed) leaves nothing to guard
        time.sleep(CHECK_EVERY_S)
        began = lease(spool)
        if began is None or now() - began < after:
            termed.clear()
            kills.clear()
            continue
        silent = now() - began
        runs = {e.name for e in _entries(spool) if jobfiles.parse_job_dir(e.name) is not None}
        first: list[str] = []   # (runs the daemon had not fenced: frozen, or gone)
        if silent >= after + grace:
            due = {name for name in runs if kills.get(name, 0) < KILLS}
            for name in stop_runs(spool, signal.SIGKILL, only=due, first=first):
                kills[name] = kills.get(name, 0) + 1
            termed |= runs
        for name in stop_runs(spool, signal.SIGTERM, only=runs - termed, first=first):
            termed.add(name)
            log.warning("fence: no word from the controller for %.1f s; stopping run %s", silent, name)
        if first:
            record_keeper_fence(spool, silent, first)


def record_keeper_fence(spool: Path, silent: float, runs: list[str]) -> None:
    """SPOOL/keeper-fenced.<time>.<pid>: "SILENT RUN...", for the daemon to report once the controller
    answers it (it reports its own fences itself). A file each, written whole (aside, then renamed):
    the daemon takes each once, whole."""
    name = f"{KEEPER_FENCED}{time.time_ns()}.{os.getpid()}"
    try:
        jobfiles.write_root_file(spool, name, f"{silent:.1f} {' '.join(runs)}\n".encode()[:MAX_KEEPER_RECORD], 0o600)
    except OSError as e:
        log.warning("fence: cannot record the runs stopped: %s", e.strerror)


def take_keeper_fences(spool: Path) -> list[tuple[float, list[tuple[int, int]]]]:
    """The keeper's fences recorded since the last call, oldest first: (seconds without word, its
    (job, run)s) each; each taken once (removed)."""
    try:
        names = sorted(e.name for e in os.scandir(spool) if e.name.startswith(KEEPER_FENCED))[:MAX_KEEPER_RECORDS]
    except OSError:
        return []
    fences = []
    for name in names:
        try:
            data = jobfiles.read_root_file(spool, name, MAX_KEEPER_RECORD)
        except (OSError, jobfiles.UnsafeFile) as e:
            log.warning("the fence keeper's record %s cannot be read: %s", name, e)
            data = b""
        try:
            os.unlink(spool / name)
        except OSError:
            pass
        silent, _, runs = data.decode("ascii", "replace").strip().partition(" ")
        try:
            fences.append((float(silent), [key for n in runs.split() if (key := jobfiles.parse_job_dir(n))]))
        except ValueError:
            continue
    return fences


def start(spool: Path, after: float, grace: float) -> int:
    """Start this node's keeper (a new session: it outlives the daemon), replacing an earlier one; it
    writes to the daemon's standard error (the journal, or the local cluster's log)."""
    stop_keeper(spool)
    proc = subprocess.Popen([sys.executable, "-P", "-m", "air.airnoded.fence", str(spool), repr(after), repr(grace)],
                            stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/")
    try:   # the last process the kernel picks when memory runs out
        with open(f"/proc/{proc.pid}/oom_score_adj", "w") as f:
            f.write("-1000")
    except OSError:
        pass
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
    # (this version runs as -m air.airnoded.fence, an earlier one as -m airnoded.fence)
    if any(arg.endswith(b"airnoded.fence") for arg in cmdline) and str(spool).encode() in cmdline:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s airnoded-fence %(levelname)s %(message)s")
    if args[:1] == ["--kill-runs"]:
        spool = Path(args[1])
        for _ in range(3):   # (a rank that was starting as the first pass ran)
            stop_runs(spool, signal.SIGKILL)
            time.sleep(0.1)
        return 0
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a daemon's stop (systemctl) leaves the keeper on guard
    keep(Path(args[0]), float(args[1]), float(args[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
