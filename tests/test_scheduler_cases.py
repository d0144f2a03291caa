"""The scheduler's decisions in the cases a user would describe, as table tests: backfill that
delays nobody, preemption that converges, holds made between passes."""
from air.airctld import scheduler
from air.protos.config import PartitionConfig, QosConfig
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, NodeState, Reason

HOUR = 3600


def _nodes(names=("n1", "n2"), gpus=4):
    return [Node(name=n, cpus=8, gpus=tuple(pb.Gpu(index=i) for i in range(gpus)), state=NodeState.UP) for n in names]


def _job(job_id, nodes=1, gpus=4, limit=HOUR, qos="", **kw):
    return Job(job_id=job_id, uid=1, gid=1, user="u", name="j", partition="p", num_nodes=nodes, gpus_per_node=gpus,
               cpus_per_node=1, time_limit_s=limit, submit_time=float(job_id), request=pb.JobRequest(qos=qos), **kw)


def _running(job_id, node, gpus=range(4), start=0.0, limit=HOUR, qos="", **kw):
    return _job(job_id, gpus=len(gpus), limit=limit, qos=qos, phase=JobPhase.RUNNING, start_time=start,
                allocation=(NodeAlloc(node, tuple(gpus), 1),), **kw)


def _plan(nodes, pending, active=(), now=0.0, **kw):
    free = scheduler.free_resources(nodes, active)
    part = {"p": PartitionConfig("p", tuple(n.name for n in nodes))}
    return scheduler.schedule(pending, free, part, now=now, active=list(active), **kw)


def test_a_long_low_job_does_not_take_the_node_the_wide_job_waits_for():
    # A (1 node, 1 h, highest), B (2 nodes, next), C (1 node, 10 h, lowest), released together
    a, b, c = _job(1, limit=HOUR), _job(2, nodes=2), _job(3, limit=10 * HOUR)
    plan = _plan(_nodes(), [a, b, c], priority={1: 30, 2: 20, 3: 10})
    assert [s[0] for s in plan.starts] == [1]
    assert plan.estimate()[2].start == HOUR          # B starts when A ends, not after C's 10 h
    assert plan.waiting == {2: Reason.RESOURCES, 3: Reason.PRIORITY}


def test_a_short_low_job_may_use_the_node_until_the_wide_job_starts():
    a, b, c = _job(1, limit=HOUR), _job(2, nodes=2), _job(3, limit=HOUR // 2)
    plan = _plan(_nodes(), [a, b, c], priority={1: 30, 2: 20, 3: 10})
    assert [s[0] for s in plan.starts] == [1, 3] and plan.estimate()[2].start == HOUR


def test_a_job_without_a_time_limit_blocks_nothing_it_cannot_see_end():
    # a running job without a limit runs forever as far as the pass knows: B could never start, so
    # nothing delays it, and C starts
    forever = _running(9, "n1", limit=0)
    plan = _plan(_nodes(), [_job(2, nodes=2), _job(3, limit=10 * HOUR)], [forever], priority={2: 20, 3: 10})
    assert [s[0] for s in plan.starts] == [3] and plan.reservations == []


def test_once_reservations_run_out_no_later_job_passes_the_unreserved_one():
    # job 1 is reserved n1 and n2 (the nodes ready last); n3 is free and no reservation covers it.
    # Job 3 fits on n3 now, but job 2 (unreserved: the one reservation is spent) needs n3 too
    busy = [_running(9, "n1", limit=HOUR), _running(8, "n2", limit=HOUR)]
    pending = [_job(1, nodes=2), _job(2, nodes=3, limit=10 * HOUR), _job(3, limit=10 * HOUR)]
    plan = _plan(_nodes(["n1", "n2", "n3"]), pending, busy, priority={1: 30, 2: 20, 3: 10}, reservations=1)
    assert [r.job_id for r in plan.reservations] == [1] and plan.estimate()[1].nodes == ("n1", "n2")
    assert plan.starts == [] and plan.waiting[3] == Reason.PRIORITY


def test_reservations_count_per_group_of_partitions_that_share_nodes():
    # partition A (a1, busy) spends the one reservation; B (b1, b2) is unrelated: its backfill goes on
    from air.protos.config import PartitionConfig
    nodes = _nodes(["a1", "b1", "b2"])
    active = [_running(90, "a1"), _running(91, "b1", gpus=range(2))]

    def job(i, part, **kw):
        return Job(**{**_job(i, **kw).__dict__, "partition": part})
    pending = [job(1, "A"), job(2, "B", nodes=2), job(3, "B", gpus=2, limit=HOUR // 2)]
    parts = {"A": PartitionConfig("A", ("a1",)), "B": PartitionConfig("B", ("b1", "b2"))}
    free = scheduler.free_resources(nodes, active)
    plan = scheduler.schedule(pending, free, parts, active=active, priority={1: 30, 2: 20, 3: 10}, reservations=1)
    assert [s[0] for s in plan.starts] == [3] and sorted(r.job_id for r in plan.reservations) == [1, 2]


def test_a_pass_out_of_time_stops_and_starts_nothing_after_the_first_job_not_looked_at():
    ticks = iter(range(10 ** 6))
    pending = [_job(i, gpus=1) for i in range(1, 601)]
    plan = _plan(_nodes(["n1"], gpus=8), pending, priority={i: 1000 - i for i in range(1, 601)},
                 max_pass_s=0.5, timer=lambda: next(ticks))    # every look at the clock: a second later
    # the clock is read every 16 jobs (a reservation can take milliseconds at 10,000 nodes)
    assert plan.stopped_at == 17 and [s[0] for s in plan.starts] == list(range(1, 9))
    assert all(i not in plan.waiting for i in range(17, 601)) and all(i in plan.waiting for i in range(9, 17))


# ---------------------------------------------------------------- preemption

QOS = scheduler.Limits(qos={"normal": QosConfig("normal"), "high": QosConfig("high", priority=10, preempt=("normal",))})


def test_a_preemptor_that_ranks_below_its_victim_may_not_preempt_it():
    victim = _running(9, "n1", qos="normal", limit=10 * HOUR)
    plan = _plan(_nodes(["n1"]), [_job(1, qos="high")], [victim], now=60, limits=QOS, priority={1: 100, 9: 500})
    assert plan.preempt == {} and "may not preempt job 9: it ranks higher" in plan.details[1]
    plan = _plan(_nodes(["n1"]), [_job(1, qos="high")], [victim], now=60, limits=QOS, priority={1: 500, 9: 100})
    assert plan.preempt == {1: [9]}


def test_equal_priority_falls_to_the_qos_order():
    victim = _running(9, "n1", qos="normal", limit=10 * HOUR)
    plan = _plan(_nodes(["n1"]), [_job(1, qos="high")], [victim], now=60, limits=QOS, priority={1: 100, 9: 100})
    assert plan.preempt == {1: [9]}
    # the reverse: a preempting QOS ranked below its victim's QOS may not preempt at equal priority
    low = scheduler.Limits(qos={"normal": QosConfig("normal", priority=10),
                                "scavenge": QosConfig("scavenge", priority=1, preempt=("normal",))})
    plan = _plan(_nodes(["n1"]), [_job(1, qos="scavenge")], [victim], now=60, limits=low, priority={1: 100, 9: 100})
    assert plan.preempt == {} and "may not preempt job 9" in plan.details[1]
    plan = _plan(_nodes(["n1"]), [_job(1, qos="scavenge")], [victim], now=60, limits=low, priority={1: 101, 9: 100})
    assert plan.preempt == {1: [9]}


def test_a_stopping_victim_counts_once_with_the_grace_it_was_given():
    # the victim was asked to stop at t=0 with a 300 s grace; the kill wait (30 s) does not apply
    stopping = _running(9, "n1", qos="normal", limit=10 * HOUR, reason=Reason.PREEMPTED)
    stopping = Job(**{**stopping.__dict__, "phase": JobPhase.COMPLETING})
    other = _running(8, "n2", qos="normal", limit=10 * HOUR)
    for now in (10.0, 200.0, 299.0):
        plan = _plan(_nodes(), [_job(1, qos="high")], [stopping, other], now=now, limits=QOS,
                     priority={1: 500, 8: 1, 9: 1}, preempt_grace_s=300, completing_release_s=30,
                     stopped_at={9: 0.0}, holds={1: ("n1",)})
        assert plan.preempt == {}, now                 # no second victim while the first stops
        assert plan.estimate()[1].start == 300 and plan.estimate()[1].nodes == ("n1",)


def test_the_nodes_a_victim_freed_are_held_for_its_preemptor():
    # the victim is gone; a higher-priority job of the same shape does not take its node
    plan = _plan(_nodes(["n1"]), [_job(1, qos="high"), _job(2)], [], limits=QOS, priority={1: 10, 2: 900},
                 holds={1: ("n1",)})
    assert [s[0] for s in plan.starts] == [1] and plan.waiting == {2: Reason.PRIORITY}


def test_a_qos_that_preempts_itself_or_a_cycle_of_qos_is_refused():
    import pytest
    from air.protos import config
    base = {"controller": {"auth": "none"}, "nodes": [], "partitions": []}
    with pytest.raises(config.ConfigError, match=r"\[\[qos\]\] normal preempts itself"):
        config.parse({**base, "qos": [{"name": "normal", "preempt": ["normal"]}]})
    with pytest.raises(config.ConfigError, match="preemption cycle: a -> b -> a"):
        config.parse({**base, "qos": [{"name": "normal"}, {"name": "a", "preempt": ["b"]},
                                      {"name": "b", "preempt": ["a", "normal"]}]})
    config.parse({**base, "qos": [{"name": "normal"}, {"name": "a", "preempt": ["b", "normal"]},
                                  {"name": "b", "preempt": ["normal"]}]})


def test_a_long_ladder_of_qos_is_checked_for_cycles_in_linear_time():
    import time

    import pytest
    from air.protos import config
    base = {"controller": {"auth": "none"}, "nodes": [], "partitions": []}
    # q0 preempts every QOS below it: a DFS without memory walks every path, 2^40 of them
    ladder = [{"name": f"q{i}", "preempt": [f"q{k}" for k in range(i + 1, 40)]} for i in range(40)]
    began = time.perf_counter()
    config.parse({**base, "qos": [{"name": "normal"}] + ladder})
    assert time.perf_counter() - began < 0.5
    ladder[39]["preempt"] = ["q0"]   # the bottom preempts the top: a cycle
    with pytest.raises(config.ConfigError, match="preemption cycle: q0 -> q1 -> .* -> q39 -> q0"):
        config.parse({**base, "qos": [{"name": "normal"}] + ladder})


def test_a_preemptor_never_preempts_the_same_job_twice():
    # job 1 preempted job 9 once; then it was held and released (or requeued), and job 9 ran again
    victim = _running(9, "n1", qos="normal", limit=10 * HOUR)
    plan = _plan(_nodes(["n1"]), [_job(1, qos="high")], [victim], now=60, limits=QOS, priority={1: 500, 9: 100},
                 preempted={1: {9}})
    assert plan.preempt == {} and plan.holds == {} and 1 not in plan.details   # (it does not outrank it: no)
    # another preemptor may still take it, and job 1 may take another victim
    plan = _plan(_nodes(["n1"]), [_job(2, qos="high")], [victim], now=60, limits=QOS, priority={2: 500, 9: 100},
                 preempted={1: {9}})
    assert plan.preempt == {2: [9]}
    other = _running(8, "n2", qos="normal", limit=10 * HOUR)
    plan = _plan(_nodes(), [_job(1, qos="high")], [victim, other], now=60, limits=QOS,
                 priority={1: 500, 8: 100, 9: 100}, preempted={1: {9}})
    assert plan.preempt == {1: [8]}


def test_a_preemptor_that_cannot_start_keeps_no_node_idle():
    # the nodes its victim freed stay held for job 1 only while job 1 could use them
    limits = scheduler.Limits(qos={**QOS.qos, "high": QosConfig("high", priority=10, preempt=("normal",),
                                                              max_gpus_per_user=4)})
    mine = _running(7, "n2", qos="high", limit=10 * HOUR)   # the user's other high job, started since
    cases = {"over its QOS limit": dict(active=[mine], limits=limits),
             "held": dict(active=[], limits=QOS, held=True),
             "waiting for a dependency": dict(active=[], limits=QOS, blocked={1: Reason.DEPENDENCY})}
    for what, case in cases.items():
        preemptor = _job(1, qos="high", hold=case.get("held", False))
        plan = _plan(_nodes(), [preemptor, _job(2)], case["active"], limits=case["limits"], priority={1: 10, 2: 900},
                     holds={1: ("n1",)}, blocked=case.get("blocked"))
        assert [s for s, _ in plan.starts] == [2] and plan.starts[0][1][0].node == "n1", what
    # the control: free to start (no limit), it takes its node, and job 2 has none
    plan = _plan(_nodes(), [_job(1, qos="high"), _job(2)], [mine], limits=QOS, priority={1: 10, 2: 900},
                 holds={1: ("n1",)})
    assert plan.starts == [(1, plan.starts[0][1])] and plan.starts[0][1][0].node == "n1"


def test_a_requeued_job_waiting_for_its_fence_keeps_its_place():
    # job 1 was requeued from a lost node: it may not start until t=40 (the node's fence); job 3, long
    # and lower, would take the node it needs; job 4, short, ends before then and may use it
    pending = [_job(1), _job(3, limit=10 * HOUR), _job(4, limit=30)]
    plan = _plan(_nodes(["n1"]), pending, now=0, priority={1: 30, 3: 20, 4: 10}, not_before={1: 40})
    assert [s for s, _ in plan.starts] == [4]
    assert plan.estimate()[1].start == 40 and 1 not in plan.waiting   # it keeps the reason it was requeued with
    # without a fence it starts at once
    plan = _plan(_nodes(["n1"]), pending, now=0, priority={1: 30, 3: 20, 4: 10})
    assert [s for s, _ in plan.starts] == [1]


def test_a_preemptor_in_a_partition_closed_to_it_keeps_no_node_idle():
    # its partition now refuses its account: it holds nothing, and the node goes to job 2 (in a
    # partition open to it over the same nodes)
    free = scheduler.free_resources(_nodes(), [])
    parts = {"p": PartitionConfig("p", ("n1", "n2"), accounts=("other",)), "q": PartitionConfig("q", ("n1", "n2"))}
    preemptor = _job(1, qos="high")
    mine = Job(**{**_job(2).__dict__, "partition": "q"})
    plan = scheduler.schedule([preemptor, mine], free, parts, now=0, limits=QOS, priority={1: 10, 2: 900},
                              holds={1: ("n1",)})
    assert [s for s, _ in plan.starts] == [2] and plan.starts[0][1][0].node == "n1"


def test_a_fenced_preemptor_neither_preempts_nor_holds_before_its_fence():
    victim = _running(9, "n1", qos="normal", limit=10 * HOUR)
    plan = _plan(_nodes(["n1"]), [_job(1, qos="high")], [victim], now=60, limits=QOS, priority={1: 500, 9: 100},
                 not_before={1: 600})
    assert plan.preempt == {} and plan.estimate()[1].start == 10 * HOUR   # after its victim-to-be ends
    plan = _plan(_nodes(["n1", "n2"]), [_job(1, qos="high"), _job(2, limit=60)], [], now=0, limits=QOS,
                 priority={1: 500, 2: 100}, holds={1: ("n1",)}, not_before={1: 120})
    assert plan.estimate()[1].start == 120 and [s for s, _ in plan.starts] == [2]
