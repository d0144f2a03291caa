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
from typing import Iterator

from airctld.steps import rank_environment
from airnoded import progress
from airnoded.cgroups import JobCgroups
from airnoded.launcher import GATE
from airnoded.procs import as_owner, exit_status, killpg
from protos import air_pb2 as pb

log = logging.getLogger("airnoded")


class StepError(Exception):
    pass


class StepRunner:
    def __init__(self, node: str, address: str, cgroups: JobCgroups | None = None, spool: Path | None = None):
        self.node = node
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
        with self._lock:
            return bool(self._groups.get(job_id))

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
        index = next(i for i, n in enumerate(step.nodes) if n.node == self.node)
        here = step.nodes[index]
        events: queue.Queue = queue.Queue()
        procs: list[subprocess.Popen] = []
        kwargs, extra_env = as_owner(step.uid, step.gid)
        if self.spool is not None:   # where the ranks report progress and read why they were stopped
            progress.prepare(self.spool, job_id, step.uid, step.gid)
            extra_env = {**extra_env, **progress.environment(self.spool, job_id)}
        group = self.cgroups.current(job_id)
        gated = group is not None   # ranks join the job's cgroup on its batch node
        argv = ["/bin/sh", "-c", GATE, "air-rank", *step.spec.argv] if gated else list(step.spec.argv)
        for local_rank, rank in enumerate(here.ranks):
            env = rank_environment(step, index, local_rank, {**step.spec.environment, **extra_env})
            try:
                proc = subprocess.Popen(argv, env=env, cwd=step.spec.workdir or "/",
                                        stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                        **kwargs)
                if gated:
                    self.cgroups.enter(group, proc)
            except OSError as e:
                message = f"airrun: {self.node}: cannot run {step.spec.argv[0]}: {e.strerror}\n"
                events.put(pb.StepEvent(rank=rank, stderr=True, data=message.encode()))
                events.put(pb.StepEvent(rank=rank, exited=True, exit_code=127 if e.errno == 2 else 126))
                continue
            procs.append(proc)
            with self._lock:
                self._groups.setdefault(job_id, set()).add(proc.pid)
            threading.Thread(target=self._watch, args=(proc, rank, events), daemon=True).start()
        log.info("step %d.%d: %d ranks started", job_id, step_id, len(procs))
        stopped = threading.Event()

        def stop() -> None:
            if stopped.is_set():
                return
            stopped.set()
            for proc in procs:
                killpg(proc.pid, signal.SIGKILL)
            with self._lock:
                groups = self._groups.get(job_id, set())
                groups.difference_update(p.pid for p in procs)

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

    @staticmethod
    def _watch(proc: subprocess.Popen, rank: int, events: queue.Queue) -> None:
        readers = [threading.Thread(target=_pump, args=(pipe, rank, is_err, events), daemon=True)
                   for pipe, is_err in ((proc.stdout, False), (proc.stderr, True))]
        for r in readers:
            r.start()
        status = proc.wait()
        killpg(proc.pid, signal.SIGKILL)  # what the rank left behind
        for r in readers:
            r.join(timeout=5)
        code, sig = exit_status(status)
        events.put(pb.StepEvent(rank=rank, exited=True, exit_code=code, exit_signal=sig))


def _pump(pipe, rank: int, is_err: bool, events: queue.Queue) -> None:
    with pipe:
        for line in iter(pipe.readline, b""):
            events.put(pb.StepEvent(rank=rank, stderr=is_err, data=line))
