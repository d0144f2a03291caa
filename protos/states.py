"""Python enums made from the proto enums, so each set of states has one definition.

The proto file is the source; these are views of it with short member names, and the
Slurm codes that the command-line tools print.
"""
import enum

from air.protos import air_pb2 as pb


def _from_proto(name: str, proto_enum, prefix: str) -> type[enum.IntEnum]:
    members = {v.name.removeprefix(prefix): v.number for v in proto_enum.DESCRIPTOR.values}
    return enum.IntEnum(name, members)


JobPhase = _from_proto("JobPhase", pb.JobPhase, "JOB_PHASE_")
JobResult = _from_proto("JobResult", pb.JobResult, "JOB_RESULT_")
Reason = _from_proto("Reason", pb.Reason, "REASON_")
NodeState = _from_proto("NodeState", pb.NodeState, "NODE_STATE_")



class ExitCode(enum.IntEnum):
    """Exit codes that mean something to AIR beyond success or failure. The runtime, which imports
    nothing of AIR's, keeps its own REQUEUE_EXIT; tests/test_layers.py checks that the two agree."""
    REQUEUE = 75     # EX_TEMPFAIL: the job checkpointed and stopped, to be requeued
    NODE_LOST = 76   # airrun: a node of its step stopped answering (a node failure, not the job's)


# Long names as scontrol prints them, for a job in a given phase with a given result.
_DONE_NAMES = {
    JobResult.NONE: "COMPLETED",
    JobResult.COMPLETED: "COMPLETED",
    JobResult.FAILED: "FAILED",
    JobResult.CANCELLED: "CANCELLED",
    JobResult.TIMEOUT: "TIMEOUT",
    JobResult.NODE_FAIL: "NODE_FAIL",
    JobResult.PREEMPTED: "PREEMPTED",
    JobResult.OUT_OF_MEMORY: "OUT_OF_MEMORY",
    JobResult.HUNG: "HUNG",
}
LONG_TO_CODE = {
    "PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "FAILED": "F",
    "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR", "OUT_OF_MEMORY": "OOM",
    "HUNG": "HG",
}
CODE_TO_LONG = {code: long for long, code in LONG_TO_CODE.items()}

# Reasons as Slurm spells them in squeue's NODELIST(REASON) column.
REASON_NAMES = {
    Reason.NONE: "None",
    Reason.PRIORITY: "Priority",
    Reason.RESOURCES: "Resources",
    Reason.DEPENDENCY: "Dependency",
    Reason.JOB_HELD_USER: "JobHeldUser",
    Reason.PARTITION_DOWN: "PartitionDown",
    Reason.NODES_DOWN: "ReqNodeNotAvail",
    Reason.BEGIN_TIME: "BeginTime",
    Reason.NODE_FAIL: "NodeFail",
    Reason.TIME_LIMIT: "TimeLimit",
    Reason.CANCELLED: "Cancelled",
    Reason.NON_ZERO_EXIT: "NonZeroExitCode",
    Reason.SIGNALED: "RaisedSignal",
    Reason.LAUNCH_FAILED: "LaunchFailed",
    Reason.JOB_LOST: "JobLost",
    Reason.PREEMPTED: "Preempted",
    Reason.REQUEUE_REQUESTED: "Requeued",
    Reason.DEPENDENCY_NEVER: "DependencyNeverSatisfied",
    Reason.QOS_MAX_GPU_PER_USER: "QOSMaxGPUPerUser",
    Reason.QOS_MAX_GPU_PER_ACCOUNT: "QOSMaxGPUPerAccount",
    Reason.ASSOC_GRP_GPU_LIMIT: "AssocGrpGPULimit",
    Reason.ARRAY_TASK_LIMIT: "JobArrayTaskLimit",
    Reason.NODES_DRAINED: "NodesDrained",
    Reason.ACCOUNT_NOT_ALLOWED: "AccountNotAllowed",
    Reason.OUT_OF_MEMORY: "OutOfMemory",
    Reason.HUNG: "Hung",
    Reason.BAD_CONSTRAINTS: "BadConstraints",
    Reason.INACTIVE_LIMIT: "InactiveLimit",
}

TERMINAL_PHASES = frozenset({JobPhase.DONE})
ACTIVE_PHASES = frozenset({JobPhase.RUNNING, JobPhase.COMPLETING})


def is_terminal(phase: int) -> bool:
    return phase in TERMINAL_PHASES


def long_state(phase: int, result: int) -> str:
    """The state name scontrol shows (PENDING, RUNNING, COMPLETED, NODE_FAIL, ...)."""
    if phase == JobPhase.DONE:   # (an IntEnum hashes as its int: no enum made in the usual case)
        return _DONE_NAMES[result] if result in _DONE_NAMES else _DONE_NAMES[JobResult(result)]
    if phase == JobPhase.COMPLETING:
        return "COMPLETING"
    if phase == JobPhase.RUNNING:
        return "RUNNING"
    return "PENDING"


def state_code(phase: int, result: int) -> str:
    """The short code squeue shows (PD, R, CG, CD, F, CA, TO, NF, ...)."""
    return LONG_TO_CODE[long_state(phase, result)]


def node_state_name(node) -> str:
    """sinfo's short state of a node (a pb.Node with its allocation counted): idle, mix, alloc, down,
    drain, drng (draining: drained, jobs still on it), unk."""
    busy = node.gpus_alloc or node.cpus_alloc
    if node.state == NodeState.DOWN:
        return "down"
    if node.state == NodeState.DRAIN:
        return "drng" if busy else "drain"
    if node.state == NodeState.UNKNOWN:
        return "unk"
    if not busy:
        return "idle"
    full = (node.gpus and node.gpus_alloc >= len(node.gpus)) or node.cpus_alloc >= node.cpus
    return "alloc" if full else "mix"
