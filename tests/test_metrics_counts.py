"""The controller's counters, in-process on a clock the test moves: each job change counts once, also
when one request changes many jobs (the counts are added once for each set of labels)."""
from air.airctld import events
from air.airctld.model import NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import Reason

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
    assert sorted(c.cancel(pb.JobFilter(uids=[0]), 0, ROOT)) == sorted(held + [job_id])
    assert _count(c, "air_job_ends_total", partition="p", result="CANCELLED") == 6
    assert c.cancel(pb.JobFilter(uids=[0]), 0, ROOT) == []   # nothing left to cancel: nothing counted again
    assert _count(c, "air_job_ends_total", partition="p", result="CANCELLED") == 6
