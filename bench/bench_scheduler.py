"""The scheduler at scale, and what backfill buys, with the real scheduling code.

    python bench/bench_scheduler.py [--quick] [--before REV] [--write bench/RESULTS.md]

1. One full pass (fairshare over the account tree, multifactor priority of every pending job,
   then the scheduler: limits, placement, reservations and backfill) on 1,000, 4,000 and
   10,000 nodes of 8 GPUs with 10,000, 50,000 and 100,000 pending jobs. The cluster is 90% busy
   with running jobs that have time limits, and the queue is a mix of 1- to 64-node jobs,
   so every pass makes reservations and backfills. Best of three passes on fresh copies.
2. GPU utilisation over a simulated day of a mixed trace (1- to 64-node jobs, runtimes from
   minutes to hours, time limits above the runtimes, 5% of them in a QOS that preempts the rest)
   on 256 nodes, with and without backfill, with this scheduler and with the one of commit REV
   (--before, loaded from git): also how much later the first waiting job could start because of
   each pass's backfill (must be 0), and the preemptions (most by one preemptor of one victim).

Slurm does not run here at these sizes; its default backfill looks at 500 jobs per 30 s cycle
(bf_max_job_test=500, bf_interval=30), which is the figure to compare the pass time with.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import tempfile
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airctld import fairshare, scheduler  # noqa: E402
from airctld.config import PartitionConfig, QosConfig, SchedulerConfig  # noqa: E402
from airctld.fairshare import Assoc  # noqa: E402
from airctld.model import Job, NodeAlloc  # noqa: E402
from airctld.priority import PriorityModel, association  # noqa: E402
from airctld.simulate import TraceJob, make_nodes, simulate  # noqa: E402
from protos import air_pb2 as pb  # noqa: E402
from protos.states import JobPhase  # noqa: E402

SIZES = [1, 1, 1, 1, 2, 2, 4, 8, 16, 32, 64]          # nodes a job asks for
GPUS = [1, 2, 4, 8, 8, 8]                             # GPUs per node, for one-node jobs
ACCOUNTS = [Assoc(f"acct{i:02d}", shares=1 + i % 4) for i in range(20)]
USERS = [(f"acct{i % 20:02d}", f"user{i:03d}") for i in range(200)]


def _request(rng, n_nodes: int) -> tuple[int, int]:
    nodes = rng.choice(SIZES)
    gpus = rng.choice(GPUS) if nodes == 1 else 8
    return min(nodes, n_nodes), gpus


def _snapshot(n_nodes: int, n_pending: int, seed: int = 1):
    rng = random.Random(seed)
    nodes = make_nodes(n_nodes)
    switches = {n.name: f"leaf{i // 32:03d}" for i, n in enumerate(nodes)}
    active = []
    job_id = 10_000_000
    # 90% of the GPUs busy: whole-node jobs on most nodes, partial ones on some
    for i, node in enumerate(nodes):
        r = rng.random()
        if r < 0.8:
            taken = 8
        elif r < 0.95:
            taken = rng.choice([2, 4, 6])
        else:
            continue
        account, user = rng.choice(USERS)
        limit = rng.choice([3600, 4 * 3600, 12 * 3600, 24 * 3600])
        active.append(Job(job_id=job_id, uid=1, gid=1, user=user, name="r", partition="p", num_nodes=1,
                          gpus_per_node=taken, cpus_per_node=1, time_limit_s=limit, submit_time=0.0,
                          request=pb.JobRequest(account=account), phase=JobPhase.RUNNING,
                          start_time=-rng.random() * limit, allocation=(NodeAlloc(node.name, tuple(range(taken)), 1),)))
        job_id += 1
    pending = []
    for k in range(1, n_pending + 1):
        account, user = rng.choice(USERS)
        nodes_wanted, gpus = _request(rng, n_nodes)
        pending.append(Job(job_id=k, uid=1, gid=1, user=user, name="p", partition="p", num_nodes=nodes_wanted,
                           gpus_per_node=gpus, cpus_per_node=1, time_limit_s=rng.choice([1800, 3600, 4 * 3600, 86400]),
                           submit_time=-rng.random() * 86400, request=pb.JobRequest(account=account)))
    usage = {leaf: rng.random() * 1e7 for leaf in USERS}
    return nodes, switches, active, pending, usage


def one_pass(nodes, switches, active, pending, usage, now: float = 0.0) -> tuple[float, scheduler.Plan]:
    sched = SchedulerConfig()
    partitions = {"p": PartitionConfig("p", tuple(n.name for n in nodes), default=True)}
    qos = {"normal": QosConfig("normal")}
    began = time.perf_counter()
    tree = fairshare.complete_tree(ACCOUNTS, {association(j) for j in pending} | set(usage))
    shares = fairshare.compute(tree, usage)
    model = PriorityModel(sched, partitions, qos, {k: s.fairshare for k, s in shares.items() if k[1]},
                          len(nodes) * 8, len(nodes) * 64)
    priority = model.priorities(pending, now)
    free = scheduler.free_resources(nodes, active, switches)
    plan = scheduler.schedule(pending, free, partitions, now=now, active=active, priority=priority,
                              limits=scheduler.Limits(qos=qos), reservations=sched.reservations,
                              max_pass_s=sched.max_pass_s, timer=time.perf_counter)
    return time.perf_counter() - began, plan


def pass_table(node_counts, pending_counts) -> list[str]:
    lines = ["| nodes (8 GPUs) | pending jobs | full pass | started | reserved | per pending job |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n_nodes in node_counts:
        for n_pending in pending_counts:
            snap = _snapshot(n_nodes, n_pending)
            best, plan = min((one_pass(*snap) for _ in range(3)), key=lambda r: r[0])
            line = (f"| {n_nodes:,} | {n_pending:,} | {best * 1000:.0f} ms | {len(plan.starts)} | "
                    f"{len(plan.reservations)} | {best / n_pending * 1e6:.1f} us |")
            print(line, flush=True)
            lines.append(line)
    return lines


def _trace(n_nodes: int, day: float, seed: int = 2) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    job_id = 1
    offered = 0.0
    # offer about 1.3 times what the cluster can run in the day, arriving through the day
    while offered < 1.3 * n_nodes * 8 * day:
        nodes, gpus = _request(rng, n_nodes)
        runtime = rng.choice([600, 1800, 3600, 2 * 3600, 4 * 3600]) * rng.uniform(0.5, 1.0)
        limit = int(runtime * rng.uniform(1.1, 2.0))
        account, user = rng.choice(USERS)
        qos = "high" if rng.random() < 0.05 else "normal"
        jobs.append(TraceJob(job_id, t, user, account, nodes, gpus, runtime, limit, qos))
        offered += nodes * gpus * runtime
        job_id += 1
        t = min(day * 0.9, t + rng.expovariate(1 / 20.0))
    return jobs


QOS = (QosConfig("normal"), QosConfig("high", priority=10, preempt=("normal",)))
BEFORE = "79fc2a6"   # the last commit before backfill counted the jobs started earlier in a pass


def load_scheduler(rev: str):
    """The schedule function of airctld/scheduler.py as of commit `rev`."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:airctld/scheduler.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"scheduler_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.schedule


def utilisation(n_nodes: int = 256, before: str = BEFORE) -> list[str]:
    day = 86400.0
    trace = _trace(n_nodes, day)
    lines = ["| scheduler | backfill | GPU utilisation over the day | jobs started | mean pass | first waiting "
             "job's delay from backfill, mean / worst | preemptions | most by one preemptor of one victim |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, impl in (("this one", None), (f"before ({before})", load_scheduler(before))):
        for backfill in (True, False):
            r = simulate(trace, make_nodes(n_nodes), until=day, assocs=ACCOUNTS, qos=QOS, pass_every=60.0,
                         backfill=backfill, measure_delay=backfill, schedule=impl)
            mean = sum(r.pass_seconds) / max(len(r.pass_seconds), 1)
            delays = r.top_delays or [0.0]
            delay = f"{sum(delays) / len(delays):.0f} s / {max(delays):.0f} s" if backfill else "-"
            line = (f"| {label} | {'on' if backfill else 'off'} | {r.utilisation * 100:.1f}% | {r.started:,} | "
                    f"{mean * 1000:.1f} ms | {delay} | {sum(r.preemptions.values())} | "
                    f"{max(r.preemptions.values(), default=0)} |")
            print(line, flush=True)
            lines.append(line)
    lines.insert(0, f"Simulated day on {n_nodes} nodes of 8 GPUs, {len(trace):,} jobs of 1 to 64 nodes offered "
                    f"(about 1.3 days of work, 5% in a QOS that preempts the others), a pass every 60 s:\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the smallest sizes only")
    parser.add_argument("--write", help="append the figures to this markdown file")
    parser.add_argument("--before", default=BEFORE, help="the commit whose scheduler to compare with")
    args = parser.parse_args()
    nodes = [1000] if args.quick else [1000, 4000, 10000]
    pending = [10000] if args.quick else [10000, 50000, 100000]
    lines = pass_table(nodes, pending)
    lines += [""] + utilisation(64 if args.quick else 256, args.before)
    if args.write:
        with open(args.write, "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: scheduler\n\n"
                    "`python bench/bench_scheduler.py --write bench/RESULTS.md` (2 cores). One full pass: "
                    "fairshare, priority of every pending job, limits, placement, reservations (1,000, then nothing "
                    "passes an unreserved job) and backfill, the placement stopping after `max_pass_s` = 0.5 s "
                    "(as Slurm's bf_max_time); best of three. Slurm's default backfill examines 500 jobs per 30 s cycle.\n\n"
                    + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
