"""A job's variables, the same on every node of it: what sbatch sets in the batch script (AIR_* and
SLURM_*), and what the ranks of its steps get too, whatever the step's --export kept. Pure; the node
daemon adds the node's own (SLURMD_NODENAME, the GPUs, the CPUs) for the batch script, and the
controller sends these with every step."""
from __future__ import annotations

import re

import hostlist

from air.protos import air_pb2 as pb
from air.protos import arrays, hetjob
from air.protos.states import REASON_NAMES, Reason
from air.protos.stepenv import tasks_per_node

# What describes one job, one step or one task: a job submitted from inside another (sbatch in a
# rank of an srun, as submitit and pipelines do) must not keep that job's, whatever its --export
# kept (a stale SLURM_NTASKS_PER_NODE would make its srun start that many tasks a node). The new
# job's own are set from job_variables; variables that are a user's settings (SLURM_MPI_TYPE, ...) stay.
SCOPED_VARIABLE = re.compile(
    r"SLURM_(JOB_\w+|JOBID|NODELIST|NNODES|NTASKS|NTASKS_PER_\w+|NPROCS|TASKS_PER_NODE|CPUS_PER_TASK|"
    r"CPUS_ON_NODE|GPUS_ON_NODE|ARRAY_\w+|STEP_\w+|STEPID|PROCID|LOCALID|NODEID|RESTART_COUNT|SUBMIT_DIR|"
    r"SUBMIT_HOST|CLUSTER_NAME|OPEN_MODE|HET_SIZE|\w+_HET_GROUP_\d+)$|SLURMD_NODENAME$|AIR_(ARRAY_\w+|STEP_ID)$")
# torch.distributed's, as every rank of a step gets them (stepenv.rank_environment): stale in a job
# submitted from a rank, where init() would join the outer step's group. Only then are they dropped:
# elsewhere they may be a user's own.
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT")


def inherited(environment: dict[str, str]) -> dict[str, str]:
    """What a new job keeps of the environment it was submitted with: not the variables of the job,
    step or task it was submitted from."""
    from_rank = "AIR_STEP_ID" in environment
    return {k: v for k, v in environment.items()
            if not SCOPED_VARIABLE.match(k) and not (from_rank and k in RANK_VARIABLES)}


def job_variables(job: pb.Job, cluster: str = "") -> dict[str, str]:
    req = job.request
    nodes = [a.node for a in job.allocation]
    nodelist = hostlist.collect_hostlist(nodes)
    env = {
        "AIR_JOB_ID": str(job.job_id),
        "AIR_JOB_NAME": req.name or "batch",
        "AIR_JOB_NODELIST": nodelist,
        "AIR_NNODES": str(len(nodes)),
        "AIR_SUBMIT_DIR": req.workdir,
        "AIR_JOB_PARTITION": job.partition,
        "SLURM_JOB_ID": str(job.job_id),
        "SLURM_JOBID": str(job.job_id),
        "SLURM_JOB_NAME": req.name or "batch",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_NUM_NODES": str(len(nodes)),
        "SLURM_SUBMIT_DIR": req.workdir,
        "SLURM_JOB_PARTITION": job.partition,
        "AIR_RESTART_COUNT": str(job.restart_count),
        "SLURM_RESTART_COUNT": str(job.restart_count),
        "AIR_LAST_STOP_REASON": REASON_NAMES[Reason(job.last_stop_reason)] if job.restart_count else "",
    }
    env.update(_slurm_variables(job, cluster))
    if job.array_job_id:
        for prefix in ("AIR", "SLURM"):
            env[f"{prefix}_ARRAY_JOB_ID"] = str(job.array_job_id)
            env[f"{prefix}_ARRAY_TASK_ID"] = str(job.array_task_id)
    return env


def _slurm_variables(job: pb.Job, cluster: str) -> dict[str, str]:
    """sbatch's other variables: tasks, CPUs, account, QOS, who and where from, and the array's shape."""
    req = job.request
    nodes = max(1, len(job.allocation))
    per_node = req.ntasks_per_node or 1
    env = {
        "SLURM_TASKS_PER_NODE": tasks_per_node([per_node] * nodes),
        "SLURM_JOB_USER": job.user,
        "SLURM_JOB_UID": str(job.uid),
        "SLURM_JOB_GID": str(job.gid),
    }
    if req.ntasks_per_node:   # as sbatch: only when tasks were asked for (Lightning, for one, reads
        # SLURM_NTASKS as "started by srun", and a script that runs python itself is not)
        env.update({"SLURM_NTASKS": str(nodes * per_node), "SLURM_NPROCS": str(nodes * per_node),
                    "SLURM_NTASKS_PER_NODE": str(per_node)})
    if req.cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(req.cpus_per_task)
    env["SLURM_OPEN_MODE"] = "t" if req.open_truncate else "a"   # srun's files follow the job's
    for key, value in (("SLURM_JOB_ACCOUNT", req.account), ("SLURM_JOB_QOS", req.qos),
                       ("SLURM_SUBMIT_HOST", req.submit_host), ("SLURM_CLUSTER_NAME", cluster)):
        if value:
            env[key] = value
    env.update(het_variables(job))
    if job.array_job_id and req.array:
        try:
            tasks, _ = arrays.parse(req.array)
        except ValueError:
            tasks = []
        if tasks:
            steps = {b - a for a, b in zip(tasks, tasks[1:])}
            env.update({"SLURM_ARRAY_TASK_COUNT": str(len(tasks)), "SLURM_ARRAY_TASK_MIN": str(tasks[0]),
                        "SLURM_ARRAY_TASK_MAX": str(tasks[-1]),
                        "SLURM_ARRAY_TASK_STEP": str(steps.pop() if len(steps) == 1 else 1)})
    return env


def het_variables(job: pb.Job) -> dict[str, str]:
    """A heterogeneous job's groups, as sbatch sets them: group i is the next nodes of the allocation
    (the batch node's first), as many as component i asked for."""
    env: dict[str, str] = {}
    if not job.request.het:
        return env
    env["SLURM_HET_SIZE"] = str(len(job.request.het))
    for i, (component, group) in enumerate(hetjob.groups(job.request, [a.node for a in job.allocation])):
        listed = hostlist.collect_hostlist(group)
        env.update({f"SLURM_JOB_NODELIST_HET_GROUP_{i}": listed, f"SLURM_NODELIST_HET_GROUP_{i}": listed,
                    f"SLURM_JOB_NUM_NODES_HET_GROUP_{i}": str(len(group)),
                    f"SLURM_NNODES_HET_GROUP_{i}": str(len(group)),
                    f"SLURM_JOB_NAME_HET_GROUP_{i}": component.name})
    return env
