"""aircontrol: the admin tool (scontrol's job): show jobs and nodes, run a local cluster."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from air.aircli.client import CliError, entry
from air.protos.limits import is_number


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Inspect and administer an AIR cluster."""


@command.group()
def show():
    """Show a job or a node, as Key=Value pairs."""


@show.command("job")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.option("--config", hidden=True)
def show_job(job_id, as_json, config):
    from air.aircli import formats
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    if not is_number(job_id):
        raise click.BadParameter(f"{job_id!r} is not a job id", param_hint="'JOB_ID'")
    job = Client(config).get_job(pb.GetJobRequest(job_id=int(job_id)))
    if as_json:
        json.dump(formats.job_json(job, time.time()), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    click.echo("\n".join(formats.job_keyvalues(job, time.time())))


@show.command("node")
@click.argument("name")
@click.option("--config", hidden=True)
def show_node(name, config):
    from air.aircli import formats
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    node = Client(config).get_node(pb.GetNodeRequest(name=name))
    click.echo("\n".join(formats.node_keyvalues(node)))


@show.command("partition")
@click.argument("name", required=False)
@click.option("--config", hidden=True)
def show_partition(name, config):
    """Every partition, or one."""
    from air.aircli import formats
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    reply = Client(config).list_nodes(pb.ListNodesRequest())
    parts = [p for p in reply.partitions if name is None or p.name == name]
    if not parts:
        raise CliError(f"partition {name!r} does not exist; partitions: "
                       f"{', '.join(p.name for p in reply.partitions)}")
    click.echo("\n\n".join("\n".join(formats.partition_keyvalues(p, list(reply.nodes))) for p in parts))


@show.command("hostnames")
@click.argument("hostlist_text", metavar="[HOSTLIST]", required=False)
def show_hostnames(hostlist_text):
    """One name per line; with no list, the job's own ($SLURM_JOB_NODELIST, as scontrol does)."""
    import hostlist
    import os
    if hostlist_text is None:
        hostlist_text = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("AIR_JOB_NODELIST")
        if not hostlist_text:
            raise CliError("no host list given, and none in $SLURM_JOB_NODELIST (not inside a job?)")
    try:
        click.echo("\n".join(hostlist.expand_hostlist(hostlist_text)))
    except hostlist.BadHostlist as e:
        raise CliError(f"{hostlist_text!r} is not a host list: {e}") from None


def _hold(ids, hold, config):
    from air.aircli.client import Client
    from air.aircli.queue import job_ids
    from air.protos import air_pb2 as pb
    filt = pb.JobFilter()
    for text in ids:
        filt.job_ids.extend(job_ids(text, "'JOB_ID'", required=True))
    Client(config).hold(pb.HoldRequest(filter=filt, hold=hold))


@command.command("requeue")
@click.argument("ids", nargs=-1, required=True)
@click.option("--config", hidden=True)
def requeue(ids, config):
    """Stop running jobs cleanly (SIGTERM, grace time to checkpoint) and put them back in the queue."""
    from air.aircli.client import Client
    from air.aircli.queue import job_ids
    from air.protos import air_pb2 as pb
    import signal
    filt, tasks = pb.JobFilter(), []
    for text in ids:
        filt.job_ids.extend(job_ids(text, "'JOB_ID'", tasks, required=True))
    filt.array_tasks.extend(pb.ArrayTask(array_job_id=a, task_id=t) for a, t in tasks)
    client = Client(config)
    # called from inside the job it requeues (submitit, Lightning), this process is the job's too: the
    # SIGTERM of the requeue may come before the answer, which the caller wants (it checks the exit code)
    mine = [env for env in (os.environ.get("AIR_JOB_ID", ""), os.environ.get("SLURM_ARRAY_JOB_ID", ""))
            if is_number(env)]
    task = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    if any(int(i) in filt.job_ids for i in mine) or \
            (len(mine) == 2 and is_number(task) and (int(mine[1]), int(task)) in tasks):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    client.requeue(filt)


@command.command("update", context_settings={"ignore_unknown_options": True})
@click.argument("settings", nargs=-1, required=True)
@click.option("--config", hidden=True)
def update(settings, config):
    """Change a job, as scontrol update: JobId=N TimeLimit=T (Slurm's time forms, UNLIMITED, or +T/-T
    to add or take off). Owners may lower a time limit; only root and operators may raise one."""
    from air.aircli.client import Client
    from air.aircli.queue import job_ids
    from air.protos import air_pb2 as pb
    job, limit = parse_update(settings)
    tasks: list = []
    ids = job_ids(job, "JobId", tasks, required=True)
    req = pb.UpdateJobRequest(filter=pb.JobFilter(job_ids=ids, array_tasks=[
        pb.ArrayTask(array_job_id=a, task_id=t) for a, t in tasks]))
    req.time_limit_s, req.time_limit_change = limit
    Client(config).update_job(req)


def parse_update(settings) -> tuple[str, tuple[int, int]]:
    """(the JobId text, (seconds, change)) from scontrol update's KEY=VALUE words; CliError names a
    word AIR does not take."""
    from air.protos.timefmt import parse_duration
    values = {}
    for word in settings:
        key, eq, value = word.partition("=")
        key = {"jobid": "jobid", "job": "jobid", "timelimit": "timelimit"}.get(key.lower())
        if not eq or not value:
            raise CliError(f"update: {word!r}: give KEY=VALUE, such as JobId=42 TimeLimit=2:00:00")
        if key is None:
            raise CliError(f"update: {word.partition('=')[0]!r}: AIR updates JobId=N TimeLimit=T only")
        values[key] = value
    if "jobid" not in values or "timelimit" not in values:
        raise CliError("update: give JobId=N and TimeLimit=T")
    text = values["timelimit"]
    change = {"+": 1, "-": -1}.get(text[:1], 0)
    try:
        seconds = parse_duration(text[1:] if change else text)
    except ValueError as e:
        raise CliError(f"update: TimeLimit={text}: {e}") from None
    if change and not seconds:
        raise CliError(f"update: TimeLimit={text}: add or take off a time, not UNLIMITED")
    return values["jobid"], (seconds, change)


@command.command("hold")
@click.argument("ids", nargs=-1, required=True)
@click.option("--config", hidden=True)
def hold(ids, config):
    """Keep pending jobs from starting (reason JobHeldUser)."""
    _hold(ids, True, config)


@command.command("release")
@click.argument("ids", nargs=-1, required=True)
@click.option("--config", hidden=True)
def release(ids, config):
    """Let held jobs be scheduled again."""
    _hold(ids, False, config)


@command.group()
def node():
    """Drain, resume, or (simulated hardware only) inject faults into a node."""


def _update_node(name, state, reason, config):
    from air.aircli import formats
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    node = Client(config).update_node(pb.UpdateNodeRequest(name=name, state=state, reason=reason))
    click.echo(f"{node.name}: {formats.node_state(node)}" + (f" ({node.reason})" if node.reason else ""))


@node.command("drain")
@click.argument("name")
@click.option("--reason", required=True)
@click.option("--config", hidden=True)
def node_drain(name, reason, config):
    """Take a node out of service: running jobs finish, no new ones start."""
    from air.protos import air_pb2 as pb
    _update_node(name, pb.NODE_STATE_DRAIN, reason, config)


@node.command("resume")
@click.argument("name")
@click.option("--config", hidden=True)
def node_resume(name, config):
    """Return a drained node to service."""
    from air.protos import air_pb2 as pb
    _update_node(name, pb.NODE_STATE_UP, "", config)


@node.command("fault")
@click.argument("name")
@click.option("--gpu", type=click.IntRange(-1), default=-1, show_default=True, help="GPU index; -1: the node")
@click.option("--xid", type=click.IntRange(1), help="an XID event on --gpu")
@click.option("--ecc-dbe", is_flag=True, help="an uncorrectable ECC error on --gpu")
@click.option("--nvlink-down", type=click.IntRange(0), help="NVLink link number that goes down on --gpu")
@click.option("--ib-down", metavar="DEVICE/PORT", help="an InfiniBand port that goes down, e.g. mlx5_0/1")
@click.option("--temp", type=click.IntRange(-50, 200), help="--gpu's temperature in C from now on")
@click.option("--config", hidden=True)
def node_fault(name, gpu, xid, ecc_dbe, nvlink_down, ib_down, temp, config):
    """Inject a hardware fault into a node with simulated GPUs (for tests and drills)."""
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    if not (xid or ecc_dbe or nvlink_down is not None or ib_down or temp is not None):
        raise CliError("say which fault: --xid, --ecc-dbe, --nvlink-down, --ib-down or --temp")
    if (xid or ecc_dbe or nvlink_down is not None or temp is not None) and gpu < 0:
        raise click.BadParameter("GPU faults need --gpu", param_hint="'--gpu'")
    fault = pb.FaultRequest(node=name, gpu=gpu, xid=xid or 0, ecc_dbe=ecc_dbe, ib_down=ib_down or "")
    if nvlink_down is not None:
        fault.nvlink_down = nvlink_down
    if temp is not None:
        fault.temperature_c = temp
    Client(config).inject_fault(fault)


@command.group()
def account():
    """Manage the account tree (accounts, sub-accounts, users, shares, GPU quotas), as sacctmgr does."""


def _account_call(op, name, user, parent, shares, max_gpus, config):
    from air.aircli import formats
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    assoc = pb.Association(account=name, user=user or "", parent=parent or "", shares=shares or 0,
                           max_gpus=max_gpus or 0)
    fields = [f for f, v in (("parent", parent), ("shares", shares), ("max_gpus", max_gpus)) if v is not None]
    if op == pb.ACCOUNT_OP_ADD and shares is None:
        assoc.shares = 1
    if op == pb.ACCOUNT_OP_MODIFY and not fields:
        raise CliError("nothing to modify: give --shares, --parent or --max-gpus")
    reply = Client(config).update_account(pb.AccountRequest(op=op, assoc=assoc, set_fields=fields))
    click.echo("\n".join(formats.table(formats.share_rows(reply.rows), left=(0, 1))))


_ACCOUNT_OPTIONS = [
    click.argument("name"),
    click.option("--user", help="the user's association under the account, instead of the account"),
    click.option("--parent", help="the account above this one (default: root)"),
    click.option("--shares", type=click.IntRange(0), help="raw shares among its siblings"),
    click.option("--max-gpus", type=click.IntRange(0), help="GPUs the account and those under it may hold (0: no limit)"),
    click.option("--config", hidden=True),
]


def _with_options(fn):
    for decorator in reversed(_ACCOUNT_OPTIONS):
        fn = decorator(fn)
    return fn


@account.command("add")
@_with_options
def account_add(name, user, parent, shares, max_gpus, config):
    """Add an account (under --parent), or a user to an account (--user)."""
    from air.protos import air_pb2 as pb
    _account_call(pb.ACCOUNT_OP_ADD, name, user, parent, shares, max_gpus, config)


@account.command("modify")
@_with_options
def account_modify(name, user, parent, shares, max_gpus, config):
    """Change an account's (or a user's) shares, parent or GPU quota."""
    from air.protos import air_pb2 as pb
    _account_call(pb.ACCOUNT_OP_MODIFY, name, user, parent, shares, max_gpus, config)


@account.command("remove")
@click.argument("name")
@click.option("--user", help="remove only this user's association")
@click.option("--config", hidden=True)
def account_remove(name, user, config):
    """Remove an account (with nothing under it), or a user from an account."""
    from air.protos import air_pb2 as pb
    _account_call(pb.ACCOUNT_OP_REMOVE, name, user, None, None, None, config)


@command.group("slurm-commands")
def slurm_commands():
    """Slurm's command names (sbatch, srun, squeue, scancel, sinfo, sacct, scontrol) as front ends
    to AIR's tools, written into a folder an admin picks; never installed by default."""


@slurm_commands.command("install")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="where to write them (e.g. /usr/local/bin)")
@click.option("--force", is_flag=True, help="replace files of those names that are not AIR's, or write into a "
              "folder others may write to")
def slurm_install(directory, force):
    from air.aircli import slurm
    for path in slurm.install(directory, force):
        click.echo(f"wrote {path}")


@slurm_commands.command("uninstall")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, path_type=Path))
def slurm_uninstall(directory):
    from air.aircli import slurm
    for path in slurm.uninstall(directory):
        click.echo(f"removed {path}")


@command.group()
def store():
    """The controller's store, on the controller's host: an online backup, an integrity check. Run as
    the controller's user (it reads the store's file); the controller's own program does the work."""


def _controller_store(config, *args: str) -> None:
    import os
    argv = [sys.executable, "-P", "-m", "air.airctld"] + (["--config", config] if config else []) + ["store", *args]
    sys.stdout.flush()
    os.execv(sys.executable, argv)


@store.command("backup")
@click.argument("path")
@click.option("--config", hidden=True)
def store_backup(path, config):
    """Copy the store to PATH (a file, or a folder to hold air-<UTC time>.db) while the controller runs."""
    _controller_store(config, "backup", path)


@store.command("restore")
@click.argument("backup")
@click.option("--config", hidden=True)
def store_restore(backup, config):
    """Put BACKUP in the store's place, airctld stopped; job ids go on past every id given out before."""
    _controller_store(config, "restore", backup)


@store.command("check")
@click.option("--quick", is_flag=True, help="skip comparing indexes with their tables")
@click.option("--config", hidden=True)
def store_check(quick, config):
    """SQLite's integrity check of the store, and its schema version."""
    _controller_store(config, "check", *(["--quick"] if quick else []))


@command.group()
def local():
    """A whole cluster on this machine, for trying AIR and for tests."""


@local.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 250))
@click.option("--gpus-per-node", default=4, show_default=True, type=click.IntRange(0, 64))
@click.option("--nvml", is_flag=True,
              help="one node with this host's real GPUs, read through NVML (instead of simulated ones)")
@click.option("--cpus-per-node", default=32, show_default=True, type=click.IntRange(1, 4096))
@click.option("--dir", "directory", default="air-local", show_default=True, type=click.Path(file_okay=False))
@click.option("--base-address", default="127.0.0.1", show_default=True,
              help="the controller's address; nodes take the next ones")
@click.option("--node-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0.5),
              help="seconds of silence before a node is DOWN")
@click.option("--auth", type=click.Choice(["none", "munge"]), default="none", show_default=True)
@click.option("--munge-socket", default="", help="munged's socket (default: libmunge's)")
@click.option("--extra-config", type=click.Path(exists=True, dir_okay=False),
              help="TOML appended to the generated air.toml ([[accounts]] tables, ...)")
@click.option("--operator", "operators", multiple=True, help="a user or @group who may act on any job")
@click.option("--private-jobs", is_flag=True, help="airq shows others' jobs only to root and operators")
@click.option("--health-program", default="", help="run on every node each second; non-zero exit drains it")
@click.option("--max-gpu-temp", default=85, show_default=True, type=click.IntRange(0, 200),
              help="a GPU hotter than this (C) drains its node; 0: no limit")
@click.option("--heartbeat", default=0.0, type=click.FloatRange(min=0.0),
              help="seconds between node heartbeats (default: a sixth of --node-timeout, at most 1)")
@click.option("--health-auto-resume", is_flag=True,
              help="nodes drained by a condition that clears return by themselves once it has")
@click.option("--inactive-limit", default=60.0, show_default=True, type=click.FloatRange(min=0.0),
              help="seconds after which airrun's own allocation ends when airrun stops renewing it (0: never)")
@click.option("--unkillable-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0.0),
              help="seconds after SIGKILL at which a run that will not die is given up and its node drained "
                   "(0: never)")
def local_up(nodes, gpus_per_node, nvml, cpus_per_node, directory, base_address, node_timeout, auth, munge_socket,
             extra_config, operators, private_jobs, health_program, max_gpu_temp, health_auto_resume, heartbeat,
             inactive_limit, unkillable_timeout):
    from air.aircli.local import up
    if nvml and nodes != 1:
        raise click.BadParameter("one node with --nvml: every node of this host would claim the same GPUs",
                                 param_hint="'--nodes'")
    extra = Path(extra_config).read_text() if extra_config else ""
    config = up(Path(directory), nodes, gpus_per_node, cpus_per_node, base_address, node_timeout,
                auth=auth, munge_socket=munge_socket, extra=extra, operators=operators,
                private_jobs=private_jobs, health_program=health_program, max_gpu_temp_c=max_gpu_temp,
                health_auto_resume=health_auto_resume, heartbeat_s=heartbeat, inactive_limit_s=inactive_limit,
                unkillable_timeout_s=unkillable_timeout, gpus="nvml" if nvml else "")
    shown = "this host's GPUs (NVML)" if nvml else f"{gpus_per_node} GPUs each"
    click.echo(f"local cluster up: {nodes} nodes with {shown}; logs in {config.parent / 'log'}")
    from air.aircli.local import metrics_urls
    urls = metrics_urls(config)
    if urls:
        click.echo(f"metrics: {urls[0]} (controller), {' '.join(urls[1:])} (nodes)")
    click.echo(f"export AIR_CONF={config}")


@local.command("down")
@click.option("--dir", "directory", default="air-local", show_default=True, type=click.Path(file_okay=False))
def local_down(directory):
    """Stop the local cluster's daemons and kill the jobs still running on it."""
    from air.aircli.local import down
    count = down(Path(directory))
    click.echo(f"local cluster down: {count} daemons stopped")


main = entry(command, "aircontrol")

if __name__ == "__main__":
    main()
