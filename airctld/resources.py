"""What nodes have free, how GPUs are picked on a node, and which requests could never run: the
pure helpers under the scheduler's pass."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from air.protos.config import PartitionConfig
from air.airctld.model import Job, Node
from air.protos.timefmt import format_limit
from air.protos.states import NodeState


@dataclass
class FreeNode:
    name: str
    up: bool
    gpus: list[int]          # free GPU indices, ascending
    cpus: int                # free CPUs
    drained: bool = False
    switch: str = ""
    total_gpus: int = 0
    domains: dict[int, int] = field(default_factory=dict)   # GPU index -> NVLink domain
    total_cpus: int = 0
    features: frozenset = frozenset()   # what --constraint may ask of it (the configuration's)


def free_resources(nodes: Iterable[Node], active: Iterable[Job], switches: Mapping[str, str] | None = None,
                   memo: dict[int, tuple] | None = None, features: Mapping[str, frozenset] | None = None
                   ) -> dict[str, FreeNode]:
    """What each node has free, given the jobs that hold resources (running or completing). `memo`,
    kept by the caller from pass to pass, keeps what a node's GPUs are (their indices and NVLink
    domains, read from its GPU records), for as long as the node has the same records."""
    switches = switches or {}
    features = features or {}
    nodes = list(nodes)
    if memo is None:
        memo = {}
    elif len(memo) > 2 * len(nodes) + 100:   # nodes' records replaced since: start afresh
        memo.clear()
    free = {}
    for n in nodes:
        known = memo.get(id(n.gpus))
        if known is None or known[0] is not n.gpus:
            known = memo[id(n.gpus)] = (n.gpus, sorted(n.gpu_indices), {g.index: g.nvlink_domain for g in n.gpus})
        free[n.name] = FreeNode(n.name, n.state == NodeState.UP, list(known[1]), n.cpus,
                                n.state == NodeState.DRAIN, switches.get(n.name) or n.name, len(n.gpus), known[2],
                                n.cpus, features.get(n.name, frozenset()))
    for job in active:
        for a in job.allocation:
            node = free.get(a.node)
            if node is not None:
                node.gpus = [g for g in node.gpus if g not in a.gpus]
                node.cpus -= a.cpus
    return free


def pick_gpus(free: list[int], count: int, total: int, domains: Mapping[int, int]) -> tuple[int, ...]:
    """`count` of the free GPUs: an aligned block (0-1, 2-3, 0-3, ...) when one is free, so that the
    node keeps whole blocks for larger jobs; else within one NVLink domain; else the lowest."""
    if count == 0:
        return ()
    if count >= len(free):
        return tuple(free[:count])
    free_set = set(free)
    block = 1
    while block < count:
        block *= 2
    if block <= total:
        for start in range(0, total, block):
            members = range(start, min(start + block, total))
            if all(g in free_set for g in members) and len({domains.get(g, 0) for g in members}) == 1:
                return tuple(members[:count])
    by_domain: dict[int, list[int]] = {}
    for g in free:
        by_domain.setdefault(domains.get(g, 0), []).append(g)
    fitting = [d for d in by_domain.values() if len(d) >= count]
    if fitting:
        return tuple(min(fitting, key=len)[:count])
    return tuple(free[:count])


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
