"""squeue's job rows: `%`-field format strings and the job fields they name. Pure. airq renders them,
and so does airctld, which keeps each job's row in squeue's default format rendered until the job
changes (a plain `airq` over a large queue then only joins them)."""
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Callable

import hostlist

from air.protos.limits import is_number
from air.protos.timefmt import format_duration
from air.protos.timefmt import format_limit
from air.protos.reports import report_numbers
from air.protos.states import JobPhase, JobResult, REASON_NAMES, Reason, long_state, state_code

if TYPE_CHECKING:   # (the generated code is imported where a job is made: airq's plain rows need none)
    from air.protos import air_pb2 as pb

SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"

_FIELD = re.compile(r"%(\.)?(-)?(\d+)?([A-Za-z%])")


class FormatError(Exception):
    pass


def compile_format(fmt: str, fields: dict[str, tuple[str, Callable]]) -> list:
    """Split a format into literal text and (header, getter, width, right) items."""
    items: list = []
    pos = 0
    for m in _FIELD.finditer(fmt):
        if m.start() > pos:
            items.append(fmt[pos:m.start()])
        right, _, width, key = m.groups()
        if key == "%":
            items.append("%")
        elif key not in fields:
            raise FormatError(f"unknown format field %{key} in {fmt!r}; known: "
                              + " ".join("%" + k for k in sorted(fields)))
        else:
            header, getter = fields[key]
            items.append((header, getter, int(width) if width else 0, bool(right)))
        pos = m.end()
    if pos < len(fmt):
        items.append(fmt[pos:])
    return items


# squeue -O/--Format names and the %-field each is
LONG_FIELDS = {
    "jobid": "i", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K", "qos": "q", "partition": "P",
    "name": "j", "username": "u", "userid": "U", "account": "a", "statecompact": "t", "state": "T",
    "timeused": "M", "timelimit": "l", "numnodes": "D", "numcpus": "C", "reasonlist": "R", "reason": "r",
    "nodelist": "N", "tres-per-node": "b", "priority": "Q", "prioritylong": "Q", "submittime": "V",
    "starttime": "S", "endtime": "e", "workdir": "Z",
}


def long_format(spec: str) -> str:
    """squeue -O: NAME[:[.]SIZE],... (20 wide, left-aligned unless the size starts with a dot) as a
    %-field format."""
    out = []
    for part in filter(None, spec.split(",")):
        name, _, size = part.partition(":")
        code = LONG_FIELDS.get(name.strip().lower())
        if code is None:
            raise FormatError(f"unknown -O field {name!r}; known: {', '.join(sorted(LONG_FIELDS))}")
        right = size.startswith(".")
        width = size.lstrip(".") or "20"
        if not is_number(width):
            raise FormatError(f"-O {part!r}: the size after : is a number")
        out.append(f"%{'.' if right else ''}{width}{code}")
    if not out:
        raise FormatError("-O names no field")
    return " ".join(out)


def _printf(items: list) -> str:
    """The items as one %-format string: `%-9.9s` (left) or `%9.9s` (right) for a field of width 9."""
    parts = []
    for i in items:
        if isinstance(i, str):
            parts.append(i.replace("%", "%%"))
        else:
            width = f"{i[2]}.{i[2]}" if i[2] else ""
            parts.append(f"%{'' if i[3] else '-'}{width}s")
    return "".join(parts)


def render(items: list, rows, header: bool) -> list[str]:
    fmt = _printf(items)
    getters = [i[1] for i in items if not isinstance(i, str)]
    lines = []
    if header:
        lines.append((fmt % tuple(i[0] for i in items if not isinstance(i, str))).rstrip())
    lines.extend((fmt % tuple([g(row) for g in getters])).rstrip() for row in rows)
    return lines


# ---------------------------------------------------------------- jobs

def nodelist(job: pb.Job) -> str:
    return hostlist.collect_hostlist([a.node for a in job.allocation]) if job.allocation else ""


def reason_text(job: pb.Job) -> str:
    return REASON_NAMES[Reason(job.reason)]


_STATE_CODES = {(p, r): state_code(p, r) for p in JobPhase for r in JobResult}


def elapsed(job: pb.Job, now: float) -> float:
    if not job.start_time:
        return 0.0
    end = job.end_time if job.phase == JobPhase.DONE and job.end_time else now
    return end - job.start_time


def _reason_or_nodes(job: pb.Job) -> str:
    if job.phase == JobPhase.PENDING or not job.allocation:
        return f"({reason_text(job)})"
    return nodelist(job)


def _gres(job: pb.Job) -> str:
    return f"gres/gpu:{job.request.gpus_per_node}" if job.request.gpus_per_node else "N/A"


def _timestamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "N/A"


def job_id_text(job: pb.Job) -> str:
    """123, 123_7 for a task of array 123, or 123_[4-99%8] for an array's pending tasks in one row."""
    if not job.array_job_id:
        return str(job.job_id)
    if job.array_pending_tasks:
        throttle = f"%{job.request.array_max_running}" if job.request.array_max_running else ""
        tasks = job.array_pending_tasks
        return f"{job.array_job_id}_{tasks}" if is_number(tasks) and not throttle else \
            f"{job.array_job_id}_[{tasks}{throttle}]"
    return f"{job.array_job_id}_{job.array_task_id}"


def compact_arrays(jobs) -> list[pb.Job]:
    """The listing with each array's pending tasks folded into one row, as squeue shows them."""
    from air.protos import air_pb2 as pb
    from air.protos.arrays import compact
    out: list = []
    rows: dict[int, tuple[pb.Job, list[int]]] = {}
    for job in jobs:
        if job.array_job_id and job.phase == JobPhase.PENDING:
            row = rows.get(job.array_job_id)
            if row is None:
                first = pb.Job()
                first.CopyFrom(job)
                rows[job.array_job_id] = row = (first, [])
                out.append(first)
            row[1].append(job.array_task_id)
            continue
        out.append(job)
    for first, tasks in rows.values():
        first.array_pending_tasks = compact(tasks)
        first.array_tasks_pending = len(tasks)
    return out


def progress_of(job: pb.Job) -> dict:
    """The numbers of a job's newest progress report. A report is the job's own text: anything but a
    JSON object of numbers (strings with terminal escapes, nested values, 400-digit integers) is left out."""
    return report_numbers(job.progress)


def _progress_field(key: str, fmt: str) -> Callable[[pb.Job], str]:
    def get(job: pb.Job) -> str:
        value = progress_of(job).get(key)
        return fmt.format(value) if value is not None else "-"
    return get


def _checkpoint_age(now: float) -> Callable[[pb.Job], str]:
    """The newest checkpoint: its step and how long ago it was written ("120@45s")."""
    def get(job: pb.Job) -> str:
        p = progress_of(job)
        if not p.get("checkpoint_step"):
            return "-"
        age = f"@{max(0, now - p['checkpoint_time']):.0f}s" if p.get("checkpoint_time") else ""
        return f"{p['checkpoint_step']:.0f}{age}"
    return get


SQUEUE_LONG = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %.8s %.9L %.9k %.6f %.10c %.14y %R"


def _restarts(job: pb.Job) -> str:
    """How many times the job restarted, and why it last stopped ("2:Preempted")."""
    if not job.restart_count:
        return "0"
    return f"{job.restart_count}:{REASON_NAMES[Reason(job.last_stop_reason)]}"


def job_fields(now: float) -> dict[str, tuple[str, Callable[[pb.Job], object]]]:
    return {
        "s": ("STEP", _progress_field("step", "{}")),
        "L": ("LOSS", _progress_field("loss", "{:.4f}")),
        "k": ("TOK/S", _progress_field("tokens_per_s", "{:.0f}")),
        "f": ("MFU", _progress_field("mfu", "{:.1%}")),
        "c": ("LAST_CKPT", _checkpoint_age(now)),
        "y": ("RESTARTS", _restarts),
        "i": ("JOBID", job_id_text),
        "A": ("JOBID", lambda j: j.job_id),
        "F": ("ARRAY_JOB_ID", lambda j: j.array_job_id or j.job_id),
        "K": ("ARRAY_TASK_ID", lambda j: (j.array_pending_tasks or j.array_task_id) if j.array_job_id else "N/A"),
        "q": ("QOS", lambda j: j.request.qos or "normal"),
        "P": ("PARTITION", lambda j: j.partition),
        "j": ("NAME", lambda j: j.request.name),
        "u": ("USER", lambda j: j.user),
        "U": ("UID", lambda j: j.uid),
        "a": ("ACCOUNT", lambda j: j.request.account or "(null)"),
        "t": ("ST", lambda j: _STATE_CODES[j.phase, j.result]),
        "T": ("STATE", lambda j: long_state(j.phase, j.result)),
        "M": ("TIME", lambda j: format_duration(elapsed(j, now)) if j.start_time else "0:00"),
        "l": ("TIME_LIMIT", lambda j: format_limit(j.time_limit_s)),
        "D": ("NODES", lambda j: len(j.allocation) or j.request.nodes or 1),
        "C": ("CPUS", lambda j: sum(a.cpus for a in j.allocation) or
              (j.request.nodes or 1) * (j.request.ntasks_per_node or 1) * (j.request.cpus_per_task or 1)),
        "R": ("NODELIST(REASON)", _reason_or_nodes),
        "r": ("REASON", reason_text),
        "N": ("NODELIST", nodelist),
        "b": ("TRES_PER_NODE", _gres),
        "Q": ("PRIORITY", lambda j: j.priority),
        "V": ("SUBMIT_TIME", lambda j: _timestamp(j.submit_time)),
        "S": ("START_TIME", lambda j: _timestamp(j.start_time)),
        "e": ("END_TIME", lambda j: _timestamp(j.end_time)),
        "Z": ("WORK_DIR", lambda j: j.request.workdir),
    }
