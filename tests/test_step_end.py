"""A step's own outcome (airrun's EndStep): kept once, for a step of the run it names, from the job's
owner only; airacct shows it on the step's record."""
import pytest

from air.airctld import events
from air.airctld.errors import Denied, InvalidRequest, NotFound
from air.airctld.model import NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.credential import Identity

ALICE, BOB = Identity(4242, 4242), Identity(4343, 4343)


def _steps(c, job_id):
    reply = c.history(pb.HistoryRequest(job_ids=[job_id]), ALICE)
    return {s.step_id: (s.end_time, s.exit_code, s.exit_signal, s.cancelled) for s in reply.jobs[0].steps}


def test_a_steps_end_is_kept_once_for_its_own_run_and_only_from_its_owner(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ALICE)
    pending = c.jobs.get(job_id)
    c._commit([(pending, events.start(pending, clock.now, (NodeAlloc("n1", (), 1),)))], clock.now, 0)
    first = c.create_step(pb.StepSpec(job_id=job_id, argv=["true"]), ALICE)
    second = c.create_step(pb.StepSpec(job_id=job_id, argv=["false"]), ALICE)
    clock.now += 5
    with pytest.raises(Denied):
        c.end_step(pb.StepEnd(job_id=job_id, step_id=first.step_id, run=0, exit_code=0), BOB)
    with pytest.raises(InvalidRequest):
        c.end_step(pb.StepEnd(job_id=job_id, step_id=first.step_id, run=0, exit_code=300), ALICE)
    with pytest.raises(NotFound):
        c.end_step(pb.StepEnd(job_id=999, step_id=0, run=0), ALICE)
    assert not c.end_step(pb.StepEnd(job_id=job_id, step_id=first.step_id, run=1, exit_code=0), ALICE)  # not its run
    with pytest.raises(InvalidRequest):
        c.end_step(pb.StepEnd(job_id=job_id, step_id=first.step_id, run=0, exit_code=-1), ALICE)
    assert c.end_step(pb.StepEnd(job_id=job_id, step_id=second.step_id, run=0, exit_code=3), ALICE)
    assert not c.end_step(pb.StepEnd(job_id=job_id, step_id=second.step_id, run=0, exit_code=0), ALICE)  # once
    third = c.create_step(pb.StepSpec(job_id=job_id, argv=["sleep", "9"]), ALICE)
    assert c.end_step(pb.StepEnd(job_id=job_id, step_id=third.step_id, run=0, exit_signal=9, cancelled=True), ALICE)
    assert _steps(c, job_id) == {first.step_id: (0.0, 0, 0, False), second.step_id: (clock.now, 3, 0, False),
                                 third.step_id: (clock.now, 0, 9, True)}
    # as sacct shows them: the unreported one with its run (running), the others with their own outcome
    from air.aircli.acct_fields import records
    reply = c.history(pb.HistoryRequest(job_ids=[job_id]), ALICE)
    shown = {r.job_id: (r.state, r.exit_code) for r in records(list(reply.jobs), False, False)}
    assert shown[f"{job_id}.{second.step_id}"] == ("FAILED", "3:0")
    assert shown[f"{job_id}.{third.step_id}"] == ("CANCELLED", "0:9")
    assert shown[f"{job_id}.{first.step_id}"][0] == "RUNNING"
