"""Launching a run of a job on its batch node, with retries for a node that does not answer.

A Launch that times out may still have started the run. Node daemons treat a repeated launch of
the same run as a no-op (running or ended) and refuse an older run, so the controller retries the
same run's launch a few times. If the node never answers, its heartbeats decide: a run they report
goes on (the node had started it), and a run two of them do not report is requeued (a new run
number) when the job allows it, or ends as LaunchFailed, with the launch's timeouts as its reason.
A node that goes silent altogether is a failed node, and its jobs are requeued as for any other.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping

import grpc

from air.airctld import events
from air.airctld.jobtable import JobTable
from air.airctld.model import Job, Node
from air.airctld.node_reports import CONTROLLER_UID
from air.protos.states import ACTIVE_PHASES, JobPhase

log = logging.getLogger("airctld")

UNANSWERED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


class Launcher:
    """Sends each run's Launch to its batch node (on a thread of the controller's pool), and settles
    a launch that fails. A collaborator of the controller: what it reads and changes is given to it.

    lock, jobs, nodes: the controller's lock, its job table and its nodes (read under the lock);
    clients: the node clients now (tests swap them); commit: the controller's way to record a job's
    change; signal: to stop a run that was cancelled while its launch was in flight; wake: a pass is
    due; stopping: the controller is shutting down; launching: (job, run) whose launch has not
    returned, shared with the passes and node reports; unanswered: job -> (run, why) whose launch
    was never answered, left to its node's heartbeats (node reports settle it)."""

    tries = 3
    backoff_s = (1.0, 2.0)   # the waits before the second and the third try

    def __init__(self, lock, jobs: JobTable, nodes: Mapping[str, Node], clients: Callable[[], object],
                 clock: Callable[[], float], commit: Callable[[list[tuple[Job, Job]], float, int], list[Job]],
                 signal: Callable[[Job, int], None], wake: threading.Event, stopping: threading.Event,
                 launching: set[tuple[int, int]], unanswered: dict[int, tuple[int, str]]):
        self._lock = lock
        self.jobs = jobs
        self.nodes = nodes
        self.clients = clients
        self.clock = clock
        self._commit = commit
        self._signal = signal
        self._wake = wake
        self._stopping = stopping
        self._launching = launching
        self._unanswered = unanswered

    def launch(self, job: Job) -> None:
        node, run = job.batch_node, job.restart_count
        try:
            if not self._still_launching(job):
                return   # cancelled, requeued or its node lost while the launch waited for a thread
            for attempt in range(1, self.tries + 1):
                try:
                    self.clients().launch(self.nodes[node].address, job.to_proto())
                    return
                except grpc.RpcError as e:
                    if e.code() not in UNANSWERED:
                        raise
                    log.warning("job %d: launch of run %d on %s not answered (try %d of %d): %s", job.job_id, run,
                                node, attempt, self.tries, _describe(e))
                if attempt < self.tries:
                    backoff = self.backoff_s[min(attempt, len(self.backoff_s)) - 1]
                    if self._stopping.wait(backoff) or not self._still_launching(job):
                        return   # shutting down, or the job was cancelled or its node failed meanwhile
            detail = f"launch of run {run} on {node} timed out {self.tries} times"
            with self._lock:
                if self._still_launching(job):   # (a job asked to stop meanwhile is settled now)
                    self._unanswered[job.job_id] = (run, f"{detail}, and {node} does not have it")
                    log.warning("job %d: %s; %s's heartbeats decide: the run goes on if %s has it",
                                job.job_id, detail, node, node)
                    return
            self._launch_ended(job, f"{detail}; a run {node} started anyway is killed as stale", unanswered=True)
        except Exception as e:
            self._launch_ended(job, f"launch of run {run} on {node} failed: {_describe(e)}", unanswered=False)
        finally:
            with self._lock:
                self._launching.discard((job.job_id, run))
                current = self.jobs.get(job.job_id)
            if current is not None and current.phase == JobPhase.COMPLETING:
                self._signal(current, 0)  # cancelled or timed out while launching

    def _still_launching(self, job: Job) -> bool:
        with self._lock:
            current = self.jobs.get(job.job_id)
            return current is not None and current.phase == JobPhase.RUNNING and \
                current.restart_count == job.restart_count

    def _launch_ended(self, job: Job, detail: str, unanswered: bool) -> None:
        """This run could not be launched: requeued or ended (see events.launch_unanswered), or failed
        as LaunchFailed when the node refused it."""
        log.warning("job %d: %s", job.job_id, detail)
        now = self.clock()
        with self._lock:
            current = self.jobs.get(job.job_id)
            if current is None or current.phase not in ACTIVE_PHASES or current.restart_count != job.restart_count:
                return   # ended or requeued meanwhile: this run's launch says nothing of the job now
            new = events.launch_unanswered(current, now, detail) if unanswered else \
                events.launch_refused(current, now, detail)
            try:
                self._commit([(current, new)], now, CONTROLLER_UID)
            except Exception as e:   # the job stays running; the node's heartbeats settle it
                log.warning("job %d: could not record that run %d was not launched: %s", job.job_id,
                            job.restart_count, e)
                return
        if new.phase == JobPhase.PENDING:
            self._wake.set()


def _describe(e: Exception) -> str:
    """One line: a gRPC error's details, or the exception's text."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        return f"{e.code().name}: {e.details() or ''}".rstrip(": ")
    return str(e).splitlines()[0] if str(e) else type(e).__name__
