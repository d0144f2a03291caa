"""airbatch: submit a batch script. Imports stay light: click only where aircli.argv leaves the command
line to it (help, a mistake, a rare form), protobuf never."""
from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

from air.aircli.client import CliError, bad_value, start_tool
from air.aircli.options import (FLAG_KINDS, OPTIONS, SLURM_ONLY, OptionError, export_environment,
                                from_environment, merge_het, not_supported, parse_directives, resolve_tasks)

if TYPE_CHECKING:
    import click

SUBMIT_LINE_CHARS = 4096   # as airctld keeps it (validate.MAX_SUBMIT_LINE)


def _read_script(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CliError(f"cannot read script {path}: {e.strerror}") from None
    if b"\0" in data:
        raise CliError(f"script {path} is a binary file, not a batch script")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise CliError(f"script {path} is not UTF-8 text") from None
    if not text.strip():
        raise CliError(f"script {path} is empty")
    if not text.startswith("#!"):
        raise CliError(f"script {path} does not start with a #! line, such as #!/bin/bash")
    return text


def _cli_values(kwargs: dict) -> dict[str, object]:
    from air.aircli.options import convert
    values = {}
    for opt in OPTIONS:
        raw = kwargs.get(opt.long[2:].replace("-", "_"))
        if raw is None or raw is False:
            continue
        try:
            values[opt.dest] = convert(opt, None if opt.kind in FLAG_KINDS else raw)
        except OptionError as e:
            raise bad_value(opt.long, str(e)) from None
    return values


def _params() -> list[click.Parameter]:
    import click
    params: list[click.Parameter] = []
    for opt in OPTIONS:
        decls = [opt.long] + ([opt.short] if opt.short else [])
        if opt.kind in FLAG_KINDS:
            params.append(click.Option(decls, is_flag=True, default=None, help=opt.help))
        else:
            params.append(click.Option(decls, default=None, metavar="VALUE", help=opt.help))
    params += [
        click.Option(["--parsable"], is_flag=True, help="print the job id alone"),
        click.Option(["--test-only"], is_flag=True, help="check the job and say where it would run; submit nothing"),
        click.Option(["--wrap"], default=None, metavar="COMMAND", help="run COMMAND under /bin/sh instead of a script"),
        click.Option(["--config"], default=None, hidden=True),
        click.Argument(["script"], required=False),
        click.Argument(["args"], nargs=-1),
    ]
    for long, short, takes_value in SLURM_ONLY:   # each refused with its own line, not as a typo
        params.append(click.Option([long] + ([short] if short else []), is_flag=not takes_value, default=None,
                                   expose_value=False, hidden=True, callback=_refuse))
    return params


def _refuse(ctx: click.Context, param: click.Parameter, value) -> None:
    if value is not None and value is not False:
        raise CliError(not_supported(param.opts[0]))


def submit_line() -> str:
    """The command as typed, for history (SubmitLine); cut to what the controller keeps."""
    import shlex
    line = shlex.join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    return line if len(line) <= SUBMIT_LINE_CHARS else line[:SUBMIT_LINE_CHARS - 3] + "..."


def submit(prog: str, script, args, parsable, test_only, wrap, config, **kwargs) -> int:
    """Submit as the command line says (click's parameters, or aircli.argv's same); the exit code."""
    if wrap is not None:
        if script:
            raise CliError("give a script or --wrap, not both")
        text = f"#!/bin/sh\n{wrap}\n"
        name_default = "wrap"
    elif script == ":":
        raise CliError("the components of a heterogeneous job go in the script, between #SBATCH hetjob lines; "
                       "':' on the command line is not supported")
    elif script:
        text = _read_script(script)
        name_default = os.path.basename(script)
    else:
        raise CliError("no batch script given: airbatch [options] script [args...] or --wrap COMMAND")
    try:
        values = parse_directives(text)
        values.update(from_environment(dict(os.environ)))
    except OptionError as e:
        raise CliError(f"{script or '--wrap'}: {e}") from None
    values.update(_cli_values(kwargs))
    components = values.pop("het", None)   # a heterogeneous job: the command line's options are the first's
    het: list[tuple[str, int]] = []
    try:
        if components:
            values, het = merge_het([values, *components[1:]])
        else:
            values = resolve_tasks(values)
    except OptionError as e:
        raise CliError(str(e)) from None
    try:
        env = export_environment(values.get("export", "ALL"), dict(os.environ))
    except OptionError as e:
        raise CliError(str(e)) from None
    workdir = os.path.abspath(values.get("chdir") or os.getcwd())
    if not os.path.isdir(workdir):
        raise CliError(f"--chdir: {workdir} is not a directory")

    from air.protos import rlimits
    from air.aircli.client import Client
    req = dict(   # a JobRequest (protos.schemas), sent without importing protobuf: see protos.protowire
        name=values.get("name") or name_default, script=text, argv=list(args),
        partition=values.get("partition", ""), account=values.get("account", ""),
        nodes=values.get("nodes", 1), gpus_per_node=values.get("gpus_per_node", 0),
        ntasks_per_node=values.get("ntasks_per_node", 0), cpus_per_task=values.get("cpus_per_task", 0),
        time_limit_s=values.get("time", 0), output=values.get("output", ""), error=values.get("error", ""),
        workdir=workdir, environment=env, hold=bool(values.get("hold")),
        dependency=values.get("dependency", ""), qos=values.get("qos", ""), nice=values.get("nice", 0),
        array=values.get("array", ""), begin_time=values.get("begin", 0.0),
        mem_per_node_mb=values.get("mem", 0), mem_per_gpu_mb=values.get("mem_per_gpu", 0),
        hang_timeout_s=values.get("hang_timeout", 0),
        no_requeue=bool(values.get("no_requeue")) and not values.get("requeue"), retries=values.get("retries", 0),
        submit_line=submit_line(), submit_host=os.uname().nodename[:255], comment=values.get("comment", ""),
        wckey=values.get("wckey", ""), mail_type=values.get("mail_type", ""), mail_user=values.get("mail_user", ""),
        open_truncate=values.get("open_mode") == "truncate", nodelist=values.get("nodelist", []),
        exclude=values.get("exclude", []), constraint=values.get("constraint", ""),
        exclusive=bool(values.get("exclusive")),
        het=[dict(name=name or f"{values.get('name') or name_default}+{i}", nodes=nodes)
             for i, (name, nodes) in enumerate(het)],
        rlimits=rlimits.capture())
    if "switches" in values:
        req["switches"], req["switches_wait_s"] = values["switches"]
    if "signal" in values:
        req["warn_signal"], req["warn_time_s"], req["warn_batch_only"] = values["signal"]
        # sbatch's meaning, when called so: without B: the steps' ranks only (the batch shell would die of
        # a signal it does not expect); airbatch's own: the whole job
        req["warn_steps_only"] = not req["warn_batch_only"] and prog == "sbatch"
    client = Client(config)
    reply = client.submit_fields({"job": req, "test_only": test_only})
    if test_only:   # (the controller's words: click.echo, which keeps a terminal's escapes off a pipe)
        import click
        click.echo(f"{prog}: job {reply['message']}")   # (sbatch: as sbatch)
    elif parsable:
        print(reply["job_id"], flush=True)
    else:
        print(f"Submitted batch job {reply['job_id']}", flush=True)
    if values.get("wait") and not test_only:
        return _wait(client, reply["job_id"])
    return 0


def _wait(client, job_id: int) -> int:
    """--wait: poll until the job (every task of an array) has ended, riding out a controller that is
    away a while; 0 if each completed, else the highest exit code (1 for one that had none), as sbatch -W."""
    import time
    from air.protos import air_pb2 as pb
    from air.protos.states import JobPhase, JobResult
    delay, away_since = 0.2, None
    while True:
        try:
            jobs = list(client.list_jobs(pb.JobFilter(job_ids=[job_id], include_old=True)).jobs)
            if not jobs:   # ended and let go from the controller's memory: its history has it
                jobs = [h.job for h in client.history(pb.HistoryRequest(job_ids=[job_id], no_steps=True)).jobs]
            away_since = None
        except CliError as e:   # only a controller away (restarting) is waited out
            away_since = away_since or time.monotonic()
            if e.status != "UNAVAILABLE" or time.monotonic() - away_since > 300:
                raise
            jobs = []
        if jobs and all(j.phase == JobPhase.DONE for j in jobs):
            return max((0 if j.result == JobResult.COMPLETED else j.exit_code or 1) for j in jobs)
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)


def _submit_from_click(**params) -> int:
    import click
    return submit(click.get_current_context().info_name, **params)


@functools.cache
def _command() -> click.Command:
    import click
    return click.Command(
        "airbatch", callback=_submit_from_click, params=_params(),
        context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
        help="Submit a batch script to AIR. Options may also come from #AIR or #SBATCH lines in the script.")


def __getattr__(name: str):   # `command`, the click command, made when first asked for
    if name == "command":
        return _command()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def options() -> dict:
    """The command line's options for aircli.argv: the option table's and airbatch's own."""
    from air.aircli.argv import Param, table
    return table([((o.long,) + ((o.short,) if o.short else ()),
                   Param(o.long[2:].replace("-", "_"), o.kind not in FLAG_KINDS)) for o in OPTIONS] +
                 [(("--parsable",), Param("parsable", False, False)), (("--test-only",), Param("test_only", False, False)),
                  (("--wrap",), Param("wrap", True)), (("--config",), Param("config", True))])


def start(prog: str, argv: list[str]) -> int:
    """airbatch (or sbatch) on argv: read by aircli.argv where it can, else by click."""
    return start_tool(prog, argv, options(), _command, lambda params: submit(prog, **params), script=True)


def main() -> None:
    sys.exit(start("airbatch", sys.argv[1:]))


if __name__ == "__main__":
    main()
