"""The first scheduler: pure functions over a snapshot; no I/O, no clock.

Order is priority, then submit order. Each job takes the first nodes of its partition
that have its GPUs and CPUs free (first fit, lowest GPU indices first); a multi-node job
starts on all of its nodes at once or not at all. A job that cannot start blocks the
jobs behind it on the same nodes (reason Priority), so large jobs are not starved; backfill
comes later. Two kinds of "no": `infeasible` says a request can never run (refused at
submit), `schedule` leaves a job pending with the reason it waits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from airctld.config import PartitionConfig
from airctld.model import Job, Node, NodeAlloc
from airctld.timefmt import format_limit
from protos.states import NodeState, Reason


@dataclass
class FreeNode:
    name: str
    up: bool
    gpus: list[int]          # free GPU indices, ascending
    cpus: int                # free CPUs


@dataclass
class Plan:
    starts: list[tuple[int, tuple[NodeAlloc, ...]]] = field(default_factory=list)
    waiting: dict[int, Reason] = field(default_factory=dict)


def free_resources(nodes: Iterable[Node], active: Iterable[Job]) -> dict[str, FreeNode]:
    """What each node has free, given the jobs that hold resources (running or completing)."""
    free = {n.name: FreeNode(n.name, n.state == NodeState.UP, sorted(n.gpu_indices), n.cpus) for n in nodes}
    for job in active:
        for a in job.allocation:
            node = free.get(a.node)
            if node is not None:
                node.gpus = [g for g in node.gpus if g not in a.gpus]
                node.cpus -= a.cpus
    return free


def _order(job: Job) -> tuple:
    return (-job.priority, job.submit_time, job.job_id)


def schedule(pending: Iterable[Job], free: dict[str, FreeNode],
             partitions: Mapping[str, PartitionConfig]) -> Plan:
    """Decide which pending jobs start now and why the others wait. `free` is updated in place."""
    plan = Plan()
    blocked: set[str] = set()   # nodes that a higher-priority waiting job is waiting for
    for job in sorted(pending, key=_order):
        if job.hold:
            plan.waiting[job.job_id] = Reason.JOB_HELD_USER
            continue
        part = partitions.get(job.partition)
        if part is None or not part.up:
            plan.waiting[job.job_id] = Reason.PARTITION_DOWN
            continue
        if blocked.intersection(part.nodes):
            plan.waiting[job.job_id] = Reason.PRIORITY
            continue
        up = [free[n] for n in part.nodes if n in free and free[n].up]
        if len(up) < job.num_nodes:
            plan.waiting[job.job_id] = Reason.NODES_DOWN
            blocked.update(part.nodes)
            continue
        fits = [n for n in up if len(n.gpus) >= job.gpus_per_node and n.cpus >= job.cpus_per_node]
        if len(fits) < job.num_nodes:
            plan.waiting[job.job_id] = Reason.RESOURCES
            blocked.update(part.nodes)
            continue
        allocation = []
        for node in fits[:job.num_nodes]:
            gpus = tuple(node.gpus[:job.gpus_per_node])
            node.gpus = node.gpus[job.gpus_per_node:]
            node.cpus -= job.cpus_per_node
            allocation.append(NodeAlloc(node.name, gpus, job.cpus_per_node))
        plan.starts.append((job.job_id, tuple(allocation)))
    return plan


def infeasible(num_nodes: int, gpus_per_node: int, cpus_per_node: int, time_limit_s: int,
               part: PartitionConfig, capacity: Mapping[str, tuple[int, int]]) -> str | None:
    """Why a request could never run in the partition, or None. `capacity` maps node -> (gpus, cpus);
    nodes whose hardware is not known yet are left out and never count against a request."""
    if num_nodes > len(part.nodes):
        return f"{num_nodes} nodes requested, but partition {part.name} has only {len(part.nodes)}"
    if part.max_time_s and time_limit_s > part.max_time_s:
        return (f"time limit {format_limit(time_limit_s)} is over partition {part.name}'s "
                f"maximum of {format_limit(part.max_time_s)}")
    known = [capacity[n] for n in part.nodes if n in capacity]
    if len(known) < len(part.nodes):
        return None
    big_enough = [n for n in known if n[0] >= gpus_per_node and n[1] >= cpus_per_node]
    if len(big_enough) >= num_nodes:
        return None
    most_gpus = max(g for g, _ in known)
    if gpus_per_node > most_gpus:
        return (f"{gpus_per_node} GPUs per node requested, but no node in partition {part.name} "
                f"has more than {most_gpus}; ask for fewer per node and more nodes (--nodes)")
    most_cpus = max(c for _, c in known)
    if cpus_per_node > most_cpus:
        return (f"{cpus_per_node} CPUs per node requested, but no node in partition {part.name} "
                f"has more than {most_cpus}")
    return (f"{num_nodes} nodes with {gpus_per_node} GPUs and {cpus_per_node} CPUs each requested, "
            f"but partition {part.name} has only {len(big_enough)} such nodes")
