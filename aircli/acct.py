"""airacct: job history, as sacct shows it, from the controller's store (jobs that have left the
queue too). Fields and records: aircli.acct_fields; time forms: aircli.slurmtime."""
from __future__ import annotations

import json
import time

import click

from air.aircli.client import CliError, entry


def _each(values: tuple[str, ...]) -> list[str]:
    """Repeatable options that also take comma-separated lists (-j 1,2 -j 3)."""
    return [v for text in values for v in text.replace(" ", ",").split(",") if v]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--jobs", "jobs", multiple=True, help="these jobs (123, array task 123_4, or a whole array 123)")
@click.option("-u", "--user", "--uid", "users", multiple=True, help="these users' jobs (names or uids)")
@click.option("-a", "--allusers", is_flag=True, help="every user's jobs (where this cluster lets you see them)")
@click.option("-A", "--accounts", multiple=True, help="jobs charged to these accounts")
@click.option("-r", "--partition", "partitions", multiple=True, help="jobs in these partitions")
@click.option("-q", "--qos", "qos", multiple=True, help="jobs of these QOS")
@click.option("--name", "names", multiple=True, help="jobs with these names")
@click.option("-s", "--state", "states", multiple=True, help="jobs in these states (CD,F,CA,TO,NF,PR,OOM,PD,R,...)")
@click.option("-S", "--starttime", "since", help="jobs not ended before this time (default: midnight today, "
              "or any time with -j)")
@click.option("-E", "--endtime", "until", help="jobs submitted before this time (default: now)")
@click.option("-X", "--allocations", is_flag=True, help="jobs only, no steps")
@click.option("-D", "--duplicates", is_flag=True, help="each earlier run of a requeued job too")
@click.option("-n", "--noheader", is_flag=True, help="no header lines")
@click.option("-P", "--parsable2", is_flag=True, help="fields separated by |, none after the last")
@click.option("-p", "--parsable", is_flag=True, help="fields separated by |, one after the last too")
@click.option("--delimiter", default="|", show_default=True, help="the separator for -p and -P")
@click.option("-o", "--format", "fmt", help="fields, comma-separated, each with an optional %WIDTH (JobName%30)")
@click.option("-l", "--long", "long_", is_flag=True, help="many fields")
@click.option("-b", "--brief", is_flag=True, help="JobID, State and ExitCode only")
@click.option("-e", "--helpformat", is_flag=True, help="list the fields -o takes")
@click.option("--json", "as_json", is_flag=True, help="JSON for programs, in sacct's shape")
@click.option("--config", hidden=True)
def command(jobs, users, allusers, accounts, partitions, qos, names, states, since, until, allocations, duplicates,
            noheader, parsable2, parsable, delimiter, fmt, long_, brief, helpformat, as_json, config):
    """Show jobs from the controller's history, the ones that have ended too (sacct)."""
    from air.aircli import acct_fields, slurmtime
    from air.aircli.queue import job_ids, state_filter, uid_of
    if helpformat:
        names_ = list(acct_fields.FIELDS)
        for i in range(0, len(names_), 5):
            click.echo("".join(f"{n:<18}" for n in names_[i:i + 5]).rstrip())
        return
    spec = fmt or (acct_fields.LONG_FORMAT if long_ else "JobID,State,ExitCode" if brief
                   else acct_fields.DEFAULT_FORMAT)
    try:
        cols = acct_fields.columns(spec)
    except acct_fields.FormatError as e:
        raise CliError(f"--format: {e}") from None
    if not delimiter:
        raise CliError("--delimiter: give at least one character")
    now = time.time()
    from air.protos import air_pb2 as pb
    req = pb.HistoryRequest(all_users=allusers, accounts=_each(accounts), partitions=_each(partitions),
                            qos=_each(qos), names=_each(names), no_steps=allocations and not as_json)
    tasks: list = []
    for text in jobs:
        req.job_ids.extend(job_ids(text, "-j", tasks))
    req.array_tasks.extend(pb.ArrayTask(array_job_id=a, task_id=t) for a, t in tasks)
    req.uids.extend(uid_of(u) for u in _each(users))
    if states:
        phases, results = state_filter(",".join(_each(states)), "-s")
        req.phases.extend(phases)
        req.results.extend(results)
    try:
        if since:
            req.since = slurmtime.parse(since, now)
        elif states and not jobs:   # sacct: with -s and no -S, the jobs in those states now
            req.since = now
        elif not jobs:   # sacct's default: jobs since midnight, or any time for the jobs named
            req.since = slurmtime.parse("today", now)
        if until:
            req.until = slurmtime.parse(until, now)
    except slurmtime.TimeError as e:
        raise CliError(f"{'-S' if since and not until else '-S/-E'}: {e}") from None
    if req.until and req.since and req.until < req.since:
        raise CliError("-E is before -S: no job can match")

    from air.aircli.client import Client
    client = Client(config)
    found: list = []
    while True:   # one page at a time: the controller bounds each reply
        reply = client.history(req, timeout=60.0)
        found.extend(reply.jobs)
        if not reply.truncated or not reply.jobs:
            break
        req.after_job_id = reply.jobs[-1].job.job_id
    if as_json:
        click.echo(json.dumps(acct_fields.to_json(found, now, duplicates), indent=2))
        return
    rows = acct_fields.records(found, duplicates, allocations)
    delim = delimiter if (parsable or parsable2) else None
    for line in acct_fields.render(rows, cols, now, header=not noheader, delimiter=delim, trailing=parsable):
        click.echo(line)


main = entry(command, "airacct")

if __name__ == "__main__":
    main()
