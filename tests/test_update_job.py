"""scontrol update JobId=N TimeLimit=T (aircontrol update): owners lower a time limit, only root and
operators raise one, the change is stored, and a running job past its new limit times out."""
import pytest

from air.aircli.client import CliError
from air.aircli.control import parse_update
from air.airctld import events
from air.airctld.controller import Controller
from air.airctld.errors import Conflict, Denied, InvalidRequest, NotFound
from air.airctld.model import NodeAlloc
from air.airctld.store import Store
from air.airctld.validate import MAX_TIME_LIMIT_S
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, Reason
from test_runs_controller import ROOT, _beat

ALICE, BOB = Identity(4242, 4242), Identity(4343, 4343)


def _update(c, job_id, seconds, change=0, who=ALICE):
    return c.update_time_limit(pb.JobFilter(job_ids=[job_id]), seconds, change, who)


def test_the_owner_lowers_a_running_jobs_limit_and_it_times_out_there(controller, tmp_path):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", time_limit_s=3600), ALICE)
    pending = c.jobs.get(job_id)
    job = c._commit([(pending, events.start(pending, clock.now, (NodeAlloc("n1", (0,), 1),)))], clock.now, 0)[0]
    clock.now += 100
    assert _update(c, job.job_id, 60, -1) == [job.job_id]          # TimeLimit=-1:00
    assert c.jobs.get(job.job_id).time_limit_s == 3540
    assert _update(c, job.job_id, 90) == [job.job_id]              # TimeLimit=1:30: already past it
    _beat(c, "n1", runs=[(job_id, 0)])
    _beat(c, "n2")
    c.tick()
    after = c.jobs.get(job.job_id)
    assert after.phase == JobPhase.COMPLETING and after.result == JobResult.TIMEOUT, after
    # stored: a controller started on the same store reads the new limit
    c.stop()
    again = Controller(c.config, Store(str(tmp_path / "air.db")), clock=clock, monotonic=clock)
    try:
        assert again.jobs.get(job.job_id).time_limit_s == 90
    finally:
        again.stop()


def test_only_root_and_operators_raise_or_lift_a_limit_and_nobody_touches_anothers_job(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", time_limit_s=600, hold=True), ALICE)
    for seconds, change, error, message in (
            (700, 0, Denied, "only root and operators may raise a time limit"),
            (60, 1, Denied, "may raise"), (0, 0, Denied, "may raise"),               # UNLIMITED lifts it
            (600, -1, InvalidRequest, "leaves none"), (1 << 40, 0, InvalidRequest, "not a time limit"),
            (0, 1, InvalidRequest, "not a time limit"), (60, 5, InvalidRequest, "not a time limit")):
        with pytest.raises(error, match=message):
            _update(c, job_id, seconds, change)
        assert c.jobs.get(job_id).time_limit_s == 600
    with pytest.raises(Denied):
        _update(c, job_id, 60, who=BOB)
    with pytest.raises(NotFound):
        _update(c, 999, 60)
    assert _update(c, job_id, 0, who=ROOT) == [job_id] and c.jobs.get(job_id).time_limit_s == 0
    with pytest.raises(Conflict, match="has no time limit to change"):
        _update(c, job_id, 60, -1, who=ROOT)
    assert _update(c, job_id, 120, who=ROOT) == [job_id] and _update(c, job_id, 120) == []   # no change, no write
    assert c.jobs.get(job_id).reason == Reason.JOB_HELD_USER


def test_an_owner_may_limit_an_unlimited_job_and_nobody_updates_every_job_at_once(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    assert c.jobs.get(job_id).time_limit_s == 0
    assert _update(c, job_id, 600) == [job_id] and c.jobs.get(job_id).time_limit_s == 600   # lowering "unlimited"
    with pytest.raises(InvalidRequest, match="name the jobs"):
        c.update_time_limit(pb.JobFilter(), 60, 0, ROOT)
    with pytest.raises(InvalidRequest, match="at most"):
        _update(c, job_id, MAX_TIME_LIMIT_S, 1, who=ROOT)
    with pytest.raises(InvalidRequest, match="100 years"):
        c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", time_limit_s=MAX_TIME_LIMIT_S + 1), ALICE)


def test_an_ended_job_takes_no_new_limit(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", time_limit_s=600), ALICE)
    c.cancel(pb.JobFilter(job_ids=[job_id]), 0, ALICE)
    with pytest.raises(Conflict, match="only pending and running jobs take a new time limit"):
        _update(c, job_id, 60)


def test_scontrol_update_words():
    assert parse_update(["JobId=42", "TimeLimit=2:00:00"]) == ("42", (7200, 0))
    assert parse_update(["job=42", "timelimit=+30"]) == ("42", (1800, 1))
    assert parse_update(["TimeLimit=-1-00:00:00", "JOBID=7"]) == ("7", (86400, -1))
    assert parse_update(["JobId=42", "TimeLimit=UNLIMITED"]) == ("42", (0, 0))
    for words, message in ((["JobId=42", "Partition=big"], "AIR updates JobId=N TimeLimit=T only"),
                           (["JobId=42"], "give JobId=N and TimeLimit=T"), (["JobId"], "give KEY=VALUE"),
                           (["JobId=42", "TimeLimit=soon"], "TimeLimit=soon"),
                           (["JobId=42", "TimeLimit=+UNLIMITED"], "not UNLIMITED")):
        with pytest.raises(CliError, match=message):
            parse_update(words)


def test_a_signal_out_of_range_is_refused_and_one_ended_array_task_says_so(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", array="0-1", time_limit_s=600), ALICE)
    with pytest.raises(InvalidRequest, match="signal 99"):
        c.cancel(pb.JobFilter(job_ids=[job_id]), 99, ALICE)
    c.cancel(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=job_id, task_id=1)]), 0, ALICE)
    with pytest.raises(Conflict, match="only pending and running jobs"):
        c.update_time_limit(pb.JobFilter(array_tasks=[pb.ArrayTask(array_job_id=job_id, task_id=1)]), 60, 0, ALICE)
    assert _update(c, job_id, 60) == [job_id]   # the array: its task still pending
