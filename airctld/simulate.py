"""A cluster simulator: the real priority, fairshare and scheduler code driven over a synthetic
trace with its own clock, so days of cluster time run in seconds. Used by bench/bench_scheduler.py
and by the fairshare convergence test."""
from __future__ import annotations

import heapq
import inspect
import time
from dataclasses import dataclass, field

from air.airctld import fairshare, scheduler
from air.protos.config import PartitionConfig, QosConfig, SchedulerConfig
from air.airctld.fairshare import Assoc
from air.airctld.model import Job, Node, evolve
from air.airctld.priority import PriorityModel, association
from air.airctld.priority_cache import LEAF, PriorityCache
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, NodeState, Reason


@dataclass(frozen=True)
class TraceJob:
    job_id: int
    submit: float
    user: str
    account: str
    nodes: int
    gpus_per_node: int
    runtime: float          # how long it really runs
    limit: int              # the time limit it asks for (at least the runtime)
    qos: str = ""


@dataclass
class Result:
    gpu_seconds: dict[str, float] = field(default_factory=dict)   # by account
    busy_gpu_seconds: float = 0.0
    capacity_gpu_seconds: float = 0.0
    passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)
    started: int = 0
    finished: int = 0
    top_delays: list[float] = field(default_factory=list)   # per pass: how much later the first waiting
    #                                                          job may start because of this pass's backfill
    preemptions: dict[tuple[int, int], int] = field(default_factory=dict)   # (preemptor, victim) -> times

    @property
    def utilisation(self) -> float:
        return self.busy_gpu_seconds / self.capacity_gpu_seconds if self.capacity_gpu_seconds else 0.0


def make_nodes(count: int, gpus: int = 8, cpus: int = 64) -> list[Node]:
    shared = tuple(pb.Gpu(index=i) for i in range(gpus))
    return [Node(name=f"n{i:05d}", cpus=cpus, gpus=shared, state=NodeState.UP) for i in range(count)]


def simulate(trace: list[TraceJob], nodes: list[Node], until: float, *, sched: SchedulerConfig = SchedulerConfig(),
             assocs: list[Assoc] = (), qos: tuple[QosConfig, ...] = (QosConfig("normal"),),
             pass_every: float = 60.0, backfill: bool = True, switches: dict[str, str] | None = None,
             measure_delay: bool = False, schedule=None) -> Result:
    """Run the trace. Preempted jobs stop after the preemption grace and go back to the queue, their
    nodes held for the preemptor. `measure_delay`: after each pass, how much later the first waiting
    job could start because of the jobs started below it (Result.top_delays). `schedule`: another
    scheduler with the same signature (bench/ compares an older one)."""
    schedule = schedule or scheduler.schedule
    part = PartitionConfig("p", tuple(n.name for n in nodes), default=True)
    partitions = {"p": part}
    qos_map = {q.name: q for q in qos}
    total_gpus = sum(len(n.gpus) for n in nodes)
    total_cpus = sum(n.cpus for n in nodes)
    arrivals = sorted(trace, key=lambda t: (t.submit, t.job_id))
    by_id = {t.job_id: t for t in trace}
    pending: dict[int, Job] = {}
    running: dict[int, Job] = {}
    ends: list[tuple[float, int, int]] = []   # (end, job, run)
    runs: dict[int, int] = {}
    stopping: dict[int, tuple[Job, float]] = {}   # preempted job -> (it, when its grace runs out)
    holds: dict[int, tuple[str, ...]] = {}
    # holds and stop times, to a scheduler that takes them (an older one, loaded by bench/, may not)
    taken = inspect.signature(schedule).parameters
    new_features = "holds" in taken
    # this tree's scheduler gets priorities and order from the cache, an older one (--before in bench/)
    # priorities computed from scratch every pass and sorts the queue itself, as their controllers did
    kept = PriorityCache() if "in_order" in taken else None
    usage: dict[tuple[str, str], float] = {}
    result = Result()
    next_arrival = 0
    now = 0.0
    last_charge = 0.0
    while now <= until:
        finished = []
        for job_id, (job, stop) in list(stopping.items()):
            if stop <= now:   # a preempted job has stopped: back to the queue
                del stopping[job_id]
                _account(result, job, job.start_time, stop)
                pending[job_id] = evolve(job, phase=JobPhase.PENDING, allocation=(), reason=Reason.NONE, start_time=0.0)
        while ends and ends[0][0] <= now:
            end, job_id, run = heapq.heappop(ends)
            if runs.get(job_id) != run or job_id not in running:
                continue
            job = running.pop(job_id)
            _account(result, job, job.start_time, end)
            result.finished += 1
            finished.append((association(job), job.start_time, end, job.num_nodes * job.gpus_per_node, 0))
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= now:
            t = arrivals[next_arrival]
            next_arrival += 1
            pending[t.job_id] = Job(job_id=t.job_id, uid=0, gid=0, user=t.user, name="sim", partition="p",
                                    num_nodes=t.nodes, gpus_per_node=t.gpus_per_node, cpus_per_node=1,
                                    time_limit_s=t.limit, submit_time=t.submit,
                                    request=pb.JobRequest(account=t.account, qos=t.qos))
        charged = [(association(j), j.start_time, 0.0, j.num_nodes * j.gpus_per_node, 0) for j in running.values()]
        usage = fairshare.accrue(usage, charged + finished, last_charge, now, sched.usage_half_life_s, sched.billing_gpu, 0.0)
        last_charge = now
        if pending:
            began = time.perf_counter()
            active = list(running.values()) + [j for j, _ in stopping.values()]
            queue = list(pending.values())
            if kept is not None:   # priorities and order kept from pass to pass, as the controller keeps them
                statics = PriorityModel(sched, partitions, qos_map, {}, total_gpus, total_cpus)
                rows = kept.rows([*queue, *active], statics)
                leaves = {r[LEAF] for r in rows[:len(queue)]}
            else:
                leaves = {association(j) for j in queue}
            tree = fairshare.complete_tree(assocs, leaves | set(usage))
            shares = fairshare.compute(tree, usage)
            fs = {k: s.fairshare for k, s in shares.items() if k[1]}
            if kept is not None:
                priority = kept.priorities(rows, fs, now)
                queue = kept.order(queue)
            else:
                priority = PriorityModel(sched, partitions, qos_map, fs, total_gpus, total_cpus).priorities(
                    [*queue, *active], now)
            chains = {k[0]: tuple(fairshare.ancestors(tree, k[0])) for k in tree if not k[1]}
            quotas = {k[0]: a.max_gpus for k, a in tree.items() if not k[1] and a.max_gpus}
            free = scheduler.free_resources(nodes, active, switches)
            limits = scheduler.Limits(qos_map, sched.default_qos, chains, quotas)
            extra = dict(stopped_at={i: stop - sched.preempt_grace_s for i, (_, stop) in stopping.items()},
                         holds=dict(holds)) if new_features else {}
            if kept is not None:
                extra["in_order"] = True
            plan = schedule(queue, free, partitions, now=now, active=active, priority=priority,
                            limits=limits, reservations=sched.reservations, backfill=backfill,
                            preempt_grace_s=sched.preempt_grace_s, **extra)
            result.pass_seconds.append(time.perf_counter() - began)
            result.passes += 1
            if measure_delay:
                result.top_delays.append(_top_delay(plan, pending, active, nodes, partitions, priority, limits,
                                                    now, switches, set(holds)))
            for job_id, alloc in plan.starts:
                job = evolve(pending.pop(job_id), phase=JobPhase.RUNNING, start_time=now, allocation=alloc)
                running[job_id] = job
                holds.pop(job_id, None)
                t = by_id[job_id]
                runs[job_id] = runs.get(job_id, 0) + 1
                heapq.heappush(ends, (now + min(t.runtime, t.limit or t.runtime), job_id, runs[job_id]))
                result.started += 1
            for preemptor, victims in plan.preempt.items():
                freed = []
                for v in victims:
                    job = running.pop(v, None)
                    if job is None:
                        continue
                    stopping[v] = (evolve(job, phase=JobPhase.COMPLETING, reason=Reason.PREEMPTED),
                                   now + sched.preempt_grace_s)
                    freed += [a.node for a in job.allocation]
                    result.preemptions[(preemptor, v)] = result.preemptions.get((preemptor, v), 0) + 1
                held = getattr(plan, "holds", {}).get(preemptor) or tuple(freed)   # (an older scheduler gives no holds)
                holds[preemptor] = tuple(sorted(set(holds.get(preemptor, ())) | set(held)))
        now += pass_every
    for job in [*running.values(), *(j for j, _ in stopping.values())]:
        _account(result, job, job.start_time, until)
    result.capacity_gpu_seconds = total_gpus * until
    return result


def _top_delay(plan, pending, active, nodes, partitions, priority, limits, now, switches, held) -> float:
    """How much later the first job this pass left waiting (with a reservation) could start once the
    jobs started below it in the pass are counted, than the reservation it got before them. A
    preemptor starting on the nodes held for it (`held`) is not backfill: it counts as above."""
    estimate = plan.estimate()
    started = dict(plan.starts)
    order = sorted(pending.values(), key=lambda j: (-priority.get(j.job_id, 0), j.submit_time, j.job_id))
    top = next((j for j in order if j.job_id not in started), None)
    if top is None or top.job_id not in estimate:
        return 0.0
    rank = {j.job_id: k for k, j in enumerate(order)}
    now_running = [evolve(pending[i], phase=JobPhase.RUNNING, start_time=now, allocation=alloc)
                   for i, alloc in plan.starts]
    above = [j for j in now_running if rank[j.job_id] < rank[top.job_id] or j.job_id in held]
    again = []
    for with_below in (False, True):
        act = list(active) + (now_running if with_below else above)
        free = scheduler.free_resources(nodes, act, switches)
        p = scheduler.schedule([top], free, partitions, now=now, active=act, priority=priority, limits=limits)
        res = p.estimate().get(top.job_id)
        again.append(res.start if res else float("inf"))
    return max(0.0, again[1] - again[0]) if again[1] < float("inf") else float("inf") if again[0] < float("inf") else 0.0


def _account(result: Result, job: Job, start: float, end: float) -> None:
    gpu_s = (end - start) * job.num_nodes * job.gpus_per_node
    account = job.account
    result.gpu_seconds[account] = result.gpu_seconds.get(account, 0.0) + gpu_s
    result.busy_gpu_seconds += gpu_s
