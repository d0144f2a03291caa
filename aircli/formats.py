"""squeue/sinfo-style output: `%`-field format strings, columns, and the fields themselves. Pure.
The job rows' fields live in air.protos.squeue, which airctld renders too."""
from __future__ import annotations

import json
from typing import Callable

import hostlist

from air.protos.timefmt import format_duration, format_limit
from air.protos import air_pb2 as pb
from air.protos.squeue import _gres, _timestamp, elapsed, nodelist, progress_of, reason_text
from air.protos.states import REASON_NAMES, Reason, long_state, node_state_name, state_code

SINFO_DEFAULT = "%9P %.5a %.10l %.6D %.6t %.11G %N"
SINFO_NODE_DEFAULT = "%N %.6D %9P %.6t %.11G %.9C"


def job_json(job: pb.Job, now: float) -> dict:
    return {
        "job_id": job.job_id, "name": job.request.name, "user": job.user, "uid": job.uid,
        "partition": job.partition, "account": job.request.account,
        "state": long_state(job.phase, job.result), "state_code": state_code(job.phase, job.result),
        "reason": reason_text(job), "reason_detail": job.reason_detail,
        "nodes": [a.node for a in job.allocation], "nodelist": nodelist(job),
        "gpus": {a.node: list(a.gpus) for a in job.allocation},
        "num_nodes": len(job.allocation) or job.request.nodes or 1,
        "gpus_per_node": job.request.gpus_per_node, "time_limit_s": job.time_limit_s,
        "elapsed_s": round(elapsed(job, now), 3), "submit_time": job.submit_time,
        "start_time": job.start_time or None, "end_time": job.end_time or None,
        "exit_code": job.exit_code, "exit_signal": job.exit_signal, "workdir": job.request.workdir,
        "restart_count": job.restart_count,
        "last_stop_reason": REASON_NAMES[Reason(job.last_stop_reason)] if job.restart_count else None,
        "qos": job.request.qos, "priority": job.priority, "dependency": job.request.dependency,
        "array_job_id": job.array_job_id or None,
        "progress": progress_of(job) or None, "last_progress": job.last_progress or None,
        "array_task_id": (job.array_pending_tasks or job.array_task_id) if job.array_job_id else None,
        "goodput": goodput_json(job.goodput) if job.HasField("goodput") else None,
    }


GOODPUT_CATEGORIES = ("queued", "starting", "restoring", "training", "checkpoint", "lost", "down", "other")


def goodput_json(g: pb.Goodput) -> dict:
    out = {f"{c}_s": round(getattr(g, f"{c}_s"), 3) for c in GOODPUT_CATEGORIES}
    out.update(wall_s=round(g.wall_s, 3), ettr=round(g.ettr, 4), lost_steps=g.lost_steps, runs=g.runs,
               partial=g.partial)
    return out


def goodput_keyvalues(g: pb.Goodput) -> list[str]:
    """Where the job's time went (aircontrol show job): ETTR, then each category."""
    if not g.wall_s:
        return [f"Goodput=(null) Queued={format_duration(g.queued_s)}"]
    return ([f"Goodput={g.ettr * 100:.1f}%{'(partial)' if g.partial else ''}"]
            + [f"{c.capitalize()}={format_duration(getattr(g, c + '_s'))}" for c in GOODPUT_CATEGORIES]
            + [f"LostSteps={g.lost_steps}"])


def job_keyvalues(job: pb.Job, now: float) -> list[str]:
    """scontrol show job: Key=Value pairs, a few to a line."""
    req = job.request
    from air.protos.outputs import output_paths
    out, err = output_paths(job, job.allocation[0].node if job.allocation else "%N")
    gpus = ";".join(f"{a.node}:{','.join(map(str, a.gpus)) or '-'}" for a in job.allocation)
    lines = [
        [f"JobId={job.job_id}", f"JobName={req.name}"]
        + ([f"ArrayJobId={job.array_job_id}", f"ArrayTaskId={job.array_task_id}"] if job.array_job_id else []),
        [f"UserId={job.user}({job.uid})", f"GroupId={job.gid}", f"Account={req.account or '(null)'}"],
        [f"Priority={job.priority}", f"Nice={req.nice}", f"QOS={req.qos or 'normal'}", f"Partition={job.partition}"],
        [f"JobState={long_state(job.phase, job.result)}", f"Reason={reason_text(job)}",
         f"Dependency={req.dependency or '(null)'}"],
        [f"ReasonDetail={job.reason_detail or '(null)'}"],
        [f"ExitCode={job.exit_code}:{job.exit_signal}", f"Restarts={job.restart_count}",
         f"LastStopReason={REASON_NAMES[Reason(job.last_stop_reason)] if job.restart_count else '(null)'}",
         f"Requeue={0 if req.no_requeue else 1}"],
        [f"RunTime={format_duration(elapsed(job, now))}", f"TimeLimit={format_limit(job.time_limit_s)}"],
        [f"SubmitTime={_timestamp(job.submit_time)}", f"StartTime={_timestamp(job.start_time)}",
         f"EndTime={_timestamp(job.end_time)}"],
        [f"NodeList={nodelist(job) or '(null)'}", f"BatchHost={job.allocation[0].node if job.allocation else '(null)'}"],
        [f"ReqNodeList={hostlist.collect_hostlist(list(req.nodelist)) or '(null)'}",
         f"ExcNodeList={hostlist.collect_hostlist(list(req.exclude)) or '(null)'}",
         f"Features={req.constraint or '(null)'}", f"OverSubscribe={'NO' if req.exclusive else 'OK'}"],
        [f"NumNodes={len(job.allocation) or req.nodes or 1}", f"NumTasks={(req.nodes or 1) * (req.ntasks_per_node or 1)}",
         f"CPUs/Task={req.cpus_per_task or 1}"],
        [f"TresPerNode={_gres(job)}", f"GpuIndices={gpus or '(null)'}"],
        [f"WorkDir={req.workdir}"],
        [f"Progress={json.dumps(progress_of(job), separators=(',', ':')) if job.progress else '(null)'}"],
        goodput_keyvalues(job.goodput),
        [f"StdOut={out}"],
        [f"StdErr={err or out}"],
    ]
    return ["   " * (i > 0) + " ".join(parts) for i, parts in enumerate(lines)]


# ---------------------------------------------------------------- pending jobs (airq --priority, --start)

def priority_rows(jobs) -> list[list[str]]:
    """sprio's columns: each factor times its weight."""
    rows = [["JOBID", "PARTITION", "USER", "ACCOUNT", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "PARTITION",
             "QOS", "NICE"]]
    for p in jobs:
        w = list(p.weights) or [0] * 5
        rows.append([str(p.job_id), p.partition, p.user, p.account, str(p.priority),
                     *(f"{round(f * wt)}" for f, wt in zip((p.age, p.fairshare, p.jobsize, p.partition_factor,
                                                           p.qos_factor), w)), str(p.nice)])
    return rows


def start_rows(jobs) -> list[list[str]]:
    """squeue --start's columns: the estimated start, from the last pass's reservations."""
    rows = [["JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "SCHEDNODES", "NODELIST(REASON)"]]
    for p in jobs:
        start = _timestamp(p.est_start) if p.est_start else "N/A"
        sched = hostlist.collect_hostlist(list(p.est_nodes)) if p.est_nodes else "(null)"
        rows.append([str(p.job_id), p.partition, p.name, p.user, "PD", start, sched,
                     f"({REASON_NAMES[Reason(p.reason)]})"])
    return rows


def table(rows: list[list[str]], header: bool = True, left: tuple[int, ...] = (0,)) -> list[str]:
    """Columns padded to their widest cell: right-aligned but for the `left` ones."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if not header:
        rows = rows[1:]
    return [" ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


# ---------------------------------------------------------------- shares (airshare)

SHARE_COLUMNS = ["Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"]


def share_rows(rows, long: bool = False) -> list[list[str]]:
    cols = SHARE_COLUMNS + (["NormUsage", "GrpGPUs", "GPUsInUse"] if long else [])
    out = [cols]
    for r in rows:
        line = [" " * r.depth + r.account, r.user, str(r.raw_shares), f"{r.norm_shares:.6f}",
                f"{round(r.raw_usage)}", f"{r.eff_usage:.6f}", f"{r.fairshare:.6f}"]
        if long:
            line += [f"{r.norm_usage:.6f}", str(r.max_gpus or ""), str(r.gpus_in_use)]
        out.append(line)
    return out


def share_json(r) -> dict:
    return {"account": r.account, "user": r.user or None, "raw_shares": r.raw_shares,
            "norm_shares": r.norm_shares, "raw_usage": r.raw_usage, "norm_usage": r.norm_usage,
            "effective_usage": r.eff_usage, "fairshare": r.fairshare, "max_gpus": r.max_gpus or None,
            "gpus_in_use": r.gpus_in_use}


# ---------------------------------------------------------------- nodes

def node_state(node: pb.Node) -> str:
    """sinfo's short state: idle, mix, alloc, down, drain, drng, unk."""
    return node_state_name(node)


def node_fields() -> dict[str, tuple[str, Callable]]:
    """Fields of a node group: (partition, state, [nodes]) for sinfo, one node for sinfo -N."""
    def nodes(g):
        return g[2]
    return {
        "P": ("PARTITION", lambda g: g[0].name + ("*" if g[0].default else "")),
        "R": ("PARTITION", lambda g: g[0].name),
        "a": ("AVAIL", lambda g: "up" if g[0].up else "down"),
        "l": ("TIMELIMIT", lambda g: "infinite" if not g[0].max_time_s else format_limit(g[0].max_time_s)),
        "D": ("NODES", lambda g: len(nodes(g))),
        "t": ("STATE", lambda g: g[1]),
        "T": ("STATE", lambda g: {"idle": "idle", "mix": "mixed", "alloc": "allocated", "down": "down",
                                  "drain": "drained", "drng": "draining", "unk": "unknown"}[g[1]]),
        "N": ("NODELIST", lambda g: hostlist.collect_hostlist([n.name for n in nodes(g)])),
        "G": ("GPUS(F/T)", lambda g: f"{sum(len(n.gpus) - n.gpus_alloc for n in nodes(g) if n.state == pb.NODE_STATE_UP)}"
                                     f"/{sum(len(n.gpus) for n in nodes(g))}"),
        "C": ("CPUS(A/T)", lambda g: f"{sum(n.cpus_alloc for n in nodes(g))}/{sum(n.cpus for n in nodes(g))}"),
        "c": ("CPUS", lambda g: nodes(g)[0].cpus if nodes(g) else 0),
        "m": ("MEMORY", lambda g: nodes(g)[0].memory_mb if nodes(g) else 0),
        "E": ("REASON", lambda g: nodes(g)[0].reason or "none"),
    }


def node_groups(reply: pb.ListNodesReply, per_node: bool) -> list[tuple]:
    """(partition, state, nodes) rows: grouped by partition and state, or one per node with -N."""
    by_name = {n.name: n for n in reply.nodes}
    rows = []
    for part in reply.partitions:
        members = [by_name[name] for name in part.nodes if name in by_name]
        if per_node:
            rows.extend((part, node_state(n), [n]) for n in members)
            continue
        groups: dict[str, list] = {}
        for n in members:
            groups.setdefault(node_state(n), []).append(n)
        rows.extend((part, state, ns) for state, ns in groups.items())
    return rows


def partition_keyvalues(part: pb.Partition, nodes: list[pb.Node]) -> list[str]:
    """scontrol show partition: one partition as Key=Value lines."""
    mine = [n for n in nodes if n.name in set(part.nodes)]
    lines = [
        [f"PartitionName={part.name}"],
        [f"Default={'YES' if part.default else 'NO'}", f"State={'UP' if part.up else 'DOWN'}"],
        [f"MaxTime={format_limit(part.max_time_s)}",
         f"DefaultTime={format_limit(part.default_time_s) if part.default_time_s else 'NONE'}"],
        [f"Nodes={hostlist.collect_hostlist(list(part.nodes)) if part.nodes else '(null)'}"],
        [f"TotalNodes={len(part.nodes)}", f"TotalCPUs={sum(n.cpus for n in mine)}",
         f"TotalGPUs={sum(len(n.gpus) for n in mine)}"],
    ]
    return ["   " * (i > 0) + " ".join(parts) for i, parts in enumerate(lines)]


def node_keyvalues(node: pb.Node) -> list[str]:
    gres = f"gpu:{len(node.gpus)}" if node.gpus else "(null)"
    lines = [
        [f"NodeName={node.name}", f"NodeAddr={node.address}"],
        [f"State={node_state(node).upper()}", f"Reason={node.reason or '(null)'}"],
        [f"CPUTot={node.cpus}", f"CPUAlloc={node.cpus_alloc}", f"RealMemory={node.memory_mb}"],
        [f"Gres={gres}", f"GresUsed=gpu:{node.gpus_alloc}"],
        [f"Partitions={','.join(node.partitions) or '(null)'}", f"RunningJobs={node.jobs_running}"],
        [f"LastHeartbeat={_timestamp(node.last_heartbeat)}"],
    ]
    status = {s.index: s for s in node.gpu_status}
    for g in node.gpus:
        line = [f"Gpu{g.index}={g.name}", f"UUID={g.uuid}", f"MemoryMB={g.memory_mb}"]
        s = status.get(g.index)
        if s is not None:
            line += [f"Util={s.utilization}%", f"Temp={s.temperature_c}C", f"Power={s.power_w:.0f}W",
                     f"MemUsedMB={s.memory_used_mb}"]
        lines.append(line)
    return ["   " * (i > 0) + " ".join(parts) for i, parts in enumerate(lines)]
