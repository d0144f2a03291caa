"""Node state changes, pure, as `events` is for jobs: each function takes a node and returns the
changed node (or None where nothing changes). Writing it to the store, the node's health history and
the jobs on it are the controller's business (node_reports).

    UNKNOWN --registered--> UP <--resumed (operator) / returned (condition cleared)-- DRAIN
    UP --drained (operator) / health_drained (critical event)--> DRAIN
    UP, DRAIN --silent (no heartbeat for node_timeout_s)--> DOWN --registered--> UP (DRAIN stays DRAIN)
"""
from __future__ import annotations

from air.airctld.events import TransitionError
from air.airctld.model import Node, evolve
from air.protos import air_pb2 as pb
from air.protos import signals
from air.protos.states import NodeState


def registered(old: Node, info: pb.Node, now: float) -> Node:
    """Its daemon registered (started, or came back): the node as it describes itself, up; a drained
    node stays drained, with why (a daemon's restart clears no fault and undoes no operator's drain)."""
    drained = old.state == NodeState.DRAIN
    return Node(name=info.name, address=info.address, cpus=info.cpus, memory_mb=info.memory_mb,
                gpus=tuple(info.gpus), state=NodeState.DRAIN if drained else NodeState.UP,
                reason=old.reason if drained else "", last_heartbeat=now,
                drain_signal=old.drain_signal if drained else "")


def drained(node: Node, reason: str) -> Node:
    """An operator drains it (`aircontrol node drain`): no new work; only an operator resumes it."""
    return evolve(node, state=NodeState.DRAIN, reason=reason, drain_signal="")


def health_drained(node: Node, event: pb.HealthEvent) -> Node | None:
    """A critical health event drains an up node, remembering the signal (some clear by themselves:
    see returned). A drained node takes the new signal as its reason when that one does not clear by
    itself (an XID, a run that would not die) and the drain so far was an operator's or one that does:
    whoever resumes it must see why it may not run jobs, and a condition that clears by itself must not
    return it to service, nor end an operator's drain. None where nothing changes (drained already for
    as long, or down)."""
    where = f"GPU {event.gpu}" if event.gpu >= 0 else "node"
    drained = evolve(node, state=NodeState.DRAIN, reason=f"{where}: {event.signal} ({event.message})",
                     drain_signal=event.signal)
    if node.state == NodeState.UP:
        return drained
    lasting = not signals.kind_of(event.signal).clears_by_itself
    if node.state == NodeState.DRAIN and lasting \
            and (not node.drain_signal or signals.kind_of(node.drain_signal).clears_by_itself):
        return drained
    return None


def resumed(node: Node) -> Node:
    """An operator resumes a drained node (`aircontrol node resume`)."""
    if node.state != NodeState.DRAIN:
        raise TransitionError(f"node {node.name} is {node.state.name.lower()}; only a drained node can be resumed")
    return evolve(node, state=NodeState.UP, reason="", drain_signal="")


def returned(node: Node) -> Node:
    """The condition that drained it has cleared by itself (a health signal that may: see
    protos.signals.clears_by_itself): back in service."""
    return evolve(node, state=NodeState.UP, reason="", drain_signal="")


def silent(node: Node, timeout_s: float) -> Node:
    """No heartbeat for the node timeout: down (its jobs are lost there; it comes back by registering)."""
    return evolve(node, state=NodeState.DOWN, reason=f"not responding for over {timeout_s:g} s")
