"""Placement, limits and preemption in the pure scheduler, as table tests on small clusters."""
from air.airctld import scheduler
from air.protos.config import PartitionConfig, QosConfig
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, NodeState, Reason


def _cluster(names, gpus=8, cpus=64, drained=(), down=()):
    def state(n):
        return NodeState.DRAIN if n in drained else NodeState.DOWN if n in down else NodeState.UP
    return [Node(name=n, cpus=cpus, gpus=tuple(pb.Gpu(index=i) for i in range(gpus)), state=state(n)) for n in names]


def _job(job_id, nodes=1, gpus=1, cpus=1, prio=0, user="alice", account="", qos="", limit=0, **kw):
    req = kw.pop("request", None) or pb.JobRequest(account=account, qos=qos)
    return Job(job_id=job_id, uid=1000, gid=1000, user=user, name="j", partition="p", num_nodes=nodes,
               gpus_per_node=gpus, cpus_per_node=cpus, time_limit_s=limit, priority=prio, submit_time=job_id,
               request=req, **kw)


def _running(job_id, allocs, prio=0, start=0.0, qos="", user="alice", account="", limit=0,
             phase=JobPhase.RUNNING, **kw):
    allocation = tuple(NodeAlloc(n, tuple(g), 1) for n, g in allocs)
    gpus = len(allocs[0][1])
    return _job(job_id, nodes=len(allocs), gpus=gpus, prio=prio, qos=qos, user=user, account=account, limit=limit,
                phase=phase, start_time=start, allocation=allocation, **kw)


def _schedule(nodes, pending, active=(), switches=None, now=0.0, **kw):
    names = tuple(n.name for n in nodes)
    free = scheduler.free_resources(nodes, active, switches)
    return scheduler.schedule(pending, free, {"p": PartitionConfig("p", names)}, now=now, active=list(active), **kw)


SWITCHES = {f"n{i}": f"s{(i - 1) // 4}" for i in range(1, 13)}   # s0: n1-n4, s1: n5-n8, s2: n9-n12
NODES12 = [f"n{i}" for i in range(1, 13)]


def test_multi_node_job_uses_one_switch_when_one_can_fit_it():
    busy = [_running(90, [("n1", range(8))]), _running(91, [("n5", range(8))])]
    plan = _schedule(_cluster(NODES12), [_job(1, nodes=4, gpus=8)], busy, SWITCHES)
    nodes = [a.node for a in dict(plan.starts)[1]]
    assert {SWITCHES[n] for n in nodes} == {"s2"} and len(nodes) == 4


def test_fewest_switches_when_no_switch_fits():
    busy = [_running(90, [("n1", range(8))]), _running(91, [("n5", range(8))])]
    plan = _schedule(_cluster(NODES12), [_job(1, nodes=8, gpus=8)], busy, SWITCHES)
    nodes = [a.node for a in dict(plan.starts)[1]]
    assert len({SWITCHES[n] for n in nodes}) == 3 and sum(SWITCHES[n] == "s2" for n in nodes) == 4


def test_switches_option_waits_for_one_switch_up_to_its_limit():
    busy = [_running(90, [("n1", range(8))]), _running(91, [("n5", range(8))]), _running(92, [("n9", range(8))])]
    req = pb.JobRequest(switches=1, switches_wait_s=600)
    plan = _schedule(_cluster(NODES12), [_job(1, nodes=4, gpus=8, request=req)], busy, SWITCHES, now=100)
    assert plan.waiting == {1: Reason.RESOURCES}
    plan = _schedule(_cluster(NODES12), [_job(1, nodes=4, gpus=8, request=req)], busy, SWITCHES, now=1000)
    assert len(dict(plan.starts)[1]) == 4   # waited long enough: takes two switches


def test_switches_option_is_ignored_without_a_topology():
    # as Slurm's --switches without topology/tree: no node has a switch, so none is waited for
    req = pb.JobRequest(switches=1, switches_wait_s=600)
    plan = _schedule(_cluster(NODES12), [_job(1, nodes=4, gpus=8, request=req)], (), None, now=100)
    assert len(dict(plan.starts)[1]) == 4
    # with a topology, the same job waits while no single switch has room (three busy nodes, one a switch)
    busy = [_running(90, [("n1", range(8))]), _running(91, [("n5", range(8))]), _running(92, [("n9", range(8))])]
    plan = _schedule(_cluster(NODES12), [_job(1, nodes=4, gpus=8, request=req)], busy, SWITCHES, now=100)
    assert plan.waiting == {1: Reason.RESOURCES}


def test_switches_counts_the_listed_nodes_switches_too():
    # -w n1 -N 3 --switches=1: the rest under n1's switch, or wait (up to the limit) until they fit there
    busy = [_running(90, [("n2", range(8))]), _running(91, [("n3", range(8))])]   # s0 has only n1 and n4 free
    req = pb.JobRequest(switches=1, switches_wait_s=600, nodelist=["n1"])
    waiting = _schedule(_cluster(NODES12), [_job(1, nodes=3, gpus=8, request=req)], busy, SWITCHES, now=100)
    assert waiting.waiting == {1: Reason.RESOURCES} and not waiting.starts
    late = _schedule(_cluster(NODES12), [_job(1, nodes=3, gpus=8, request=req)], busy, SWITCHES, now=1000)
    nodes = [a.node for a in dict(late.starts)[1]]
    assert nodes[:2] == ["n1", "n4"] and len({SWITCHES[n] for n in nodes}) == 2   # waited: n1's switch first
    roomy = _schedule(_cluster(NODES12), [_job(1, nodes=3, gpus=8, request=req)], busy[:1], SWITCHES, now=100)
    assert sorted(a.node for a in dict(roomy.starts)[1]) == ["n1", "n3", "n4"]   # fits under s0: starts now
    apart = pb.JobRequest(switches=1, switches_wait_s=600, nodelist=["n1", "n5"])   # two switches listed:
    for nodes in (2, 3):                                                           # no wait can help, it starts
        plan = _schedule(_cluster(NODES12), [_job(1, nodes=nodes, gpus=8, request=apart)], (), SWITCHES, now=100)
        assert len(dict(plan.starts)[1]) == nodes
    listed = pb.JobRequest(switches=1, switches_wait_s=600, nodelist=["n1", "n2"])   # all its nodes listed
    assert sorted(a.node for a in dict(_schedule(_cluster(NODES12), [_job(1, nodes=2, gpus=8, request=listed)],
                                                 (), SWITCHES, now=100).starts)[1]) == ["n1", "n2"]


def test_small_jobs_fill_partly_used_nodes_and_aligned_gpu_blocks():
    busy = [_running(90, [("n2", (0,))])]
    plan = _schedule(_cluster(["n1", "n2", "n3"]), [_job(1, gpus=2), _job(2, gpus=1), _job(3, gpus=8)], busy)
    starts = dict(plan.starts)
    assert starts[1] == (NodeAlloc("n2", (2, 3), 1),)     # partly used node, an aligned pair
    assert starts[2] == (NodeAlloc("n2", (1,), 1),)
    assert starts[3][0].node == "n1"                      # a whole node was kept whole


def test_gpus_in_one_nvlink_domain():
    gpus = tuple(pb.Gpu(index=i, nvlink_domain=0 if i < 4 else 1) for i in range(8))
    node = Node(name="n1", cpus=64, gpus=gpus, state=NodeState.UP)
    busy = [_running(90, [("n1", (0, 1, 4))])]
    plan = _schedule([node], [_job(1, gpus=3)], busy)
    assert set(dict(plan.starts)[1][0].gpus) == {5, 6, 7}


def test_drained_and_down_nodes():
    plan = _schedule(_cluster(["n1", "n2"], drained=("n2",)), [_job(1, nodes=2)])
    assert plan.waiting == {1: Reason.NODES_DRAINED}
    plan = _schedule(_cluster(["n1", "n2"], down=("n2",)), [_job(1, nodes=2)])
    assert plan.waiting == {1: Reason.NODES_DOWN}


LIMITS = scheduler.Limits(
    qos={"normal": QosConfig("normal", max_gpus_per_user=8, max_gpus_per_account=12),
         "high": QosConfig("high", priority=10, preempt=("normal",))},
    account_chain={"ml": ("ml", "research"), "bio": ("bio", "research"), "research": ("research",)},
    account_max_gpus={"research": 20})


def test_qos_and_account_limits_hold_jobs_with_their_reasons():
    busy = [_running(90, [("n1", range(6))], user="alice", account="ml", qos="normal")]
    pending = [_job(1, gpus=4, user="alice", account="ml"),        # alice would hold 10 > 8
               _job(2, gpus=4, user="bob", account="ml"),          # ml would hold 10 <= 12
               _job(3, gpus=4, user="carol", account="ml"),        # ml would hold 14 > 12
               _job(4, gpus=8, user="dave", account="bio"),        # research: 6 + 4 + 8 = 18 <= 20
               _job(5, gpus=4, user="erin", account="bio")]        # research would hold 22 > 20
    plan = _schedule(_cluster(["n1", "n2", "n3", "n4"]), pending, busy, limits=LIMITS)
    assert sorted(dict(plan.starts)) == [2, 4]
    assert plan.waiting == {1: Reason.QOS_MAX_GPU_PER_USER, 3: Reason.QOS_MAX_GPU_PER_ACCOUNT,
                            5: Reason.ASSOC_GRP_GPU_LIMIT}


def test_array_throttle():
    req = pb.JobRequest(array_max_running=2)
    busy = [_running(10, [("n1", (0,))], array_job_id=10, request=req)]
    pending = [_job(i, array_job_id=10, array_task_id=i - 10, request=req) for i in range(11, 15)]
    plan = _schedule(_cluster(["n1", "n2"]), pending, busy)
    assert [s[0] for s in plan.starts] == [11]
    assert plan.waiting == {12: Reason.ARRAY_TASK_LIMIT, 13: Reason.ARRAY_TASK_LIMIT, 14: Reason.ARRAY_TASK_LIMIT}


def test_preemption_picks_the_fewest_lowest_priority_newest_victims():
    busy = [
        _running(90, [("n1", range(4))], prio=5, start=10, qos="normal"),
        _running(91, [("n1", range(4, 8))], prio=1, start=20, qos="normal"),
        _running(92, [("n2", range(4))], prio=1, start=30, qos="normal"),
        _running(93, [("n2", range(4, 8))], prio=1, start=40, qos="normal"),
        _running(94, [("n3", range(8))], prio=0, start=50, qos="high"),   # same QOS: never a victim
    ]
    # an 8-GPU job of QOS high: node n2 frees with two victims (92, 93), n1 would need 90 (prio 5)
    plan = _schedule(_cluster(["n1", "n2", "n3"]), [_job(1, gpus=8, qos="high", prio=100)], busy,
                     limits=LIMITS, now=100)
    assert sorted(plan.preempt[1]) == [92, 93]
    # a 4-GPU job needs one victim: the lowest priority, most recently started
    plan = _schedule(_cluster(["n1", "n2", "n3"]), [_job(1, gpus=4, qos="high", prio=100)], busy,
                     limits=LIMITS, now=100)
    assert plan.preempt[1] == [93]


def test_no_preemption_when_resources_free_soon_or_qos_may_not():
    busy = [_running(90, [("n1", range(8))], qos="normal", limit=110, start=0)]
    plan = _schedule(_cluster(["n1"]), [_job(1, gpus=8, qos="high")], busy, limits=LIMITS, now=100)
    assert plan.preempt == {} and plan.estimate()[1].start == 110
    plan = _schedule(_cluster(["n1"]), [_job(1, gpus=8, qos="normal")], busy, limits=LIMITS, now=0)
    assert plan.preempt == {}


def test_completing_victims_are_not_preempted_again():
    victim = _running(90, [("n1", range(8))], qos="normal", phase=JobPhase.COMPLETING)
    plan = _schedule(_cluster(["n1"]), [_job(1, gpus=8, qos="high")], [victim], limits=LIMITS, now=100,
                     completing_release_s=30, preempt_grace_s=30)
    assert plan.preempt == {} and plan.estimate()[1].start == 130
