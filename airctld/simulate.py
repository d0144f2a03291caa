"""A cluster simulator: the real priority, fairshare and scheduler code driven over a synthetic
trace with its own clock, so days of cluster time run in seconds. Used by bench/bench_scheduler.py
and by the fairshare convergence test."""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from airctld import fairshare, scheduler
from airctld.config import PartitionConfig, QosConfig, SchedulerConfig
from airctld.fairshare import Assoc
from airctld.model import Job, Node, evolve
from airctld.priority import PriorityModel, association
from protos import air_pb2 as pb
from protos.states import JobPhase, NodeState


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

    @property
    def utilisation(self) -> float:
        return self.busy_gpu_seconds / self.capacity_gpu_seconds if self.capacity_gpu_seconds else 0.0


def make_nodes(count: int, gpus: int = 8, cpus: int = 64) -> list[Node]:
    shared = tuple(pb.Gpu(index=i) for i in range(gpus))
    return [Node(name=f"n{i:05d}", cpus=cpus, gpus=shared, state=NodeState.UP) for i in range(count)]


def simulate(trace: list[TraceJob], nodes: list[Node], until: float, *, sched: SchedulerConfig = SchedulerConfig(),
             assocs: list[Assoc] = (), qos: tuple[QosConfig, ...] = (QosConfig("normal"),),
             pass_every: float = 60.0, backfill: bool = True, switches: dict[str, str] | None = None) -> Result:
    part = PartitionConfig("p", tuple(n.name for n in nodes), default=True)
    partitions = {"p": part}
    qos_map = {q.name: q for q in qos}
    total_gpus = sum(len(n.gpus) for n in nodes)
    total_cpus = sum(n.cpus for n in nodes)
    arrivals = sorted(trace, key=lambda t: (t.submit, t.job_id))
    by_id = {t.job_id: t for t in trace}
    pending: dict[int, Job] = {}
    running: dict[int, Job] = {}
    ends: list[tuple[float, int]] = []
    usage: dict[tuple[str, str], float] = {}
    result = Result()
    next_arrival = 0
    now = 0.0
    last_charge = 0.0
    while now <= until:
        finished = []
        while ends and ends[0][0] <= now:
            end, job_id = heapq.heappop(ends)
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
            tree = fairshare.complete_tree(assocs, {association(j) for j in pending.values()} | set(usage))
            shares = fairshare.compute(tree, usage)
            model = PriorityModel(sched, partitions, qos_map, {k: s.fairshare for k, s in shares.items() if k[1]},
                                  total_gpus, total_cpus)
            chains = {k[0]: tuple(fairshare.ancestors(tree, k[0])) for k in tree if not k[1]}
            quotas = {k[0]: a.max_gpus for k, a in tree.items() if not k[1] and a.max_gpus}
            active = list(running.values())
            free = scheduler.free_resources(nodes, active, switches)
            plan = scheduler.schedule(list(pending.values()), free, partitions, now=now, active=active,
                                      priority=model.priorities(pending.values(), now),
                                      limits=scheduler.Limits(qos_map, sched.default_qos, chains, quotas),
                                      reservations=sched.reservations, backfill=backfill)
            result.pass_seconds.append(time.perf_counter() - began)
            result.passes += 1
            for job_id, alloc in plan.starts:
                job = evolve(pending.pop(job_id), phase=JobPhase.RUNNING, start_time=now, allocation=alloc)
                running[job_id] = job
                t = by_id[job_id]
                heapq.heappush(ends, (now + min(t.runtime, t.limit or t.runtime), job_id))
                result.started += 1
        now += pass_every
    for job in running.values():
        _account(result, job, job.start_time, until)
    result.capacity_gpu_seconds = total_gpus * until
    return result


def _account(result: Result, job: Job, start: float, end: float) -> None:
    gpu_s = (end - start) * job.num_nodes * job.gpus_per_node
    account = job.request.account or "default"
    result.gpu_seconds[account] = result.gpu_seconds.get(account, 0.0) + gpu_s
    result.busy_gpu_seconds += gpu_s
