"""Plain airq reads rows that airctld keeps rendered in squeue's default format. Checked against the
rows airq makes itself from the jobs (the -o path: ListJobs, compact_arrays, render), over a queue with
pending, held, running and ended jobs, array tasks of two arrays interleaved, and jobs that change
between listings: a kept row never outlives the version of the job it shows."""
import random

from air.airctld import events
from air.airctld.model import NodeAlloc
from air.protos import air_pb2 as pb
from air.protos import squeue
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, Reason

ALICE, BOB, ROOT = Identity(4242, 4242), Identity(4343, 4343), Identity(0, 0)


def _by_hand(c, clock, filt, who) -> str:
    """What airq -o '<the default format>' prints, without its header."""
    plain = pb.JobFilter()
    plain.CopyFrom(filt)
    plain.rendered = False
    jobs = [pb.Job.FromString(b) for b in c.list_jobs(plain, who)]
    rows = jobs if filt.expand_arrays else squeue.compact_arrays(jobs)
    items = squeue.compile_format(squeue.SQUEUE_DEFAULT, squeue.job_fields(clock.now))
    return "".join(line + "\n" for line in squeue.render(items, rows, header=False))


def _queue(c, clock, seed: int) -> list[int]:
    rng = random.Random(seed)
    ids = []
    for i in range(40):
        who = rng.choice((ALICE, BOB))
        kind = rng.choice(("plain", "held", "array", "array", "named"))
        req = pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", name=f"job{i}" if kind == "named" else "",
                            hold=kind == "held", array="0-5%2" if kind == "array" else "",
                            time_limit_s=rng.choice((0, 60, 3600)))
        ids.append(c.submit(req, who)[0])
    for job_id in rng.sample(ids, 8):   # some start, some of those end, some are cancelled
        job = c.jobs.get(job_id)
        if job.phase != JobPhase.PENDING or job.hold:
            continue
        job = c._commit([(job, events.start(job, clock.now, (NodeAlloc(rng.choice(("n1", "n2")), (), 1),)))],
                        clock.now, 0)[0]
        clock.now += rng.uniform(1, 500)
        if rng.random() < 0.5:
            c._commit([(job, events.exited(job, clock.now, rng.choice((0, 3)), 0))], clock.now, 0)
    c.cancel(pb.JobFilter(job_ids=rng.sample(ids, 3)), 0, ROOT)
    return ids


def test_kept_rows_are_the_rows_airq_would_make_whatever_the_filter(controller):
    c, clock = controller
    _queue(c, clock, seed=7)
    filters = [pb.JobFilter(), pb.JobFilter(expand_arrays=True), pb.JobFilter(uids=[ALICE.uid]),
               pb.JobFilter(phases=[pb.JOB_PHASE_PENDING]), pb.JobFilter(partitions=["p"]),
               pb.JobFilter(partitions=["elsewhere"]), pb.JobFilter(job_ids=[1, 2, 3])]
    for round_ in range(3):   # the second and third listing come from kept rows
        clock.now += 61
        for filt in filters:
            for who in (ALICE, ROOT):
                filt.rendered = True
                assert c.list_rows(filt, who) == _by_hand(c, clock, filt, who), (round_, filt, who)


def test_a_row_changes_with_its_job_and_a_running_jobs_time_moves(controller):
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True, name="watched"), ALICE)
    every = pb.JobFilter(rendered=True)

    def row() -> list[str]:
        text = c.list_rows(every, ALICE)
        assert text == _by_hand(c, clock, every, ALICE)
        return text.split()

    assert row()[4:] == ["PD", "0:00", "1", "(JobHeldUser)"]
    c.hold(pb.JobFilter(job_ids=[job_id]), False, ALICE)
    assert row()[4:] == ["PD", "0:00", "1", "(None)"]
    job = c.jobs.get(job_id)
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n2", (), 1),)))], clock.now, 0)
    assert row()[4:] == ["R", "0:00", "1", "n2"]
    clock.now += 75
    assert row()[4:] == ["R", "1:15", "1", "n2"]
    job = c.jobs.get(job_id)
    c._commit([(job, events.stop(job, clock.now, JobResult.CANCELLED, Reason.CANCELLED))], clock.now, 0)
    job = c.jobs.get(job_id)
    c._commit([(job, events.exited(job, clock.now, 0, 15))], clock.now, 0)
    clock.now += 100
    assert row()[4:] == ["CA", "1:15", "1", "n2"]


def test_a_row_made_from_a_job_that_changed_meanwhile_is_never_kept_for_the_new_one(controller):
    # a listing renders outside the controller's lock: the job may change between its pick and its row
    c, clock = controller
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ALICE)
    old = c.jobs.get(job_id)
    c.hold(pb.JobFilter(job_ids=[job_id]), False, ALICE)
    c.jobs.keep_row(old, "stale row")
    assert c.jobs.row(c.jobs.get(job_id)) is None and c.jobs.row(old) is None
    assert "stale" not in c.list_rows(pb.JobFilter(rendered=True), ALICE)
