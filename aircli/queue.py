"""airq: the job queue, as squeue shows it."""
from __future__ import annotations

import codecs
import functools
import os
import pwd
import sys
import time
from typing import TYPE_CHECKING

from air.aircli.argv import rows_table
from air.aircli.client import CliError, bad_value, click_options, start_tool
from air.protos.limits import is_number

if TYPE_CHECKING:
    import click


def _write_rows(head: str, rows) -> None:
    """The header, then the controller's rows (UTF-8 bytes) as they came, in one write where stdout
    takes UTF-8 bytes: no decode, copy and encode of megabytes (16 ms of a large queue's airq), and a
    reader that stops after the first lines (`airq | head`) gets all of a short listing at once."""
    out = getattr(sys.stdout, "buffer", None)
    if rows and out is not None and codecs.lookup(sys.stdout.encoding or "ascii").name == "utf-8":
        sys.stdout.flush()
        out.write(head.encode() + rows)
    else:
        sys.stdout.write(head + (str(rows, "utf-8", "replace") if rows else ""))


def uid_of(user: str) -> int:
    """A user name or numeric uid given on the command line, resolved locally."""
    if is_number(user):
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise CliError(f"user {user!r} does not exist") from None


def job_ids(text: str, option: str, tasks: list | None = None, required: bool = False) -> list[int]:
    """Job ids (123); with `tasks`, array tasks too (123_7), appended to it as (array id, task id).
    `required`: text that names no job ("", ",") is refused, where a filter left without it would
    name more jobs (`aircancel "$J" -n x` with J unset)."""
    ids = []
    had = len(tasks) if tasks is not None else 0
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        array, sep, task = part.partition("_")
        if sep and tasks is not None and is_number(array) and is_number(task) and int(array) >= 1:
            tasks.append((int(array), int(task)))
            continue
        if not is_number(part) or int(part) < 1:
            raise bad_value(option, f"{part!r} is not a job id (such as 123, or 123_7 for a task of an array)")
        ids.append(int(part))
    if required and not ids and (tasks is None or len(tasks) == had):
        raise bad_value(option, f"{text!r} names no job")
    return ids


def state_filter(text: str, option: str) -> tuple[list[int], list[int]]:
    """States as codes or long names (PD, R, CG, CD, F, CA, TO, NF; PENDING, ...): (phases, results)."""
    from air.protos.states import CODE_TO_LONG, JobPhase, JobResult
    phases, results = [], []
    for part in text.upper().split(","):
        long = CODE_TO_LONG.get(part, part)
        if long in ("PENDING", "RUNNING", "COMPLETING"):
            phases.append(JobPhase[long])
        elif long in JobResult.__members__ and long != "NONE":
            results.append(JobResult[long])
        elif long == "ALL":
            continue
        else:
            raise bad_value(option, f"unknown state {part!r}; use PD, R, CG, CD, F, CA, TO, NF or their long names")
    if results:
        phases.append(JobPhase.DONE)
    return phases, results


# (names, click's parameter name, takes a value, help; None: hidden)
OPTIONS: tuple[tuple[tuple[str, ...], str, bool, str | None], ...] = (
    (("-u", "--user"), "users", True, "only these users' jobs (comma-separated names or uids)"),
    (("--me",), "me", False, "only my jobs"),
    (("-t", "--states"), "states", True, "only jobs in these states (PD,R,CD,...)"),
    (("-j", "--jobs"), "jobs", True, "only these job ids"),
    (("-n", "--name"), "names", True, "only jobs with these names"),
    (("-h", "--noheader"), "noheader", False, "no header line"),
    (("-o", "--format"), "fmt", True, "squeue-style %-field format"),
    (("-O", "--Format"), "long_fmt", True, "squeue's field names: JobID,Name:30,State,..."),
    (("-p", "--partition"), "partitions", True, "only jobs in these partitions (comma-separated)"),
    (("--json",), "as_json", False, "JSON for programs"),
    (("-r", "--array"), "expand_arrays", False, "one line per array task"),
    (("-l", "--long"), "long_", False,
     "with running jobs' progress: STEP, LOSS, TOK/S, MFU, LAST_CKPT (from runtime reports)"),
    (("--priority",), "show_priority", False, "pending jobs' priority factors, weighted (as sprio shows them)"),
    (("--start",), "show_start", False, "pending jobs' estimated start times"),
    (("--config",), "config", True, None),
)


def listing(users, me, states, jobs, names, noheader, fmt, long_fmt, partitions, as_json, expand_arrays, long_,
            show_priority, show_start, config) -> None:
    """airq's work, on click's parameters (or aircli.argv's same)."""
    from air.aircli.client import Client
    from air.protos import squeue
    wanted: dict = {}   # a JobFilter, as protos.protowire's dict: a plain airq sends it without protobuf
    tasks: list = []
    if users or me:
        wanted["uids"] = [uid_of(u) for u in (users or "").split(",") if u] + ([os.getuid()] if me else [])
    if jobs:
        wanted["job_ids"] = job_ids(jobs, "'-j'", tasks)
        wanted["array_tasks"] = [{"array_job_id": a, "task_id": t} for a, t in tasks]
    if names:
        wanted["names"] = [n for n in names.split(",") if n]
    if states:
        wanted["phases"], wanted["results"] = state_filter(states, "'-t'")
    if partitions:
        wanted["partitions"] = [p for p in partitions.split(",") if p]
    try:
        if long_fmt:
            fmt = squeue.long_format(long_fmt)
        items = squeue.compile_format(fmt or (squeue.SQUEUE_LONG if long_ else squeue.SQUEUE_DEFAULT),
                                       squeue.job_fields(time.time()))
    except squeue.FormatError as e:
        raise bad_value("'-O'" if long_fmt else "'-o'", str(e)) from None
    sent: list[bytes] | None = None
    if not (fmt or long_ or as_json or show_priority or show_start):   # squeue's default rows, kept rendered
        plain = Client(config).list_jobs_fields({**wanted, "rendered": True, "expand_arrays": expand_arrays},
                                                as_sent=frozenset({"rendered"}))
        if plain["rendered"] or not plain["jobs"]:
            _write_rows(squeue.render(items, [], header=True)[0] + "\n" if not noheader else "", plain["rendered"])
            return
        sent = plain["jobs"]   # (a controller from before rendered rows sends jobs)
    from air.aircli import formats
    from air.protos import air_pb2 as pb
    filt = pb.JobFilter(**{k: v for k, v in wanted.items() if k != "array_tasks"},
                        array_tasks=[pb.ArrayTask(**t) for t in wanted.get("array_tasks", ())])
    if show_priority or show_start:
        filt.ClearField("phases")
        filt.phases.append(pb.JOB_PHASE_PENDING)
        pending = Client(config).pending(filt).jobs
        if as_json:
            import json
            keys = ("job_id", "user", "account", "partition", "qos", "priority", "age", "fairshare", "jobsize",
                    "partition_factor", "qos_factor", "nice", "est_start")
            json.dump({"jobs": [{k: getattr(p, k) for k in keys} | {"est_nodes": list(p.est_nodes)} for p in pending]},
                      sys.stdout, indent=1)
            sys.stdout.write("\n")
            return
        rows = formats.priority_rows(pending) if show_priority else formats.start_rows(pending)
        lines = formats.table(rows, header=not noheader, left=(0, 1, 2, 3))
        sys.stdout.write("\n".join(lines) + "\n" if lines else "")
        return
    filt.with_progress = bool(long_ or as_json or (fmt and any(f in fmt for f in ("%s", "%L", "%k", "%f", "%c"))))
    listed = Client(config).list_jobs(filt).jobs if sent is None else [pb.Job.FromString(j) for j in sent]
    now = time.time()
    if filt.partitions:   # (a controller from before JobFilter.partitions sends every partition's)
        listed = [j for j in listed if j.partition in filt.partitions]
    rows = listed if expand_arrays else squeue.compact_arrays(listed)
    if as_json:
        import json
        json.dump({"jobs": [formats.job_json(j, now) for j in rows]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    lines = squeue.render(items, rows, header=not noheader)
    sys.stdout.write("\n".join(lines) + "\n" if lines else "")


@functools.cache
def _command() -> click.Command:
    import click
    return click.Command("command", callback=listing, params=click_options(OPTIONS),
                         context_settings={"help_option_names": ["--help"]})


def __getattr__(name: str):   # `command`, the click command, made when first asked for
    if name == "command":
        return _command()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def start(prog: str, argv: list[str]) -> int:
    """airq (or squeue) on argv: read by aircli.argv where it can, else by click."""
    return start_tool(prog, argv, rows_table(OPTIONS), _command, lambda params: listing(**params) or 0)


def main() -> None:
    sys.exit(start("airq", sys.argv[1:]))


if __name__ == "__main__":
    main()
