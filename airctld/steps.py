"""Laying out a job step (airrun) over a job's allocation: which ranks and GPUs go where. Pure."""
from __future__ import annotations

from air.airctld.errors import InvalidRequest
from air.airctld.model import Job
from air.protos import air_pb2 as pb
from air.protos.limits import memory_limit_bytes


def layout(job: Job, spec: pb.StepSpec, addresses: dict[str, str]) -> tuple[list[pb.StepNode], int]:
    """The step's nodes (each with its global ranks and per-rank GPU sets) and its world size."""
    allocated = {a.node: a for a in job.allocation}
    if spec.nodelist:
        unknown = [n for n in spec.nodelist if n not in allocated]
        if unknown:
            raise InvalidRequest(f"node {unknown[0]} is not in job {job.job_id}'s allocation "
                                 f"({','.join(allocated)})")
        names = list(spec.nodelist)
    else:
        count = spec.nodes or len(job.allocation)
        if count > len(job.allocation):
            raise InvalidRequest(f"{count} nodes asked for, but job {job.job_id} has {len(job.allocation)}")
        names = [a.node for a in job.allocation[:count]]
    nodes, rank = [], 0
    for node_rank, name in enumerate(names):
        gpus = list(allocated[name].gpus)
        ntasks = spec.ntasks_per_node or (len(gpus) // spec.gpus_per_task if spec.gpus_per_task else len(gpus)) or 1
        per_task = spec.gpus_per_task or (len(gpus) // ntasks if gpus else 0)
        if ntasks * per_task > len(gpus):
            raise InvalidRequest(f"{ntasks} tasks with {per_task} GPUs each need {ntasks * per_task} GPUs, "
                                 f"but job {job.job_id} has {len(gpus)} on {name}")
        sets = [",".join(str(g) for g in gpus[i * per_task:(i + 1) * per_task]) for i in range(ntasks)]
        nodes.append(pb.StepNode(node=name, address=addresses[name], node_rank=node_rank,
                                 ranks=list(range(rank, rank + ntasks)), gpu_sets=sets,
                                 allocation=pb.NodeAlloc(node=name, gpus=gpus),
                                 memory_limit_bytes=memory_limit_bytes(job.request.mem_per_node_mb,
                                                                       job.request.mem_per_gpu_mb, len(gpus))))
        rank += ntasks
    return nodes, rank
