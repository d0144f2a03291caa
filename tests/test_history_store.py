"""Job history from the store (airacct's queries), checked against a plain Python filter over the
same jobs, kept beside the store as they were written: every filter, the time window, arrays, and
paging. Also the runs a requeue leaves, steps and who cancelled."""
import random

import pytest

from air.airctld import events
from air.airctld.model import Job, NodeAlloc
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult, Reason

USERS = (1000, 1001, 1002)
ACCOUNTS = ("ml", "vision", "")
DONE = (JobResult.COMPLETED, JobResult.FAILED, JobResult.CANCELLED, JobResult.TIMEOUT)


def _new(rng, t: float, array: int = 0, task: int = 0) -> Job:
    uid = rng.choice(USERS)
    name = rng.choice(("train", "eval", "prep"))
    req = pb.JobRequest(name=name, script="#!/bin/sh\n", account=rng.choice(ACCOUNTS),
                        qos=rng.choice(("normal", "high")))
    return Job(job_id=0, uid=uid, gid=uid, user=f"u{uid}", name=name, partition=rng.choice(("gpu", "cpu")),
               num_nodes=1, gpus_per_node=1, cpus_per_node=1, time_limit_s=60, submit_time=t, request=req,
               array_job_id=array, array_task_id=task)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A store with 400 jobs of every kind, and the same jobs as plain objects (the reference)."""
    rng = random.Random(7)
    store = Store(str(tmp_path_factory.mktemp("history") / "air.db"))
    jobs: dict[int, Job] = {}
    t = 1000.0
    for i in range(400):
        t += rng.uniform(1, 50)
        array = rng.random() < 0.2 and i > 0
        with store.transaction():
            parent = max(jobs) if array else 0
            job = _new(rng, t, parent and jobs[parent].array_job_id or parent, rng.randrange(4))
            job_id = store.insert_job(job, who=job.uid)
            job = store.get_job(job_id)
            if array and not job.array_job_id:   # the first task of an array names it
                store.set_array_job_id([parent, job_id], parent)
                jobs[parent] = store.get_job(parent)
                job = store.get_job(job_id)
            fate = rng.random()
            if fate > 0.15:
                new = events.start(job, t + 5, (NodeAlloc("node01", (0,), 1),))
                store.update_job(job, new, t + 5, 0)
                job = new
                if rng.random() < 0.2:   # requeued, then started again
                    new = events.requeued(job, t + 6, Reason.PREEMPTED)
                    store.update_job(job, new, t + 6, 0)
                    job = new
                    new = events.start(job, t + 7, (NodeAlloc("node02", (0,), 1),))
                    store.update_job(job, new, t + 7, 0)
                    job = new
            if fate > 0.3:
                new = events.finished(job, t + rng.uniform(10, 5000), rng.choice((0, 1)), 0)
                if rng.random() < 0.2:
                    new = events.stop(job, new.end_time, JobResult.CANCELLED, Reason.CANCELLED)
                    new = events.exited(new, new.end_time, 0, 15)
                store.update_job(job, new, new.end_time, 0)
                job = new
        jobs[job_id] = job
    for job_id in jobs:
        jobs[job_id] = store.get_job(job_id)
    yield store, jobs
    store.close()


def _reference(jobs: dict[int, Job], req: pb.HistoryRequest) -> list[int]:
    out = []
    for job in jobs.values():
        if req.job_ids or req.array_tasks:
            named = job.job_id in req.job_ids or job.array_job_id in req.job_ids or any(
                job.array_job_id == t.array_job_id and job.array_task_id == t.task_id for t in req.array_tasks)
            if not named:
                continue
        if req.uids and job.uid not in req.uids:
            continue
        if req.accounts and job.request.account not in req.accounts:
            continue
        if req.partitions and job.partition not in req.partitions:
            continue
        if req.names and job.name not in req.names:
            continue
        if req.qos and job.request.qos not in req.qos:
            continue
        if req.phases or req.results:
            if job.phase == JobPhase.DONE:
                if req.results and job.result not in req.results:
                    continue
                if not req.results and JobPhase.DONE not in req.phases:
                    continue
            elif job.phase not in req.phases:
                continue
        if req.since and job.phase == JobPhase.DONE and job.end_time < req.since:
            continue
        if req.until and job.submit_time > req.until:
            continue
        if job.job_id <= req.after_job_id:
            continue
        out.append(job.job_id)
    return sorted(out)


def _random_request(rng, jobs) -> pb.HistoryRequest:
    req = pb.HistoryRequest()
    times = sorted(j.submit_time for j in jobs.values())
    if rng.random() < 0.3:
        req.job_ids.extend(rng.sample(sorted(jobs), rng.randint(1, 5)))
    if rng.random() < 0.2:
        arrays = sorted({j.array_job_id for j in jobs.values() if j.array_job_id})
        req.array_tasks.append(pb.ArrayTask(array_job_id=rng.choice(arrays), task_id=rng.randrange(4)))
    if rng.random() < 0.5:
        req.uids.extend(rng.sample(USERS, rng.randint(1, 2)))
    if rng.random() < 0.3:
        req.accounts.extend(rng.sample(ACCOUNTS, rng.randint(1, 2)))
    if rng.random() < 0.2:
        req.partitions.append(rng.choice(("gpu", "cpu")))
    if rng.random() < 0.2:
        req.names.append(rng.choice(("train", "eval")))
    if rng.random() < 0.2:
        req.qos.append(rng.choice(("normal", "high")))
    if rng.random() < 0.3:
        req.phases.extend(rng.sample([JobPhase.PENDING, JobPhase.RUNNING, JobPhase.DONE], rng.randint(1, 2)))
    if rng.random() < 0.3:
        req.results.extend(rng.sample(DONE, rng.randint(1, 2)))
        if JobPhase.DONE not in req.phases:
            req.phases.append(JobPhase.DONE)
    ends = sorted(j.end_time for j in jobs.values() if j.end_time)
    if rng.random() < 0.6:   # an end time itself half the time: the bound is inclusive
        req.since = rng.choice(times if rng.random() < 0.5 else ends)
    if rng.random() < 0.3:   # a submit time itself: inclusive too
        req.until = rng.choice(times)
    return req


def test_every_filter_matches_a_plain_filter_over_the_same_jobs(history):
    store, jobs = history
    rng = random.Random(11)
    nonempty = 0
    for _ in range(400):
        req = _random_request(rng, jobs)
        got, more = store.history(req, 10_000)
        expected = _reference(jobs, req)
        assert [e.job.job_id for e in got] == expected, req
        assert not more
        nonempty += bool(expected)
    assert nonempty > 100   # the requests find jobs, not only nothing


def test_pages_join_up_to_the_whole_answer(history):
    store, jobs = history
    req = pb.HistoryRequest(uids=[1000, 1001], since=3000.0)
    whole = _reference(jobs, req)
    assert len(whole) > 30
    pages = []
    while True:
        got, more = store.history(req, 7)
        pages.extend(e.job.job_id for e in got)
        if not more:
            break
        assert len(got) == 7
        req.after_job_id = got[-1].job.job_id
    assert pages == whole


def test_a_requeue_leaves_its_run_and_a_cancel_says_who(tmp_path):
    store = Store(str(tmp_path / "air.db"))
    rng = random.Random(1)
    with store.transaction():
        job_id = store.insert_job(_new(rng, 100.0), who=1000)
    job = store.get_job(job_id)
    first = events.start(job, 110.0, (NodeAlloc("node01", (0, 1), 4), NodeAlloc("node02", (0, 1), 4)))
    again = events.requeued(first, 150.0, Reason.PREEMPTED, "preempted by job 9")
    second = events.start(again, 160.0, (NodeAlloc("node03", (2,), 2),))
    store.add_step(job_id, 0, 1, 161.0, "node03", 2, "python train.py")
    stopping = events.stop(second, 170.0, JobResult.CANCELLED, Reason.CANCELLED)
    ended = events.exited(stopping, 171.0, 0, 15)
    with store.transaction():
        store.update_job(job, first, 110.0, 0)
        store.update_job(first, again, 150.0, 0)
        store.update_job(again, second, 160.0, 0)
        store.update_job(second, stopping, 170.0, 1001)
        store.update_job(stopping, ended, 171.0, 0)
    (entry,), more = store.history(pb.HistoryRequest(job_ids=[job_id]), 10)
    assert [(r.run, r.start_time, r.end_time, [a.node for a in r.allocation], Reason(r.reason))
            for r in entry.runs] == [(0, 110.0, 150.0, ["node01", "node02"], Reason.PREEMPTED)]
    assert [(s.step_id, s.run, s.nodes, s.command) for s in entry.steps] == [(0, 1, "node03", "python train.py")]
    assert entry.cancelled and entry.cancelled_by == 1001
    assert entry.job.restart_count == 1 and entry.job.start_time == 160.0
    store.close()


def test_a_request_too_large_is_refused_naming_its_limit(history):
    store, _ = history
    with pytest.raises(ValueError, match="10001 jobs named; the limit is 10000"):
        store.history(pb.HistoryRequest(job_ids=range(1, 10_002)), 10)
    with pytest.raises(ValueError, match="1001 uids given; the limit is 1000"):
        store.history(pb.HistoryRequest(uids=range(1001)), 10)


def test_a_page_stops_at_its_byte_budget_and_the_next_goes_on_from_there(history):
    store, jobs = history
    req = pb.HistoryRequest(uids=[1000])
    whole, _ = store.history(req, 10_000)
    one = whole[0].ByteSize()
    first, more = store.history(req, 10_000, max_bytes=one * 3)
    assert more and 1 <= len(first) <= 3 and [e.job.job_id for e in first] == [e.job.job_id for e in whole[:len(first)]]
    tiny, more = store.history(req, 10_000, max_bytes=1)   # at least one job, whatever the budget
    assert more and len(tiny) == 1
