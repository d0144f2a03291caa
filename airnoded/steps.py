"""This node's part of a job step: ranks started as the job's owner when airrun attaches,
their output streamed back line by line, and every rank killed when the stream ends.

Steps belong to a run of their job (the job's restart count): signals, cleanup and the
controller's "stale run" kills name the run, so nothing meant for an old run reaches a new one.
Everything a user can make grow is bounded: ranks per step and per node, steps per user and per
node, prepared steps per job, queued output lines and the length of one line.
"""
from __future__ import annotations

import logging
import os
import signal
import select
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

from air.airnoded import fence, jobfiles, progress, shepherding
from air.airnoded.outbox import QUIET, Outbox
from air.airnoded.cgroups import JobCgroups, local_devices
from air.airnoded.procs import as_owner, killpg
from air.airnoded.shepherding import Child, Herd
from air.airnoded.shepherd import start_time
from air.protos import air_pb2 as pb
from air.protos import keepalive
from air.protos.stepenv import rank_base, rank_environment

log = logging.getLogger("airnoded")

# Ranks enter the step's working directory as their owner (Popen's cwd would chdir as root, before
# it drops to the owner), after the cgroup gate when there is one.
RANK_START = 'cd -- "$1" || exit 126; shift; exec "$@"'
MAX_QUEUED = 4096  # output lines held for airrun per step on this node
MAX_QUEUED_BYTES = 4 << 20   # and their bytes: ranks that print faster than airrun reads wait
MAX_LINE = 64 * 1024
MAX_PREPARED = 64  # steps of one job prepared here and not yet started
MAX_STREAMS = 96   # steps streaming on this node at once, all users together (the server has 128 threads)
MAX_STEP_FILE = 64 << 20
ATTACH_WAIT_S = 60.0   # how long adopted ranks wait for their airrun to attach again
DRAIN_S = 2.0      # how long a stopping daemon waits for airrun to take the output it has read
# a rank's output read and not passed on when the daemon stopped, kept for the next one: at most the
# step's queued bytes and a rank's unfinished line and last read, so never cut short
MAX_REST = MAX_QUEUED_BYTES + 2 * MAX_LINE + 65536


class StepError(Exception):
    pass


class Stopping(Exception):
    """The daemon is stopping: the caller may try again once its successor is up."""


class StepLimit(Exception):
    """Too many ranks, or too many steps at once: a bound a user hit."""


RunKey = tuple[int, int]   # (job id, run)


class StepRunner:
    def __init__(self, node: str, address: str, cgroups: JobCgroups | None = None, spool: Path | None = None,
                 max_tasks_per_node: int = 512, max_streams_per_user: int = 16,
                 on_idle: Callable[[int, int], None] | None = None,
                 on_kill: Callable[[RunKey], None] = lambda key: None,
                 limits: Callable[[Mapping[str, int]], list[list[int]]] = lambda wanted: [],
                 batch_here: Callable[[int, int], bool] = lambda job_id, run: False,
                 on_leftover: Callable[[int, int, Path], None] = lambda job_id, run, group: None):
        self.node = node
        self.on_leftover = on_leftover   # a run's own group that would not empty after its last step
        self.batch_here = batch_here   # whether this run's batch script runs here, or is being started
        self.limits = limits     # airrun's resource limits -> those to set on the ranks (config's propagation)
        self.on_kill = on_kill   # told of every run whose ranks are sent SIGKILL (the kill watch)
        self.address = address
        self.spool = spool
        self.cgroups = cgroups or JobCgroups(node, mode="none")
        self.max_tasks_per_node = max_tasks_per_node
        self.max_ranks = 2 * max_tasks_per_node   # ranks running on this node at once, all steps together
        self.max_streams_per_user = max_streams_per_user
        self.on_idle = on_idle or (lambda job_id, run: None)
        self._prepared: dict[tuple[int, int], pb.Step] = {}   # (job, step) -> step
        self._groups: dict[RunKey, dict[int, int | None]] = {}   # run -> its ranks' groups and their start times
        self._streams: dict[RunKey, int] = {}       # run -> steps of it streaming here
        self._user_streams: dict[int, int] = {}     # uid -> steps of theirs streaming here
        self._ranks = 0                             # ranks running here
        self._adopted: dict[tuple[int, int], _Stream] = {}   # (job, step) -> adopted, airrun not back yet
        self._live: set[_Stream] = set()
        # run -> its cgroup here, where no batch script runs: the steps' own, made by the first and
        # removed (what is left in it killed) with the last; group_lock orders the two
        self._own_groups: dict[RunKey, Path] = {}
        self._group_locks = [threading.Lock() for _ in range(16)]
        self.detaching = threading.Event()
        self.spawner: shepherding.Spawner | None = None   # forks shepherds cheaply, once started
        self._lock = threading.Lock()

    def prepare(self, step: pb.Step) -> int:
        """Remember the step; return a port free on this node's address (for the first node's MASTER_PORT)."""
        with self._lock:
            self._prepared[(step.job_id, step.step_id)] = step
            mine = [k for k in self._prepared if k[0] == step.job_id]
            for key in mine[:-MAX_PREPARED]:   # steps laid out but never started: keep the newest
                del self._prepared[key]
        with socket.socket() as s:
            s.bind((self.address, 0))
            return s.getsockname()[1]

    def forget_job(self, job_id: int, run: int) -> None:
        """Steps prepared for this run (or an older one) will not start."""
        with self._lock:
            for key in [k for k, s in self._prepared.items() if k[0] == job_id and s.run <= run]:
                del self._prepared[key]

    def groups(self, job_id: int, run: int) -> list[int]:
        """The process groups of the ranks of this run (and older ones) of the job here."""
        with self._lock:
            return [g for (j, r), gs in self._groups.items() if j == job_id and r <= run for g in gs]

    def has_ranks(self, job_id: int, run: int) -> bool:
        """Whether a step of this run of the job is starting or running here, or left processes in the
        run's group here that would not die (its folder keeps the group's record for the fence keeper)."""
        with self._lock:
            return bool(self._groups.get((job_id, run))) or self._streams.get((job_id, run), 0) > 0 \
                or (job_id, run) in self._own_groups

    def rank_count(self) -> int:
        """Ranks starting or running here, all steps together."""
        with self._lock:
            return self._ranks

    def runs(self) -> list[RunKey]:
        """Runs with ranks alive here (a step whose ranks have all ended, waiting for airrun to collect
        their exits, runs nothing)."""
        with self._lock:
            return [k for k, n in self._streams.items() if n > 0 and self._groups.get(k)]

    def signal(self, job_id: int, run: int, sig: int) -> bool:
        """Signal the ranks of this run (and older ones) here; 0: the daemon ends the run, with SIGKILL to
        the ranks and to what they left in the run's own group, watched by the kill watch (a user's own
        SIGKILL to the steps is not: the run goes on)."""
        with self._lock:
            groups = [(g, t) for (j, r), gs in self._groups.items() if j == job_id and r <= run for g, t in gs.items()]
            own = [g for (j, r), g in self._own_groups.items() if j == job_id and r <= run]
            keys = [k for k in self._groups.keys() | self._own_groups.keys() if k[0] == job_id and k[1] <= run]
        if sig == 0:
            for key in keys:
                self.on_kill(key)
        for pgid, began in groups:   # a rank reaped by its shepherd and not yet seen here: its number is not ours
            if began is None or start_time(pgid) in (began, 0):
                killpg(pgid, sig or signal.SIGKILL)
        if sig in (0, signal.SIGKILL):   # and whatever the ranks started that left their process groups
            for group in own:
                self.cgroups.kill(group)
        return bool(groups) or any(self.cgroups.pids(g) for g in own)

    def streaming(self, job_id: int, run: int) -> bool:
        """Whether a step of this run is starting or running here."""
        with self._lock:
            return self._streams.get((job_id, run), 0) > 0

    def forget_group(self, job_id: int, run: int, group: Path) -> None:
        """The run's own group here, left by its last step and now removed (by the leftover watch)."""
        with self._lock:
            if self._own_groups.get((job_id, run)) == group:
                del self._own_groups[(job_id, run)]

    def kill_again(self, job_id: int, run: int) -> list[int]:
        """SIGKILL what is left of this run's ranks here once more; the processes still there (the ranks'
        leaders, and what is in the run's own group)."""
        self.signal(job_id, run, 0)
        with self._lock:
            leaders = list(self._groups.get((job_id, run), {}))
            own = self._own_groups.get((job_id, run))
        return leaders + (self.cgroups.pids(own) if own is not None else [])

    def group_lock(self, key: RunKey) -> threading.Lock:
        """One of a few locks that order a run's group being made and removed (one user's slow cleanup
        holds up the steps of the runs that share its lock, not all)."""
        return self._group_locks[hash(key) % len(self._group_locks)]

    def run_group(self, step: pb.Step, index: int, folder: Path) -> Path | None:
        """The cgroup the step's ranks join here: where the run's batch script runs (its shepherd's
        record is in the run's folder), the batch script's, made by the launcher; on a node where only
        ranks run, the run's own, made now with the job's memory limit on this node and recorded in the
        run's folder (for the fence keeper, and for a daemon that adopts the ranks)."""
        if not self.cgroups.enabled:
            return None
        key = (step.job_id, step.run)
        here = step.nodes[index]   # (an older controller does not say the job's GPUs here: none denied)
        gpus = list(here.allocation.gpus) if here.HasField("allocation") else None
        recorded = fence.recorded_cgroup(folder)   # (by this daemon, or an earlier one: its path may differ)
        if shepherding.BATCH in shepherding.tags(folder) or self.batch_here(*key):
            # the batch script's, which the launcher makes and removes: a step that comes while the script
            # is still being started makes it (the same group, with the same limits), never as its own
            return recorded or self.cgroups.create(step.job_id, step.run, here.memory_limit_bytes, gpus)
        with self.group_lock(key):
            with self._lock:
                group = self._own_groups.get(key)
            if group is not None and group.is_dir():
                return group
            if recorded is not None:   # an earlier daemon's, for ranks it left running here
                with self._lock:
                    self._own_groups[key] = recorded
                return recorded
            group = self.cgroups.create(step.job_id, step.run, here.memory_limit_bytes, gpus)
            jobfiles.write_root_file(folder, fence.CGROUP, str(group).encode(), 0o600)
            with self._lock:
                self._own_groups[key] = group
            return group

    def _end_group(self, key: RunKey) -> None:
        """The run's last step here has ended: kill what its ranks left in the run's own cgroup, and
        remove it (unless a step of the run started meanwhile). A group that will not empty stays this
        run's, so that the run's stop, a stale-run kill or a fence still reach what is in it."""
        with self.group_lock(key):
            with self._lock:
                if self._streams.get(key):
                    return
                group = self._own_groups.get(key)
                if group is not None and self.batch_here(*key):   # a batch script started in it meanwhile:
                    del self._own_groups[key]                     # the group is the script's now
                    return
            if group is None:
                return
            if self.cgroups.pids(group):
                log.warning("job %d: killing processes its ranks left on %s (run %d)", key[0], self.node, key[1])
            if not self.cgroups.empty(group):
                log.warning("job %d: processes its ranks left on %s (run %d) outlive SIGKILL; cgroup %s kept",
                            key[0], self.node, key[1], group)
                self.on_leftover(key[0], key[1], group)
                return
            self.cgroups.remove(group)
            with self._lock:
                if self._own_groups.get(key) == group:
                    del self._own_groups[key]

    def attach(self, job_id: int, step_id: int, uid: int,
               beats: bool = False) -> tuple[Iterator[pb.StepEvent], Callable[[], None]]:
        """Follow a step an earlier daemon started here (airrun again after a restart); once."""
        with self._lock:
            if self.detaching.is_set():
                raise Stopping(f"{self.node}'s daemon is stopping; try again")
            stream = self._adopted.get((job_id, step_id))
            if stream is None or stream.attached.is_set() or stream.stopped.is_set():
                raise StepError(f"step {job_id}.{step_id} is not running on {self.node}")
            if uid not in (stream.step.uid, 0):
                raise PermissionError(f"step {job_id}.{step_id} belongs to uid {stream.step.uid}")
            stream.attached.set()
            del self._adopted[(job_id, step_id)]
        return stream.events(beats), stream.stop

    def run(self, job_id: int, step_id: int, uid: int,
            beats: bool = False) -> tuple[Iterator[pb.StepEvent], Callable[[], None]]:
        """Start this node's ranks; returns (events, stop). `uid` is the verified caller: the step's
        owner as the controller signed it, or root. Nothing is taken or counted before the checks."""
        with self._lock:
            if self.detaching.is_set():
                raise Stopping(f"{self.node}'s daemon is stopping; try again")
            step = self._prepared.get((job_id, step_id))
            if step is None:
                raise StepError(f"step {job_id}.{step_id} is not prepared on {self.node}")
            if uid not in (step.uid, 0):
                raise PermissionError(f"step {job_id}.{step_id} belongs to uid {step.uid}")
            index = next((i for i, n in enumerate(step.nodes) if n.node == self.node), None)
            if index is None:
                raise StepError(f"step {job_id}.{step_id} has no ranks on {self.node}")
            here = step.nodes[index]
            if len(here.ranks) > self.max_tasks_per_node:
                raise StepLimit(f"step {job_id}.{step_id} asks for {len(here.ranks)} ranks on {self.node}; "
                                f"the limit is {self.max_tasks_per_node} (max_tasks_per_node)")
            if self._ranks + len(here.ranks) > self.max_ranks:
                raise StepLimit(f"{self.node} runs {self._ranks} ranks already; {len(here.ranks)} more would pass "
                                f"its limit of {self.max_ranks}")
            if sum(self._user_streams.values()) >= MAX_STREAMS:
                raise StepLimit(f"{self.node} is running {MAX_STREAMS} steps already; try again later")
            if self._user_streams.get(step.uid, 0) >= self.max_streams_per_user:
                raise StepLimit(f"uid {step.uid} has {self.max_streams_per_user} steps running on {self.node} "
                                "already (max_steps_per_user)")
            del self._prepared[(job_id, step_id)]
            key = (job_id, step.run)
            self._user_streams[step.uid] = self._user_streams.get(step.uid, 0) + 1
            self._streams[key] = self._streams.get(key, 0) + 1
            self._ranks += len(here.ranks)
            stream = _Stream(self, step, key, len(here.ranks))
            self._live.add(stream)   # with the check above: a daemon that stops now drains it too
        try:
            stream.start(index)
        except BaseException:
            stream.stop()
            raise
        return stream.events(beats), stream.stop

    def _started(self, key: RunKey, pgid: int, began: int | None = None) -> None:
        """A rank's process group, with its leader's start time (`began`: as its shepherd recorded it;
        else read now, just after the start)."""
        with self._lock:
            self._groups.setdefault(key, {})[pgid] = start_time(pgid) if began is None else began

    def _reaped(self, key: RunKey, pgid: int) -> None:
        """A rank's leader is about to be reaped: its group's number may be anyone's afterwards."""
        with self._lock:
            groups = self._groups.get(key)
            if groups is not None:
                groups.pop(pgid, None)

    def _ended(self, key: RunKey, uid: int, pgids: list[int], ranks: int, stream: "_Stream") -> None:
        """A stream's end: its ranks and counts go, and the run's folder with its last step here."""
        with self._lock:
            self._adopted.pop((key[0], stream.step.step_id), None)
            groups = self._groups.get(key, {})
            for pgid in pgids:
                groups.pop(pgid, None)
            if not groups:
                self._groups.pop(key, None)
            self._ranks -= ranks
            self._live.discard(stream)
            self._user_streams[uid] -= 1
            if not self._user_streams[uid]:
                del self._user_streams[uid]
            self._streams[key] -= 1
            idle = not self._streams[key]
            if idle:
                del self._streams[key]
        if idle and not self.detaching.is_set():
            self._end_group(key)
            self.on_idle(*key)

    def detach(self) -> None:
        """The daemon is stopping: streams end without killing their ranks (the next daemon adopts them).
        What each has read goes to airrun first, for up to DRAIN_S; what airrun does not take then (and
        an unfinished line) stays in the run's folder for the next daemon: a restart loses no output."""
        self.detaching.set()
        with self._lock:
            streams = list(self._live)
        deadline = time.monotonic() + DRAIN_S
        for stream in streams:
            stream.drain(deadline)
        for stream in streams:
            stream.finish_drain(deadline)

    def adopt(self, spool: Path) -> set[RunKey]:
        """The steps an earlier daemon on this node started and whose ranks still run or ended unseen:
        each waits for airrun to attach again (ATTACH_WAIT_S, then its ranks are killed). Returns the runs."""
        runs = set()
        for entry in os.scandir(spool):
            key = jobfiles.parse_job_dir(entry.name)
            if key is None:
                continue
            folder = Path(entry.path)
            for tag in shepherding.tags(folder):
                if not tag.startswith("step"):
                    continue
                try:
                    step = pb.Step.FromString(jobfiles.read_root_file(folder, f"{tag}.pb", MAX_STEP_FILE))
                    index = next(i for i, n in enumerate(step.nodes) if n.node == self.node)
                    if (step.job_id, step.run) != key or tag.split("-")[0] != f"step{step.step_id}":
                        raise ValueError("its record names another step")
                except Exception as e:   # (a record that does not parse, too): that step alone is killed
                    log.warning("%s/%s left by an earlier airnoded cannot be adopted: %s", entry.name, tag, e)
                    herd = shepherding.adopt(folder, tag)
                    herd.kill_children()
                    herd.close()
                    continue
                here = step.nodes[index]
                stream = _Stream(self, step, key, len(here.ranks))
                stream.tag = tag
                group = fence.recorded_cgroup(folder)
                own = group is not None and shepherding.BATCH not in shepherding.tags(folder)
                with self._lock:
                    if own:   # the run's own group here (no batch script ran here): it goes with the last step
                        self._own_groups[key] = group
                    self._adopted[(step.job_id, step.step_id)] = stream
                    self._live.add(stream)
                    self._user_streams[step.uid] = self._user_streams.get(step.uid, 0) + 1
                    self._streams[key] = self._streams.get(key, 0) + 1
                    self._ranks += len(here.ranks)
                stream.adopt(folder, index)
                timer = threading.Timer(ATTACH_WAIT_S, self._unclaimed, (stream,))
                timer.daemon = True   # never keeps a stopping daemon alive
                timer.start()
                runs.add(key)
                log.info("step %d.%d (run %d) adopted from an earlier airnoded: %d ranks running", step.job_id,
                         step.step_id, step.run, len(stream.herd.running()))
        return runs

    def _unclaimed(self, stream: "_Stream") -> None:
        if not stream.attached.is_set() and not stream.stopped.is_set() and not self.detaching.is_set():
            log.warning("step %d.%d: airrun did not come back in %.0f s; killing its ranks", stream.key[0],
                        stream.step.step_id, ATTACH_WAIT_S)
            stream.stop()


class _Stream:
    """One step's ranks on this node (children of one shepherd) and the events airrun reads from them.

    Each rank writes its output into two FIFOs in the run's folder that its shepherd holds open, so
    a rank never loses its output or gets EPIPE while no daemon reads (it waits), and a daemon that
    adopts the step opens them again and goes on where the last one stopped."""

    def __init__(self, runner: StepRunner, step: pb.Step, key: RunKey, ranks: int):
        self.runner = runner
        self.step = step
        self.key = key
        self.ranks = ranks
        self.tag = f"step{step.step_id}-{os.urandom(4).hex()}"   # a step id reused (controller restart) never collides
        self.outbox = Outbox(MAX_QUEUED, MAX_QUEUED_BYTES)   # ranks that print faster than airrun reads wait
        self.stopped = threading.Event()
        self.attached = threading.Event()   # someone follows the events (set at once for a live start)
        self.herd: Herd | None = None
        self.outputs: dict[int, tuple[int, int, bool]] = {}   # fd -> (child, rank, stderr)
        self.rank_of: list[int] = []                         # child -> global rank
        self.rest: dict[int, tuple[bytes, Path]] = {}   # fd -> output an earlier daemon read and did not pass on
        self.drain_by: float | None = None  # set when the daemon stops: the pump reads no more
        self._unread: dict[tuple[int, bool], bytes] = {}   # (child, stderr) -> read and not queued, at a drain
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)   # ends the pump's wait
        self._wake_lock = threading.Lock()
        self._pump_thread: threading.Thread | None = None
        self._stop_lock = threading.Lock()

    def start(self, index: int) -> None:
        runner, step = self.runner, self.step
        job_id, run = self.key
        here = step.nodes[index]
        kwargs, extra_env = as_owner(step.uid, step.gid)
        if runner.spool is not None:   # where the ranks report progress and read why they were stopped
            folder = progress.prepare(runner.spool, job_id, run, step.uid, step.gid).parent
            extra_env = {**extra_env, **progress.environment(runner.spool, job_id, run)}
        else:
            raise StepError(f"{runner.node} has no spool for the step's records")
        jobfiles.write_root_file(folder, f"{self.tag}.pb", step.SerializeToString(), 0o600)
        argv = ["/bin/sh", "-c", RANK_START, "air-rank", step.spec.workdir or "/", *step.spec.argv]
        children, ours, theirs = [], [], []
        base = rank_base(step, extra_env)   # (once: the same for every rank here, and up to MiBs)
        try:
            for local_rank, rank in enumerate(here.ranks):
                env = rank_environment(step, index, local_rank, base)
                if runner.cgroups.gpu_minors and here.HasField("allocation") and env["CUDA_VISIBLE_DEVICES"]:
                    # the run's devices group lets the rank open only its job's GPUs here: CUDA numbers them
                    env["CUDA_VISIBLE_DEVICES"] = local_devices(env["CUDA_VISIBLE_DEVICES"],
                                                                list(here.allocation.gpus))
                fds = []
                for stream in ("out", "err"):
                    r, w = shepherding.make_fifo(folder, f"{self.tag}.{local_rank}.{stream}")
                    ours.append(r)
                    theirs.append(w)
                    self.outputs[r] = (local_rank, rank, stream == "err")
                    fds.append(w)
                children.append(Child(argv, env, fds[0], fds[1]))
                self.rank_of.append(rank)
            self.herd = shepherding.spawn(folder, self.tag, children,
                                          None if step.uid == os.getuid() else step.uid, step.gid,
                                          list(kwargs.get("extra_groups", [step.gid])),
                                          runner.run_group(step, index, folder),
                                          holds=[folder / f"{self.tag}.{i}.{s}" for i in range(len(children))
                                                 for s in ("out", "err")], spawner=runner.spawner,
                                          rlimits=runner.limits(step.spec.rlimits))
        except BaseException:
            for fd in ours:
                os.close(fd)
            self.outputs.clear()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        for child, pgid in self.herd.pids.items():
            runner._started(self.key, pgid)
        self.attached.set()
        self._start_pump()
        log.info("step %d.%d (run %d): %d ranks started", job_id, step.step_id, run, len(self.herd.pids))

    def adopt(self, folder: Path, index: int) -> None:
        """Follow the ranks an earlier daemon started for this step here (their shepherd's record)."""
        here = self.step.nodes[index]
        self.rank_of = list(here.ranks)
        self.herd = shepherding.adopt(folder, self.tag)
        for local_rank, rank in enumerate(here.ranks):
            for stream in ("out", "err"):
                name = f"{self.tag}.{local_rank}.{stream}"
                fd = shepherding.open_fifo(folder, name)
                if fd >= 0:
                    self.outputs[fd] = (local_rank, rank, stream == "err")
                    try:   # what the earlier daemon had read and could not pass on: it goes first
                        self.rest[fd] = (jobfiles.read_root_file(folder, f"{name}.rest", MAX_REST),
                                         folder / f"{name}.rest")
                    except FileNotFoundError:
                        pass
                    except (OSError, jobfiles.UnsafeFile) as e:
                        log.warning("step %d.%d: %s.rest cannot be read: %s", self.key[0], self.step.step_id,
                                    name, e)
        for child, pgid in self.herd.running().items():   # (the start times recorded, not whoever has the
            self.runner._started(self.key, pgid, self.herd.starts.get(child))   # number now: pid reuse)
        self._start_pump()

    def _start_pump(self) -> None:
        with self._wake_lock:
            if self._wake_w < 0:   # stopped meanwhile (the daemon stops): the next daemon follows the ranks
                for fd in self.outputs:
                    os.close(fd)
                self.outputs.clear()
                self.herd.close()
                return
            self._pump_thread = threading.Thread(target=self._pump, daemon=True,
                                                 name=f"step-{self.key[0]}.{self.step.step_id}")
            self._pump_thread.start()

    def drain(self, deadline: float) -> None:
        """The daemon stops: read no more, pass on what was read until `deadline`, keep the rest."""
        self.drain_by = deadline
        with self._wake_lock:
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    def _close_wake(self) -> None:
        with self._wake_lock:
            if self._wake_w >= 0:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_r = self._wake_w = -1

    def finish_drain(self, deadline: float) -> None:
        """After drain(): once airrun has taken the events queued, or at `deadline`, the stream ends;
        the output it did not take, with what the pump read and did not queue, stays in the run's
        folder (the exits go too: the next daemon has them from the shepherd's record)."""
        if self._pump_thread is not None:
            self._pump_thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
            if self._pump_thread.is_alive():
                log.warning("step %d.%d: its output reader has not stopped; what it holds is lost",
                            self.key[0], self.step.step_id)
        while self.attached.is_set() and not self.outbox.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        kept: dict[tuple[int, bool], list[bytes]] = {}
        for event in self.outbox.hand_over():   # the reader takes nothing from here on: no line out of order
            if event.data:
                kept.setdefault((self.rank_of.index(event.rank), event.stderr), []).append(event.data)
        for key, rest in self._unread.items():
            kept.setdefault(key, []).append(rest)
        self._keep(kept)
        self.stop()

    def _keep(self, kept: dict[tuple[int, bool], list[bytes]]) -> None:
        if self.runner.spool is None:
            return
        folder = jobfiles.job_dir(self.runner.spool, *self.key)
        for (child, is_err), pieces in kept.items():
            rest = b"".join(pieces)
            lost = max(0, len(rest) - MAX_REST)
            try:
                if rest:
                    jobfiles.write_root_file(folder, f"{self.tag}.{child}.{'err' if is_err else 'out'}.rest",
                                             rest[:MAX_REST], 0o600)
            except OSError as e:
                lost = len(rest)
                log.warning("step %d.%d: cannot keep rank %d's output: %s", self.key[0], self.step.step_id,
                            self.rank_of[child], e)
            if lost:
                log.warning("step %d.%d: %d bytes of rank %d's output are lost in the daemon's restart",
                            self.key[0], self.step.step_id, lost, self.rank_of[child])

    def events(self, beats: bool = False) -> Iterator[pb.StepEvent]:
        """The step's events; with `beats` (an airrun that asks for them), also a beat first and after
        each keepalive.BEAT_S without an event: its sign that this daemon is there."""
        remaining = self.ranks
        try:
            if beats:
                yield pb.StepEvent(beat=True)
            while remaining:
                event = self.outbox.get(keepalive.BEAT_S if beats else None)
                if event is QUIET:
                    yield pb.StepEvent(beat=True)
                    continue
                if event is None:
                    return
                if event.exited:
                    remaining -= 1
                yield event
        finally:
            self.stop()

    def stop(self) -> None:
        """Kill the ranks and give back what the step held; once, whoever calls first (the stream's
        end, or gRPC when airrun went away). While the daemon itself stops, the ranks are left to
        their shepherd for the next daemon to adopt: only the stream ends."""
        with self._stop_lock:
            if self.stopped.is_set():
                return
            self.stopped.set()
        with self._wake_lock:
            pumping = self._pump_thread is not None
        if not pumping:
            self._close_wake()
        if not self.runner.detaching.is_set() and self.herd is not None:
            self.herd.kill_children()
            self._forget_files()
        self.runner._ended(self.key, self.step.uid, list(self.herd.pids.values()) if self.herd else [], self.ranks,
                           self)
        self.outbox.close()   # a reader ends after the events held

    def _forget_files(self) -> None:
        """The step's records in the run's folder: a later daemon has nothing of it to adopt."""
        if self.runner.spool is None:
            return
        folder = jobfiles.job_dir(self.runner.spool, *self.key)
        try:
            names = [e.name for e in os.scandir(folder) if e.name.startswith(self.tag + ".")]
        except OSError:
            return
        for name in names:
            try:
                os.unlink(folder / name)
            except OSError:
                pass

    def _put(self, event: pb.StepEvent) -> bool:
        """Queue an event unless the stream has ended (then nobody will read it) or the daemon stops
        and airrun has not taken the events before them in time."""
        if self.stopped.is_set():
            return False
        return self.outbox.put(event, lambda: self.stopped.is_set() or (self.drain_by is not None and (
            time.monotonic() > self.drain_by or not self.attached.is_set())))

    def _pump(self) -> None:
        """Every rank's output a line (or MAX_LINE bytes of one) at a time, and each rank's exit after
        the last of its output; then the FIFOs are closed."""
        herd = self.herd
        poller = select.poll()
        partial: dict[int, bytes] = {}
        efd = herd.fd   # (herd.fd is -1 once it is closed)
        done: set[int] = set()
        try:
            for fd in self.outputs:
                poller.register(fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            if not herd.ended:
                poller.register(efd, select.POLLIN)
            for fd, (rest, path) in self.rest.items():   # an earlier daemon's leftovers go first
                _, rank, is_err = self.outputs[fd]
                partial[fd] = self._send(rank, is_err, rest)
                try:   # queued now (an unfinished line is kept with what the FIFO brings)
                    os.unlink(path)
                except OSError:
                    pass
            self.rest = {}
            for child in sorted(herd.exits):   # ended before this daemon saw them (adopted)
                self._exited(child, partial, poller, done)
            while len(done) < len(self.rank_of) and not self.stopped.is_set() and self.drain_by is None:
                ready = poller.poll(500)
                for fd, _ in ready:
                    if fd == efd:
                        self._events(herd.read(0), partial, poller, done)
                    elif fd in self.outputs:
                        self._read(fd, partial, poller)
                if not herd.ended and not any(fd == efd for fd, _ in ready) and not herd.alive():
                    # (a FIFO opened after its writer never reports the writer's end: an adopted shepherd)
                    self._events(herd._end(), partial, poller, done)
                if herd.ended:
                    _unregister(poller, efd)
                if herd.ended and self.drain_by is None:   # ranks the shepherd could not tell about: gone with it
                    herd.kill_children()
                    for child in range(len(self.rank_of)):
                        if child not in done:
                            herd.exits.setdefault(child, signal.SIGKILL)
                            self._exited(child, partial, poller, done)
        except Exception:   # ranks no one can follow are not left running
            log.exception("step %d.%d: following its ranks failed; ending the step", self.key[0], self.step.step_id)
            self.stop()
        finally:
            if self.runner.detaching.is_set():   # read and not queued: finish_drain keeps it
                self._unread = {self.outputs[fd][0::2]: rest for fd, rest in partial.items()
                                if rest and fd in self.outputs}
            for fd in list(self.outputs):
                os.close(fd)
            self.outputs.clear()
            self._close_wake()
            herd.close()
            if herd.proc is not None and not self.runner.detaching.is_set():
                try:   # its last child is gone or killed: the shepherd ends at once
                    herd.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    log.warning("step %d.%d: its shepherd (pid %d) has not ended", self.key[0], self.step.step_id,
                                herd.pid)
                    # (this daemon's child: reaped whenever it ends, never left a zombie)
                    threading.Thread(target=herd.proc.wait, daemon=True, name="reap-shepherd").start()

    def _events(self, new: list[tuple[str, int]], partial: dict[int, bytes], poller, done: set[int]) -> None:
        for kind, child in new:
            if kind == "exit":
                self._exited(child, partial, poller, done)

    def _read(self, fd: int, partial: dict[int, bytes], poller) -> bool:
        """Read what a FIFO has now; False when it has nothing more (closed, or would block), or when
        what was read before could not be queued (the stream ends, or the daemon stops)."""
        if len(partial.get(fd, b"")) >= MAX_LINE:   # try what waits again first
            _, rank, is_err = self.outputs[fd]
            partial[fd] = self._send(rank, is_err, partial[fd])
            if len(partial[fd]) >= MAX_LINE:
                return False
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        child, rank, is_err = self.outputs[fd]
        if not data:
            _unregister(poller, fd)
            return False
        partial[fd] = self._send(rank, is_err, partial.get(fd, b"") + data)
        return True

    def _send(self, rank: int, is_err: bool, buf: bytes, flush: bool = False) -> bytes:
        """Queue `buf` a line (or MAX_LINE bytes of one) at a time; returns what is left: an
        unfinished line (unless `flush`), or everything from the first event that could not be queued."""
        start = 0
        while start < len(buf):
            end = buf.find(b"\n", start, start + MAX_LINE)
            if end >= 0:
                end += 1
            elif len(buf) - start >= MAX_LINE or flush:
                end = min(len(buf), start + MAX_LINE)
            else:
                break
            if not self._put(pb.StepEvent(rank=rank, stderr=is_err, data=buf[start:end])):
                break
            start = end
        return buf[start:]

    def _exited(self, child: int, partial: dict[int, bytes], poller, done: set[int]) -> None:
        """A rank ended (its group is killed): its output up to now, then its exit."""
        if child in done or child >= len(self.rank_of):
            return
        done.add(child)
        rank = self.rank_of[child]
        for fd in [fd for fd, (c, _, _) in self.outputs.items() if c == child]:
            reads = 0
            while reads < 1024 and self._read(fd, partial, poller):
                reads += 1
            if partial.get(fd):
                partial[fd] = self._send(rank, self.outputs[fd][2], partial[fd], flush=True)
                if partial[fd]:   # the daemon stops: the rest and the exit are the next daemon's to pass on
                    return
            _unregister(poller, fd)
            os.close(fd)
            del self.outputs[fd]
        pgid = self.herd.pids.get(child)
        if pgid:
            self.runner._reaped(self.key, pgid)
        status = self.herd.exits.get(child, signal.SIGKILL)
        code, sig = (0, os.WTERMSIG(status)) if os.WIFSIGNALED(status) else (os.WEXITSTATUS(status), 0)
        # a rank the node's fence stopped did not fail: its node lost the controller (airrun says so)
        fenced = fence.fenced_before_end(jobfiles.job_dir(self.runner.spool, *self.key), self.herd.tag)
        self._put(pb.StepEvent(rank=rank, exited=True, exit_code=code, exit_signal=sig, fenced=fenced))


def _unregister(poller, fd: int) -> None:
    if fd < 0:   # (a herd closed, or ended before it was followed)
        return
    try:
        poller.unregister(fd)
    except KeyError:
        pass
