"""What -w/-x/-C/--exclusive cost a scheduling pass, with the real scheduling code.

    python bench/bench_filters.py [--nodes 10000] [--jobs 200] [--write bench/RESULTS.md]

A cluster of --nodes nodes of 8 GPUs, every GPU busy with a running job whose time limit ends at a
different time (so every pending job gets a reservation), half the nodes with features "a" and "ib",
half with "b". One pass over --jobs pending one-node jobs, best of three, for: plain jobs; jobs with
`-x` of one node; `--exclusive` jobs; jobs with a 64-name constraint (the most a constraint may
have); and a mixed queue with 16 top-priority jobs that each name a node and a 64-name constraint
ahead of 50 plain jobs, on a cluster half free (the pass must start the plain jobs). Also the check
at submit of a `-w` that names every node. No Slurm figure: the peer Slurm here has one node.
"""
from __future__ import annotations

import argparse
import time

from air.airctld import nodefilter, scheduler
from harness import report, table
from air.airctld.model import Job, Node, NodeAlloc
from air.protos import air_pb2 as pb
from air.protos.config import PartitionConfig
from air.protos.states import JobPhase, NodeState


def cluster(count: int):
    names = [f"n{i:05d}" for i in range(count)]
    features = {n: frozenset({"a", "ib"} if i % 2 else {"b"}) for i, n in enumerate(names)}
    nodes = [Node(name=n, cpus=64, gpus=tuple(pb.Gpu(index=g) for g in range(8)), state=NodeState.UP) for n in names]
    active = [Job(job_id=1_000_000 + i, uid=0, gid=0, user="r", name="r", partition="gpu", num_nodes=1,
                  gpus_per_node=8, cpus_per_node=1, time_limit_s=1000 + i, submit_time=0.0, phase=JobPhase.RUNNING,
                  start_time=0.0, allocation=(NodeAlloc(n, tuple(range(8)), 1),), request=pb.JobRequest())
              for i, n in enumerate(names)]
    return names, features, nodes, active


def job(job_id: int, priority: int = 0, **request) -> Job:
    return Job(job_id=job_id, uid=0, gid=0, user="u", name="j", partition="gpu", num_nodes=1, gpus_per_node=1,
               cpus_per_node=1, time_limit_s=100, submit_time=float(job_id), priority=priority,
               request=pb.JobRequest(nodes=1, **request))


def best_pass(pending, nodes, active, features, part, **kw) -> tuple[float, scheduler.Plan]:
    best, plan = float("inf"), None
    for _ in range(3):
        free = scheduler.free_resources(nodes, active, features=features)
        began = time.perf_counter()
        plan = scheduler.schedule(pending, free, {"gpu": part}, active=active, now=0.0, **kw)
        best = min(best, time.perf_counter() - began)
    return best, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--write")
    args = parser.parse_args()
    names, features, nodes, active = cluster(args.nodes)
    part = PartitionConfig(name="gpu", nodes=tuple(names), default=True)
    longest = "|".join(["b"] * (nodefilter.MAX_TERMS - 1)) + "|a"
    rows = []
    for label, request in (("plain", {}), ("-x of one node", {"exclude": [names[0]]}),
                           ("--exclusive", {"exclusive": True}),
                           (f"-C of {nodefilter.MAX_TERMS} names", {"constraint": longest})):
        seconds, plan = best_pass([job(i + 1, **request) for i in range(args.jobs)], nodes, active, features, part)
        rows.append((f"one pass, {args.jobs} pending jobs, {label} (s)", f"{seconds:.3f}",
                     f"{len(plan.reservations)} reservations"))
    half = active[: args.nodes // 2]
    hostile = [job(i + 1, priority=1000, nodelist=[names[0]], constraint=longest) for i in range(16)]
    seconds, plan = best_pass(hostile + [job(100 + i) for i in range(50)], nodes, half, features, part,
                              max_pass_s=0.5, timer=time.perf_counter)
    rows.append(("one pass, 16 top jobs with -w and a 64-name -C before 50 plain jobs, half the nodes free (s)",
                 f"{seconds:.3f}", f"{len(plan.starts)} of the plain jobs started"))
    began = time.perf_counter()
    nodefilter.settle(pb.JobRequest(nodelist=names), "gpu", names, features, names)
    rows.append((f"submit check of -w naming all {args.nodes} nodes (s)", f"{time.perf_counter() - began:.3f}", ""))
    report("node filters", table(["figure", "AIR", "note"], rows), args.write,
           f"{args.nodes} nodes of 8 GPUs, all busy (every pending job is reserved a node). No Slurm figure (the "
           "peer Slurm has one node)")


if __name__ == "__main__":
    main()
