"""Per-job control groups: every process of a job, however it forked or detached, in one group
that a kill reaches, with a memory limit (--mem) and an out-of-memory count read back at the end,
and a bound on its tasks (`max_pids_per_job`: a fork bomb in one job never takes the node's pids,
the daemon's own threads and shepherds among them). On v1 the bound is a group of the same name in
the pids hierarchy, which the job's processes join beside the memory one (see `joined`).

GPUs: on v1, a group of the same name in the devices hierarchy denies the run the device files of the
node's GPUs that are not the job's (/dev/nvidia<minor>), as Slurm's ConstrainDevices does: a job that
unsets CUDA_VISIBLE_DEVICES still reaches only its own GPUs. cgroup v2 filters devices with an eBPF
program only, which is not done: there the GPUs are kept apart by CUDA_VISIBLE_DEVICES alone, and the
daemon says so in its log.

cgroup v2 (the unified hierarchy) where the host has it; the v1 memory controller on hosts that
mount v1 (as this project's CI machine does); neither when the daemon is not root or the
hierarchy cannot be written, in which case jobs are tracked by process group alone and the
daemon says so in its log. Groups live under <root>/air/<node>.<spool>/job<ID>.<RUN> (<spool>: a
hash of the daemon's spool folder), so several node daemons on one host (local clusters, whose
nodes share names and number their jobs from 1) never touch each other's groups.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

from air.protos.limits import is_number

log = logging.getLogger("airnoded")

CGROUP_ROOT = Path("/sys/fs/cgroup")
NVIDIA_MAJOR = 195   # /dev/nvidia<N>: character devices 195:N (nvidiactl is 195:255, never a GPU's)


class JobCgroups:
    """One node daemon's job groups. `mode` is "v2", "v1" or "none"."""

    def __init__(self, node: str, root: Path = CGROUP_ROOT, mode: str | None = None, spool: Path | None = None,
                 pids_max: int = 0, gpu_minors: dict[int, int] | None = None):
        self.node = node
        self.pids_max = 0   # the bound in force: set once the pids controller is ready (_bound_tasks)
        self.gpu_minors: dict[int, int] = {}   # GPU index -> device minor, once devices can be denied
        plain = node   # where groups lived before they were named by spool too (an upgrade finds them there)
        if spool is not None:
            node = node_folder(node, spool)
        self._lock = threading.Lock()
        self._current: dict[int, Path] = {}
        self.mode = mode if mode is not None else detect(root)
        if self.mode == "v2":
            self.base, self.legacy = root / "air" / node, root / "air" / plain
        elif self.mode == "v1":
            self.base, self.legacy = root / "memory" / "air" / node, root / "memory" / "air" / plain
        else:
            self.base = self.legacy = None
        if self.base is not None:
            try:
                self.base.mkdir(parents=True, exist_ok=True)
                if self.mode == "v2":
                    _enable(root, self.base, "memory")
            except OSError as e:
                log.warning("cannot create job cgroups under %s (%s); tracking jobs by process group only",
                            self.base, e.strerror)
                self.mode, self.base = "none", None
        if self.mode == "none":
            log.info("no writable cgroup hierarchy (cgroup v2, or v1 memory, as root): jobs are tracked by "
                     "process group only and --mem is not enforced")
        else:
            log.info("jobs run in cgroup %s groups under %s", self.mode, self.base)
            self.pids_max = self._bound_tasks(root, pids_max)
            if gpu_minors:
                self.gpu_minors = self._constrain_devices(root, gpu_minors)

    def _constrain_devices(self, root: Path, minors: dict[int, int]) -> dict[int, int]:
        """The devices hierarchy made ready for the runs' groups (v1); the GPUs it can keep apart."""
        try:
            if self.mode != "v1":
                raise OSError("cgroup v2 filters devices with eBPF, which this daemon does not load")
            if not (root / "devices" / "devices.deny").exists():
                raise OSError("no devices hierarchy is mounted")
            _sibling(self.base, "devices", below=2).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("jobs are not kept from other jobs' GPUs by their cgroup (only by CUDA_VISIBLE_DEVICES): "
                        "%s", e.strerror or e)
            return {}
        log.info("each run's devices cgroup denies it the GPUs on this node that are not its job's")
        return dict(minors)

    def _bound_tasks(self, root: Path, wanted: int) -> int:
        """The pids controller made ready for the runs' bound on their tasks; the bound in force (0: none,
        said in the log). Never more than half the host's pid_max: one job must not take them all."""
        if not wanted:
            return 0
        try:
            pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        except (OSError, ValueError):
            pid_max = 0
        bound = min(wanted, pid_max // 2) if pid_max else wanted
        try:
            if self.mode == "v2":
                if "pids" not in (root / "cgroup.controllers").read_text().split():
                    raise OSError("the pids controller is not available")
                _enable(root, self.base, "pids")
            elif (root / "pids" / "cgroup.procs").exists():
                _sibling(self.base, "pids", below=2).mkdir(parents=True, exist_ok=True)
            else:
                raise OSError("no pids hierarchy is mounted")
        except OSError as e:
            log.warning("max_pids_per_job is not enforced: %s", e.strerror or e)
            return 0
        log.info("each run's tasks on this node are bounded at %d (max_pids_per_job %d, pid_max %d)", bound,
                 wanted, pid_max)
        return bound

    @property
    def enabled(self) -> bool:
        return self.base is not None

    def create(self, job_id: int, run: int, memory_bytes: int, gpus: list[int] | None = None) -> Path | None:
        """The group of one run of the job (a requeued job's next run gets its own, so that the end
        of an old run never touches the new one), with its memory limit (0: none), and denied the
        node's GPUs other than `gpus`, the job's here (None: not known, none denied)."""
        if self.base is None:
            return None
        path = self.run_path(job_id, run)
        path.mkdir(parents=True, exist_ok=True)
        if self.pids_max:
            if self.mode == "v2" and (path / "pids.max").exists():
                (path / "pids.max").write_text(str(self.pids_max))
            elif self.mode == "v1" and _sibling(self.base, "pids", below=2).is_dir():
                tasks = _sibling(path, "pids")
                tasks.mkdir(exist_ok=True)
                (tasks / "pids.max").write_text(str(self.pids_max))
        if self.gpu_minors and gpus is not None:
            devices = _sibling(path, "devices")
            devices.mkdir(exist_ok=True)
            for index, minor in sorted(self.gpu_minors.items()):
                if index not in gpus:
                    (devices / "devices.deny").write_text(f"c {NVIDIA_MAJOR}:{minor} rwm")
        if memory_bytes:
            if self.mode == "v2":
                (path / "memory.max").write_text(str(memory_bytes))
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
        with self._lock:
            self._current[job_id] = path
        return path

    def run_path(self, job_id: int, run: int) -> Path | None:
        """Where the group of this run of the job is (or would be) on this node."""
        return self.base / f"job{job_id}.{run}" if self.base is not None else None

    def current(self, job_id: int) -> Path | None:
        """The group of the job's run on this node now, if it has one (its ranks join it)."""
        with self._lock:
            path = self._current.get(job_id)
        return path if path is not None and path.is_dir() else None

    def adopt(self, job_id: int, path: Path) -> None:
        """The group of a run an earlier daemon started (found in its folder): the job's current one here,
        if it is one of this node's."""
        if self.base is not None and path.parent == self.base and path.is_dir():
            with self._lock:
                self._current[job_id] = path

    @staticmethod
    def pids(path: Path) -> list[int]:
        try:
            return [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def empty(self, path: Path, tries: int = 50) -> bool:
        """SIGKILL what is in the group until nothing is (a process forking as it dies comes back in the
        next round); whether it is empty now."""
        for _ in range(tries):
            if not self.kill(path):
                return True
            time.sleep(0.02)
        return not self.pids(path)

    def kill(self, path: Path, sig: int = signal.SIGKILL) -> int:
        """Signal every process in the group; how many there were."""
        pids = self.pids(path)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return len(pids)

    def oom_kills(self, path: Path) -> int:
        """How many of the group's processes the kernel killed for memory."""
        name = "memory.events" if self.mode == "v2" else "memory.oom_control"
        try:
            for line in (path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_memory(self, path: Path) -> int:
        name = "memory.peak" if self.mode == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((path / name).read_text())
        except (OSError, ValueError):
            return 0

    def remove(self, path: Path) -> None:
        with self._lock:
            for job_id, current in list(self._current.items()):
                if current == path:
                    del self._current[job_id]
        for group in reversed(joined(path)):   # (the pids and devices ones first: emptied with the memory one)
            try:
                group.rmdir()
            except OSError as e:   # processes still in it: they die with the next kill
                if e.errno != errno.ENOENT:
                    log.warning("cannot remove cgroup %s: %s", group, e.strerror)

    def leftovers(self) -> list[Path]:
        """Groups an earlier daemon left behind (also one of a version that named them by node only)."""
        if self.base is None:
            return []
        older = self.legacy.glob("job*") if self.legacy != self.base and self.legacy.is_dir() else ()
        return sorted([*self.base.glob("job*"), *older])

    def close(self) -> None:
        """On the daemon's way out: remove the node's folder (and air/ above it) if no job is left in it."""
        if self.base is None:
            return
        bases = [self.base] + ([_sibling(self.base, h, below=2) for h in ("pids", "devices")]
                               if self.mode == "v1" else [])
        for base in bases:
            for folder in (base, base.parent):
                try:
                    folder.rmdir()
                except OSError:
                    break


def local_devices(visible: str, job_gpus: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a process whose devices group lets it open only its job's GPUs on this
    node: the CUDA driver numbers the GPUs it can open from 0, in the order of their indices, so GPU g
    of the job is the position of g among the job's GPUs here (as Slurm does under ConstrainDevices).
    `visible`: the node's indices ("4,6"), as the allocation gives them."""
    order = {g: i for i, g in enumerate(sorted(set(job_gpus)))}
    return ",".join(str(order[int(g)]) for g in visible.split(",") if is_number(g.strip()) and int(g) in order)


def node_folder(node: str, spool: Path) -> str:
    """The folder of a node daemon's groups under air/: named by its node and its spool, so that the
    daemons of two clusters on one host (whose nodes share names) never touch each other's groups."""
    return f"{node}.{hashlib.sha256(str(Path(spool).resolve()).encode()).hexdigest()[:8]}"


def detect(root: Path = CGROUP_ROOT) -> str:
    if os.geteuid() != 0:
        return "none"
    if (root / "cgroup.controllers").exists() and "memory" in (root / "cgroup.controllers").read_text().split():
        return "v2"
    if (root / "memory" / "memory.limit_in_bytes").exists() or (root / "memory" / "cgroup.procs").exists():
        return "v1"
    return "none"


def _enable(root: Path, base: Path, controller: str) -> None:
    """v2: a controller (memory, pids) enabled down to the node's folder and in it, for the runs' groups
    under it (a group has a controller's files only when its parent's subtree_control enables it)."""
    here = root
    for part in [*base.relative_to(root).parts, None]:
        control = here / "cgroup.subtree_control"
        if control.exists() and controller not in control.read_text().split():
            control.write_text(f"+{controller}")
        if part is not None:
            here = here / part


def _sibling(path: Path, hierarchy: str, below: int = 3) -> Path:
    """v1: the group of the same name as `path` in another hierarchy; `path` is in the memory one,
    `below` folders under it (<root>/memory/air/<node>/job<ID>.<RUN>: 3, the node's folder: 2).
    (On strings: a run's start and end ask for these several times, and pathlib's parsing of parts
    was a sixth of the node daemon's Python time in a drain of trivial jobs.)"""
    parts = str(path).rsplit("/", below + 1)
    return Path("/".join([parts[0], hierarchy, *parts[2:]]))


def joined(path: Path) -> list[Path]:
    """The groups a process of the run whose group is `path` joins: that one, and on v1 (a group of the
    memory hierarchy) the run's groups in the pids and devices hierarchies where it has them."""
    parts = str(path).rsplit("/", 4)
    if len(parts) < 5 or parts[1] != "memory" or parts[2] != "air":
        return [path]
    return [path] + [Path(group) for group in ("/".join([parts[0], h, *parts[2:]]) for h in ("pids", "devices"))
                     if os.path.isdir(group)]

