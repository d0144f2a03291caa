"""Checks on a submitted job request, pure: every limit names the field, the value and the bound.

Paths are checked for shape only (absolute, no NUL, bounded); what a job may write is decided by
the kernel, because node daemons open output files as the job's owner.
"""
from __future__ import annotations

import re

from air.protos.config import ControllerConfig
from air.airctld.errors import InvalidRequest
from air.protos import air_pb2 as pb
from air.protos import rlimits
from air.protos.limits import MAX_CONSTRAINT_CHARS, MAX_HET_COMPONENTS, MAX_NODE_NAMES

MAX_PATH = 4096
MAX_DEPENDENCY_CHARS = 64 * 1024
MAX_MEM_MB = 1 << 30          # --mem and --mem-per-gpu: 1 PiB
MAX_TIME_LIMIT_S = 100 * 365 * 86400   # --time (and scontrol update's TimeLimit): 100 years
MAX_ARGS = 1024
MAX_ARGS_BYTES = 256 * 1024
MAX_ENV_VARS = 4096
MAX_SUBMIT_LINE = 4096
MAX_COMMENT = 1024
ALWAYS_DROPPED = ("LD_PRELOAD", "LD_AUDIT")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NODE_NAME = re.compile(r"[\x21-\x7e]+")   # printable, no space


def check_request(req: pb.JobRequest, cc: ControllerConfig) -> None:
    if not req.script.strip():
        raise InvalidRequest("the batch script is empty")
    size = len(req.script.encode())
    if size > cc.max_script_bytes:
        raise InvalidRequest(f"the batch script is {size} bytes; the limit is {cc.max_script_bytes}")
    if "\0" in req.script:
        raise InvalidRequest("the batch script contains NUL bytes; is it a binary file?")
    if not req.script.startswith("#!"):
        raise InvalidRequest("the batch script must start with a #! line, such as #!/bin/bash")
    longest = cc.max_name_chars
    # text others see (airq, airacct) is printable: no control, format or bidi character for their terminals
    for field, what in (("name", "job name"), ("account", "account"), ("qos", "QOS"), ("partition", "partition")):
        value = getattr(req, field)
        if len(value) > longest or not value.isprintable():
            raise InvalidRequest(f"{what} {value[:40]!r}: at most {longest} printable characters (max_name_chars)")
    if len(req.dependency) > MAX_DEPENDENCY_CHARS or not req.dependency.isprintable():
        raise InvalidRequest(f"dependency {req.dependency[:40]!r}...: at most {MAX_DEPENDENCY_CHARS} printable "
                             "characters")
    if not req.workdir.startswith("/"):
        raise InvalidRequest(f"working directory {req.workdir!r} is not an absolute path")
    if req.time_limit_s > MAX_TIME_LIMIT_S:
        raise InvalidRequest(f"--time of {req.time_limit_s} s: at most {MAX_TIME_LIMIT_S} s (100 years)")
    for field, flag in (("mem_per_node_mb", "--mem"), ("mem_per_gpu_mb", "--mem-per-gpu")):
        if getattr(req, field) > MAX_MEM_MB:   # (times a node's GPUs, in bytes, it must still fit the wire's 64 bits)
            raise InvalidRequest(f"{flag}={getattr(req, field)}M: at most {MAX_MEM_MB}M (1 PiB)")
    for field in ("workdir", "output", "error"):
        value = getattr(req, field)
        if len(value) > MAX_PATH or "\0" in value or "\n" in value:
            raise InvalidRequest(f"{field} {value[:40]!r}...: a path of at most {MAX_PATH} characters, "
                                 "without NUL or newline")
    if len(req.submit_host) > 255 or any(c <= " " for c in req.submit_host):
        raise InvalidRequest(f"submit host {req.submit_host[:40]!r}: a host name of at most 255 characters")
    for field in ("comment", "wckey", "mail_type", "mail_user"):
        value = getattr(req, field)
        if len(value) > MAX_COMMENT or not value.isprintable():
            raise InvalidRequest(f"--{field.replace('_', '-')}: at most {MAX_COMMENT} printable characters")
    if len(req.constraint) > MAX_CONSTRAINT_CHARS or not req.constraint.isprintable():
        raise InvalidRequest(f"--constraint: at most {MAX_CONSTRAINT_CHARS} printable characters")
    for flag, names in (("-w/--nodelist", req.nodelist), ("-x/--exclude", req.exclude)):
        if len(names) > MAX_NODE_NAMES or any(len(n) > longest or not _NODE_NAME.fullmatch(n) for n in names):
            raise InvalidRequest(f"{flag}: at most {MAX_NODE_NAMES} node names of at most {longest} characters, "
                                 "without spaces")
    if req.het:
        _check_het(req, longest)
    _check_limits(req.rlimits)
    if len(req.submit_line) > MAX_SUBMIT_LINE or "\0" in req.submit_line:
        raise InvalidRequest(f"submit line of {len(req.submit_line)} characters; the limit is {MAX_SUBMIT_LINE}, "
                             "without NUL")
    if len(req.argv) > MAX_ARGS or sum(len(a) for a in req.argv) > MAX_ARGS_BYTES:
        raise InvalidRequest(f"{len(req.argv)} script arguments; the limit is {MAX_ARGS} "
                             f"and {MAX_ARGS_BYTES} bytes in all")
    if len(req.environment) > MAX_ENV_VARS:
        raise InvalidRequest(f"{len(req.environment)} environment variables; the limit is {MAX_ENV_VARS}")
    env_bytes = sum(len(k) + len(v) + 2 for k, v in req.environment.items())
    if env_bytes > cc.max_env_bytes:
        raise InvalidRequest(f"the environment is {env_bytes} bytes; the limit is {cc.max_env_bytes} "
                             "(submit with --export=NONE,VAR,... to send less)")
    bad = next((k for k in req.environment if not _ENV_NAME.fullmatch(k)), None)
    if bad is not None:
        raise InvalidRequest(f"environment variable name {bad[:40]!r} is not valid")
    if any("\0" in v for v in req.environment.values()) or any("\0" in a for a in req.argv):
        raise InvalidRequest("a script argument or an environment value contains a NUL byte")


def _check_limits(limits) -> None:
    """Resource limits by their names, each a count, or -1 (unlimited)."""
    try:
        rlimits.check(limits, "resource limits")
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    bad = next((name for name, value in limits.items() if value < rlimits.UNLIMITED), None)
    if bad is not None:
        raise InvalidRequest(f"resource limit {bad} = {limits[bad]}: a count, or -1 (unlimited)")


def _check_het(req: pb.JobRequest, longest: int) -> None:
    """A heterogeneous job: its components' sizes make up its nodes, and it is none of what AIR cannot
    also make heterogeneous (an array, airrun's own allocation, a -w list)."""
    if not 2 <= len(req.het) <= MAX_HET_COMPONENTS:
        raise InvalidRequest(f"a heterogeneous job has 2 to {MAX_HET_COMPONENTS} components, not {len(req.het)}")
    if any(c.nodes < 1 for c in req.het) or sum(c.nodes for c in req.het) != max(req.nodes, 1):
        raise InvalidRequest(f"the components of a heterogeneous job ask for {sum(c.nodes for c in req.het)} nodes "
                             f"in all, each at least 1; the job for {max(req.nodes, 1)}")
    for c in req.het:
        if len(c.name) > longest or not c.name.isprintable():
            raise InvalidRequest(f"component name {c.name[:40]!r}: at most {longest} printable characters "
                                 "(max_name_chars)")
    if req.array or req.allocation or req.nodelist:
        raise InvalidRequest("a heterogeneous job cannot be an array, an allocation of airrun's, or name its "
                             "nodes with -w")


def check_step(spec: pb.StepSpec, cc: ControllerConfig, job_nodes: int) -> None:
    """A step (airrun) asks for at most max_tasks_per_node ranks a node, names each node of its job
    at most once, and carries a command and environment the kernel can take."""
    if spec.ntasks_per_node > cc.max_tasks_per_node:
        raise InvalidRequest(f"{spec.ntasks_per_node} tasks per node asked for; the limit is "
                             f"{cc.max_tasks_per_node} (max_tasks_per_node)")
    if len(spec.nodelist) > job_nodes or len(set(spec.nodelist)) != len(spec.nodelist):
        raise InvalidRequest(f"the step's node list names {len(spec.nodelist)} nodes, some more than once or "
                             f"more than the job's {job_nodes}; name each node of the job at most once")
    if not spec.argv:
        raise InvalidRequest("the step has no command")
    if len(spec.argv) > MAX_ARGS or sum(len(a) for a in spec.argv) > MAX_ARGS_BYTES or any("\0" in a for a in spec.argv):
        raise InvalidRequest(f"the step's command: at most {MAX_ARGS} arguments and {MAX_ARGS_BYTES} bytes, "
                             "without NUL")
    env_bytes = sum(len(k) + len(v) + 2 for k, v in spec.environment.items())
    if len(spec.environment) > MAX_ENV_VARS or env_bytes > cc.max_env_bytes:
        raise InvalidRequest(f"the step's environment is {env_bytes} bytes in {len(spec.environment)} variables; "
                             f"the limits are {cc.max_env_bytes} bytes and {MAX_ENV_VARS} variables")
    bad = next((k for k, v in spec.environment.items() if not _ENV_NAME.fullmatch(k) or "\0" in v), None)
    if bad is not None:
        raise InvalidRequest(f"environment variable {bad[:40]!r} of the step is not valid (a bad name, or NUL)")
    if len(spec.workdir) > MAX_PATH or "\0" in spec.workdir:
        raise InvalidRequest(f"the step's working directory: a path of at most {MAX_PATH} characters, without NUL")
    _check_limits(spec.rlimits)


def filtered_environment(env, dropped: tuple[str, ...]) -> dict[str, str]:
    """The submitter's environment less what no job may carry in (loader hooks) and what the
    sysadmin lists in drop_env."""
    drop = set(ALWAYS_DROPPED) | set(dropped)
    return {k: v for k, v in env.items() if k not in drop}
