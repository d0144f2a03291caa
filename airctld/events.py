"""Job state transitions, pure: each function takes a job and returns the changed job.

Side effects (store writes, messages to node daemons) are the controller's business; a
transition that is not allowed raises TransitionError with a message for the user.
"""
from __future__ import annotations

import signal as signals

from air.airctld.model import Job, NodeAlloc, evolve, evolve_all
from air.protos.states import ExitCode, JobPhase, JobResult, Reason, long_state


class TransitionError(Exception):
    pass


# Stops after which a job goes back to the queue (when it allows requeue) rather than ending.
REQUEUING = frozenset({Reason.REQUEUE_REQUESTED, Reason.PREEMPTED, Reason.HUNG})


def _require(job: Job, *phases: JobPhase, doing: str) -> None:
    if job.phase not in phases:
        raise TransitionError(f"job {job.job_id} is {long_state(job.phase, job.result).lower()}; cannot {doing}")


def start(job: Job, now: float, allocation: tuple[NodeAlloc, ...]) -> Job:
    _require(job, JobPhase.PENDING, doing="start it")
    return evolve(job, phase=JobPhase.RUNNING, reason=Reason.NONE, reason_detail="",
                  allocation=allocation, start_time=now, exit_code=0, exit_signal=0)   # the last run's exit: gone


def stop(job: Job, now: float, result: JobResult, reason: Reason, detail: str = "") -> Job:
    """Ask a job to end with the given result: a pending job ends now, a running one starts completing."""
    _require(job, JobPhase.PENDING, JobPhase.RUNNING, doing="cancel it")
    if job.phase == JobPhase.PENDING:
        return evolve(job, **_pending_stop(now, result, reason, detail))
    return evolve(job, phase=JobPhase.COMPLETING, result=result, reason=reason,
                               reason_detail=detail)


def stop_pending(jobs: list[Job], now: float, result: JobResult, reason: Reason,
                 detail: str = "") -> tuple[dict, list[tuple[Job, Job]]]:
    """stop() of pending jobs: the fields it changes, the same for each job (see Store.update_jobs),
    and each (old, new) job."""
    for job in jobs:
        _require(job, JobPhase.PENDING, doing="cancel it")
    fields = _pending_stop(now, result, reason, detail)
    return fields, list(zip(jobs, evolve_all(jobs, fields)))


def _pending_stop(now: float, result: JobResult, reason: Reason, detail: str) -> dict:
    """A pending job's run never ran: it has no exit of its own (not the last run's)."""
    return dict(phase=JobPhase.DONE, result=result, reason=reason, reason_detail=detail, end_time=now,
                exit_code=0, exit_signal=0)


def exited(job: Job, now: float, exit_code: int, exit_signal: int, detail: str = "",
           launch_failed: bool = False, out_of_memory: bool = False) -> Job:
    """The batch script ended (or could not start)."""
    _require(job, JobPhase.RUNNING, JobPhase.COMPLETING, doing="record its exit")
    fields = dict(phase=JobPhase.DONE, end_time=now, exit_code=exit_code, exit_signal=exit_signal)
    if job.phase == JobPhase.COMPLETING:
        return evolve(job, **fields)  # the result chosen when the stop was asked
    if launch_failed:
        result, reason = JobResult.FAILED, Reason.LAUNCH_FAILED
    elif out_of_memory:
        result, reason = JobResult.OUT_OF_MEMORY, Reason.OUT_OF_MEMORY
        detail = detail or "the kernel killed a process of the job at its memory limit (--mem)"
    elif exit_signal:
        result, reason = JobResult.FAILED, Reason.SIGNALED
        detail = detail or f"killed by {_signal_name(exit_signal)}"
    elif exit_code:
        result, reason = JobResult.FAILED, Reason.NON_ZERO_EXIT
    else:
        result, reason = JobResult.COMPLETED, Reason.NONE
    return evolve(job, result=result, reason=reason, reason_detail=detail, **fields)


def requeued(job: Job, now: float, reason: Reason, detail: str = "", exit_code: int = 0,
             exit_signal: int = 0) -> Job:
    """Back to the queue after a stop: the allocation is given up, the restart counted. The exit of
    the run that ended, where there was one, stays until the next run ends (history shows it)."""
    _require(job, JobPhase.RUNNING, JobPhase.COMPLETING, doing="requeue it")
    return evolve(job, phase=JobPhase.PENDING, result=JobResult.NONE, reason=Reason.NONE, reason_detail=detail,
                  allocation=(), start_time=0.0, end_time=0.0, restart_count=job.restart_count + 1,
                  last_stop_reason=reason, exit_code=exit_code, exit_signal=exit_signal)


def launch_unanswered(job: Job, now: float, detail: str) -> Job:
    """The batch node never answered the launch of this run (it may have started it anyway: the
    heartbeat then reports that run as stale, and the node kills it). Back to the queue as a new run
    when the job allows requeue; LaunchFailed otherwise."""
    if job.phase == JobPhase.COMPLETING:
        return launch_refused(job, now, detail)
    if job.requeue_allowed:
        return requeued(job, now, Reason.LAUNCH_FAILED, detail)
    return exited(job, now, 1, 0, detail, launch_failed=True)


def launch_refused(job: Job, now: float, detail: str) -> Job:
    """The batch node refused the launch of this run: LaunchFailed; but a job asked to stop meanwhile
    ends as that stop said (a requeue asked, or a preemption, sends it back to the queue: it never
    ends without a result)."""
    return finished(job, now, 1, 0, detail, launch_failed=True)


def lost(job: Job, now: float, reason: Reason, detail: str) -> Job:
    """The job's node failed or no longer has it: it ends as NODE_FAIL, whatever was asked before."""
    _require(job, JobPhase.RUNNING, JobPhase.COMPLETING, doing="mark it failed")
    return evolve(job, phase=JobPhase.DONE, result=JobResult.NODE_FAIL, reason=reason,
                               reason_detail=detail, end_time=now)


def preempted(job: Job, now: float, by: int) -> Job:
    """Stop a running job for a preempting one: it goes back to the queue once it has stopped if it
    allows requeue, and ends as PREEMPTED if not."""
    result = JobResult.NONE if job.requeue_allowed else JobResult.PREEMPTED
    return stop(job, now, result, Reason.PREEMPTED, f"preempted by job {by}")


def hung(job: Job, now: float, silent_s: float) -> Job:
    """Stop a job whose ranks stopped reporting progress: back to the queue if it allows requeue,
    HUNG if not."""
    result = JobResult.NONE if job.requeue_allowed else JobResult.HUNG
    return stop(job, now, result, Reason.HUNG, f"no progress for {silent_s:.0f} s (--hang-timeout)")


def cancelled_while_stopping(job: Job, detail: str) -> Job:
    """A job stopping to go back to the queue (preempted, requeue asked, hung) is cancelled: it ends
    CANCELLED when its run has stopped, instead of being requeued."""
    _require(job, JobPhase.COMPLETING, doing="cancel it")
    return evolve(job, result=JobResult.CANCELLED, reason=Reason.CANCELLED, reason_detail=detail)


def held(job: Job, hold: bool) -> Job:
    """Hold a pending job, or release it."""
    _require(job, JobPhase.PENDING, doing="hold or release it")
    return evolve(job, hold=hold, reason=Reason.JOB_HELD_USER if hold else Reason.NONE, reason_detail="")


def finished(job: Job, now: float, exit_code: int, exit_signal: int, detail: str = "",
             launch_failed: bool = False, out_of_memory: bool = False, warned: bool = False,
             step_left_batch_node: bool = False) -> Job:
    """The batch script ended: back to the queue when a requeue was asked for, or when it failed on its
    own and has retries left (--retries); otherwise done. Exit ExitCode.NODE_LOST is airrun's word that a
    node of its step stopped answering; any script can exit with it, so it counts as a node failure
    only when a step of this run reached beyond the batch node (`step_left_batch_node`), and as an
    ordinary failure otherwise."""
    if job.phase == JobPhase.COMPLETING and job.reason in REQUEUING and job.requeue_allowed:
        return requeued(job, now, job.reason, job.reason_detail or "requeued on request", exit_code, exit_signal)
    if job.phase == JobPhase.RUNNING and exit_code == ExitCode.REQUEUE and not exit_signal and job.requeue_allowed:
        # stopped cleanly for requeue on its own: at the time-limit warning (--signal), or told by a
        # signal the cluster did not send
        reason = Reason.TIME_LIMIT if warned else Reason.REQUEUE_REQUESTED
        return requeued(job, now, reason, "checkpointed and stopped for requeue", exit_code)
    if job.phase == JobPhase.RUNNING and exit_code == ExitCode.NODE_LOST and step_left_batch_node and not exit_signal \
            and job.requeue_allowed:
        # airrun lost a node of its step before the controller noticed the node was gone
        return requeued(job, now, Reason.NODE_FAIL, "a node of the step stopped answering (airrun)", exit_code)
    done = exited(job, now, exit_code, exit_signal, detail, launch_failed, out_of_memory)
    if done.result == JobResult.FAILED and not launch_failed and job.restart_count < job.request.retries:
        return requeued(job, now, done.reason, f"exit {exit_code}:{exit_signal}; retry {job.restart_count + 1} "
                                               f"of {job.request.retries}", exit_code, exit_signal)
    return done


def node_lost(job: Job, now: float, reason: Reason, detail: str) -> Job:
    """A node of the job failed: requeued (to resume from its last checkpoint) when the job allows it,
    NODE_FAIL otherwise. A job already being cancelled or timed out is not requeued."""
    if job.requeue_allowed and (job.phase == JobPhase.RUNNING or job.reason in REQUEUING):
        return requeued(job, now, reason, detail)
    return lost(job, now, reason, detail)


def waiting(job: Job, reason: Reason, detail: str = "") -> Job:
    """A pending job's reason for waiting, as the last scheduling pass found it."""
    _require(job, JobPhase.PENDING, doing="set its pending reason")
    return evolve(job, reason=reason, reason_detail=detail)


def _signal_name(num: int) -> str:
    try:
        return signals.Signals(num).name
    except ValueError:
        return f"signal {num}"
