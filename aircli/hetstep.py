"""A step of a heterogeneous job: `srun [options] A : [options] B`, as TorchX's Slurm scheduler writes
it. Component i runs on the job's het group i (the nodes of `$SLURM_JOB_NODELIST_HET_GROUP_<i>`)
unless it names its nodes (-w, or --het-group=N), as one airrun step of its own; all start at once.
A component that fails ends the others (--kill-on-bad-exit, the default), and the first failure is
the exit code. Slurm runs the components as one step with one rank numbering; AIR numbers each
component's ranks from 0 (programs that meet through a rendezvous, as torchrun's c10d, do not mind)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import click

from air.aircli.client import CliError

SEPARATOR = ":"
# a component's airrun; SIGINT (how a failed component ends the others) works even where the shell
# started srun in the background, with SIGINT ignored
CHILD = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
         "from air.aircli.client import run\nfrom air.aircli.run import command\n"
         "sys.exit(run(command, sys.argv[1], sys.argv[2:]))")


def components(argv: list[str]) -> list[list[str]]:
    """The command line split at its ':' words."""
    parts: list[list[str]] = [[]]
    for word in argv:
        if word == SEPARATOR:
            parts.append([])
        else:
            parts[-1].append(word)
    return parts


def placed(command: click.Command, prog: str, args: list[str], index: int) -> tuple[list[str], bool]:
    """A component's arguments: on the job's het group of the same index, unless it names its nodes
    (-w) or its group (--het-group); and whether its failure ends the others (--kill-on-bad-exit)."""
    with command.make_context(prog, list(args), resilient_parsing=True) as ctx:
        chosen = bool(ctx.params.get("nodelist")) or ctx.params.get("het_group") is not None
        kill = ctx.params.get("kill_on_bad_exit") is not False
    return (list(args) if chosen else ["--het-group", str(index), *args]), kill


def group_nodes(group: int, env: dict[str, str]) -> str:
    """The nodes of het group `group` of the job this runs in (a CliError for one it does not have)."""
    nodes = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}")
    if not nodes:
        size = int(env.get("SLURM_HET_SIZE", "0") or 0)
        raise CliError(f"--het-group={group}: " + (f"give 0 to {size - 1}" if size else
                                                     "this is not a heterogeneous job (#SBATCH hetjob)"))
    return nodes


def run(command: click.Command, prog: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run every component's step at once; the first failure's exit code, else 0."""
    env = dict(os.environ if env is None else env)
    parts = components(argv)
    if any(not p for p in parts):
        raise CliError("an empty component next to ':'")
    size = int(env.get("SLURM_HET_SIZE", "0") or 0)
    if not size:
        raise CliError("':' separates the components of a heterogeneous job's step, and this is not a "
                       "heterogeneous job (#SBATCH hetjob)")
    if len(parts) > size:
        raise CliError(f"{len(parts)} components, and the job has {size}")
    argvs, kill_on_bad_exit = zip(*(placed(command, prog, p, i) for i, p in enumerate(parts)))
    children: list[subprocess.Popen] = []

    def forward(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):   # (before any child: none is left alone)
        signal.signal(signum, forward)
    children.extend(subprocess.Popen([sys.executable, "-c", CHILD, prog, *a]) for a in argvs)
    first_bad = 0
    while any(c.poll() is None for c in children):
        for index, child in enumerate(children):
            code = child.poll()
            if code and not first_bad:
                first_bad = code if code > 0 else 128 - code
                if kill_on_bad_exit[index]:   # (SIGINT: airrun ends its step, and the node stops its ranks)
                    print(f"{prog}: component {index} exited with {first_bad}; ending the others",
                          file=sys.stderr, flush=True)
                    for other in children:
                        if other.poll() is None:
                            other.send_signal(signal.SIGINT)
        time.sleep(0.1)
    for child in children:
        code = child.returncode
        if code and not first_bad:
            first_bad = code if code > 0 else 128 - code
    return first_bad
