"""aircancel: cancel jobs, or send them a signal, as scancel does."""
from __future__ import annotations

import signal as signals

import click

from air.aircli.client import CliError, entry
from air.aircli.queue import job_ids, state_filter, uid_of


def signal_number(text: str) -> int:
    name = text.upper()
    if name.isdigit():
        return int(name)
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise click.BadParameter(f"unknown signal {text!r}", param_hint="'-s'") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("ids", nargs=-1)
@click.option("-u", "--user", help="cancel this user's jobs")
@click.option("-t", "--state", "states", help="only jobs in these states (PD, R)")
@click.option("-n", "--name", help="only jobs with this name")
@click.option("-s", "--signal", "sig", help="send this signal instead of cancelling")
@click.option("-b", "--batch", is_flag=True, help="with -s: signal the batch shell only, not the steps")
@click.option("-f", "--full", is_flag=True, help="with -s: signal the batch shell and the steps (aircancel's default; "
              "scancel's without -b or -f is the steps only)")
@click.option("-v", "--verbose", is_flag=True, help="say which jobs were acted on")
@click.option("--config", hidden=True)
@click.pass_context
def command(ctx, ids, user, states, name, sig, batch, full, verbose, config):
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    filt = pb.JobFilter()
    tasks: list = []
    for text in ids:
        filt.job_ids.extend(job_ids(text, "'ID'", tasks))
    filt.array_tasks.extend(pb.ArrayTask(array_job_id=a, task_id=t) for a, t in tasks)
    if user:
        filt.uids.append(uid_of(user))
    if name:
        filt.names.append(name)
    if states:
        phases, results = state_filter(states, "'-t'")
        filt.phases.extend(phases)
        filt.results.extend(results)
    if not (filt.job_ids or filt.array_tasks or filt.uids or filt.names or states):
        raise CliError("no job given: aircancel ID... or -u USER, -n NAME, -t STATES")
    number = signal_number(sig) if sig else 0
    if sig and not 1 <= number <= 64:
        raise CliError(f"-s {sig}: give a signal (1 to 64, or a name such as USR1); without -s the jobs are cancelled")
    if batch and not number:
        raise CliError("-b/--batch signals the batch shell: give the signal with -s (scancel -b -s USR1 ID)")
    # scancel, as Slurm's: a signal without -b or -f goes to the job's steps, not to the batch shell
    steps_only = ctx.info_name == "scancel" and not full and not batch and number != signals.SIGKILL
    reply = Client(config).cancel(pb.CancelRequest(filter=filt, signal=number, batch_only=batch,
                                                           steps_only=steps_only), timeout=120)
    if verbose:
        for job_id in reply.job_ids:
            click.echo(f"aircancel: {'signalled' if number else 'cancelled'} job {job_id}")


main = entry(command, "aircancel")

if __name__ == "__main__":
    main()
