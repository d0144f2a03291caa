"""aircancel: cancel jobs, or send them a signal, as scancel does."""
from __future__ import annotations

import functools
import signal as signals
import sys
from typing import TYPE_CHECKING

from air.aircli.argv import rows_table
from air.aircli.client import CliError, bad_value, click_options, start_tool
from air.aircli.queue import job_ids, state_filter, uid_of
from air.protos.limits import is_number

if TYPE_CHECKING:
    import click


def signal_number(text: str) -> int:
    name = text.upper()
    if is_number(name):
        return int(name)
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise bad_value("'-s'", f"unknown signal {text!r}") from None


# (names, click's parameter name, takes a value, help; None: hidden); and the job ids, as arguments
OPTIONS: tuple[tuple[tuple[str, ...], str, bool, str | None], ...] = (
    (("-u", "--user"), "user", True, "cancel this user's jobs"),
    (("-t", "--state"), "states", True, "only jobs in these states (PD, R)"),
    (("-n", "--name"), "name", True, "only jobs with this name"),
    (("-s", "--signal"), "sig", True, "send this signal instead of cancelling"),
    (("-b", "--batch"), "batch", False, "with -s: signal the batch shell only, not the steps"),
    (("-f", "--full"), "full", False, "with -s: signal the batch shell and the steps (aircancel's default; "
                                      "scancel's without -b or -f is the steps only)"),
    (("-v", "--verbose"), "verbose", False, "say which jobs were acted on"),
    (("--config",), "config", True, None),
)


def cancel(prog: str, ids, user, states, name, sig, batch, full, verbose, config) -> int:
    """aircancel's work, on click's parameters (or aircli.argv's same); `prog`: scancel signals steps."""
    from air.aircli.client import Client
    for option, value in (("'-u'", user), ("'-n'", name), ("'-t'", states)):
        if value is not None and not value.strip():   # (`-u "$U"` with U unset: not a filter left out)
            raise bad_value(option, "an empty value; give one, or leave the option out")
    wanted: dict = {}   # a JobFilter, as protos.protowire's dict: sent without protobuf
    tasks: list = []
    for text in ids:
        wanted.setdefault("job_ids", []).extend(job_ids(text, "'ID'", tasks, required=True))
    if tasks:
        wanted["array_tasks"] = [{"array_job_id": a, "task_id": t} for a, t in tasks]
    if user:
        wanted["uids"] = [uid_of(user)]
    if name:
        wanted["names"] = [name]
    if states:
        wanted["phases"], wanted["results"] = state_filter(states, "'-t'")
    if not any(wanted.get(key) for key in ("job_ids", "array_tasks", "uids", "names", "phases", "results")):
        # (an empty filter is every job: `aircancel ,` or `-t ALL` alone must not cancel them all)
        raise CliError("no job given: aircancel ID... or -u USER, -n NAME, -t STATES")
    number = signal_number(sig) if sig else 0
    if sig and not 1 <= number <= 64:
        raise CliError(f"-s {sig}: give a signal (1 to 64, or a name such as USR1); without -s the jobs are cancelled")
    if batch and not number:
        raise CliError("-b/--batch signals the batch shell: give the signal with -s (scancel -b -s USR1 ID)")
    # scancel, as Slurm's: a signal without -b or -f goes to the job's steps, not to the batch shell
    steps_only = prog == "scancel" and not full and not batch and number != signals.SIGKILL
    reply = Client(config).cancel_fields({"filter": wanted, "signal": number, "batch_only": bool(batch),
                                          "steps_only": steps_only}, timeout=120)
    if verbose:
        for job_id in reply["job_ids"]:
            print(f"aircancel: {'signalled' if number else 'cancelled'} job {job_id}", flush=True)
    return 0


@functools.cache
def _command() -> click.Command:
    import click

    def callback(**params):
        return cancel(click.get_current_context().info_name, **params)
    return click.Command("command", callback=callback, params=[click.Argument(["ids"], nargs=-1),
                                                               *click_options(OPTIONS)],
                         context_settings={"help_option_names": ["-h", "--help"]})


def __getattr__(name: str):   # `command`, the click command, made when first asked for
    if name == "command":
        return _command()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def start(prog: str, argv: list[str]) -> int:
    """aircancel (or scancel) on argv: read by aircli.argv where it can, else by click."""
    return start_tool(prog, argv, rows_table(OPTIONS), _command, lambda params: cancel(prog, **params),
                      positional="ids")


def main() -> None:
    sys.exit(start("aircancel", sys.argv[1:]))


if __name__ == "__main__":
    main()
