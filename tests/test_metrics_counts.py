"""The controller's counters, in-process on a clock the test moves: each job change counts once, also
when one request changes many jobs (the counts are added once for each set of labels)."""
import pytest

from air.airctld import events
from air.airctld.model import NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import Reason
from fakeclock import Clock, build

ROOT = Identity(0, 0)


def _count(c, name, **labels):
    return c.metrics.registry.get_sample_value(name, labels) or 0


def test_one_cancel_of_many_jobs_counts_each_end_once(controller):
    c, clock = controller
    held = [c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", hold=True), ROOT)[0] for _ in range(5)]
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=4), ROOT)
    job = c.jobs.get(job_id)
    clock.now += 7
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0, 1, 2, 3), 1),)))], clock.now, 0)
    assert _count(c, "air_job_starts_total", partition="p") == 1
    assert _count(c, "air_job_submit_to_start_seconds_sum", partition="p") == 7
    running = c.jobs.get(job_id)
    c._commit([(running, events.node_lost(running, clock.now, Reason.NODE_FAIL, "test"))], clock.now, 0)
    assert _count(c, "air_job_requeues_total", reason="NODE_FAIL") == 1
    # a run's end makes every category of its account's goodput a series, at 0 where it took no time:
    # rate() and ratios over them need the series there (a missing one is no data, not 0)
    account = c.jobs.get(job_id).account
    for category in ("starting", "restoring", "training", "checkpoint", "lost", "other"):
        assert c.metrics.registry.get_sample_value("air_goodput_seconds_total",
                                                   {"account": account, "category": category}) is not None, category
    assert sorted(c.cancel(pb.JobFilter(uids=[0]), 0, ROOT)) == sorted(held + [job_id])
    assert _count(c, "air_job_ends_total", partition="p", result="CANCELLED") == 6
    assert c.cancel(pb.JobFilter(uids=[0]), 0, ROOT) == []   # nothing left to cancel: nothing counted again
    assert _count(c, "air_job_ends_total", partition="p", result="CANCELLED") == 6


def _beat(c, node, runs=()):
    c.heartbeat(pb.HeartbeatRequest(name=node, running=sorted({j for j, _ in runs}),
                                    runs=[pb.RunRef(job_id=j, run=r) for j, r in runs]))


def test_usage_is_charged_for_running_ended_and_requeued_runs_and_never_for_pending_jobs(controller):
    # GPU-seconds against a hand count (billing: 1 a GPU-second; a week's half-life decays < 0.01% here)
    c, clock = controller
    c.tick()   # charged up to now: what follows is all the usage there is
    ids = {}
    for account, gpus in (("ended", 4), ("running", 2), ("requeued", 1), ("pending", 4)):
        ids[account], _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=gpus,
                                                 account=account, hold=account == "pending"), ROOT)
    for account, node, gpus in (("ended", "n1", (0, 1, 2, 3)), ("running", "n2", (0, 1)), ("requeued", "n2", (2,))):
        job = c.jobs.get(ids[account])
        c._commit([(job, events.start(job, clock.now, (NodeAlloc(node, gpus, 1),)))], clock.now, 0)
    clock.now += 10
    _beat(c, "n1")
    _beat(c, "n2", [(ids["running"], 0), (ids["requeued"], 0)])
    job = c.jobs.get(ids["ended"])
    c._commit([(job, events.exited(job, clock.now, 0, 0))], clock.now, 0)
    clock.now += 2
    job = c.jobs.get(ids["requeued"])   # its run ends in a requeue 12 s after its start, before any charge
    c._commit([(job, events.node_lost(job, clock.now, Reason.NODE_FAIL, "test"))], clock.now, 0)
    clock.now += 8
    _beat(c, "n1")
    _beat(c, "n2", [(ids["running"], 0)])
    c.tick()
    usage = {account: v for (account, _), v in c.accounting.usage.items()}
    assert usage.get("ended") == pytest.approx(4 * 10, rel=1e-3)    # 4 GPUs for the 10 s it ran
    assert usage.get("running") == pytest.approx(2 * 20, rel=1e-3)  # 2 GPUs, still running after 20 s
    assert usage.get("requeued") == pytest.approx(1 * 12, rel=1e-3)  # 1 GPU for the 12 s of its run
    assert usage.get("pending", 0) == 0                            # pending: nothing used


def _charged_then_started(tmp_path, gpus):
    """A controller that has just charged usage, and a job of account `a` it started then on n1."""
    clock = Clock()
    c = build(tmp_path, clock, clock)
    c.tick()
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=gpus, account="a"), ROOT)
    job = c.jobs.get(job_id)
    c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", tuple(range(gpus)), 1),)))], clock.now, 0)
    return c, clock, job_id


def test_a_run_requeued_just_before_a_controller_restart_is_charged_by_the_next_controller(tmp_path):
    c, clock, job_id = _charged_then_started(tmp_path, gpus=2)
    clock.now += 3   # (less than the 5 s between charges: nothing charged when it is requeued)
    job = c.jobs.get(job_id)
    c._commit([(job, events.node_lost(job, clock.now, Reason.NODE_FAIL, "test"))], clock.now, 0)
    c.stop()   # gone before its next charge
    again = build(tmp_path, clock, clock)
    usage = {account: v for (account, _), v in again.accounting.usage.items()}
    assert usage.get("a") == pytest.approx(2 * 3, rel=1e-3)
    again.tick()   # and only once
    clock.now += 10
    again.tick()
    assert {account: v for (account, _), v in again.accounting.usage.items()}.get("a") == pytest.approx(6, rel=1e-3)
    again.stop()


def test_a_job_that_ended_just_before_a_long_controller_stop_is_charged_by_the_next_controller(tmp_path):
    # stopped longer than the visibility window: the job is not in the next controller's memory
    c, clock, job_id = _charged_then_started(tmp_path, gpus=4)
    clock.now += 3
    job = c.jobs.get(job_id)
    c._commit([(job, events.exited(job, clock.now, 0, 0))], clock.now, 0)
    c.stop()
    clock.now += 3600
    again = build(tmp_path, clock, clock)
    assert again.jobs.get(job_id) is None
    usage = {account: v for (account, _), v in again.accounting.usage.items()}
    assert usage.get("a") == pytest.approx(4 * 3, rel=1e-3)
    again.stop()
