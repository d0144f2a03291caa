"""Node state changes (airctld.node_events), pure, against a table of what each does in each state."""
import pytest

from air.airctld import node_events
from air.airctld.events import TransitionError
from air.airctld.model import Node
from air.protos import air_pb2 as pb
from air.protos import signals
from air.protos.states import NodeState

UP, DRAIN, DOWN, UNKNOWN = NodeState.UP, NodeState.DRAIN, NodeState.DOWN, NodeState.UNKNOWN
INFO = pb.Node(name="n1", address="10.0.0.1:7000", cpus=64, memory_mb=1024, gpus=[pb.Gpu(index=0), pb.Gpu(index=1)])
XID = pb.HealthEvent(gpu=1, signal="xid", message="XID 79", critical=True)

# (change, state before) -> state after; None: nothing changes; TransitionError: refused
TABLE = {
    ("registered", UNKNOWN): UP, ("registered", UP): UP, ("registered", DOWN): UP, ("registered", DRAIN): DRAIN,
    ("drained", UNKNOWN): DRAIN, ("drained", UP): DRAIN, ("drained", DOWN): DRAIN, ("drained", DRAIN): DRAIN,
    ("health_drained", UP): DRAIN, ("health_drained", DRAIN): None, ("health_drained", DOWN): None,
    ("health_drained", UNKNOWN): None,
    ("resumed", DRAIN): UP, ("resumed", UP): TransitionError, ("resumed", DOWN): TransitionError,
    ("resumed", UNKNOWN): TransitionError,
    ("silent", UP): DOWN, ("silent", DRAIN): DOWN,
}
CALLS = {
    "registered": lambda n: node_events.registered(n, INFO, 50.0),
    "drained": lambda n: node_events.drained(n, "maintenance"),
    "health_drained": lambda n: node_events.health_drained(n, XID),
    "resumed": node_events.resumed,
    "silent": lambda n: node_events.silent(n, 15.0),
}


def _node(state):
    signal = "ib" if state == DRAIN else ""
    return Node(name="n1", address="old:1", state=state, reason="before" if state == DRAIN else "", drain_signal=signal)


@pytest.mark.parametrize("change,state", sorted(TABLE, key=str))
def test_each_change_in_each_state(change, state):
    want = TABLE[(change, state)]
    if want is TransitionError:
        with pytest.raises(TransitionError, match=f"node n1 is {state.name.lower()}; only a drained node"):
            CALLS[change](_node(state))
        return
    got = CALLS[change](_node(state))
    assert (got.state if got is not None else None) == want


def test_what_each_change_says():
    drained = _node(DRAIN)
    again = node_events.registered(drained, INFO, 50.0)   # a daemon's restart clears no drain and no fault
    assert (again.reason, again.drain_signal, again.address, again.cpus, len(again.gpus), again.last_heartbeat) == \
        ("before", "ib", "10.0.0.1:7000", 64, 2, 50.0)
    up = node_events.registered(_node(DOWN), INFO, 50.0)
    assert (up.reason, up.drain_signal) == ("", "")
    assert node_events.health_drained(_node(UP), XID).reason == "GPU 1: xid (XID 79)"
    whole = node_events.health_drained(_node(UP), pb.HealthEvent(gpu=-1, signal="ib", message="mlx5_0/1 down"))
    assert (whole.reason, whole.drain_signal) == ("node: ib (mlx5_0/1 down)", "ib")
    assert node_events.drained(_node(UP), "maintenance").drain_signal == ""   # an operator's: not a signal's
    # a drain that would lift by itself (a port down) gives way to one an operator must lift, not back
    port = node_events.health_drained(_node(UP), pb.HealthEvent(gpu=-1, signal=signals.ib_port("mlx5_0/1", "DOWN"),
                                                                  message="port down"))
    stuck = node_events.health_drained(port, pb.HealthEvent(gpu=-1, signal=signals.KILL_TASK_FAILED, message="x"))
    assert (stuck.state, stuck.drain_signal, stuck.reason) == (DRAIN, "Kill task failed", "node: Kill task failed (x)")
    assert node_events.health_drained(stuck, pb.HealthEvent(gpu=-1, signal=signals.THERMAL, message="hot")) is None
    assert node_events.health_drained(port, pb.HealthEvent(gpu=-1, signal=signals.THERMAL, message="hot")) is None
    # an operator's drain gives way to a fault only an operator may lift, so that whoever resumes it sees
    # the fault; never to one that lifts by itself, which would end the operator's drain when it does
    kept = node_events.drained(_node(UP), "maintenance")
    taken = node_events.health_drained(kept, pb.HealthEvent(gpu=-1, signal=signals.KILL_TASK_FAILED, message="x"))
    assert (taken.state, taken.drain_signal, taken.reason) == (DRAIN, "Kill task failed", "node: Kill task failed (x)")
    assert node_events.health_drained(kept, pb.HealthEvent(gpu=-1, signal=signals.THERMAL, message="hot")) is None
    assert node_events.health_drained(kept, pb.HealthEvent(gpu=-1, signal=signals.ib_port("mlx5_0/1", "DOWN"),
                                                           message="port down")) is None
    for back in (node_events.resumed(drained), node_events.returned(drained)):
        assert (back.state, back.reason, back.drain_signal) == (UP, "", "")
    assert node_events.silent(_node(UP), 15.0).reason == "not responding for over 15 s"
