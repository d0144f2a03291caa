"""A bulk change (a cancel of many pending jobs) is written with one statement for all its jobs
(Store.update_jobs' `alike`). What it leaves in the store must be exactly what writing each job's
new version a row at a time leaves, and what the controller holds in memory."""
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from air.airctld import events
from air.airctld.model import Job, NodeAlloc, evolve
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, Reason

ROOT = Identity(0, 0)

_pending = st.builds(
    dict, hold=st.booleans(), priority=st.integers(0, 10**6), name=st.text(max_size=8),
    restart_count=st.integers(0, 3), last_stop_reason=st.sampled_from([Reason.NONE, Reason.PREEMPTED]),
    reason=st.sampled_from([Reason.NONE, Reason.PRIORITY, Reason.JOB_HELD_USER]), reason_detail=st.text(max_size=8),
    array_task_id=st.integers(0, 2))


def _store(jobs: list[dict]) -> Store:
    s = Store(":memory:")
    with s.transaction():
        for fields in jobs:
            job = Job(job_id=0, uid=1000, gid=100, user="alice", name=fields.get("name", "j"), partition="gpu",
                      num_nodes=1, gpus_per_node=1, cpus_per_node=1, time_limit_s=60, submit_time=100.0,
                      request=pb.JobRequest(name=fields.get("name", "j"), script="#!/bin/sh\ntrue\n"))
            job_id = s.insert_job(job, who=1000)
            s.update_job(s.get_job(job_id), evolve(s.get_job(job_id), **fields), 101.0, who=0)
    return s


def _tables(s: Store) -> tuple[list, list]:
    conn: sqlite3.Connection = s.db.conn
    return (conn.execute("SELECT * FROM jobs ORDER BY id").fetchall(),
            sorted(conn.execute("SELECT job_id, time, old_state, new_state, reason, detail, who FROM events")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(_pending, min_size=1, max_size=12), data=st.data(),
       result=st.sampled_from([JobResult.CANCELLED, JobResult.FAILED, JobResult.TIMEOUT]),
       reason=st.sampled_from([Reason.CANCELLED, Reason.TIME_LIMIT, Reason.DEPENDENCY_NEVER]),
       detail=st.text(max_size=12), now=st.floats(0, 2e9, allow_nan=False))
def test_a_bulk_stop_leaves_what_writing_each_job_leaves(jobs, data, result, reason, detail, now):
    bulk, each = _store(jobs), _store(jobs)
    chosen = data.draw(st.lists(st.sampled_from(range(1, len(jobs) + 1)), unique=True))
    # a pass keeps pending jobs' priorities in memory only: the change writes them
    olds = [evolve(bulk.get_job(i), priority=data.draw(st.integers(0, 10**6))) for i in chosen]
    alike, changes = events.stop_pending(olds, now, result, reason, detail)
    with bulk.transaction():
        bulk.update_jobs(changes, now, 7, alike)
    with each.transaction():
        each.update_jobs(changes, now, 7)
    assert _tables(bulk) == _tables(each)                    # the reference: a row at a time
    for _, new in changes:                                    # and memory's view of each job
        assert bulk.get_job(new.job_id) == new


def _running(s: Store, job_id: int) -> Job:
    job = s.get_job(job_id)
    started = events.start(job, 102.0, (NodeAlloc("n1", (0,), 1),))
    with s.transaction():
        s.update_job(job, started, 102.0, who=0)
    return started


@pytest.mark.parametrize("case", ["requeue", "same phase"])
def test_a_bulk_change_that_cannot_be_written_alike_is_written_a_row_at_a_time(case):
    """A requeue (the event's reason is why the run stopped, and the run gets its row) and a change
    in which a job keeps its phase (no event) are written as each job would be."""
    bulk, each = _store([dict(hold=False)] * 3), _store([dict(hold=False)] * 3)
    olds = [_running(bulk, i) for i in (1, 2)]
    assert [_running(each, i) for i in (1, 2)] == olds
    if case == "requeue":
        fields = dict(phase=JobPhase.PENDING, result=JobResult.NONE, reason=Reason.NONE, reason_detail="lost")
        changes = [(j, events.node_lost(j, 110.0, Reason.NODE_FAIL, "lost")) for j in olds]
    else:
        fields = dict(phase=JobPhase.RUNNING, result=JobResult.NONE, reason=Reason.NONE, reason_detail="x")
        changes = [(j, evolve(j, **fields)) for j in olds]
    with bulk.transaction():
        bulk.update_jobs(changes, 110.0, 7, fields)
    with each.transaction():
        each.update_jobs(changes, 110.0, 7)
    assert _tables(bulk) == _tables(each)
    assert bulk.db.execute("SELECT count(*) FROM runs").fetchone()[0] == (2 if case == "requeue" else 0)


def _submit(c, **fields):
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=4, **fields), ROOT)
    return job_id


def test_a_cancel_of_every_kind_of_job_leaves_the_store_as_memory(controller):
    c, clock = controller
    plain, held = _submit(c), _submit(c, hold=True)
    array = _submit(c, array="0-3")
    c._dirty = True
    c.tick()                                   # two jobs start, on n1 and n2
    running = [j.job_id for j in c.jobs.in_phase(JobPhase.RUNNING)]
    assert len(running) == 2 and held not in running
    clock.now += 5
    ids = c.cancel(pb.JobFilter(uids=[0]), 0, ROOT)
    assert {plain, held} | set(running) <= set(ids) and len(ids) == 6
    assert sum(c.jobs.get(i).array_job_id == array for i in ids) == 4   # the array's tasks
    for job_id in ids:
        in_memory, stored = c.jobs.get(job_id), c.store.get_job(job_id)
        assert stored == in_memory, job_id
        want = JobPhase.COMPLETING if job_id in running else JobPhase.DONE
        assert stored.phase == want and stored.result == JobResult.CANCELLED
        assert c.store.events(job_id)[-1]["new_state"] == ("CANCELLED" if want == JobPhase.DONE else "COMPLETING")
    assert c.store.events(held)[-1]["old_state"] == "PENDING"


def test_a_cancel_whose_second_write_fails_changes_nothing(controller, monkeypatch):
    c, clock = controller
    pending = [_submit(c) for _ in range(3)]
    c._dirty = True
    c.tick()
    running = [j.job_id for j in c.jobs.in_phase(JobPhase.RUNNING)]
    assert running
    before = {i: c.jobs.get(i) for i in pending}
    real, calls = c.store.update_jobs, []

    def failing(changes, now, who, alike=None):
        calls.append(alike)
        if len(calls) == 2:   # the running jobs' write, after the pending jobs' bulk one
            raise sqlite3.OperationalError("disk I/O error")
        return real(changes, now, who, alike)
    monkeypatch.setattr(c.store, "update_jobs", failing)
    with pytest.raises(Exception, match="disk I/O error"):
        c.cancel(pb.JobFilter(uids=[0]), 0, ROOT)
    assert calls[0] is not None                # the bulk write was made, and is rolled back with the rest
    monkeypatch.undo()
    for job_id, job in before.items():
        assert c.jobs.get(job_id) == job and c.store.get_job(job_id).phase == job.phase
    assert all(c.store.get_job(i).phase == JobPhase.RUNNING for i in running)
