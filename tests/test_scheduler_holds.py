"""Preemption and holds across passes, with the nodes the scheduler says to hold carried from one
pass to the next as the controller carries them: the preemptor keeps all the nodes it counted,
preempts once, and never delays a higher-priority job."""
from air.airctld import scheduler
from air.protos.config import PartitionConfig
from air.airctld.model import evolve
from air.protos.states import JobPhase, Reason

from test_scheduler_cases import HOUR, QOS, _job, _nodes, _plan, _running


def _stopping(job):
    return evolve(job, phase=JobPhase.COMPLETING, reason=Reason.PREEMPTED)


def test_the_preemptor_holds_the_free_nodes_it_counted_as_well_as_its_victims():
    # n1 is free, n2 and n3 run long jobs; P needs two whole nodes: one victim and n1
    v2 = _running(12, "n2", qos="normal", limit=10 * HOUR, start=0.0)
    v3 = _running(13, "n3", qos="normal", limit=10 * HOUR, start=1.0)
    nodes = _nodes(["n1", "n2", "n3"])
    p, low = _job(1, nodes=2, qos="high"), _job(3, qos="normal", limit=2 * HOUR)
    pri = {1: 500, 2: 900, 3: 5, 12: 1, 13: 1}
    plan = _plan(nodes, [p, low], [v2, v3], now=60, limits=QOS, priority=pri, preempt_grace_s=30)
    assert plan.preempt == {1: [13]} and plan.holds == {1: ("n1", "n3")}
    assert plan.starts == []                     # the low job does not take n1 in the same pass
    holds = dict(plan.holds)
    # next pass: the victim stops; a higher-priority job that would fit on n1 arrives
    high = _job(2, qos="normal", limit=10 * HOUR)
    plan = _plan(nodes, [p, high, low], [_stopping(v3), v2], now=70, limits=QOS, priority=pri,
                 preempt_grace_s=30, stopped_at={13: 60.0}, holds=holds)
    assert plan.starts == [] and plan.preempt == {}
    assert plan.estimate()[1].start == 90 and plan.estimate()[1].nodes == ("n1", "n3")
    # the victim is gone: the preemptor starts on the nodes held for it, and nobody else was preempted
    plan = _plan(nodes, [p, high, low], [v2], now=100, limits=QOS, priority=pri, preempt_grace_s=30, holds=holds)
    assert plan.starts[0][0] == 1 and {a.node for a in plan.starts[0][1]} == {"n1", "n3"}
    assert plan.preempt == {}


def test_a_hold_too_small_for_the_preemptor_still_reserves_ahead_of_the_queue():
    # held: n1 only (an older hold), P needs two nodes; n2 runs a job ending in an hour
    v2 = _running(12, "n2", qos="normal", limit=HOUR)
    plan = _plan(_nodes(["n1", "n2"]), [_job(1, nodes=2, qos="high"), _job(2, limit=10 * HOUR)], [v2],
                 limits=QOS, priority={1: 10, 2: 900, 12: 100}, holds={1: ("n1",)})
    assert plan.starts == [] and plan.estimate()[1].start == HOUR


def test_a_lower_priority_preemptor_does_not_preempt_into_a_higher_jobs_reservation():
    v = _running(9, "n1", qos="normal", limit=2 * HOUR)          # ends at 2 h
    h = _job(1, qos="normal", limit=HOUR)                        # highest priority: reserved at 2 h
    p = _job(2, qos="high", limit=10 * HOUR)                     # lower priority, may preempt v
    plan = _plan(_nodes(["n1"]), [h, p], [v], now=60, limits=QOS, priority={1: 900, 2: 500, 9: 1})
    assert plan.preempt == {} and plan.estimate()[1].start == 2 * HOUR


def test_a_preemptor_that_ends_before_the_reservation_may_preempt():
    v = _running(9, "n1", qos="normal", limit=10 * HOUR)         # ends at 10 h: h is reserved then
    h = _job(1, qos="normal", limit=HOUR)
    p = _job(2, qos="high", limit=HOUR)                          # done long before 10 h
    plan = _plan(_nodes(["n1"]), [h, p], [v], now=60, limits=QOS, priority={1: 900, 2: 500, 9: 1})
    assert plan.preempt == {2: [9]} and plan.estimate()[1].start == 10 * HOUR


def test_a_reservation_dropped_mid_pass_frees_its_nodes_for_later_jobs():
    # P holds n1 (its victim stops at 90) but starts at once on n5; J2 then finds n1 from 90
    from air.airctld.model import Node
    from air.protos import air_pb2 as pb
    from air.protos.states import NodeState

    def node(n, g):
        return Node(name=n, cpus=8, gpus=tuple(pb.Gpu(index=i) for i in range(g)), state=NodeState.UP)
    nodes = [node("n1", 4), node("n4", 4), node("n5", 8), node("n6", 4)]
    act = [_stopping(_running(9, "n1", qos="normal", limit=10 * HOUR)), _running(8, "n4", limit=200),
           _running(7, "n6", limit=5000)]
    pend = [_job(1, nodes=2, gpus=4, limit=HOUR), _job(2, gpus=4, limit=10 * HOUR, qos="high"), _job(3, gpus=4, limit=HOUR)]
    free = scheduler.free_resources(nodes, act)
    plan = scheduler.schedule(pend, free, {"p": PartitionConfig("p", ("n1", "n4", "n5", "n6"))}, now=70, active=act,
                              priority={1: 900, 2: 500, 3: 400}, limits=QOS, preempt_grace_s=30,
                              stopped_at={9: 60.0}, holds={2: ("n1",)})
    assert [(i, alloc[0].node) for i, alloc in plan.starts] == [(2, "n5")]
    assert plan.estimate()[3].start == 90 and plan.estimate()[3].nodes == ("n1",)
