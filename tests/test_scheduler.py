"""The pure scheduler: order, placement, gang starts, backfill, topology, limits, preemption,
reasons, and the never-satisfiable check. Table tests; test_scheduler_properties.py has the
property tests over random clusters."""
from air.airctld import scheduler
from air.protos.config import PartitionConfig
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, NodeState, Reason

PART = PartitionConfig(name="gpu", nodes=("n1", "n2"), default=True)
PARTS = {"gpu": PART}


def _nodes(gpus=4, cpus=8, down=()):
    return [Node(name=n, cpus=cpus, gpus=tuple(pb.Gpu(index=i) for i in range(gpus)),
                 state=NodeState.DOWN if n in down else NodeState.UP) for n in ("n1", "n2")]


def _job(job_id, nodes=1, gpus=1, cpus=1, prio=0, submit=None, limit=0, request=None, **kw):
    return Job(job_id=job_id, uid=0, gid=0, user="root", name="j", partition="gpu", num_nodes=nodes,
               gpus_per_node=gpus, cpus_per_node=cpus, time_limit_s=limit, priority=prio,
               submit_time=submit if submit is not None else job_id, request=request or pb.JobRequest(), **kw)


def _running(job_id, node, gpus, start=0.0, limit=0, prio=0, qos="", cpus=1, **kw):
    return _job(job_id, gpus=len(gpus), cpus=cpus, prio=prio, limit=limit, phase=JobPhase.RUNNING,
                start_time=start, allocation=(NodeAlloc(node, tuple(gpus), cpus),),
                request=pb.JobRequest(qos=qos), **kw)


def _run(pending, active=(), now=0.0, **node_kw):
    free = scheduler.free_resources(_nodes(**node_kw), active)
    return scheduler.schedule(pending, free, PARTS, now=now, active=list(active))


def test_first_fit_lowest_gpus_first_and_no_overlap():
    plan = _run([_job(1, gpus=2), _job(2, gpus=2), _job(3, gpus=3)])
    assert plan.starts == [(1, (NodeAlloc("n1", (0, 1), 1),)), (2, (NodeAlloc("n1", (2, 3), 1),)),
                           (3, (NodeAlloc("n2", (0, 1, 2), 1),))]


def test_running_jobs_hold_their_gpus():
    running = _job(9, gpus=3, phase=JobPhase.RUNNING, allocation=(NodeAlloc("n1", (0, 2, 3), 1),))
    plan = _run([_job(1, gpus=1)], active=[running])
    assert plan.starts == [(1, (NodeAlloc("n1", (1,), 1),))]


def test_gang_start_all_or_nothing():
    running = _running(9, "n1", (0, 1, 2))
    plan = _run([_job(1, nodes=2, gpus=2)], active=[running])
    assert plan.starts == [] and plan.waiting == {1: Reason.RESOURCES}


def test_backfill_may_not_delay_the_reservation():
    # n1 frees its GPUs at t=100; job 1 (both nodes, 2 GPUs each) is reserved for t=100 on n1+n2.
    running = _running(9, "n1", (0, 1, 2), limit=100)
    pending = [_job(1, nodes=2, gpus=2, prio=10, limit=50), _job(2, gpus=4, limit=200),
               _job(3, gpus=4, limit=90), _job(4, gpus=2, limit=500)]
    plan = _run(pending, active=[running])
    assert plan.estimate()[1].start == 100 and set(plan.estimate()[1].nodes) == {"n1", "n2"}
    started = dict(plan.starts)
    # job 2 would hold n2 past t=100: it waits behind the reservation; job 3 ends by t=90 and backfills
    assert plan.waiting[2] == Reason.PRIORITY
    assert 3 in started and started[3][0].node == "n2"
    # job 4 would leave 2 GPUs of n2 at t=100... but job 3 holds n2 now, so it waits for resources
    assert plan.waiting[4] == Reason.RESOURCES


def test_backfill_on_what_the_reservation_leaves_spare():
    running = _running(9, "n1", (0, 1, 2, 3), limit=100)
    pending = [_job(1, nodes=2, gpus=2, prio=10), _job(2, gpus=2, limit=1000)]
    plan = _run(pending, active=[running])
    # job 1 needs 2 of n2's 4 GPUs at t=100; job 2 may take the other 2 now, for as long as it likes
    assert plan.estimate()[1].start == 100
    assert dict(plan.starts)[2] == (NodeAlloc("n2", (0, 1), 1),)


def test_no_reservation_behind_jobs_without_time_limit():
    running = _running(9, "n1", (0, 1, 2), limit=0)
    plan = _run([_job(1, nodes=2, gpus=2, prio=10), _job(2, gpus=1)], active=[running])
    assert plan.reservations == [] and [s[0] for s in plan.starts] == [2]


def test_priority_then_submit_order():
    plan = _run([_job(1, gpus=4, submit=5), _job(2, gpus=4, prio=10, submit=9), _job(3, gpus=4, submit=1),
                 _job(4, gpus=1, submit=10)])
    assert [s[0] for s in plan.starts] == [2, 3]
    assert plan.waiting == {1: Reason.RESOURCES, 4: Reason.RESOURCES}


def test_held_jobs_do_not_block_and_down_nodes_count():
    plan = _run([_job(1, hold=True), _job(2, nodes=2)], down=("n2",))
    assert plan.starts == [] and plan.waiting == {1: Reason.JOB_HELD_USER, 2: Reason.NODES_DOWN}
    plan = _run([_job(1, cpus=9)])
    assert plan.waiting == {1: Reason.RESOURCES}


def test_partition_down():
    free = scheduler.free_resources(_nodes(), [])
    plan = scheduler.schedule([_job(1)], free, {"gpu": PartitionConfig("gpu", ("n1", "n2"), up=False)})
    assert plan.waiting == {1: Reason.PARTITION_DOWN}


def test_infeasible_says_why():
    cap = {"n1": (4, 8), "n2": (4, 8)}
    assert scheduler.infeasible(1, 4, 8, 0, PART, cap) is None
    assert "8 GPUs per node requested, but no node in partition gpu has more than 4" in \
        scheduler.infeasible(1, 8, 1, 0, PART, cap)
    assert "3 nodes requested, but partition gpu has only 2" in scheduler.infeasible(3, 1, 1, 0, PART, cap)
    assert "16 CPUs per node" in scheduler.infeasible(1, 1, 16, 0, PART, cap)
    limited = PartitionConfig("gpu", ("n1", "n2"), max_time_s=3600)
    assert "over partition gpu's maximum of 1:00:00" in scheduler.infeasible(1, 1, 1, 7200, limited, cap)
    # nodes not heard from yet never make a request "never"
    assert scheduler.infeasible(1, 8, 1, 0, PART, {"n1": (4, 8)}) is None
