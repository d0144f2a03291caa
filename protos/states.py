"""The proto enums as Python enums, with short member names, and the Slurm codes that the
command-line tools print.

The proto file is the source. These are written out, not made from the generated code at import,
so that a short command (airq, aircancel) never imports protobuf: tests/test_protos.py checks each
member, name and number, against air.proto's enum, so a value added there fails it until added here.
"""
import enum


class JobPhase(enum.IntEnum):   # air.proto's JobPhase, less its JOB_PHASE_ prefix
    UNSPECIFIED = 0
    PENDING = 1
    RUNNING = 2
    COMPLETING = 3
    DONE = 4


class JobResult(enum.IntEnum):   # air.proto's JobResult, less its JOB_RESULT_ prefix
    NONE = 0
    COMPLETED = 1
    FAILED = 2
    CANCELLED = 3
    TIMEOUT = 4
    NODE_FAIL = 5
    PREEMPTED = 6
    OUT_OF_MEMORY = 7
    HUNG = 8


class Reason(enum.IntEnum):   # air.proto's Reason, less its REASON_ prefix
    NONE = 0
    PRIORITY = 1
    RESOURCES = 2
    DEPENDENCY = 3
    JOB_HELD_USER = 4
    PARTITION_DOWN = 5
    NODES_DOWN = 6
    BEGIN_TIME = 7
    NODE_FAIL = 8
    TIME_LIMIT = 9
    CANCELLED = 10
    NON_ZERO_EXIT = 11
    SIGNALED = 12
    LAUNCH_FAILED = 13
    JOB_LOST = 14
    PREEMPTED = 15
    REQUEUE_REQUESTED = 16
    DEPENDENCY_NEVER = 17
    QOS_MAX_GPU_PER_USER = 18
    QOS_MAX_GPU_PER_ACCOUNT = 19
    ASSOC_GRP_GPU_LIMIT = 20
    ARRAY_TASK_LIMIT = 21
    NODES_DRAINED = 22
    ACCOUNT_NOT_ALLOWED = 23
    OUT_OF_MEMORY = 24
    HUNG = 25
    BAD_CONSTRAINTS = 26
    INACTIVE_LIMIT = 27


class NodeState(enum.IntEnum):   # air.proto's NodeState, less its NODE_STATE_ prefix
    UNKNOWN = 0
    UP = 1
    DOWN = 2
    DRAIN = 3


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


_DONE = JobPhase.DONE   # (an enum's member read from its class costs 0.1 us: bulk changes call this per job)
_UNDONE_NAMES = {JobPhase.RUNNING: "RUNNING", JobPhase.COMPLETING: "COMPLETING"}


def long_state(phase: int, result: int) -> str:
    """The state name scontrol shows (PENDING, RUNNING, COMPLETED, NODE_FAIL, ...)."""
    if phase == _DONE:   # (an IntEnum hashes as its int: no enum made in the usual case)
        return _DONE_NAMES[result] if result in _DONE_NAMES else _DONE_NAMES[JobResult(result)]
    return _UNDONE_NAMES.get(phase, "PENDING")


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
