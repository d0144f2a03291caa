"""Chaos, measured: tinygpt trains on a local cluster while faults strike at random, and the benchmark
counts what they cost.

    flock /tmp/air-it.lock python bench/bench_chaos.py [--minutes 20] [--every 120] [--seed 1]
                                                       [--reference DIR] [--write bench/RESULTS.md]
    flock /tmp/air-it.lock python bench/bench_chaos.py --minutes 4 --every 40      # a short run
    ... --prepare-only [--reference DIR]    # only measure --steps and make the uninterrupted run, to reuse

3 nodes of 2 simulated GPUs, each in a network namespace of its own (bench/chaos_cluster.py says why);
examples/tinygpt on 2 of them (2 ranks each, through airrun), with enough steps for --minutes of
uninterrupted training (measured first; --sleep per step stands for a GPU's compute), a checkpoint
every --checkpoint-seconds, and OMP_NUM_THREADS=1 as torchrun sets it (airrun does not: 4 ranks of
2 threads each on 2 cores train 10 times slower). While it trains, at exponentially distributed
intervals of mean --every seconds (from --seed), one fault after another, in a seeded round robin:

  stop     SIGSTOP of an airnoded that runs the job, for the node timeout + 5 s, then SIGCONT
  kill     a host crash: kill -9 of that airnoded, of the job's processes on its node and of the
           shepherds that started them; the daemon started again
  ctld     kill -9 of airctld; started again
  restart  SIGTERM of that airnoded; started again once it has exited
  crash    kill -9 of that airnoded alone (the job's processes and their shepherds live on); started
           again at once
  cut      that host's link taken down for the node timeout + 5 s, then up again
  xid      XID 79 on one of the job's GPUs there (the node drains); the node resumed once the job
           trains again
  preempt  a job of a QOS that may preempt the training job's, on all 3 nodes, for --preempt-seconds

A fault waits until the job has trained a step since the last one and every node is up, so each
recovery is measured alone. Meanwhile every process on the machine is sampled a few times a second:
two runs of the job alive at once (processes with different AIR_RESTART_COUNT, or two processes of
one rank) is an overlap. At the end: accepted jobs that did not complete, steps missing from the
final history or trained on another batch than an uninterrupted run's, whether the final parameters
equal that run's bit for bit (4 ranks under torchrun, without the per-step sleep, which changes no
arithmetic), ETTR, the time from each fault to the first step after it, and where the time went
(bench/chaos_report.py has the definitions). The goal (issue 11): ETTR >= 90% with a fault every
2 minutes, no overlap, no lost accepted job.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_cluster import BIN, INSIDE, ROOT, Cluster, enter_private_namespace  # noqa: E402
from harness import report as write_report, table as table_of  # noqa: E402
from chaos_report import KINDS, Fault, analyse, batch_mismatches, late_steps, per_kind_table, timeline_table  # noqa: E402
from cluster import in_spool, job_processes, spool_prefixes  # noqa: E402  (tests/cluster.py, through harness's path)

TRAIN = ROOT / "examples" / "tinygpt" / "train.py"
SMALL = ["--layers", "2", "--width", "64", "--heads", "2", "--block", "32", "--batch", "4"]
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "HUNG", "OUT_OF_MEMORY")


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([str(BIN / "torchrun"), "--nproc-per-node", "4", "--master-port", str(_free_port()),
                                 "--", str(TRAIN), *SMALL, *args], stdout=out, stderr=subprocess.STDOUT,
                                env=_env(), cwd=str(ROOT))


def calibrate(work: Path, sleep: float) -> float:
    """Seconds per step of 4 ranks with the per-step sleep, from step 15 to step 55."""
    folder = work / "calibrate"
    folder.mkdir()
    proc = _torchrun(["--steps", "55", "--every", "1000", "--sleep", str(sleep), "--checkpoint-dir",
                      str(folder / "ckpt"), "--log", str(folder / "log")], folder / "out")
    log, seen, last = folder / "log.rank0", {}, 0
    while proc.poll() is None:
        count = len(log.read_text().splitlines()) if log.exists() else 0
        for line in range(last + 1, count + 1):
            seen[line] = time.time()
        last = max(last, count)
        time.sleep(0.02)
    if proc.returncode != 0 or 15 not in seen or 55 not in seen:
        raise RuntimeError(f"the calibration run failed; see {folder / 'out'}")
    return (seen[55] - seen[15]) / 40


def reference(folder: Path, steps: int) -> Path:
    """Final parameters and per-rank batches of an uninterrupted run (reused when it matches)."""
    meta = {"steps": steps, "model": SMALL, "train": str(TRAIN)}
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "meta.json").exists() and json.loads((folder / "meta.json").read_text()) == meta \
            and (folder / "final.pt").exists():
        print(f"reference: reusing {folder}", flush=True)
        return folder
    began = time.time()
    for old in folder.glob("log.rank*"):
        old.unlink()
    proc = _torchrun(["--steps", str(steps), "--every", "1000000", "--checkpoint-dir", str(folder / "ckpt"),
                      "--log", str(folder / "log"), "--out", str(folder / "final.pt")], folder / "out")
    if proc.wait() != 0:
        raise RuntimeError(f"the reference run failed; see {folder / 'out'}")
    (folder / "meta.json").write_text(json.dumps(meta))
    print(f"reference: {steps} steps uninterrupted in {time.time() - began:.0f} s -> {folder}", flush=True)
    return folder


def history(prefix: Path, rank: int) -> dict[int, str]:
    """step -> batch, from every log `prefix*.rank<R>` in run order; a later run's step replaces an earlier's."""
    steps = {}
    for path in sorted(prefix.parent.glob(f"{prefix.name}*.rank{rank}"),
                       key=lambda p: int(re.sub(r"\D", "", p.name[len(prefix.name):].split(".")[0]) or 0)):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                steps[int(parts[0])] = parts[1]
    return steps


# ------------------------------------------------------------------ watchers


class StepLog:
    """When each line of rank 0's logs appears (one log per run), and when each run says it resumed."""

    LINE = re.compile(r"restart (\d+), from step (\d+)")

    def __init__(self, work: Path):
        self.work = work
        self.steps: dict[int, list[tuple[float, int]]] = {}
        self.restored: dict[int, tuple[float, int]] = {}
        self._offsets: dict[Path, int] = {}

    def _new_lines(self, path: Path) -> list[str]:
        at = self._offsets.get(path, 0)
        with open(path, "rb") as f:
            f.seek(at)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        self._offsets[path] = at + len(whole)
        return whole.decode(errors="replace").splitlines()

    def poll(self) -> None:
        now = time.time()
        for path in self.work.glob("train.run*.rank0"):
            run = int(path.name[len("train.run"):-len(".rank0")])
            for line in self._new_lines(path):
                self.steps.setdefault(run, []).append((now, int(line.split()[0])))
        for path in self.work.glob("train-*.out"):
            for line in self._new_lines(path):
                m = self.LINE.search(line)
                if m:
                    self.restored[int(m.group(1))] = (now, int(m.group(2)))

    def last_step_time(self) -> float:
        return max((lines[-1][0] for lines in self.steps.values() if lines), default=0.0)


class Overlaps:
    """Every process on the machine, a few times a second: the job's, grouped by run and by rank. (Its own
    scan rather than cluster.job_processes: one pass reads each process's command line and state too.)
    `found`: the samples that saw any of the job's processes, `runs_seen` their runs (none: the
    overlap count measured nothing)."""

    def __init__(self, job: str, spool: Path):
        self.job = job
        self.prefixes = spool_prefixes(spool)   # this cluster's (a test run beside it numbers its jobs from 1 too)
        self.samples = self.found = 0
        self.runs_seen: set[str] = set()
        self.episodes: list[dict] = []
        self._open: dict | None = None

    def sample(self) -> None:
        import psutil
        procs = []
        for p in psutil.process_iter(["pid", "environ", "cmdline", "status"]):
            env = p.info["environ"] or {}
            if env.get("AIR_JOB_ID") != self.job or not in_spool(env, self.prefixes) \
                    or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            procs.append({"pid": p.info["pid"], "run": env.get("AIR_RESTART_COUNT", "?"),
                          "node": env.get("AIR_NODENAME", "?"), "rank": env.get("RANK") if "train.py" in cmd else None,
                          "cmd": cmd[:120]})
        self.samples += 1
        runs = {p["run"] for p in procs}
        self.found += bool(procs)
        self.runs_seen |= runs
        ranks: dict[str, int] = {}
        for p in procs:
            if p["rank"] is not None:
                ranks[p["rank"]] = ranks.get(p["rank"], 0) + 1
        now = time.time()
        if len(runs) > 1 or any(n > 1 for n in ranks.values()):
            if self._open is None:
                self._open = {"start": now, "end": now, "samples": 0, "runs": sorted(runs), "processes": procs}
                self.episodes.append(self._open)
            self._open["end"] = now
            self._open["samples"] += 1
        else:
            self._open = None


class Watch(threading.Thread):
    def __init__(self, steps: StepLog, overlaps: Overlaps, interval: float):
        super().__init__(daemon=True)
        self.steps, self.overlaps, self.interval = steps, overlaps, interval
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        next_sample = 0.0
        while not self.stop.is_set():
            try:
                self.steps.poll()
                if time.monotonic() >= next_sample:
                    self.overlaps.sample()
                    next_sample = time.monotonic() + self.interval
            except Exception as e:   # a process gone between listing and reading is not an error
                if not isinstance(e, (FileNotFoundError, ProcessLookupError)):
                    self.error = e
            time.sleep(0.1)


# ------------------------------------------------------------------ faults


class Chaos:
    def __init__(self, cluster: Cluster, job: int, work: Path, args, steps: StepLog):
        self.cluster, self.job, self.work, self.args, self.steps = cluster, job, work, args, steps
        self.hold_s = args.node_timeout + 5
        self.faults: list[Fault] = []
        self.preemptors: list[int] = []
        self.state: dict = {}

    def refresh(self) -> dict | None:
        from air.aircli.client import CliError
        try:
            self.state = self.cluster.job(self.job)
            return self.state
        except CliError:
            return None

    def ready(self) -> bool:
        """The job trains (a step since the last fault), every node is up, no preemptor is left."""
        from air.aircli.client import CliError
        if self.state.get("state") != "RUNNING":
            return False
        lines = self.steps.steps.get(self.state["restart_count"], [])
        if not lines or (self.faults and lines[-1][0] <= self.faults[-1].undone):
            return False
        try:
            if any(s not in ("idle", "mix", "alloc") for s in self.cluster.node_states().values()):
                return False
            return all(self.cluster.job(j)["state"] in TERMINAL for j in self.preemptors)
        except CliError:
            return False

    def inject(self, kind: str, rng: random.Random) -> Fault:
        nodes = self.state["nodes"]
        node = "" if kind in ("ctld", "preempt") else rng.choice(nodes)
        fault = Fault(kind, time.time(), node, self.state["restart_count"], bool(node) and node == nodes[0])
        self.faults.append(fault)
        print(f"{time.strftime('%H:%M:%S')} fault {len(self.faults)}: {kind} {node} (run {fault.run})", flush=True)
        getattr(self, f"_{kind}")(fault)
        fault.undone = max(fault.undone, time.time())
        return fault

    def _stop(self, f: Fault) -> None:
        self.cluster.signal(f.node, signal.SIGSTOP)
        time.sleep(self.hold_s)
        self.cluster.signal(f.node, signal.SIGCONT)

    def _kill(self, f: Fault) -> None:
        doomed = _host_processes(str(self.job), f.node, self.cluster.dir)
        self.cluster.signal(f.node, signal.SIGKILL)
        for p in doomed:
            try:
                p.kill()
            except Exception:
                pass
        self.cluster.wait_exit(f.node, 10)
        f.note = f"{len(doomed)} processes killed"
        self.cluster.start_node(f.node)

    def _ctld(self, f: Fault) -> None:
        self.cluster.signal("airctld", signal.SIGKILL)
        self.cluster.wait_exit("airctld", 10)
        self.cluster.start_controller()

    def _restart(self, f: Fault) -> None:
        self.cluster.signal(f.node, signal.SIGTERM)
        if not self.cluster.wait_exit(f.node, 30):
            f.note = "did not exit within 30 s of SIGTERM: killed"
            self.cluster.signal(f.node, signal.SIGKILL)
            self.cluster.wait_exit(f.node, 10)
        self.cluster.start_node(f.node)

    def _crash(self, f: Fault) -> None:
        self.cluster.signal(f.node, signal.SIGKILL)
        self.cluster.wait_exit(f.node, 10)
        self.cluster.start_node(f.node)

    def _cut(self, f: Fault) -> None:
        self.cluster.net.cut(f.node)
        time.sleep(self.hold_s)
        self.cluster.net.restore(f.node)

    def _xid(self, f: Fault) -> None:
        gpu = self.state["gpus"][f.node][0]
        f.note = f"GPU {gpu}"
        self.cluster.cli("aircontrol", "node", "fault", f.node, "--gpu", str(gpu), "--xid", "79")
        # an admin looks at the node once the job trains again elsewhere (or has not been moved at all)
        began = time.time()
        while time.time() < began + 120 and not any(r > f.run for r in self.steps.steps):
            if time.time() > began + 30 and self.refresh() and self.state["restart_count"] == f.run:
                f.note += "; the job was not requeued"
                break
            time.sleep(0.5)
        self.cluster.cli("aircontrol", "node", "resume", f.node)

    def _preempt(self, f: Fault) -> None:
        script = self.work / "preempt.sh"
        script.write_text(f"#!/bin/sh\nsleep {self.args.preempt_seconds:g}\n")
        job = int(self.cluster.cli("airbatch", "--parsable", "-N", str(len(self.cluster.names)), "--gpus-per-node=2",
                                   "--qos=high", "-o", str(self.work / "preempt-%j.out"), str(script)).strip())
        self.preemptors.append(job)
        f.note = f"job {job}"


def _host_processes(job: str, node: str, cluster_dir) -> list:
    """What a crash of the host takes with the daemon: the job's processes there (in this cluster's spool:
    another cluster on the host numbers its jobs from 1 too), and the shepherds that started them (they
    outlive a daemon on purpose, and would report the kill as the job's exit)."""
    import psutil
    found = job_processes(cluster_dir / "spool", [job], node)
    for p in list(found):
        try:
            parent = p.parent()
            if parent is not None and parent not in found and "shepherd" in " ".join(parent.cmdline()):
                found.append(parent)
        except psutil.Error:
            pass
    return found


# ------------------------------------------------------------------ the run


def submit_training(cluster: Cluster, work: Path, steps: int, args) -> int:
    script = work / "train.sh"
    script.write_text(f"#!/bin/bash\nexec airrun {sys.executable} {TRAIN} --steps {steps} --every 0 "
                      f"--every-seconds {args.checkpoint_seconds:g} --sleep {args.sleep:g} {' '.join(SMALL)} "
                      f"--checkpoint-dir {work}/ckpt --log {work}/train.run$AIR_RESTART_COUNT --out {work}/final.pt\n")
    limit = int(args.minutes * 4 + 30)
    return int(cluster.cli("airbatch", "--parsable", "-J", "tinygpt", "-N", "2", "--gpus-per-node=2",
                           "--ntasks-per-node=2", f"--time={limit // 60}:{limit % 60:02d}:00",
                           "-o", str(work / "train-%j.out"), str(script)).strip())


def chaos_run(work: Path, steps: int, args) -> dict:
    cluster = Cluster(work / "cluster", node_timeout=args.node_timeout)
    rng = random.Random(args.seed)
    kinds = [k for k in args.faults.split(",") if k]
    order: list[str] = []
    try:
        cluster.up()
        job = submit_training(cluster, work, steps, args)
        log, overlaps = StepLog(work), Overlaps(str(job), cluster.dir / "spool")
        watch = Watch(log, overlaps, args.sample_every)
        watch.start()
        chaos = Chaos(cluster, job, work, args, log)
        deadline = time.time() + args.minutes * 60 * 3 + 600
        first_start = None
        next_at = math.inf
        while time.time() < deadline:
            state = chaos.refresh()
            if state and state["state"] in TERMINAL:
                break
            if state and first_start is None and state["state"] == "RUNNING":
                first_start = time.time()
                next_at = first_start + rng.expovariate(1 / args.every)
            if kinds and time.time() >= next_at and chaos.ready():
                if not order:
                    order = rng.sample(kinds, len(kinds))
                chaos.inject(order.pop(0), rng)
                next_at = time.time() + rng.expovariate(1 / args.every)
            time.sleep(0.2)
        final = chaos.refresh() or {}
        if final.get("state") not in TERMINAL:
            print(f"job {job} did not finish within the deadline: {final.get('state')}; cancelling it", flush=True)
            cluster.cli("aircancel", str(job), check=False)
        # a preemptor still queued must run to its end too: it is an accepted job
        wait_until = time.time() + 120
        others = {j: cluster.job(j)["state"] for j in chaos.preemptors}
        while any(s not in TERMINAL for s in others.values()) and time.time() < wait_until:
            time.sleep(1)
            others = {j: cluster.job(j)["state"] for j in chaos.preemptors}
        time.sleep(0.5)
        watch.stop.set()
        watch.join()
        log.poll()
        if watch.error:
            print(f"bench_chaos: the watcher failed: {watch.error!r}", file=sys.stderr)
        return {"job": job, "final": final, "others": others, "faults": chaos.faults, "steps": log.steps,
                "restored": log.restored, "overlaps": overlaps, "events": _events(cluster, job),
                "ranks": ranks_started(cluster.dir / "log", job)}
    finally:
        cluster.down()


RANKS_STARTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) airnoded\[\w+\] INFO step (\d+)\.\d+ "
                           r"\(run (\d+)\): \d+ ranks started")


def ranks_started(logs: Path, job: int) -> dict[int, float]:
    """run -> when the last node daemon started that run's ranks (the daemons log in local time)."""
    from datetime import datetime
    started: dict[int, float] = {}
    for path in logs.glob("node*.log"):
        for line in path.read_text(errors="replace").splitlines():
            m = RANKS_STARTED.match(line)
            if m and int(m.group(2)) == job:
                t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                started[int(m.group(3))] = max(started.get(int(m.group(3)), 0.0), t)
    return started


def _events(cluster: Cluster, job: int) -> list[tuple]:
    db = sqlite3.connect(f"file:{cluster.dir / 'state' / 'air.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT time, old_state, new_state, reason, detail FROM events WHERE job_id = ? "
                          "ORDER BY id", (job,)).fetchall()
    finally:
        db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="uninterrupted training time (sets --steps)")
    parser.add_argument("--every", type=float, default=120.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(KINDS), help=f"which, of {','.join(KINDS)}")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default: --minutes' worth, measured)")
    parser.add_argument("--sleep", type=float, default=0.2, help="extra seconds per step (a GPU's compute time)")
    parser.add_argument("--checkpoint-seconds", type=float, default=10.0)
    parser.add_argument("--node-timeout", type=float, default=10.0)
    parser.add_argument("--preempt-seconds", type=float, default=5.0)
    parser.add_argument("--sample-every", type=float, default=0.2, help="seconds between process samples")
    parser.add_argument("--reference", help="folder of the uninterrupted run: reused when it matches, else made")
    parser.add_argument("--work", help="working folder (default: a new one in /tmp, kept)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="measure --steps and make the reference, then stop (to reuse them in later runs)")
    parser.add_argument("--write")
    args = parser.parse_args()
    unknown = [k for k in args.faults.split(",") if k and k not in KINDS]
    if unknown:
        parser.error(f"--faults: {unknown[0]!r} is not one of {','.join(KINDS)}")
    if os.environ.get(INSIDE) != "1":
        # torchrun's rendezvous fails inside the benchmark's network namespace here: the uninterrupted
        # run (and the measure of a step) happen before entering it
        work = Path(args.work or tempfile.mkdtemp(prefix="air-bench-chaos-")).resolve()
        work.mkdir(parents=True, exist_ok=True)
        os.chmod(work, 0o755)
        print(f"working in {work}", flush=True)
        steps = args.steps
        if not steps:
            per_step = calibrate(work, args.sleep)
            steps = math.ceil(args.minutes * 60 / per_step)
            print(f"{per_step * 1000:.0f} ms a step: {steps} steps for {args.minutes:g} min (--steps {steps})",
                  flush=True)
        ref = reference(Path(args.reference).resolve() if args.reference else work / "reference", steps)
        if args.prepare_only:
            print(f"next: --steps {steps} --reference {ref}")
            return 0
        os.environ["AIR_CHAOS_COMMAND"] = " ".join(sys.argv[1:])
        enter_private_namespace([*sys.argv, "--steps", str(steps), "--reference", str(ref), "--work", str(work)])
    work, steps, ref = Path(args.work), args.steps, Path(args.reference)
    began, cpu = time.time(), time.process_time()
    got = chaos_run(work, steps, args)
    took = time.time() - began
    got["own_cpu"] = (time.process_time() - cpu) / took
    print(f"chaos run: {took:.0f} s; the benchmark itself used {got['own_cpu']:.1%} of a core", flush=True)
    return report(work, ref, steps, got, args)


def _goodput_text(g: dict | None) -> str:
    if not g:
        return "-"
    parts = ", ".join(f"{k[:-2]} {g[k]:.0f} s" for k in ("starting_s", "restoring_s", "training_s", "checkpoint_s",
                                                            "lost_s", "down_s", "other_s"))
    return f"{g['ettr']:.1%}{' (partial)' if g.get('partial') else ''}: {parts}; {g['lost_steps']} steps lost"


def report(work: Path, ref: Path, steps: int, got: dict, args) -> int:
    import torch
    analysis = analyse(got["steps"], got["restored"], got["events"], got["faults"], steps, got["ranks"])
    lost_jobs = [f"{got['job']} ({got['final'].get('state')})"] if got["final"].get("state") != "COMPLETED" else []
    lost_jobs += [f"{j} ({s})" for j, s in got["others"].items() if s != "COMPLETED"]
    mismatched = set()
    for rank in range(4):
        mismatched |= set(batch_mismatches(history(work / "train.run", rank), history(ref / "log", rank)))
    equal = None
    if (work / "final.pt").exists():
        final, expected = torch.load(work / "final.pt"), torch.load(ref / "final.pt")
        equal = final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in expected)
    episodes = got["overlaps"].episodes
    late = late_steps(got["steps"])
    resumes = [o.resume for o in analysis.outcomes if o.resume is not None]
    counts = {k: sum(f.kind == k for f in got["faults"]) for k in KINDS}
    shown_faults = ", ".join(f"{k} {n}" for k, n in counts.items() if n)
    interval = (analysis.end - analysis.start) / len(got["faults"]) if got["faults"] else 0.0
    seen_text = ", ".join(sorted(got["overlaps"].runs_seen)) or "none"
    rows = [
        ("faults injected", f"{len(got['faults'])}: {shown_faults or 'none'}",
         f"one every {interval:.0f} s of the run on average (asked: {args.every:g} s)"),
        ("overlapping runs seen",
         f"{len(episodes)}" if got["overlaps"].found else "NOT MEASURED: no sample saw the job",
         f"{got['overlaps'].samples} samples of every process, every {args.sample_every:g} s, "
         f"{got['overlaps'].found} with the job's processes (runs {seen_text}); "
         f"and {len(late)} steps logged by a run after a newer run's first step; goal 0"),
        ("accepted jobs not completed", f"{len(lost_jobs)}" + (f": {', '.join(lost_jobs)}" if lost_jobs else ""),
         f"the training job and {len(got['others'])} preemptors; goal 0"),
        ("steps lost", f"{len(analysis.missing) + len(mismatched - set(analysis.missing))}",
         f"of {steps}: missing from the final history ({len(analysis.missing)}) or trained on another batch than "
         f"the uninterrupted run's ({len(mismatched)})"),
        ("final parameters = uninterrupted run's", {True: "yes, bit for bit", False: "NO",
                                                    None: "no final parameters"}[equal], "4 ranks under torchrun"),
        ("ETTR", f"{analysis.ettr:.1%}", f"{analysis.useful:.0f} s of steps that count / {analysis.wall:.0f} s from "
         f"the first start to the end; goal >= 90%"),
        ("ETTR by AIR's own goodput accounting", _goodput_text(got["final"].get("goodput")),
         "aircontrol show job: what the runtime and the controller recorded (docs/runtime.md, Goodput)"),
        ("fault -> first step after it, mean (s)", f"{sum(resumes) / len(resumes):.1f}" if resumes else "-",
         f"{len(resumes)} faults; {analysis.runs} runs of the job"),
        ("the benchmark's own CPU", f"{got.get('own_cpu', 0):.1%} of a core",
         "its process sampler and log readers, on the cores the cluster uses"),
    ]
    table = table_of(["figure", "value", "note"], rows)
    misses = []
    if analysis.ettr < 0.9:
        misses.append(f"ETTR {analysis.ettr:.1%} < 90%")
    if episodes or late:
        misses.append(f"{len(episodes)} overlapping runs, {len(late)} steps of an older run logged late")
    seen = got["overlaps"].runs_seen
    if len(seen) < min(analysis.runs, 2):   # (one run seen: no two could have been seen at once)
        misses.append(f"overlaps not measured: the sampler saw the job's runs {sorted(seen)} of {analysis.runs}")
    if lost_jobs:
        misses.append(f"{len(lost_jobs)} accepted jobs not completed")
    if analysis.missing or mismatched or not equal:
        misses.append("steps lost or final parameters differ")
    if args.every > 120:
        misses.append(f"faults rarer than the goal's (every {args.every:g} s)")
    verdict = "Goal met." if not misses else "GOAL NOT MET: " + "; ".join(misses) + "."
    where = (f"Where the {analysis.wall - analysis.useful:.0f} s not spent on steps that count went: first start "
             f"to first step {analysis.startup:.1f} s; faults {sum(o.cost or 0 for o in analysis.outcomes):.1f} s "
             f"(per kind below); last step to the job's end {analysis.tail:.1f} s; the rest {analysis.other:.1f} s "
             f"(steps slower than usual count as useful).")
    text = "\n\n".join([table, verdict, where, per_kind_table(analysis), timeline_table(analysis)])
    if episodes:
        text += "\n\nOverlaps:\n" + "\n".join(
            f"- {e['start'] - analysis.start:.1f} s to {e['end'] - analysis.start:.1f} s ({e['samples']} samples), "
            f"runs {e['runs']}: " + "; ".join(f"{p['pid']} run {p['run']} {p['node']} {p['cmd'][:60]}"
                                               for p in e["processes"]) for e in episodes)
    (work / "report.md").write_text(text + "\n")
    raw = {"steps": got["steps"], "restored": got["restored"], "events": got["events"], "ranks": got["ranks"],
           "faults": [vars(f) for f in got["faults"]], "overlaps": episodes, "final": got["final"],
           "others": got["others"], "total_steps": steps,
           "sampler": {"samples": got["overlaps"].samples, "found": got["overlaps"].found,
                       "runs_seen": sorted(got["overlaps"].runs_seen)}}
    (work / "raw.json").write_text(json.dumps(raw, indent=1))   # to work the figures out again
    write_report("chaos", text, args.write,
           f"tinygpt ({steps} steps) on 2 of 3 local nodes (2 ranks each), a checkpoint every "
           f"{args.checkpoint_seconds:g} s, node timeout {args.node_timeout:g} s, faults every {args.every:g} s on "
           f"average, seed {args.seed}", command=f"python bench/bench_chaos.py {os.environ.get('AIR_CHAOS_COMMAND', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
