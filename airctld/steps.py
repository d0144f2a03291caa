"""Laying out a job step (airrun) over a job's allocation: which ranks and GPUs go where. Pure."""
from __future__ import annotations

import hostlist

from airctld.errors import InvalidRequest
from airctld.model import Job
from protos import air_pb2 as pb
from protos.limits import memory_limit_bytes


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
                                 memory_limit_bytes=memory_limit_bytes(job.request.mem_per_node_mb,
                                                                       job.request.mem_per_gpu_mb, len(gpus))))
        rank += ntasks
    return nodes, rank


def tasks_per_node(counts: list[int]) -> str:
    """Slurm's compressed form: 2(x3),1 for [2, 2, 2, 1]."""
    out: list[str] = []
    for count in counts:
        if out and out[-1][0] == count:
            out[-1][1] += 1
        else:
            out.append([count, 1])
    return ",".join(f"{c}(x{n})" if n > 1 else str(c) for c, n in out)


def rank_environment(step: pb.Step, node_index: int, local_rank: int, base: dict[str, str]) -> dict[str, str]:
    """What torch.distributed (and srun-style scripts) expect in every rank."""
    here = step.nodes[node_index]
    nodelist = hostlist.collect_hostlist([n.node for n in step.nodes])
    per_node = tasks_per_node([len(n.ranks) for n in step.nodes])
    env = dict(base)
    env.update({
        "RANK": str(here.ranks[local_rank]),
        "WORLD_SIZE": str(step.world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(len(here.ranks)),
        "NODE_RANK": str(here.node_rank),
        "GROUP_RANK": str(here.node_rank),
        "MASTER_ADDR": step.master_addr,
        "MASTER_PORT": str(step.master_port),
        "CUDA_VISIBLE_DEVICES": here.gpu_sets[local_rank],
        "AIR_STEP_ID": str(step.step_id),
        "AIR_NODENAME": here.node,
        "SLURM_PROCID": str(here.ranks[local_rank]),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": str(here.node_rank),
        "SLURM_NTASKS": str(step.world_size),
        "SLURM_STEP_ID": str(step.step_id),
        "SLURM_STEPID": str(step.step_id),
        "SLURMD_NODENAME": here.node,
        "SLURM_NPROCS": str(step.world_size),
        "SLURM_NNODES": str(len(step.nodes)),              # srun's: the step's nodes and tasks on each
        "SLURM_NTASKS_PER_NODE": str(len(here.ranks)),
        "SLURM_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_STEP_NUM_TASKS": str(step.world_size),
        "SLURM_STEP_NUM_NODES": str(len(step.nodes)),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_STEP_GPUS": here.gpu_sets[local_rank],
    })
    if len(here.ranks) > 1 and "OMP_NUM_THREADS" not in base:
        # as torchrun does: ranks sharing a node would each start a thread per core and fight for them
        env["OMP_NUM_THREADS"] = "1"
    return env
