"""-w/--nodelist, -x/--exclude, -C/--constraint and --exclusive: the constraint language, the
checks at submit, and the scheduler's placements, reservations and preemptions under them. The
property test checks every start against a reference written here (a brute force over node sets,
with the constraint evaluated from the tree it was printed from), not against the scheduler."""
import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from air.airctld import nodefilter, scheduler
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.config import PartitionConfig, QosConfig
from air.protos.states import JobPhase, NodeState, Reason

NAMES = ("n1", "n2", "n3", "n4")
PART = PartitionConfig(name="gpu", nodes=NAMES, default=True)
FEATURES = {"n1": frozenset({"a100", "ib"}), "n2": frozenset({"a100"}), "n3": frozenset({"h100", "ib"}),
            "n4": frozenset({"h100"})}


def _free(active=(), down=(), gpus=4, cpus=8):
    nodes = [Node(name=n, cpus=cpus, gpus=tuple(pb.Gpu(index=i) for i in range(gpus)),
                  state=NodeState.DOWN if n in down else NodeState.UP) for n in NAMES]
    return scheduler.free_resources(nodes, active, features=FEATURES)


def _job(job_id, nodes=1, gpus=1, cpus=1, prio=0, limit=0, **req):
    return Job(job_id=job_id, uid=0, gid=0, user="root", name="j", partition="gpu", num_nodes=nodes,
               gpus_per_node=gpus, cpus_per_node=cpus, time_limit_s=limit, priority=prio, submit_time=job_id,
               request=pb.JobRequest(nodes=nodes, **req))


def _running(job_id, node, gpus, cpus=1, limit=0, qos="", exclusive=False, start=0.0):
    return Job(job_id=job_id, uid=0, gid=0, user="root", name="r", partition="gpu", num_nodes=1,
               gpus_per_node=len(gpus), cpus_per_node=cpus, time_limit_s=limit, submit_time=0.0, phase=JobPhase.RUNNING,
               start_time=start, allocation=(NodeAlloc(node, tuple(gpus), cpus),),
               request=pb.JobRequest(qos=qos, exclusive=exclusive))


def _plan(pending, active=(), now=0.0, **kw):
    return scheduler.schedule(pending, _free(active, kw.pop("down", ())), {"gpu": PART}, now=now,
                              active=list(active), **kw)


# ---------------------------------------------------------------- the constraint language

@pytest.mark.parametrize("text, have, expected", [
    ("a100", {"a100"}, True), ("a100", {"h100"}, False),
    ("a100&ib", {"a100"}, False), ("a100&ib", {"a100", "ib"}, True),
    ("a100|h100", {"h100"}, True), ("a100|h100&ib", {"a100"}, True),     # & binds tighter
    ("a100|h100&ib", {"h100"}, False), ("(a100|h100)&ib", {"a100"}, False),
    ("(a100|h100)&ib", {"h100", "ib"}, True), (" a100 & ( ib | nvl ) ", {"a100", "nvl"}, True),
])
def test_constraints_mean_what_slurm_users_write(text, have, expected):
    # (as a pass works them out: over the index of which node has which feature)
    chosen = nodefilter.select(nodefilter.parse_constraint(text), {f: {"n1"} for f in have}, {"n1"})
    assert chosen == ({"n1"} if expected else set())


@pytest.mark.parametrize("text, message", [
    ("a100*2", r"unexpected '\*' \(counts, \[..\] and ! are not supported\)"),
    ("[a100|h100]", r"unexpected '\['"), ("!a100", "unexpected '!'"), ("a100&", "ends where a feature"),
    ("(a100", "not closed"), ("a100)", r"unexpected '\)'"), ("&a", "'&' where a feature name"),
    ("(" * 40 + "a" + ")" * 40, "nested too deep"), ("a" * 2000, "at most 1024"),
])
def test_constraints_slurm_forms_air_lacks_are_refused_in_one_line(text, message):
    with pytest.raises(nodefilter.ConstraintError, match=message):
        nodefilter.parse_constraint(text)


def test_submit_checks_name_what_can_never_be_met():
    def settle(**req):
        return nodefilter.settle(pb.JobRequest(**req), "gpu", ("n1", "n2", "n3"), FEATURES, NAMES + ("m9",))
    assert settle(nodelist=["n2", "n3"]) == (2, {"n1", "n2", "n3"})        # -w alone: as many nodes as it lists
    assert settle(nodelist=["n2"], nodes=3) == (3, {"n1", "n2", "n3"})
    assert settle(exclude=["n1"], nodes=2, constraint="ib|a100") == (2, {"n2", "n3"})
    for req, message in (({"nodelist": ["n9"]}, "invalid node name 'n9': no such node"),
                         ({"exclude": ["n9"]}, "-x/--exclude: invalid node name 'n9'"),
                         ({"nodelist": ["m9"]}, "node m9 is not in partition gpu"),
                         ({"nodelist": ["n1", "n1"]}, "names a node more than once"),
                         ({"nodelist": ["n1"], "exclude": ["n1"]}, "node n1 is both in"),
                         ({"nodelist": ["n1", "n2"], "nodes": 1}, "names 2 nodes but --nodes=1"),
                         ({"constraint": "v100"}, "no node of partition gpu has feature 'v100'"),
                         ({"constraint": "h100|v100"}, "has feature 'v100'"),
                         ({"nodelist": ["n2"], "constraint": "ib"}, "node n2 does not have the features"),
                         ({"nodes": 2, "constraint": "h100"}, "only 1 nodes of partition gpu match"),
                         ({"nodes": 3, "exclude": ["n3"]}, "only 2 nodes")):
        with pytest.raises(nodefilter.ConstraintError, match=message):
            settle(**req)


# ---------------------------------------------------------------- placements

def test_nodelist_runs_exactly_there_and_waits_for_it():
    plan = _plan([_job(1, nodes=2, nodelist=["n3", "n2"])])
    assert plan.starts == [(1, (NodeAlloc("n2", (0,), 1), NodeAlloc("n3", (0,), 1)))]
    busy = _running(9, "n2", (0, 1, 2, 3), limit=100)
    plan = _plan([_job(1, nodelist=["n2"], limit=10), _job(2, gpus=4, limit=500)], active=[busy])
    # it waits for n2, though three nodes are free; the job after it may not take n2 when it frees
    assert plan.starts == [(2, (NodeAlloc("n1", (0, 1, 2, 3), 1),))] and plan.waiting[1] == Reason.RESOURCES
    assert plan.estimate()[1].nodes == ("n2",) and plan.estimate()[1].start == 100


def test_a_filtered_job_backfills_only_where_it_delays_no_reservation():
    busy = _running(9, "n2", (0, 1, 2), limit=100)
    top = _job(1, gpus=4, nodelist=["n2"], prio=10, limit=50)   # reserved n2 from 100
    plan = _plan([top, _job(2, nodelist=["n2"], limit=500), _job(3, nodelist=["n2"], exclusive=False, limit=60)],
                 active=[busy])
    assert plan.estimate()[1].start == 100 and [j for j, _ in plan.starts] == [3]   # 3 ends by 100; 2 would not
    assert plan.waiting[2] == Reason.PRIORITY


def test_nodelist_with_more_nodes_takes_the_rest_elsewhere_and_a_down_listed_node_is_reqnodenotavail():
    plan = _plan([_job(1, nodes=3, nodelist=["n4"], exclude=["n1"])])
    assert [a.node for a in plan.starts[0][1]] == ["n2", "n3", "n4"]
    plan = _plan([_job(1, nodelist=["n4"])], down=("n4",))
    assert plan.starts == [] and plan.waiting[1] == Reason.NODES_DOWN


def test_exclude_and_constraint_leave_nodes_out():
    plan = _plan([_job(1, gpus=4, exclude=["n1", "n2"]), _job(2, gpus=4, constraint="h100&ib"),
                  _job(3, gpus=4, constraint="a100|ib")])
    assert [(j, a[0].node) for j, a in plan.starts] == [(1, "n3"), (3, "n1")]
    assert plan.waiting[2] == Reason.RESOURCES   # n3 was taken by job 1; n4 lacks ib


def test_exclusive_takes_whole_idle_nodes_and_nobody_shares_them():
    plan = _plan([_job(1, gpus=1, exclusive=True), _job(2, gpus=1)], active=[_running(9, "n1", (0,))])
    (first, alloc), (second, other) = plan.starts
    assert (first, alloc) == (1, (NodeAlloc("n2", (0, 1, 2, 3), 8),))   # n1 has a job: not idle
    assert second == 2 and other[0].node == "n1"
    # a running exclusive job leaves nothing for others on its node, even a job of no GPUs
    plan = _plan([_job(3, gpus=0, nodelist=["n2"])], active=[_running(1, "n2", (0, 1, 2, 3), cpus=8, exclusive=True)])
    assert plan.starts == [] and plan.waiting[3] == Reason.RESOURCES


def test_exclusive_waits_for_a_node_to_empty_and_is_reserved_it():
    active = [_running(10 + i, n, (0,), limit=50 + 10 * i) for i, n in enumerate(NAMES)]
    plan = _plan([_job(1, gpus=1, exclusive=True, limit=10, prio=5), _job(2, gpus=1, limit=1000)], active=active)
    assert plan.waiting[1] == Reason.RESOURCES
    assert plan.estimate()[1].start == 50 and plan.estimate()[1].nodes == ("n1",)
    # job 2 would run past 50 on n1: it takes another node
    assert plan.starts[0][0] == 2 and plan.starts[0][1][0].node != "n1"


def test_a_preemptor_with_a_nodelist_takes_victims_only_there():
    limits = scheduler.Limits(qos={"normal": QosConfig("normal"), "high": QosConfig("high", priority=10, preempt=("normal",))})
    active = [_running(10 + i, n, (0, 1, 2, 3), qos="normal", start=float(i)) for i, n in enumerate(NAMES)]
    plan = _plan([_job(1, gpus=4, nodelist=["n2"], qos="high")], active=active, limits=limits)
    assert plan.preempt == {1: [11]} and plan.holds[1] == ("n2",)
    plan = _plan([_job(2, gpus=1, constraint="h100", exclusive=True, qos="high")], active=active, limits=limits)
    assert plan.preempt == {2: [13]} and plan.holds[2] == ("n4",)   # n4 started last: the cheapest victim


def test_an_exclusive_job_passes_the_gpu_limits_only_with_every_gpu_it_would_hold():
    limits = scheduler.Limits(qos={"normal": QosConfig("normal", max_gpus_per_user=6)})
    plan = _plan([_job(1, nodes=2, gpus=0, exclusive=True, qos="normal"),    # 8 GPUs held, though it asks none
                  _job(2, nodes=2, gpus=1, exclusive=True, qos="normal"), _job(3, gpus=2, qos="normal")],
                 limits=limits)
    assert plan.waiting[1] == plan.waiting[2] == Reason.QOS_MAX_GPU_PER_USER and [j for j, _ in plan.starts] == [3]


def test_exclusive_jobs_are_charged_for_what_they_hold():
    limits = scheduler.Limits(qos={"normal": QosConfig("normal", max_gpus_per_user=6)})
    plan = _plan([_job(1, gpus=1, exclusive=True, qos="normal"), _job(2, gpus=4, qos="normal")], limits=limits)
    assert [j for j, _ in plan.starts] == [1] and plan.waiting[2] == Reason.QOS_MAX_GPU_PER_USER


# ---------------------------------------------------------------- against a reference

FEATS = ("a", "b", "c")


@st.composite
def exprs(draw, depth=0):
    if depth >= 2 or draw(st.booleans()):
        return draw(st.sampled_from(FEATS))
    return (draw(st.sampled_from("&|")), [draw(exprs(depth + 1)) for _ in range(draw(st.integers(2, 3)))])


def _text(e) -> str:
    return e if isinstance(e, str) else "(" + e[0].join(_text(x) for x in e[1]) + ")"


def _holds(e, have) -> bool:
    if isinstance(e, str):
        return e in have
    results = [_holds(x, have) for x in e[1]]
    return all(results) if e[0] == "&" else any(results)


def _drawn_running(draw, names, caps, most, limits):
    """Up to `most` running one-node jobs placed where they fit (of QOS normal or other), and what
    each node has left: node -> [gpus, cpus]."""
    active, free = [], {name: list(caps[name]) for name in names}
    for k in range(draw(st.integers(0, most))):
        name = draw(st.sampled_from(names))
        g, c = draw(st.integers(0, free[name][0])), draw(st.integers(0, free[name][1]))
        if c == 0:
            continue
        used = caps[name][0] - free[name][0]
        active.append(Job(job_id=100 + k, uid=0, gid=0, user="r", name="r", partition="p", num_nodes=1,
                          gpus_per_node=g, cpus_per_node=c, time_limit_s=draw(st.sampled_from(limits)),
                          submit_time=0.0, phase=JobPhase.RUNNING, start_time=float(k),
                          allocation=(NodeAlloc(name, tuple(range(used, used + g)), c),),
                          request=pb.JobRequest(qos=draw(st.sampled_from(["normal", "other"])))))
        free[name][0] -= g
        free[name][1] -= c
    return active, free


@st.composite
def cases(draw):
    n = draw(st.integers(1, 5))
    names = [f"n{i}" for i in range(n)]
    caps = {name: (draw(st.sampled_from([0, 2, 4])), draw(st.integers(1, 4))) for name in names}
    feats = {name: frozenset(draw(st.sets(st.sampled_from(FEATS)))) for name in names}
    active, free = _drawn_running(draw, names, caps, 4, [0, 50])
    expr = draw(st.none() | exprs())
    req = dict(nodes=draw(st.integers(1, n)), gpus=draw(st.integers(0, 4)), cpus=draw(st.integers(1, 4)),
               nodelist=sorted(draw(st.sets(st.sampled_from(names), max_size=2))),
               exclude=sorted(draw(st.sets(st.sampled_from(names), max_size=2))),
               expr=expr, exclusive=draw(st.booleans()))
    return names, caps, feats, active, free, req


@given(cases())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_lone_job_starts_exactly_when_the_reference_finds_it_a_place_and_only_where_it_may(case):
    names, caps, feats, active, free, r = case
    nodes = [Node(name=name, cpus=caps[name][1], gpus=tuple(pb.Gpu(index=i) for i in range(caps[name][0])),
                  state=NodeState.UP) for name in names]
    count = max(r["nodes"], len(r["nodelist"]))
    job = Job(job_id=1, uid=0, gid=0, user="u", name="j", partition="p", num_nodes=count, gpus_per_node=r["gpus"],
              cpus_per_node=r["cpus"], time_limit_s=10, submit_time=0.0,
              request=pb.JobRequest(nodes=count, nodelist=r["nodelist"], exclude=r["exclude"],
                                    constraint=_text(r["expr"]) if r["expr"] else "", exclusive=r["exclusive"]))
    plan = scheduler.schedule([job], scheduler.free_resources(nodes, active, features=feats),
                              {"p": PartitionConfig("p", tuple(names))}, active=active, now=0.0)

    # the reference: the nodes it may use now, and whether `count` of them, with every listed one, exist
    def usable(name):
        if name in r["exclude"] or (r["expr"] is not None and not _holds(r["expr"], feats[name])):
            return False
        g, c = free[name]
        if r["exclusive"] and (g, c) != caps[name]:   # whole nodes: nothing else on it
            return False
        return g >= r["gpus"] and c >= r["cpus"]
    ok = [name for name in names if usable(name)]
    possible = any(set(r["nodelist"]) <= set(pick) for pick in itertools.combinations(ok, count))
    assert bool(plan.starts) == possible, (plan, ok)
    if plan.starts:
        (_, alloc), = plan.starts
        got = [a.node for a in alloc]
        assert len(set(got)) == count and set(got) <= set(ok) and set(r["nodelist"]) <= set(got)
        for a in alloc:
            if r["exclusive"]:   # all of it
                assert (len(a.gpus), a.cpus) == caps[a.node]
            else:
                assert (len(a.gpus), a.cpus) == (r["gpus"], r["cpus"])
            used = {g for j in active for b in j.allocation if b.node == a.node for g in b.gpus}
            assert not used & set(a.gpus)


def test_a_stored_job_the_configuration_no_longer_fits_waits_and_the_pass_goes_on():
    # (a node removed from air.toml since submit, a constraint the parser now refuses)
    plan = _plan([_job(1, nodelist=["gone"]), _job(2, constraint="a100*2"), _job(3, exclude=["gone"])])
    assert plan.waiting == {1: Reason.NODES_DOWN, 2: Reason.BAD_CONSTRAINTS} and [j for j, _ in plan.starts] == [3]
    plan = _plan([_job(4, constraint="v100|a100&h100"), _job(5, constraint="v100|h100")])   # v100: on no node
    assert plan.waiting == {4: Reason.BAD_CONSTRAINTS} and [j for j, _ in plan.starts] == [5]


# ---------------------------------------------------------------- reservations and preemption, against plain arithmetic

@st.composite
def queues(draw):
    n = draw(st.integers(1, 4))
    names = [f"n{i}" for i in range(n)]
    caps = {m: (draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 4))) for m in names}
    feats = {m: frozenset(draw(st.sets(st.sampled_from(("a", "b"))))) for m in names}
    active, _ = _drawn_running(draw, names, caps, 5, [0, 20, 40, 60])
    pending = []
    for i in range(draw(st.integers(1, 5))):
        count = draw(st.integers(1, n))
        req = {}
        if draw(st.booleans()):
            req["nodelist"] = sorted(draw(st.sets(st.sampled_from(names), max_size=min(2, count))))
            req["exclude"] = [m for m in draw(st.sets(st.sampled_from(names), max_size=1)) if m not in req["nodelist"]]
            req["constraint"] = draw(st.sampled_from(["", "a", "b", "a|b", "a&b"]))
            req["exclusive"] = draw(st.booleans())
        pending.append(Job(job_id=i + 1, uid=0, gid=0, user="u", name="j", partition="p", num_nodes=count,
                           gpus_per_node=draw(st.integers(0, 2)), cpus_per_node=draw(st.integers(1, 2)),
                           time_limit_s=draw(st.sampled_from([10, 30, 100])), submit_time=float(i),
                           priority=draw(st.integers(0, 3)), request=pb.JobRequest(nodes=count, **req)))
    return names, caps, feats, active, pending


def _nodes_of(names, caps):
    return [Node(name=m, cpus=caps[m][1], gpus=tuple(pb.Gpu(index=i) for i in range(caps[m][0])),
                 state=NodeState.UP) for m in names]


@given(queues())
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_start_or_reservation_overlaps_a_reservation_with_filters_in_the_queue(case):
    names, caps, feats, active, pending = case
    plan = scheduler.schedule(pending, scheduler.free_resources(_nodes_of(names, caps), active, features=feats),
                              {"p": PartitionConfig("p", tuple(names))}, active=active, now=0.0)
    byid = {j.job_id: j for j in pending}

    def size(job, m):   # what a job holds on node m: all of it under --exclusive
        return caps[m] if job.request.exclusive else (job.gpus_per_node, job.cpus_per_node)
    use = {m: [] for m in names}   # (start, end, gpus, cpus) on each node
    for j in active:
        for a in j.allocation:
            use[a.node].append((0.0, j.time_limit_s or INF, len(a.gpus), a.cpus))
    for job_id, alloc in plan.starts:
        for a in alloc:
            use[a.node].append((0.0, byid[job_id].time_limit_s or INF, len(a.gpus), a.cpus))
    for r in plan.reservations:
        for m in r.nodes:
            others = [(r2.start, r2.end, *size(byid[r2.job_id], m)) for r2 in plan.reservations
                      if r2 is not r and m in r2.nodes]
            moments = {r.start} | {e for _, e, _, _ in use[m] + others if r.start < e < r.end} \
                | {s0 for s0, _, _, _ in others if r.start <= s0 < r.end}
            for t in moments:
                g = sum(x[2] for x in use[m] + others if x[0] <= t < x[1]) + size(byid[r.job_id], m)[0]
                c = sum(x[3] for x in use[m] + others if x[0] <= t < x[1]) + size(byid[r.job_id], m)[1]
                assert g <= caps[m][0] and c <= caps[m][1], (r, m, t, plan)


INF = float("inf")


@given(queues())
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_preemptor_with_a_filter_holds_nodes_it_may_use_and_that_its_victims_free(case):
    names, caps, feats, active, pending = case
    job = pending[0]
    job.request.qos = "high"
    limits = scheduler.Limits(qos={"normal": QosConfig("normal"), "other": QosConfig("other"),
                                   "high": QosConfig("high", priority=10, preempt=("normal",))})
    plan = scheduler.schedule([job], scheduler.free_resources(_nodes_of(names, caps), active, features=feats),
                              {"p": PartitionConfig("p", tuple(names))}, active=active, now=0.0, limits=limits)
    if job.job_id not in plan.preempt:
        return
    held, gone = plan.holds[job.job_id], set(plan.preempt[job.job_id])
    r = job.request
    assert len(held) == job.num_nodes and set(r.nodelist) <= set(held)
    for m in held:
        assert m not in r.exclude and (not r.constraint or _holds(nodefilter.parse_constraint(r.constraint), feats[m]))
        left = [j for j in active if j.job_id not in gone and j.allocation[0].node == m]
        g = caps[m][0] - sum(len(j.allocation[0].gpus) for j in left)
        c = caps[m][1] - sum(j.allocation[0].cpus for j in left)
        if r.exclusive:
            assert (g, c) == caps[m] and g >= job.gpus_per_node and c >= job.cpus_per_node, (m, plan)
        else:
            assert g >= job.gpus_per_node and c >= job.cpus_per_node, (m, plan)
    assert all(j.request.qos == "normal" for j in active if j.job_id in gone)


def test_submit_refuses_an_exclusive_job_whose_whole_nodes_are_over_a_gpu_limit(tmp_path):
    from air.airctld.controller import Controller
    from air.airctld.errors import InvalidRequest
    from air.airctld.store import Store
    from air.protos import config as cfg
    from air.protos.credential import Identity
    conf = cfg.parse({"controller": {"auth": "none", "state_dir": str(tmp_path)},
                      "nodes": [{"name": "n[1-2]", "address": "127.0.0.[9-10]", "gpus": "sim:4"}],
                      "partitions": [{"name": "p", "nodes": "n[1-2]", "default": True}],
                      "qos": [{"name": "normal", "max_gpus_per_user": 6}]})
    c = Controller(conf, Store(str(tmp_path / "air.db")))
    try:
        for name in ("n1", "n2"):
            c.register(pb.Node(name=name, address=c.config.node(name).endpoint, cpus=8, memory_mb=1024,
                               gpus=[pb.Gpu(index=i) for i in range(4)]))
        alice = Identity(4242, 4242)
        base = dict(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1)
        with pytest.raises(InvalidRequest, match="8 GPUs requested, but QOS normal allows 6 per user"):
            c.submit(pb.JobRequest(nodes=2, exclusive=True, **base), alice)
        assert c.submit(pb.JobRequest(nodes=1, exclusive=True, **base), alice)[0]   # 4 GPUs: within
    finally:
        c.stop()


def test_filtered_multi_node_jobs_keep_to_one_leaf_switch_when_they_can():
    nodes = [Node(name=n, cpus=8, gpus=tuple(pb.Gpu(index=i) for i in range(4)), state=NodeState.UP) for n in NAMES]
    free = scheduler.free_resources(nodes, [], {"n1": "s1", "n2": "s2", "n3": "s1", "n4": "s2"}, features=FEATURES)
    plan = scheduler.schedule([_job(1, nodes=2, exclusive=True), _job(2, nodes=2, exclude=["n1"])], free,
                              {"gpu": PART}, now=0.0)
    assert [[a.node for a in alloc] for _, alloc in plan.starts] == [["n1", "n3"], ["n2", "n4"]]
