"""What every rank of a step (airrun) and every batch script sees of the step's layout: Slurm's and
torch.distributed's variables. Pure; shared by the controller's layout and the node daemons."""
from __future__ import annotations

import hostlist

from air.protos import air_pb2 as pb


def tasks_per_node(counts: list[int]) -> str:
    """Slurm's compressed form: 2(x3),1 for [2, 2, 2, 1]."""
    out: list[str] = []
    for count in counts:
        if out and out[-1][0] == count:
            out[-1][1] += 1
        else:
            out.append([count, 1])
    return ",".join(f"{c}(x{n})" if n > 1 else str(c) for c, n in out)


def rank_base(step: pb.Step, node_own: dict[str, str]) -> dict[str, str]:
    """What a rank's environment is built on: what srun's --export kept, then its job's variables (as
    srun's, a rank always knows its job), then the node's own for the run (its owner, its progress
    files), which nothing a user sends overrides."""
    return {**step.spec.environment, **step.job_environment, **node_own}


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
