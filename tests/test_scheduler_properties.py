"""Property tests of the scheduler over random clusters and queues (hypothesis)."""
import copy

from hypothesis import HealthCheck, given, settings, strategies as st

from air.airctld import scheduler
from air.protos.config import PartitionConfig, QosConfig
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, NodeState

LIMITS = scheduler.Limits(
    qos={"normal": QosConfig("normal", max_gpus_per_user=12), "high": QosConfig("high", preempt=("normal",))},
    account_chain={"a": ("a", "top"), "b": ("b", "top"), "c": ("c",)},
    account_max_gpus={"top": 16, "c": 8})
USERS = ("u1", "u2", "u3")


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 10))
    nodes = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 4, 8]))
        state = draw(st.sampled_from([NodeState.UP] * 5 + [NodeState.DRAIN, NodeState.DOWN]))
        nodes.append(Node(name=f"n{i:02d}", cpus=draw(st.integers(1, 16)),
                          gpus=tuple(pb.Gpu(index=g, nvlink_domain=g // 4) for g in range(gpus)), state=state))
    switches = {node.name: f"s{draw(st.integers(0, 2))}" for node in nodes}
    # running jobs, placed greedily where they fit
    free = {node.name: [list(range(len(node.gpus))), node.cpus] for node in nodes}
    active = []
    for job_id in range(1000, 1000 + draw(st.integers(0, 12))):
        node = draw(st.sampled_from(nodes))
        g = draw(st.integers(0, 8))
        c = draw(st.integers(1, 4))
        if len(free[node.name][0]) < g or free[node.name][1] < c:
            continue
        gpus, free[node.name][0] = free[node.name][0][:g], free[node.name][0][g:]
        free[node.name][1] -= c
        limit = draw(st.sampled_from([0, 50, 100, 300]))
        active.append(_job(draw, job_id, 1, g, c, limit, phase=JobPhase.RUNNING,
                           start_time=draw(st.floats(0, 100)), allocation=(NodeAlloc(node.name, tuple(gpus), c),)))
    pending = [_job(draw, job_id, draw(st.integers(1, 4)), draw(st.integers(0, 8)), draw(st.integers(1, 8)),
                    draw(st.sampled_from([0, 30, 60, 200, 1000])))
               for job_id in range(1, draw(st.integers(1, 25)))]
    priority = {j.job_id: draw(st.integers(0, 100)) for j in pending + active}
    return nodes, switches, active, pending, priority


def _job(draw, job_id, n, g, c, limit, **kw):
    req = pb.JobRequest(qos=draw(st.sampled_from(["normal", "high", ""])), account=draw(st.sampled_from("abc")),
                        switches=draw(st.sampled_from([0, 0, 1])), switches_wait_s=100)
    return Job(job_id=job_id, uid=1, gid=1, user=draw(st.sampled_from(USERS)), name="j", partition="p",
               num_nodes=n, gpus_per_node=g, cpus_per_node=c, time_limit_s=limit, submit_time=float(job_id),
               request=req, **kw)


def _plan(case, now=100.0, reservations=5):
    nodes, switches, active, pending, priority = case
    free = scheduler.free_resources(nodes, active, switches)
    part = {"p": PartitionConfig("p", tuple(n.name for n in nodes))}
    return scheduler.schedule(pending, free, part, now=now, active=active, priority=priority, limits=LIMITS,
                              reservations=reservations)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(clusters())
def test_no_gpu_twice_gangs_whole_and_only_up_nodes(case):
    nodes, _, active, pending, _ = case
    plan = _plan(case)
    by_name = {n.name: n for n in nodes}
    jobs = {j.job_id: j for j in pending}
    held = {(a.node, g) for j in active for a in j.allocation for g in a.gpus}
    cpus = {n.name: n.cpus - sum(a.cpus for j in active for a in j.allocation if a.node == n.name) for n in nodes}
    for job_id, alloc in plan.starts:
        job = jobs[job_id]
        assert len(alloc) == job.num_nodes and len({a.node for a in alloc}) == job.num_nodes
        for a in alloc:
            assert by_name[a.node].state == NodeState.UP
            assert len(a.gpus) == job.gpus_per_node and a.cpus == job.cpus_per_node
            for g in a.gpus:
                assert (a.node, g) not in held and g < len(by_name[a.node].gpus)
                held.add((a.node, g))
            cpus[a.node] -= a.cpus
            assert cpus[a.node] >= 0
    assert set(plan.waiting) | {s[0] for s in plan.starts} == set(jobs)


@SETTINGS
@given(clusters())
def test_backfill_never_delays_a_reservation(case):
    nodes, _, active, pending, _ = case
    now = 100.0
    plan = _plan(case, now)
    jobs = {j.job_id: j for j in pending}
    victims = {v for vs in plan.preempt.values() for v in vs}   # told to stop now: gone after the grace (30 s)
    running = [(min(scheduler.job_end(j, now, 30.0), now + 30.0) if j.job_id in victims
                else scheduler.job_end(j, now, 30.0), a) for j in active for a in j.allocation]
    running += [(now + jobs[i].time_limit_s if jobs[i].time_limit_s else scheduler.INF, a) for i, alloc in plan.starts
                for a in alloc]
    by_name = {n.name: n for n in nodes}
    # each reservation, at its start, finds on each of its nodes what it and the reservations made
    # before it (higher priority) that hold the node then need, with every job started now counted
    for k, r in enumerate(plan.reservations):
        for name in r.nodes:
            before = [q for q in plan.reservations[:k + 1] if name in q.nodes and q.start <= r.start < q.end]
            busy_g = sum(len(a.gpus) for end, a in running if a.node == name and end > r.start)
            busy_c = sum(a.cpus for end, a in running if a.node == name and end > r.start)
            assert len(by_name[name].gpus) - busy_g >= sum(q.gpus_per_node for q in before)
            assert by_name[name].cpus - busy_c >= sum(q.cpus_per_node for q in before)


@SETTINGS
@given(clusters())
def test_limits_are_never_exceeded_by_new_starts(case):
    nodes, _, active, pending, _ = case
    plan = _plan(case)
    jobs = {j.job_id: j for j in pending}
    started = [jobs[i] for i, _ in plan.starts]

    def totals(js):
        out = {}
        for j in js:
            g = j.num_nodes * j.gpus_per_node
            qos = j.request.qos or "normal"
            keys = [("qos_user", qos, j.user)] + [("account", a) for a in LIMITS.account_chain[j.request.account]]
            for k in keys:
                out[k] = out.get(k, 0) + g
        return out

    before, after = totals(active), totals(active + started)
    caps = {("account", a): c for a, c in LIMITS.account_max_gpus.items()}
    caps.update({("qos_user", "normal", u): 12 for u in USERS})
    for key, cap in caps.items():
        assert after.get(key, 0) <= max(cap, before.get(key, 0))
        if before.get(key, 0) >= cap:
            assert after.get(key, 0) == before.get(key, 0) or all(
                j.num_nodes * j.gpus_per_node == 0 for j in started)


@SETTINGS
@given(clusters())
def test_the_decision_is_a_function_of_the_snapshot(case):
    first = _plan(copy.deepcopy(case))
    second = _plan(copy.deepcopy(case))
    assert first == second
    shuffled = copy.deepcopy(case)
    shuffled[3].reverse()   # the order pending jobs arrive in does not matter
    assert _plan(shuffled) == first
