"""A bulk change (a cancel of many pending jobs) is written with one statement for all its jobs
(Store.update_jobs' `alike`). What it leaves in the store must be exactly what writing each job's
new version a row at a time leaves, and what the controller holds in memory."""
import signal
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
    cut = data.draw(st.integers(0, len(chosen)))
    for part, when in ((chosen[:cut], now), (chosen[cut:], now + 1)):   # two bulk changes, one after the other
        # a pass keeps pending jobs' priorities in memory only: the change writes them
        olds = [evolve(bulk.get_job(i), priority=data.draw(st.integers(0, 10**6))) for i in part]
        alike, changes = events.stop_pending(olds, when, result, reason, detail)
        with bulk.transaction():
            bulk.update_jobs(changes, when, 7, alike)
        with each.transaction():
            each.update_jobs(changes, when, 7)
        assert _tables(bulk) == _tables(each)                # the reference: a row at a time
        for _, new in changes:                                # and memory's view of each job
            assert bulk.get_job(new.job_id) == new


def _running(s: Store, job_id: int) -> Job:
    job = s.get_job(job_id)
    started = events.start(job, 102.0, (NodeAlloc("n1", (0,), 1),))
    with s.transaction():
        s.update_job(job, started, 102.0, who=0)
    return started


@pytest.mark.parametrize("case", ["requeue", "running", "no phase"])
def test_a_change_that_is_no_bulk_change_of_pending_jobs_is_refused_before_any_write(case):
    """The controller keeps no run's figures for a bulk change, and the store writes only its fields:
    a job that ends a run (a requeue, a running job's end) must go a row at a time."""
    s = _store([dict(hold=False)] * 3)
    before = _tables(s)
    if case == "requeue":
        old = _running(s, 1)
        fields = dict(phase=JobPhase.PENDING, result=JobResult.NONE, reason=Reason.NONE, reason_detail="lost")
        changes = [(old, events.node_lost(old, 110.0, Reason.NODE_FAIL, "lost"))]
    elif case == "running":
        old = _running(s, 1)
        fields = dict(phase=JobPhase.DONE, result=JobResult.CANCELLED, reason=Reason.CANCELLED, reason_detail="x")
        changes = [(old, evolve(old, **fields))]
    else:
        old = s.get_job(1)
        fields = dict(result=JobResult.CANCELLED, reason=Reason.CANCELLED, reason_detail="x")
        changes = [(old, evolve(old, **fields))]
    before = _tables(s)
    with pytest.raises(ValueError, match="not a bulk change of pending jobs"), s.transaction():
        s.update_jobs(changes, 110.0, 7, fields)
    assert _tables(s) == before


def test_rows_left_in_the_scratch_table_change_no_other_job():
    s = _store([dict(hold=False)] * 2)
    s.db.execute("INSERT INTO temp.changing (id, priority) VALUES (2, 0)")   # (a failure outside a transaction)
    before = s.get_job(2)
    alike, changes = events.stop_pending([s.get_job(1)], 5.0, JobResult.CANCELLED, Reason.CANCELLED, "x")
    with s.transaction():
        s.update_jobs(changes, 5.0, 0, alike)
    assert s.get_job(1) == changes[0][1] and s.get_job(2) == before


def test_a_bulk_change_that_names_a_job_twice_is_written_as_a_row_at_a_time_writes_it():
    bulk, each = _store([dict(hold=False)] * 2), _store([dict(hold=False)] * 2)
    olds = [bulk.get_job(1), bulk.get_job(2), bulk.get_job(1)]
    alike, changes = events.stop_pending(olds, 5.0, JobResult.CANCELLED, Reason.CANCELLED, "x")
    with bulk.transaction():
        bulk.update_jobs(changes, 5.0, 0, alike)
    with each.transaction():
        each.update_jobs(changes, 5.0, 0)
    assert _tables(bulk) == _tables(each)


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


def test_a_kill_of_stopping_jobs_alone_needs_no_write(controller, tmp_path):
    """aircancel -s KILL of jobs already stopping changes nothing in the store: it works while
    another process holds the store's write lock (a backup, say)."""
    c, clock = controller
    _submit(c)
    c._dirty = True
    c.tick()
    job_id = c.jobs.in_phase(JobPhase.RUNNING)[0].job_id
    c.cancel(pb.JobFilter(job_ids=[job_id]), 0, ROOT)
    assert c.jobs.get(job_id).phase == JobPhase.COMPLETING
    c.store.db.execute("PRAGMA busy_timeout=200")
    other = sqlite3.connect(str(tmp_path / "air.db"))
    other.execute("BEGIN IMMEDIATE")
    try:
        assert c.cancel(pb.JobFilter(job_ids=[job_id]), signal.SIGKILL, ROOT) == [job_id]
    finally:
        other.rollback()
        other.close()
    assert job_id in c._no_grace


def test_a_cancel_of_pending_and_running_jobs_answers_in_the_order_asked(controller):
    c, clock = controller
    first, second = _submit(c), _submit(c)
    c._dirty = True
    c.tick()
    queued = [_submit(c) for _ in range(3)]
    assert c.jobs.get(first).phase == JobPhase.RUNNING and c.jobs.get(queued[0]).phase == JobPhase.PENDING
    asked = [queued[2], first, queued[0], second, queued[1]]
    assert c.cancel(pb.JobFilter(job_ids=asked), 0, ROOT) == asked
