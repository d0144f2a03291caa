"""airacct's records and fields, as sacct names and prints them. Pure: history in, lines out.

A job gives one record for its last (or current) run; with duplicates (-D) one for each earlier
run of a requeued job too, before it. Unless allocations only (-X), each run that started is
followed by its batch step (123.batch) and by its steps (123.0, 123.1, ...)."""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Callable

import hostlist

from air.aircli.slurmtime import stamp
from air.protos import air_pb2 as pb
from air.protos import hetjob
from air.protos.states import JobPhase, REASON_NAMES, Reason, long_state

DEFAULT_FORMAT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
LONG_FORMAT = ("JobID,JobIDRaw,JobName,Partition,QOS,Account,User,Submit,Eligible,Start,End,Elapsed,Timelimit,"
               "NNodes,NodeList,AllocCPUS,AllocTRES,ReqTRES,NTasks,State,ExitCode,RestartCnt,Reason,WorkDir")

# An earlier run's state, from why it was stopped (sacct -D shows them so)
_RUN_STATES = {Reason.PREEMPTED: "PREEMPTED", Reason.NODE_FAIL: "NODE_FAIL", Reason.JOB_LOST: "NODE_FAIL",
               Reason.TIME_LIMIT: "TIMEOUT", Reason.OUT_OF_MEMORY: "OUT_OF_MEMORY"}


@dataclasses.dataclass
class Record:
    job_id: str            # as sacct shows it: 123, 123_4, 123.batch, 123.0
    job_id_raw: str
    name: str
    job: pb.Job            # the job it belongs to
    state: str
    exit_code: str = "0:0"
    start: float = 0.0
    end: float = 0.0
    nodes: tuple[str, ...] = ()
    cpus: int = 0
    gpus: int = 0
    ntasks: int = 0
    run: int = 0
    step: bool = False

    def elapsed(self, now: float) -> int:
        if not self.start:
            return 0
        return int((self.end or now) - self.start)


def records(jobs: list[pb.HistoryJob], duplicates: bool, allocations_only: bool) -> list[Record]:
    out: list[Record] = []
    for entry in jobs:
        job = entry.job
        base = job_id(job)
        if duplicates:
            for run in entry.runs:
                state = _RUN_STATES.get(Reason(run.reason), "REQUEUED")
                code = f"{run.exit_code}:{run.exit_signal}"
                out.extend(_job_records(base, job, state, code, run.start_time, run.end_time, run.allocation,
                                        run.run))
                if not allocations_only:
                    out.extend(_steps(entry, base, run.run, state, run.start_time, run.end_time, run.allocation,
                                      code))
        state = job_state(entry)
        code = f"{job.exit_code}:{job.exit_signal}"
        out.extend(_job_records(base, job, state, code, job.start_time, job.end_time, job.allocation,
                                job.restart_count))
        if not allocations_only and job.start_time:
            out.extend(_steps(entry, base, job.restart_count, state.split()[0], job.start_time, job.end_time,
                              job.allocation, code))
    return out


def _job_records(base: str, job: pb.Job, state: str, code: str, start: float, end: float, allocation,
                 run: int) -> list[Record]:
    """The record of one run of a job; of a heterogeneous job, one per component (123+0, 123+1, ...:
    its name, and its group of the allocation's nodes), as sacct shows them."""
    if not job.request.het:
        return [Record(base, str(job.job_id), job.request.name or "batch", job, state, code, start, end,
                       tuple(a.node for a in allocation), sum(a.cpus for a in allocation),
                       sum(len(a.gpus) for a in allocation), run=run)]
    out = []
    for index, (component, group) in enumerate(hetjob.groups(job.request, list(allocation))):
        out.append(Record(f"{base}+{index}", f"{job.job_id}+{index}", component.name, job, state, code, start, end,
                          tuple(a.node for a in group), sum(a.cpus for a in group),
                          sum(len(a.gpus) for a in group), run=run))
    return out


def _steps(entry: pb.HistoryJob, base: str, run: int, state: str, start: float, end: float, allocation,
           code: str = "0:0") -> list[Record]:
    """The batch step and the numbered steps of one run. The batch step shows its run's state, end and
    exit code; a numbered step the outcome airrun reported for it, or, when it reported none (killed
    with its job, or still running), its run's state and end."""
    job = entry.job
    out = []
    groups = {a.node: f"+{i}" for i, (_, group) in enumerate(hetjob.groups(job.request, list(allocation)))
              for a in group}   # a heterogeneous job's steps are named by their component: 123+1.0
    if allocation:
        first = allocation[0]
        out.append(Record(f"{base}{groups.get(first.node, '')}.batch", f"{job.job_id}.batch", "batch", job, state,
                          code, start, end, (first.node,), first.cpus, len(first.gpus), 1, run, step=True))
    for s in entry.steps:
        if s.run != run:
            continue
        names = tuple(hostlist.expand_hostlist(s.nodes)) if s.nodes else ()
        component = groups.get(names[0], "") if names else ""
        name = _program(s.command)
        held = [a for a in allocation if a.node in names]
        own = (_step_state(s), f"{s.exit_code}:{s.exit_signal}", s.end_time) if s.end_time else (state, "0:0", end)
        out.append(Record(f"{base}{component}.{s.step_id}", f"{job.job_id}.{s.step_id}", name, job, own[0],
                          own[1], s.start_time, own[2], names, sum(a.cpus for a in held),
                          sum(len(a.gpus) for a in held), s.ntasks, run, step=True))
    return out


def _step_state(s: pb.HistoryStep) -> str:
    """sacct's state of a step that airrun reported the end of."""
    if s.cancelled:
        return "CANCELLED"
    return "FAILED" if s.exit_code or s.exit_signal else "COMPLETED"


def _program(command: str) -> str:
    """The name sacct gives a step: its program's (the command is kept cut at 1 KiB, maybe mid-quote)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return words[0].rsplit("/", 1)[-1] if words else ""


def job_id(job: pb.Job) -> str:
    return f"{job.array_job_id}_{job.array_task_id}" if job.array_job_id else str(job.job_id)


def job_state(entry: pb.HistoryJob) -> str:
    """Slurm's state name; CANCELLED by UID for a cancelled job, as sacct shows it."""
    job = entry.job
    state = long_state(job.phase, job.result)
    if state == "CANCELLED" and entry.cancelled:
        return f"CANCELLED by {entry.cancelled_by}"
    return state


def hms(seconds: int) -> str:
    """sacct's durations: HH:MM:SS, D-HH:MM:SS past a day."""
    days, s = divmod(max(0, int(seconds)), 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def _tres(cpus: int, gpus: int, nodes: int, mem_mb: int) -> str:
    parts = [f"billing={cpus}", f"cpu={cpus}"]
    if gpus:
        parts.append(f"gres/gpu={gpus}")
    if mem_mb:
        parts.append(f"mem={mem_mb}M")
    parts.append(f"node={nodes}")
    return ",".join(parts)


def _mem_mb(job: pb.Job, nodes: int) -> int:
    req = job.request
    per_node = req.mem_per_node_mb or req.mem_per_gpu_mb * req.gpus_per_node
    return per_node * nodes


def _alloc_tres(r: Record, now: float = 0.0) -> str:
    if not r.nodes:
        return ""
    return _tres(r.cpus, r.gpus, len(r.nodes), 0 if r.step else _mem_mb(r.job, len(r.nodes)))


def _req_tres(r: Record, now: float = 0.0) -> str:
    if r.step:
        return ""
    req, nodes = r.job.request, r.job.request.nodes or 1
    cpus = max(1, req.cpus_per_task) * max(1, req.ntasks_per_node) * nodes
    return _tres(cpus, req.gpus_per_node * nodes, nodes, _mem_mb(r.job, nodes))


def _eligible(r: Record, now: float = 0.0) -> str:
    if r.step:
        return stamp(r.start)
    return stamp(max(r.job.submit_time, r.job.request.begin_time))


def _timelimit(r: Record, now: float = 0.0) -> str:
    if r.step:
        return ""
    return "UNLIMITED" if not r.job.time_limit_s else hms(r.job.time_limit_s)


def _reason(r: Record, now: float = 0.0) -> str:
    if r.step:
        return ""
    return REASON_NAMES.get(Reason(r.job.reason), "None") if r.job.phase == JobPhase.PENDING else "None"


def _nodelist(r: Record, now: float = 0.0) -> str:
    if not r.nodes:
        return "None assigned"
    return hostlist.collect_hostlist(list(r.nodes))


def _submit_line(r: Record, now: float = 0.0) -> str:
    return "" if r.step else r.job.request.submit_line


# name (as sacct spells it) -> (default width, right-aligned, getter(record, now))
FIELDS: dict[str, tuple[int, bool, Callable[[Record, float], object]]] = {
    "JobID": (12, False, lambda r, now: r.job_id),
    "JobIDRaw": (12, False, lambda r, now: r.job_id_raw),
    "JobName": (10, True, lambda r, now: r.name),
    "User": (9, True, lambda r, now: "" if r.step else r.job.user),
    "UID": (6, True, lambda r, now: "" if r.step else r.job.uid),
    "Group": (9, True, lambda r, now: "" if r.step else _group(r.job.gid)),
    "GID": (6, True, lambda r, now: "" if r.step else r.job.gid),
    "Account": (10, True, lambda r, now: r.job.request.account),
    "Partition": (10, True, lambda r, now: "" if r.step else r.job.partition),
    "QOS": (10, True, lambda r, now: "" if r.step else r.job.request.qos),
    "State": (10, True, lambda r, now: r.state),
    "ExitCode": (8, True, lambda r, now: r.exit_code),
    "Submit": (19, True, lambda r, now: stamp(r.start if r.step else r.job.submit_time)),
    "Eligible": (19, True, _eligible),
    "Start": (19, True, lambda r, now: stamp(r.start)),
    "End": (19, True, lambda r, now: stamp(r.end)),
    "Elapsed": (10, True, lambda r, now: hms(r.elapsed(now))),
    "ElapsedRaw": (10, True, lambda r, now: r.elapsed(now)),
    "Timelimit": (10, True, _timelimit),
    "TimelimitRaw": (12, True, lambda r, now: "" if r.step else
                     (-(-r.job.time_limit_s // 60) if r.job.time_limit_s else "UNLIMITED")),   # minutes, up
    "NNodes": (8, True, lambda r, now: len(r.nodes) if r.nodes else (r.job.request.nodes or 1)),
    "NodeList": (15, True, _nodelist),
    "AllocCPUS": (10, True, lambda r, now: r.cpus),
    "AllocNodes": (10, True, lambda r, now: len(r.nodes)),
    "AllocTRES": (10, True, _alloc_tres),
    "ReqTRES": (10, True, _req_tres),
    "ReqCPUS": (8, True, lambda r, now: "" if r.step else max(1, r.job.request.cpus_per_task)
                * max(1, r.job.request.ntasks_per_node) * (r.job.request.nodes or 1)),
    "ReqNodes": (8, True, lambda r, now: "" if r.step else (r.job.request.nodes or 1)),
    "NTasks": (8, True, lambda r, now: r.ntasks if r.step else ""),
    "RestartCnt": (10, True, lambda r, now: "" if r.step else r.job.restart_count),
    "Reason": (20, True, _reason),
    "WorkDir": (20, True, lambda r, now: "" if r.step else r.job.request.workdir),
    "SubmitLine": (20, True, _submit_line),
    "Priority": (10, True, lambda r, now: "" if r.step else r.job.priority),
    "Comment": (20, True, lambda r, now: "" if r.step else r.job.request.comment),
    "WCKey": (10, True, lambda r, now: "" if r.step else r.job.request.wckey),
    "Goodput": (8, True, lambda r, now: _goodput(r, lambda g: f"{g.ettr * 100:.1f}%" if g.wall_s else "")),
    "QueueTime": (10, True, lambda r, now: _goodput(r, lambda g: hms(g.queued_s))),
    "StartupTime": (11, True, lambda r, now: _goodput(r, lambda g: hms(g.starting_s))),
    "RestoreTime": (11, True, lambda r, now: _goodput(r, lambda g: hms(g.restoring_s))),
    "TrainTime": (10, True, lambda r, now: _goodput(r, lambda g: hms(g.training_s))),
    "CkptTime": (10, True, lambda r, now: _goodput(r, lambda g: hms(g.checkpoint_s))),
    "LostWork": (10, True, lambda r, now: _goodput(r, lambda g: hms(g.lost_s))),
    "LostSteps": (9, True, lambda r, now: _goodput(r, lambda g: g.lost_steps)),
    "DownTime": (10, True, lambda r, now: _goodput(r, lambda g: hms(g.down_s))),
    "OtherTime": (10, True, lambda r, now: _goodput(r, lambda g: hms(g.other_s))),
    "ArrayJobID": (12, True, lambda r, now: r.job.array_job_id or ""),
    "ArrayTaskID": (12, True, lambda r, now: r.job.array_task_id if r.job.array_job_id else ""),
}
_BY_LOWER = {k.lower(): k for k in FIELDS}
_SPEC = re.compile(r"^([A-Za-z]+)(?:%(-?\d+))?$")


def _goodput(r: Record, show: Callable[[pb.Goodput], object]) -> object:
    """Goodput is the whole job's: on its own record (its last or current run), not on steps or earlier runs."""
    if r.step or r.run != r.job.restart_count or not r.job.HasField("goodput"):
        return ""
    return show(r.job.goodput)


def _group(gid: int) -> str:
    import grp
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class FormatError(ValueError):
    pass


@dataclasses.dataclass
class Column:
    name: str
    width: int
    right: bool
    get: Callable[[Record, float], object]


def columns(spec: str) -> list[Column]:
    """-o/--format: comma-separated field names (any case), each with an optional %WIDTH (a negative
    width left-aligns)."""
    out = []
    for part in spec.replace(" ", ",").split(","):
        if not part:
            continue
        m = _SPEC.match(part)
        name = _BY_LOWER.get(m.group(1).lower()) if m else None
        if name is None:
            raise FormatError(f"unknown field {part!r}; fields: {', '.join(FIELDS)}")
        width, right, get = FIELDS[name]
        if m.group(2):
            n = int(m.group(2))
            width, right = abs(n), (right and n > 0)
        out.append(Column(name, width, right, get))
    if not out:
        raise FormatError("no fields in the format")
    return out


def _fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:   # sacct marks a cut value with a +
        text = text[:max(0, width - 1)] + "+"
    return text.rjust(width) if right else text.ljust(width)


def render(rows: list[Record], cols: list[Column], now: float, header: bool = True,
           delimiter: str | None = None, trailing: bool = False) -> list[str]:
    """Columns as sacct prints them; with a delimiter (-p, -P), values whole and separated."""
    lines = []
    if delimiter is not None:
        end = delimiter if trailing else ""
        if header:
            lines.append(delimiter.join(c.name for c in cols) + end)
        for r in rows:   # a value never holds the delimiter (a hostile name would forge fields)
            lines.append(delimiter.join(_clean(c.get(r, now)).replace(delimiter, "?") for c in cols) + end)
        return lines
    if header:
        lines.append(" ".join(_fit(c.name[:c.width], c.width, c.right) for c in cols))
        lines.append(" ".join("-" * c.width for c in cols))
    for r in rows:
        lines.append(" ".join(_fit(_clean(c.get(r, now)), c.width, c.right) for c in cols))
    return lines


def _clean(value: object) -> str:
    """One line, no terminal controls: names and commands are the user's own text."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def to_json(jobs: list[pb.HistoryJob], now: float, duplicates: bool) -> dict:
    """sacct --json's shape: jobs (each with its steps; with -D an entry for each earlier run too),
    meta, errors, warnings."""
    out: list[dict] = []
    for r in records(jobs, duplicates, allocations_only=False):
        if r.step:
            out[-1]["steps"].append({
                "step": {"id": r.job_id_raw, "name": r.name}, "state": r.state.split()[0],
                "exit_code": _exit_json(*map(int, r.exit_code.split(":"))),
                "time": {"start": int(r.start), "end": int(r.end), "elapsed": r.elapsed(now)},
                "nodes": {"count": len(r.nodes), "range": _nodelist(r)}, "tasks": {"count": r.ntasks}})
            continue
        job = r.job
        out.append({
            "job_id": job.job_id, "name": r.name, "user": job.user, "account": job.request.account,
            "partition": job.partition, "qos": job.request.qos,
            "array": {"job_id": job.array_job_id,
                      "task_id": {"set": bool(job.array_job_id), "infinite": False, "number": job.array_task_id}},
            "state": {"current": [r.state.split()[0]], "reason": _reason(r)},
            "exit_code": _exit_json(*map(int, r.exit_code.split(":"))),
            "time": {"submission": int(job.submit_time), "eligible": int(max(job.submit_time, job.request.begin_time)),
                     "start": int(r.start), "end": int(r.end), "elapsed": r.elapsed(now),
                     "limit": {"set": bool(job.time_limit_s), "infinite": not job.time_limit_s,
                               "number": job.time_limit_s // 60}},
            "nodes": _nodelist(r) if r.nodes else "", "allocation_nodes": len(r.nodes),
            "restart_cnt": job.restart_count, "working_directory": job.request.workdir,
            "submit_line": job.request.submit_line,
            "priority": {"set": True, "infinite": False, "number": job.priority},
            "tres": {"allocated": _tres_json(_alloc_tres(r)), "requested": _tres_json(_req_tres(r))},
            "steps": []})
    return {"meta": {"plugin": {"type": "openapi/air", "name": "airacct"}, "client": {"source": "airacct"},
                     "slurm": {"version": {"major": "24", "minor": "05", "micro": "0"}, "release": "AIR"}},
            "jobs": out, "errors": [], "warnings": []}


def _exit_json(code: int, sig: int) -> dict:
    status = "SUCCESS" if code == 0 and sig == 0 else ("SIGNALED" if sig else "ERROR")
    return {"status": [status], "return_code": {"set": True, "infinite": False, "number": code},
            "signal": {"id": {"set": bool(sig), "infinite": False, "number": sig}, "name": _signame(sig)}}


def _signame(sig: int) -> str:
    import signal
    try:
        return signal.Signals(sig).name if sig else ""
    except ValueError:
        return ""


def _tres_json(text: str) -> list[dict]:
    out = []
    for part in filter(None, text.split(",")):
        key, _, count = part.partition("=")
        kind, _, name = key.partition("/")
        out.append({"type": kind, "name": name, "count": int(count.rstrip("M") or 0)})
    return out
