"""This node's part of a job step: ranks started as the job's owner when airrun attaches,
their output streamed back line by line, and every rank killed when the stream ends."""
from __future__ import annotations

import logging
import queue
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Callable, Iterator

from airctld.steps import rank_environment
from airnoded import progress
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


class StepError(Exception):
    pass


class StepLimit(Exception):
    """Too many ranks, or too many steps at once: a bound a user hit."""


class StepRunner:
    def __init__(self, node: str, address: str, cgroups: JobCgroups | None = None, spool: Path | None = None,
                 max_tasks_per_node: int = 512, max_streams_per_user: int = 16,
                 on_idle: Callable[[int], None] | None = None):
        self.node = node
        self.max_tasks_per_node = max_tasks_per_node
        self.max_streams_per_user = max_streams_per_user
        self.on_idle = on_idle or (lambda job_id: None)
        self._streams: dict[int, int] = {}       # job id -> steps of it streaming here
        self._user_streams: dict[int, int] = {}  # uid -> steps of theirs streaming here
        self.address = address
        self.spool = spool
        self.cgroups = cgroups or JobCgroups(node, mode="none")
        self._prepared: dict[tuple[int, int], pb.Step] = {}
        self._groups: dict[int, set[int]] = {}   # job id -> process groups of its running ranks
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

    def forget_job(self, job_id: int) -> None:
        with self._lock:
            for key in [k for k in self._prepared if k[0] == job_id]:
                del self._prepared[key]

    def groups(self, job_id: int) -> list[int]:
        """The process groups of the job's running ranks here."""
        with self._lock:
            return list(self._groups.get(job_id, ()))

    def has_ranks(self, job_id: int) -> bool:
        """Whether a step of the job is starting or running here."""
        with self._lock:
            return bool(self._groups.get(job_id)) or self._streams.get(job_id, 0) > 0

    def jobs(self) -> list[int]:
        """Jobs with a step here."""
        with self._lock:
            return [j for j, n in self._streams.items() if n > 0]

    def signal(self, job_id: int, sig: int) -> bool:
        with self._lock:
            groups = list(self._groups.get(job_id, ()))
        for pgid in groups:
            killpg(pgid, sig or signal.SIGKILL)
        return bool(groups)

    def run(self, job_id: int, step_id: int, uid: int) -> tuple[Iterator[pb.StepEvent], callable]:
        """Start this node's ranks; returns (events, stop). `uid` is the verified caller."""
        with self._lock:
            step = self._prepared.pop((job_id, step_id), None)
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
        with self._lock:
            if sum(self._user_streams.values()) >= MAX_STREAMS:
                raise StepLimit(f"{self.node} is running {MAX_STREAMS} steps already; try again later")
            if self._user_streams.get(step.uid, 0) >= self.max_streams_per_user:
                raise StepLimit(f"uid {step.uid} has {self.max_streams_per_user} steps running on {self.node} "
                                "already (max_steps_per_user)")
            self._user_streams[step.uid] = self._user_streams.get(step.uid, 0) + 1
            self._streams[job_id] = self._streams.get(job_id, 0) + 1
        events: queue.Queue = queue.Queue(maxsize=MAX_QUEUED)   # ranks that print faster than airrun reads wait
        stopped = threading.Event()
        procs: list[subprocess.Popen] = []
        kwargs, extra_env = as_owner(step.uid, step.gid)
        try:
            if self.spool is not None:   # where the ranks report progress and read why they were stopped
                progress.prepare(self.spool, job_id, step.uid, step.gid)
                extra_env = {**extra_env, **progress.environment(self.spool, job_id)}
        except OSError:
            self._end_stream(job_id, step.uid)
            raise
        group = self.cgroups.current(job_id)
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
                if gated:
                    self.cgroups.enter(group, proc)
            except OSError as e:
                message = f"airrun: {self.node}: cannot run {step.spec.argv[0]}: {e.strerror}\n"
                _put(events, pb.StepEvent(rank=rank, stderr=True, data=message.encode()), stopped)
                _put(events, pb.StepEvent(rank=rank, exited=True, exit_code=127 if e.errno == 2 else 126), stopped)
                continue
            procs.append(proc)
            with self._lock:
                self._groups.setdefault(job_id, set()).add(proc.pid)
            threading.Thread(target=self._watch, args=(proc, rank, events, stopped), daemon=True).start()
        log.info("step %d.%d: %d ranks started", job_id, step_id, len(procs))

        def stop() -> None:
            if stopped.is_set():
                return
            stopped.set()
            for proc in procs:
                killpg(proc.pid, signal.SIGKILL)
            with self._lock:
                groups = self._groups.get(job_id, set())
                groups.difference_update(p.pid for p in procs)
                if not groups:
                    self._groups.pop(job_id, None)
            self._end_stream(job_id, step.uid)

        def stream() -> Iterator[pb.StepEvent]:
            remaining = len(here.ranks)
            try:
                while remaining:
                    event = events.get()
                    if event.exited:
                        remaining -= 1
                    yield event
            finally:
                stop()
        return stream(), stop

    def _end_stream(self, job_id: int, uid: int) -> None:
        with self._lock:
            self._user_streams[uid] -= 1
            if not self._user_streams[uid]:
                del self._user_streams[uid]
            self._streams[job_id] -= 1
            idle = not self._streams[job_id]
            if idle:
                del self._streams[job_id]
        if idle:
            self.on_idle(job_id)

    @staticmethod
    def _watch(proc: subprocess.Popen, rank: int, events: queue.Queue, stopped: threading.Event) -> None:
        readers = [threading.Thread(target=_pump, args=(pipe, rank, is_err, events, stopped), daemon=True)
                   for pipe, is_err in ((proc.stdout, False), (proc.stderr, True))]
        for r in readers:
            r.start()
        status = proc.wait()
        killpg(proc.pid, signal.SIGKILL)  # what the rank left behind
        for r in readers:
            r.join(timeout=5)
        code, sig = exit_status(status)
        _put(events, pb.StepEvent(rank=rank, exited=True, exit_code=code, exit_signal=sig), stopped)


def _pump(pipe, rank: int, is_err: bool, events: queue.Queue, stopped: threading.Event) -> None:
    """A rank's output, a line (or MAX_LINE bytes of one) at a time."""
    with pipe:
        for line in iter(lambda: pipe.readline(MAX_LINE), b""):
            if not _put(events, pb.StepEvent(rank=rank, stderr=is_err, data=line), stopped):
                return


def _put(events: queue.Queue, event: pb.StepEvent, stopped: threading.Event) -> bool:
    """Queue an event unless the stream has ended (then nobody will read it)."""
    while not stopped.is_set():
        try:
            events.put(event, timeout=0.5)
            return True
        except queue.Full:
            continue
    return False
