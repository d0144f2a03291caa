"""airstat: a job's loss and throughput curves in the terminal, from the progress reports the
controller kept (runtime reports, see docs/runtime.md)."""
from __future__ import annotations

import json
import re
import sys

import click

from air.protos.limits import is_number
from air.protos.reports import report_numbers

from air.aircli.client import CliError, entry

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def series(reports: list[str]) -> dict[str, list]:
    """Steps with loss and tokens/s, the newest report of each step winning (a step run again after a
    resume replaces the first run of it)."""
    by_step: dict[int, dict] = {}
    for text in reports:
        r = report_numbers(text)   # (a job's own text: numbers only, finite, within 64 bits)
        if isinstance(r.get("step"), int):
            by_step[r["step"]] = r
    steps = sorted(by_step)
    return {"step": steps, "loss": [by_step[s].get("loss") for s in steps],
            "tokens_per_s": [by_step[s].get("tokens_per_s") for s in steps],
            "mfu": [by_step[s].get("mfu") for s in steps]}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="the series as JSON instead of plots")
@click.option("--width", type=click.IntRange(40, 400), default=None, help="plot width in columns")
@click.option("--config", hidden=True)
def command(job_id, as_json, width, config):
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    if not is_number(job_id):
        raise click.BadParameter(f"{job_id!r} is not a job id", param_hint="'JOB_ID'")
    reports = Client(config).reports(pb.ReportsRequest(job_id=int(job_id))).reports
    data = series(list(reports))
    if as_json:
        json.dump(data, sys.stdout)
        sys.stdout.write("\n")
        return
    if not data["step"]:
        raise CliError(f"job {job_id} has no progress reports (its script reports through runtime's ctx.report)")
    import plotext as plt
    for key, title in (("loss", "loss"), ("tokens_per_s", "tokens/s")):
        points = [(s, v) for s, v in zip(data["step"], data[key]) if v is not None]
        if not points:
            continue
        plt.clear_figure()
        plt.plot([p[0] for p in points], [p[1] for p in points], marker="braille")
        plt.title(f"job {job_id}: {title} by step")
        plt.xlabel("step")
        plt.plotsize(width or min(plt.terminal_width() or 100, 120), 15)
        plt.theme("clear")
        if sys.stdout.isatty():
            plt.show()
        else:   # a file or a pipe: the same drawing without escape codes
            sys.stdout.write(ANSI.sub("", plt.build()) + "\n")


main = entry(command, "airstat")

if __name__ == "__main__":
    main()
