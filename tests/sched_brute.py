"""A brute-force reference for small scheduling cases (up to 6 nodes, 8 pending jobs, integer times),
for tests. It imports nothing from airctld and keeps no timeline, steps, spare or heaps: what a
node holds at a moment is summed afresh from every slot, at every integer moment, and a job's
earliest start is found by trying every integer time in turn.

Why integer moments are enough: every start and end is an integer, so what a node holds is the
same throughout [k, k + 1); past `horizon` (after every end that is not "forever") it no longer
changes. Checking each integer moment from t to the horizon is checking every moment from t on.

The rule it states is the scheduler's own (docs/scheduling.md): a job waiting for room is reserved
the earliest time from which enough nodes keep room for it at every later moment, beside what runs,
what was started earlier in the pass and the reservations of the jobs above it; a job below it may
start only where the job above can still run from that time for as long as its limit (a job below
may use a node after the reservation above it ends: that delays nobody).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """What a job holds on each of its nodes, from start up to (not including) end; end None: forever."""
    nodes: tuple[str, ...]
    gpus: int
    cpus: int
    start: int
    end: int | None


def held(slots: list[Slot], node: str, t: int) -> tuple[int, int]:
    """GPUs and CPUs the slots hold on the node at moment t."""
    gpus = cpus = 0
    for s in slots:
        if node in s.nodes and s.start <= t and (s.end is None or t < s.end):
            gpus += s.gpus
            cpus += s.cpus
    return gpus, cpus


def room_from(cap: dict[str, tuple[int, int]], slots: list[Slot], node: str, gpus: int, cpus: int,
              t: int, horizon: int) -> bool:
    """Whether the node has room for gpus and cpus at every moment from t on."""
    return room_during(cap, slots, node, gpus, cpus, t, None, horizon)


def room_during(cap: dict[str, tuple[int, int]], slots: list[Slot], node: str, gpus: int, cpus: int,
                start: int, end: int | None, horizon: int) -> bool:
    """Whether the node has room for gpus and cpus at every moment from start up to end (None: on)."""
    last = horizon if end is None else min(end - 1, horizon)
    for moment in range(start, last + 1):
        g, c = held(slots, node, moment)
        if g + gpus > cap[node][0] or c + cpus > cap[node][1]:
            return False
    return True


def runs_at(cap: dict[str, tuple[int, int]], slots: list[Slot], nodes: int, gpus: int, cpus: int,
            start: int, end: int | None, horizon: int) -> bool:
    """Whether `nodes` nodes have room for the job from start up to end."""
    return sum(room_during(cap, slots, node, gpus, cpus, start, end, horizon) for node in cap) >= nodes


def earliest(cap: dict[str, tuple[int, int]], slots: list[Slot], nodes: int, gpus: int, cpus: int,
             now: int, horizon: int) -> int | None:
    """The first integer moment from now on at which `nodes` nodes have room for the job from then
    on; None if none ever has."""
    for t in range(now, horizon + 1):
        if sum(room_from(cap, slots, node, gpus, cpus, t, horizon) for node in cap) >= nodes:
            return t
    return None


def overfull(cap: dict[str, tuple[int, int]], slots: list[Slot], now: int, horizon: int) -> list[tuple[str, int]]:
    """(node, moment) wherever the slots hold more than the node has."""
    return [(node, t) for node in cap for t in range(now, horizon + 1)
            if held(slots, node, t)[0] > cap[node][0] or held(slots, node, t)[1] > cap[node][1]]
