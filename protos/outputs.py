"""Where a batch script's output goes: Slurm's filename patterns, expanded the same way by the node
daemon that opens the files and by the tools that show them."""
from __future__ import annotations

import os

from air.protos import air_pb2 as pb

DEFAULT_OUTPUT = "air-%j.out"


def expand_pattern(pattern: str, job: pb.Job, node: str) -> str:
    """Slurm's filename patterns: %j job id, %x job name, %u user, %N node, %A array job id, %a array task
    id, %% a percent sign."""
    return substitute(pattern, {
        "j": str(job.job_id), "x": job.request.name or "batch", "u": job.user, "N": node,
        "A": str(job.array_job_id or job.job_id), "a": str(job.array_task_id) if job.array_job_id else "4294967294"})


def substitute(pattern: str, values: dict[str, str]) -> str:
    """`pattern` with each %c that `values` names replaced by its value, and %% by %; any other % stays."""
    values = {**values, "%": "%"}
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def output_paths(job: pb.Job, node: str) -> tuple[str, str | None]:
    """(stdout path, stderr path or None when stderr goes with stdout), absolute."""
    req = job.request
    out = os.path.join(req.workdir, expand_pattern(req.output or DEFAULT_OUTPUT, job, node))
    err = os.path.join(req.workdir, expand_pattern(req.error, job, node)) if req.error else None
    return out, err
