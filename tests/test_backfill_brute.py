"""The scheduler against the brute-force reference (sched_brute.py) on small clusters (up to 6
nodes, some without GPUs; 6 running and 8 pending jobs) with integer times: walking the queue in
priority order, each job left waiting is reserved exactly its earliest start, counting what runs,
the jobs started earlier in the same pass and the reservations above it; with the jobs started
below it (backfill), enough nodes still have room for it from that start for as long as its limit;
and nothing the plan holds, started or reserved, ever overfills a node.

The example count is 300 by default; AIR_BRUTE_EXAMPLES=3000 runs more."""
import os

from hypothesis import HealthCheck, given, settings, strategies as st

import sched_brute as brute
from air.airctld import scheduler
from air.protos.config import PartitionConfig
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, NodeState

EXAMPLES = int(os.environ.get("AIR_BRUTE_EXAMPLES", "300"))
NOW = 100


@st.composite
def instances(draw):
    n = draw(st.integers(1, 6))
    nodes = [Node(name=f"n{i}", cpus=draw(st.sampled_from([2, 4])),
                  gpus=tuple(pb.Gpu(index=g) for g in range(draw(st.sampled_from([0, 2, 4])))), state=NodeState.UP)
             for i in range(n)]
    left = {nd.name: [len(nd.gpus), nd.cpus] for nd in nodes}
    running = []
    for job_id in range(100, 100 + draw(st.integers(0, 6))):
        node = draw(st.sampled_from(nodes))
        g, c = draw(st.integers(0, 2)), draw(st.integers(1, 2))
        if left[node.name][0] < g or left[node.name][1] < c:
            continue
        first = len(node.gpus) - left[node.name][0]
        left[node.name][0] -= g
        left[node.name][1] -= c
        running.append(Job(job_id=job_id, uid=1, gid=1, user="u", name="r", partition="p", num_nodes=1,
                           gpus_per_node=g, cpus_per_node=c, time_limit_s=draw(st.sampled_from([0, 3, 6, 9])),
                           submit_time=0.0, request=pb.JobRequest(), phase=JobPhase.RUNNING,
                           start_time=float(NOW - draw(st.integers(0, 2))),   # none overdue
                           allocation=(NodeAlloc(node.name, tuple(range(first, first + g)), c),)))
    pending = [Job(job_id=k, uid=1, gid=1, user="u", name="p", partition="p", num_nodes=draw(st.integers(1, n)),
                   gpus_per_node=draw(st.sampled_from([0, 1, 1, 2, 2, 4])), cpus_per_node=draw(st.sampled_from([1, 1, 2, 3])),
                   time_limit_s=draw(st.sampled_from([0, 1, 2, 3, 4, 7])), submit_time=float(k), request=pb.JobRequest())
               for k in range(1, draw(st.integers(1, 8)) + 1)]
    priority = {j.job_id: draw(st.integers(0, 3)) for j in pending}
    return nodes, running, pending, priority


def _slot(job: Job, nodes, start) -> brute.Slot:
    return brute.Slot(tuple(nodes), job.gpus_per_node, job.cpus_per_node, int(start),
                      int(start) + job.time_limit_s if job.time_limit_s else None)


def check(case):
    nodes, running, pending, priority = case
    free = scheduler.free_resources(nodes, running)
    plan = scheduler.schedule(pending, free, {"p": PartitionConfig("p", tuple(nd.name for nd in nodes))},
                              now=float(NOW), active=running, priority=priority)
    cap = {nd.name: (len(nd.gpus), nd.cpus) for nd in nodes}
    horizon = NOW + 10 + sum(j.time_limit_s for j in pending)   # after every end that is not "forever"
    runs = [_slot(j, [a.node for a in j.allocation], j.start_time) for j in running]
    started = {i: [a.node for a in alloc] for i, alloc in plan.starts}
    reserved = plan.estimate()
    order = sorted(pending, key=lambda j: (-priority[j.job_id], j.submit_time, j.job_id))
    every_start = [_slot(j, started[j.job_id], NOW) for j in order if j.job_id in started]
    above_started, above_reserved = [], []    # what the jobs above hold
    for k, job in enumerate(order):
        if job.job_id in started:
            above_started.append(_slot(job, started[job.job_id], NOW))
            continue
        res = reserved.get(job.job_id)
        want = (job.num_nodes, job.gpus_per_node, job.cpus_per_node)
        before = runs + above_started + above_reserved
        first = brute.earliest(cap, before, *want, NOW, horizon)
        if res is None:
            assert first is None, f"job {job.job_id} could start at {first} but has no reservation"
            continue
        assert res.start == first, f"job {job.job_id} reserved at {res.start}, its earliest start is {first}"
        assert all(brute.room_from(cap, before, name, job.gpus_per_node, job.cpus_per_node, first, horizon)
                   for name in res.nodes), f"job {job.job_id} reserved on {res.nodes}, not all with room then"
        end = first + job.time_limit_s if job.time_limit_s else None
        below = [j.job_id for j in order[k + 1:] if j.job_id in started]
        assert brute.runs_at(cap, runs + every_start + above_reserved, *want, first, end, horizon), \
            f"jobs {below} started below job {job.job_id} leave it no room from its earliest start {first} to {end}"
        above_reserved.append(_slot(job, res.nodes, res.start))
    full = brute.overfull(cap, runs + every_start + above_reserved, NOW, horizon)
    assert not full, f"node and moment held beyond the node's size: {full[:3]}"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_reservations_are_the_earliest_starts_and_backfill_delays_none_of_them(case):
    check(case)
