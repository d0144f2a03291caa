"""The controller's in-memory records: jobs, allocations, nodes. Plain frozen data."""
from __future__ import annotations

from dataclasses import dataclass, field

from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult, NodeState, Reason


DEFAULT_ACCOUNT = "default"   # the account of jobs that have none (a cluster without accounts)


def evolve(record, **changes):
    """A copy of a frozen record with some fields changed; dataclasses.replace without its
    per-call field introspection, which dominated bulk changes (100,000 cancels)."""
    if not changes.keys() <= record.__dict__.keys():   # (a comparison builds no set: the usual case)
        unknown = changes.keys() - record.__dict__.keys()
        raise TypeError(f"{type(record).__name__} has no field {sorted(unknown)[0]}")
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


def evolve_all(records: list, changes: dict) -> list:
    """evolve() of each record (all of one type) with the same changes, checked once: a bulk change's
    100,000 copies."""
    if not records:
        return []
    first = evolve(records[0], **changes)
    kind, make = type(first), object.__new__
    out = [first]
    for record in records[1:]:
        if type(record) is not kind:
            raise TypeError(f"evolve_all: a {type(record).__name__} among {kind.__name__}s")
        new = make(kind)
        fields = new.__dict__
        fields.update(record.__dict__)
        fields.update(changes)
        out.append(new)
    return out


@dataclass(frozen=True)
class NodeAlloc:
    node: str
    gpus: tuple[int, ...]
    cpus: int


@dataclass(frozen=True)
class Job:
    job_id: int
    uid: int
    gid: int
    user: str
    name: str
    partition: str
    num_nodes: int
    gpus_per_node: int
    cpus_per_node: int
    time_limit_s: int
    submit_time: float
    request: pb.JobRequest = field(compare=False, repr=False)
    priority: int = 0
    phase: JobPhase = JobPhase.PENDING
    result: JobResult = JobResult.NONE
    reason: Reason = Reason.NONE
    reason_detail: str = ""
    hold: bool = False
    allocation: tuple[NodeAlloc, ...] = ()
    start_time: float = 0.0
    end_time: float = 0.0
    exit_code: int = 0
    exit_signal: int = 0
    restart_count: int = 0
    last_stop_reason: Reason = Reason.NONE
    array_job_id: int = 0     # 0: not an array task
    array_task_id: int = 0
    figures: str = ""        # the runtime's figures of the last run that ended (JSON; airctld.goodput)

    @property
    def requeue_allowed(self) -> bool:
        return not self.request.no_requeue

    @property
    def account(self) -> str:
        """The account it is charged to (fairshare, limits, metrics): the one it asked for or was given,
        DEFAULT_ACCOUNT on a cluster without accounts (where it is shown as Slurm shows none)."""
        return self.request.account or DEFAULT_ACCOUNT

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(a.node for a in self.allocation)

    @property
    def gpus_held(self) -> int:
        """The GPUs its allocation holds (every GPU of its nodes under --exclusive); before it starts,
        those it asks for."""
        if self.allocation:
            return sum(len(a.gpus) for a in self.allocation)
        return self.num_nodes * self.gpus_per_node

    @property
    def cpus_held(self) -> int:
        if self.allocation:
            return sum(a.cpus for a in self.allocation)
        return self.num_nodes * self.cpus_per_node

    @property
    def batch_node(self) -> str:
        return self.allocation[0].node if self.allocation else ""

    def to_proto(self) -> pb.Job:
        return pb.Job(
            job_id=self.job_id, request=self.request, uid=self.uid, gid=self.gid, user=self.user,
            phase=self.phase, result=self.result, reason=self.reason, reason_detail=self.reason_detail,
            partition=self.partition, time_limit_s=self.time_limit_s,
            allocation=[pb.NodeAlloc(node=a.node, gpus=a.gpus, cpus=a.cpus) for a in self.allocation],
            submit_time=self.submit_time, start_time=self.start_time, end_time=self.end_time,
            exit_code=self.exit_code, exit_signal=self.exit_signal, priority=self.priority,
            restart_count=self.restart_count, last_stop_reason=self.last_stop_reason,
            array_job_id=self.array_job_id, array_task_id=self.array_task_id, figures=self.figures)


@dataclass(frozen=True)
class Node:
    """A configured node and what the controller last heard from it."""
    name: str
    address: str = ""
    cpus: int = 0
    memory_mb: int = 0
    gpus: tuple[pb.Gpu, ...] = ()
    state: NodeState = NodeState.UNKNOWN
    reason: str = ""
    last_heartbeat: float = 0.0
    drain_signal: str = ""    # the health signal that drained it; "" when an admin did

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)
