"""Pure job state transitions."""
import pytest

from air.airctld import events
from air.airctld.model import Job, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import ExitCode, JobPhase, JobResult, Reason, long_state, state_code


def _job(**kw):
    base = dict(job_id=7, uid=1000, gid=1000, user="u", name="n", partition="gpu", num_nodes=1,
                gpus_per_node=1, cpus_per_node=1, time_limit_s=0, submit_time=1.0, request=pb.JobRequest())
    base.update(kw)
    return Job(**base)


ALLOC = (NodeAlloc("node01", (0,), 1),)


def test_normal_life():
    job = events.start(_job(), 10.0, ALLOC)
    assert job.phase == JobPhase.RUNNING and job.start_time == 10.0 and job.batch_node == "node01"
    done = events.exited(job, 15.0, 0, 0)
    assert (done.phase, done.result, done.reason) == (JobPhase.DONE, JobResult.COMPLETED, Reason.NONE)
    assert state_code(done.phase, done.result) == "CD"


@pytest.mark.parametrize("code,sig,result,reason,st", [
    (2, 0, JobResult.FAILED, Reason.NON_ZERO_EXIT, "F"),
    (0, 9, JobResult.FAILED, Reason.SIGNALED, "F"),
])
def test_failures(code, sig, result, reason, st):
    done = events.exited(events.start(_job(), 1, ALLOC), 2, code, sig)
    assert (done.result, done.reason, state_code(done.phase, done.result)) == (result, reason, st)
    if sig:
        assert done.reason_detail == "killed by SIGKILL"


def test_cancel_pending_ends_at_once_running_goes_through_completing():
    pending = events.stop(_job(), 5, JobResult.CANCELLED, Reason.CANCELLED)
    assert pending.phase == JobPhase.DONE and state_code(pending.phase, pending.result) == "CA"
    running = events.stop(events.start(_job(), 1, ALLOC), 5, JobResult.CANCELLED, Reason.CANCELLED)
    assert running.phase == JobPhase.COMPLETING and state_code(running.phase, running.result) == "CG"
    done = events.exited(running, 6, 0, 15)  # the SIGTERM that cancel sent does not turn it into FAILED
    assert (done.result, long_state(done.phase, done.result)) == (JobResult.CANCELLED, "CANCELLED")


def test_timeout_and_node_failure():
    job = events.start(_job(), 1, ALLOC)
    assert state_code(*_pr(events.exited(events.stop(job, 9, JobResult.TIMEOUT, Reason.TIME_LIMIT), 10, 0, 15))) == "TO"
    lost = events.lost(job, 9, Reason.NODE_FAIL, "node01 stopped responding")
    assert state_code(*_pr(lost)) == "NF" and lost.reason_detail == "node01 stopped responding"


def _pr(job):
    return job.phase, job.result


def test_forbidden_transitions_say_why():
    done = events.exited(events.start(_job(), 1, ALLOC), 2, 0, 0)
    with pytest.raises(events.TransitionError, match="job 7 is completed; cannot cancel it"):
        events.stop(done, 3, JobResult.CANCELLED, Reason.CANCELLED)
    with pytest.raises(events.TransitionError):
        events.start(done, 3, ALLOC)
    with pytest.raises(events.TransitionError):
        events.exited(_job(), 3, 0, 0)


def test_requeue_paths():
    running = events.start(_job(request=pb.JobRequest(retries=1)), 1, ALLOC)
    again = events.finished(running, 2, 3, 0)
    assert (again.phase, again.restart_count, again.last_stop_reason) == (JobPhase.PENDING, 1, Reason.NON_ZERO_EXIT)
    assert again.allocation == () and "retry 1 of 1" in again.reason_detail
    second = events.finished(events.start(again, 3, ALLOC), 4, 3, 0)
    assert second.result == JobResult.FAILED                       # no retries left
    asked = events.stop(events.start(_job(), 1, ALLOC), 2, JobResult.NONE, Reason.REQUEUE_REQUESTED)
    back = events.finished(asked, 3, 0, 15)
    assert back.phase == JobPhase.PENDING and back.last_stop_reason == Reason.REQUEUE_REQUESTED
    lost = events.node_lost(events.start(_job(), 1, ALLOC), 2, Reason.NODE_FAIL, "node01 stopped responding")
    assert lost.phase == JobPhase.PENDING and lost.restart_count == 1
    never = events.node_lost(events.start(_job(request=pb.JobRequest(no_requeue=True)), 1, ALLOC), 2,
                             Reason.NODE_FAIL, "x")
    assert state_code(never.phase, never.result) == "NF"
    cancelling = events.stop(events.start(_job(), 1, ALLOC), 2, JobResult.CANCELLED, Reason.CANCELLED)
    assert events.node_lost(cancelling, 3, Reason.NODE_FAIL, "x").result == JobResult.NODE_FAIL


def test_clean_stops_and_lost_nodes_reported_by_exit_codes():
    running = events.start(_job(), 1, ALLOC)
    warned = events.finished(running, 2, ExitCode.REQUEUE, 0, warned=True)
    assert warned.phase == JobPhase.PENDING and warned.last_stop_reason == Reason.TIME_LIMIT
    asked = events.finished(running, 2, ExitCode.REQUEUE, 0)
    assert asked.phase == JobPhase.PENDING and asked.last_stop_reason == Reason.REQUEUE_REQUESTED
    lost = events.finished(running, 2, ExitCode.NODE_LOST, 0, step_left_batch_node=True)
    assert lost.phase == JobPhase.PENDING and lost.last_stop_reason == Reason.NODE_FAIL
    own = events.finished(running, 2, ExitCode.NODE_LOST, 0)   # no step of it left the batch node
    assert own.result == JobResult.FAILED and own.exit_code == ExitCode.NODE_LOST
    stuck = events.start(_job(request=pb.JobRequest(no_requeue=True)), 1, ALLOC)
    assert events.finished(stuck, 2, ExitCode.REQUEUE, 0).result == JobResult.FAILED
    hung = events.hung(running, 5, 120)
    assert hung.reason == Reason.HUNG and events.finished(hung, 6, 0, 9).phase == JobPhase.PENDING
    oom = events.finished(running, 2, 137, 0, out_of_memory=True)
    assert oom.result == JobResult.OUT_OF_MEMORY and oom.reason == Reason.OUT_OF_MEMORY
