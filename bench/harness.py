"""What the benchmarks share: a local cluster of their own, brought up and always torn down; timed
commands; and their figures, printed and written to bench/RESULTS.md the same way.

    with LocalAir(nodes=2, gpus_per_node=4) as air:
        air.cli("airbatch", "--wrap", "true")
        ms = median_ms([air.tool("airq")], air.env, runs=7)
    report("core", "| figure | AIR |", rows, args.write, note="...")
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SLURM = ROOT.parent / "shared" / "peers" / "slurm"

sys.path.insert(0, str(ROOT / "tests"))
from cluster import Block   # noqa: E402  (the tests' reservations of loopback blocks: one pool for both)


class LocalAir:
    """`aircontrol local up` in a temporary folder of its own (its cluster in `dir`, its config in
    `config`, the tools' environment in `env`), on a block of loopback addresses reserved for it as the
    tests' clusters reserve theirs (`block`: a benchmark never shares an address or a port with a test
    run or another benchmark); down() stops the daemons, removes the folder and lets the block go, also
    when the benchmark fails (use it as a context manager)."""

    def __init__(self, nodes: int = 2, gpus_per_node: int | None = None, cpus_per_node: int | None = None,
                 options: tuple[str, ...] = (), prefix: str = "air-bench-"):
        self.block = Block()
        base_address = self.block.address(1)
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        os.chmod(self.root, 0o755)   # (jobs run as their submitter: the scripts written here are read by them)
        self.dir = self.root / "cluster"
        self.config = str(self.dir / "air.toml")
        # (jobs get the submitter's environment: their airrun is this one's, with or without an activated venv)
        self.env = dict(os.environ, AIR_CONF=self.config, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self.args = ["--dir", str(self.dir), "--nodes", str(nodes), "--base-address", base_address, *options]
        for option, value in (("--gpus-per-node", gpus_per_node), ("--cpus-per-node", cpus_per_node)):
            if value is not None:   # (None: aircontrol local's own default)
                self.args += [option, str(value)]

    def up(self) -> "LocalAir":
        try:
            subprocess.run([self.tool("aircontrol"), "local", "up", *self.args], check=True, capture_output=True,
                           text=True)
        except subprocess.CalledProcessError as e:
            self.down()
            raise RuntimeError(f"aircontrol local up failed: {e.stderr.strip()}") from None
        return self

    def down(self) -> None:
        subprocess.run([self.tool("aircontrol"), "local", "down", "--dir", str(self.dir)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        self.block.release()

    def __enter__(self) -> "LocalAir":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    @staticmethod
    def tool(name: str) -> str:
        return str(BIN / name)

    def cli(self, name: str, *args: str, cwd: Path | None = None) -> str:
        """Run one of AIR's tools against this cluster; its output (a failure raises)."""
        return subprocess.run([self.tool(name), *args], check=True, capture_output=True, text=True, env=self.env,
                              cwd=cwd or self.root).stdout

    def client(self):
        from air.aircli.client import Client
        return Client(self.config)


def _api_submit(args) -> int:
    config, count, hold, workdir = args
    from air.aircli.client import Client
    from air.protos import air_pb2 as pb
    client = Client(config)
    req = pb.SubmitRequest(job=pb.JobRequest(name="bench", script="#!/bin/sh\ntrue\n", workdir=workdir,
                                             output="/dev/null", hold=hold, nodes=1, ntasks_per_node=1,
                                             cpus_per_task=1))
    for _ in range(count):
        client.submit(req)
    return count


def api_submit(config: str, total: int, clients: int, hold: bool, workdir: str) -> tuple[float, float]:
    """Jobs acknowledged per second, `clients` processes in parallel (each reply comes after the commit),
    and when the first of them was sent (time.perf_counter(): the clients' own start is not timed)."""
    per = total // clients
    # spawn, not fork: a forked child of this threaded process can inherit a held lock and hang
    with get_context("spawn").Pool(clients) as pool:
        pool.map(_api_submit, [(config, 1, hold, workdir)] * clients)  # connect and warm up
        t = time.perf_counter()
        done = sum(pool.map(_api_submit, [(config, per, hold, workdir)] * clients))
        return done / (time.perf_counter() - t), t


def timed(args: list[str], env: dict | None = None, cwd: Path | None = None) -> float:
    """Seconds a command takes (its output thrown away; a failure raises)."""
    t = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
    return time.perf_counter() - t


def median_ms(args: list[str], env: dict | None = None, runs: int = 7) -> float:
    return statistics.median(timed(args, env) for _ in range(runs)) * 1000


def ratio(ours: float, theirs: float | None, higher_is_better: bool) -> str:
    """How many times better AIR is than Slurm ("-" without a Slurm figure)."""
    if not theirs:
        return "-"
    value = ours / theirs if higher_is_better else theirs / ours
    return f"{value:.1f}x" if value >= 1 else f"{value:.2f}x"


def table(header: list[str], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def report(title: str, text: str, write: str | None, note: str = "", command: str | None = None) -> None:
    """Print a benchmark's table; with `write`, append it to that markdown file as a dated section
    that names the command that made it (this process's, unless given) and the cores it ran on."""
    print(text, flush=True)
    if not write:
        return
    command = command or f"python bench/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}".rstrip()
    heading = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) + (f": {title}" if title else "")
    with open(write, "a") as f:
        f.write(f"\n## {heading}\n\n`{command}` on {os.cpu_count()} cores{'; ' + note if note else ''}.\n\n"
                f"{text}\n")
