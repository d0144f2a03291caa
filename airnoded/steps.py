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
import queue
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator

from airctld.steps import rank_environment
from airnoded import fence, jobfiles, progress
from airnoded.cgroups import JobCgroups
from airnoded.launcher import GATE_LINE
from airnoded.procs import as_owner, exit_status, killpg
from protos import air_pb2 as pb

log = logging.getLogger("airnoded")

# Ranks enter the step's working directory as their owner (Popen's cwd would chdir as root, before
# it drops to the owner), after the cgroup gate when there is one.
RANK_START = 'cd -- "$1" || exit 126; shift; exec "$@"'
MAX_QUEUED = 4096  # output lines held for airrun per step on this node
MAX_LINE = 64 * 1024
MAX_PREPARED = 64  # steps of one job prepared here and not yet started
MAX_STREAMS = 96   # steps streaming on this node at once, all users together (the server has 128 threads)
_END = object()    # put on a step's queue when the stream must end


class StepError(Exception):
    pass


class StepLimit(Exception):
    """Too many ranks, or too many steps at once: a bound a user hit."""


RunKey = tuple[int, int]   # (job id, run)


class StepRunner:
    def __init__(self, node: str, address: str, cgroups: JobCgroups | None = None, spool: Path | None = None,
                 max_tasks_per_node: int = 512, max_streams_per_user: int = 16,
                 on_idle: Callable[[int, int], None] | None = None):
        self.node = node
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
        """Whether a step of this run of the job is starting or running here."""
        with self._lock:
            return bool(self._groups.get((job_id, run))) or self._streams.get((job_id, run), 0) > 0

    def runs(self) -> list[RunKey]:
        """Runs with a step here."""
        with self._lock:
            return [k for k, n in self._streams.items() if n > 0]

    def signal(self, job_id: int, run: int, sig: int) -> bool:
        pgids = self.groups(job_id, run)
        for pgid in pgids:
            killpg(pgid, sig or signal.SIGKILL)
        return bool(pgids)

    def run(self, job_id: int, step_id: int, uid: int) -> tuple[Iterator[pb.StepEvent], Callable[[], None]]:
        """Start this node's ranks; returns (events, stop). `uid` is the verified caller: the step's
        owner as the controller signed it, or root. Nothing is taken or counted before the checks."""
        with self._lock:
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
        try:
            stream.start(index)
        except BaseException:
            stream.stop()
            raise
        return stream.events(), stream.stop

    def _started(self, key: RunKey, pgid: int) -> None:
        with self._lock:
            self._groups.setdefault(key, {})[pgid] = fence.start_time(pgid)
            self._record(key)

    def _reaped(self, key: RunKey, pgid: int) -> None:
        """A rank's leader is about to be reaped: its group's number may be anyone's afterwards."""
        with self._lock:
            groups = self._groups.get(key)
            if groups is not None:
                groups.pop(pgid, None)
                self._record(key)

    def _record(self, key: RunKey) -> None:
        """The run's rank groups in its folder, where the fence keeper finds them (under the lock)."""
        if self.spool is None:
            return
        folder = jobfiles.job_dir(self.spool, *key)
        groups = dict(self._groups.get(key, {}))
        try:
            batch = int(jobfiles.read_root_file(folder, "pgid", 64))
            groups[batch] = fence.start_time(batch)
        except (OSError, ValueError, jobfiles.UnsafeFile):
            pass
        try:
            fence.record_groups(folder, groups)
        except OSError as e:
            log.warning("job %d: rank groups not recorded for the fence: %s", key[0], e)

    def _ended(self, key: RunKey, uid: int, pgids: list[int], ranks: int) -> None:
        """A stream's end: its ranks and counts go, and the run's folder with its last step here."""
        with self._lock:
            groups = self._groups.get(key, {})
            for pgid in pgids:
                groups.pop(pgid, None)
            if not groups:
                self._groups.pop(key, None)
            self._record(key)
            self._ranks -= ranks
            self._user_streams[uid] -= 1
            if not self._user_streams[uid]:
                del self._user_streams[uid]
            self._streams[key] -= 1
            idle = not self._streams[key]
            if idle:
                del self._streams[key]
        if idle:
            self.on_idle(*key)


class _Stream:
    """One step's ranks on this node and the events airrun reads from them."""

    def __init__(self, runner: StepRunner, step: pb.Step, key: RunKey, ranks: int):
        self.runner = runner
        self.step = step
        self.key = key
        self.ranks = ranks
        self.queue: queue.Queue = queue.Queue(maxsize=MAX_QUEUED)   # ranks that print faster than airrun reads wait
        self.stopped = threading.Event()
        self.procs: list[subprocess.Popen] = []
        self._stop_lock = threading.Lock()

    def start(self, index: int) -> None:
        runner, step = self.runner, self.step
        job_id, run = self.key
        here = step.nodes[index]
        kwargs, extra_env = as_owner(step.uid, step.gid)
        if runner.spool is not None:   # where the ranks report progress and read why they were stopped
            progress.prepare(runner.spool, job_id, run, step.uid, step.gid)
            extra_env = {**extra_env, **progress.environment(runner.spool, job_id, run)}
        group = runner.cgroups.current(job_id)
        gated = group is not None   # ranks join the job's cgroup on its batch node
        start = (GATE_LINE + RANK_START) if gated else RANK_START
        argv = ["/bin/sh", "-c", start, "air-rank", step.spec.workdir or "/", *step.spec.argv]
        for local_rank, rank in enumerate(here.ranks):
            env = rank_environment(step, index, local_rank, {**step.spec.environment, **extra_env})
            try:
                proc = subprocess.Popen(argv, env=env, cwd="/",
                                        stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                        **kwargs)
            except (OSError, ValueError) as e:
                message = f"airrun: {runner.node}: cannot run {step.spec.argv[0] if step.spec.argv else '?'}: " \
                          f"{getattr(e, 'strerror', None) or e}\n"
                self._put(pb.StepEvent(rank=rank, stderr=True, data=message.encode()))
                self._put(pb.StepEvent(rank=rank, exited=True, exit_code=126))
                continue
            self.procs.append(proc)
            runner._started(self.key, proc.pid)
            if gated:
                runner.cgroups.enter(group, proc)
            threading.Thread(target=self._watch, args=(proc, rank), daemon=True).start()
        log.info("step %d.%d (run %d): %d ranks started", job_id, step.step_id, run, len(self.procs))

    def events(self) -> Iterator[pb.StepEvent]:
        remaining = self.ranks
        try:
            while remaining:
                event = self.queue.get()
                if event is _END:
                    return
                if event.exited:
                    remaining -= 1
                yield event
        finally:
            self.stop()

    def stop(self) -> None:
        """Kill the ranks and give back what the step held; once, whoever calls first (the stream's
        end, or gRPC when airrun went away)."""
        with self._stop_lock:
            if self.stopped.is_set():
                return
            self.stopped.set()
        for proc in self.procs:
            killpg(proc.pid, signal.SIGKILL)
        self.runner._ended(self.key, self.step.uid, [p.pid for p in self.procs], self.ranks)
        while True:   # wake a reader waiting on a full queue: it ends at _END
            try:
                self.queue.put_nowait(_END)
                return
            except queue.Full:
                try:
                    self.queue.get_nowait()
                except queue.Empty:
                    pass

    def _put(self, event: pb.StepEvent) -> bool:
        """Queue an event unless the stream has ended (then nobody will read it)."""
        while not self.stopped.is_set():
            try:
                self.queue.put(event, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _watch(self, proc: subprocess.Popen, rank: int) -> None:
        readers = [threading.Thread(target=self._pump, args=(pipe, rank, is_err), daemon=True)
                   for pipe, is_err in ((proc.stdout, False), (proc.stderr, True))]
        for r in readers:
            r.start()
        try:   # kill what the rank left behind while its group's number is still ours, then reap
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        killpg(proc.pid, signal.SIGKILL)
        self.runner._reaped(self.key, proc.pid)
        status = proc.wait()
        for r in readers:   # every line before the exit, however long airrun takes to read them
            while r.is_alive() and not self.stopped.is_set():
                r.join(timeout=0.5)
        code, sig = exit_status(status)
        self._put(pb.StepEvent(rank=rank, exited=True, exit_code=code, exit_signal=sig))

    def _pump(self, pipe, rank: int, is_err: bool) -> None:
        """A rank's output, a line (or MAX_LINE bytes of one) at a time."""
        with pipe:
            for line in iter(lambda: pipe.readline(MAX_LINE), b""):
                if not self._put(pb.StepEvent(rank=rank, stderr=is_err, data=line)):
                    return
