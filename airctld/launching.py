"""Launching a run of a job on its batch node, with retries for a node that does not answer.

A Launch that times out may still have started the run. Node daemons treat a repeated launch of
the same run as a no-op and refuse an older run, so the controller retries the same run's launch a
few times. If the node never answers, the job is requeued (a new run number) when it allows it, and
ends as LaunchFailed when not; either way a run the node did start is older than the job's run, so
the node's next heartbeat reports it as stale and the node kills it: the job never runs twice.
"""
from __future__ import annotations

import logging

import grpc

from air.airctld import events
from air.airctld.model import Job
from air.airctld.node_reports import CONTROLLER_UID
from air.protos.states import ACTIVE_PHASES, JobPhase

log = logging.getLogger("airctld")

UNANSWERED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


class Launching:
    """Mixed into Controller; uses its jobs, nodes, clients, store and lock."""

    launch_tries = 3
    launch_backoff_s = (1.0, 2.0)   # the waits before the second and the third try

    def _launch(self, job: Job) -> None:
        node, run = job.batch_node, job.restart_count
        try:
            if not self._still_launching(job):
                return   # cancelled, requeued or its node lost while the launch waited for a thread
            for attempt in range(1, self.launch_tries + 1):
                try:
                    self.clients.launch(self.nodes[node].address, job.to_proto())
                    return
                except grpc.RpcError as e:
                    if e.code() not in UNANSWERED:
                        raise
                    log.warning("job %d: launch of run %d on %s not answered (try %d of %d): %s", job.job_id, run,
                                node, attempt, self.launch_tries, _describe(e))
                if attempt < self.launch_tries:
                    backoff = self.launch_backoff_s[min(attempt, len(self.launch_backoff_s)) - 1]
                    if self._stopping.wait(backoff) or not self._still_launching(job):
                        return   # shutting down, or the job was cancelled or its node failed meanwhile
            self._launch_ended(job, f"launch of run {run} on {node} timed out {self.launch_tries} times; "
                                    f"a run {node} started anyway is killed as stale", unanswered=True)
        except Exception as e:
            self._launch_ended(job, f"launch of run {run} on {node} failed: {_describe(e)}", unanswered=False)
        finally:
            with self._lock:
                self._launching.discard((job.job_id, run))
                current = self.jobs.get(job.job_id)
            if current is not None and current.phase == JobPhase.COMPLETING:
                self._send_signal(current, 0)  # cancelled or timed out while launching

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
