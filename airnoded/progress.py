"""Reading what jobs' ranks report about their progress (runtime.Reporter writes the files)."""
from __future__ import annotations

import os
from pathlib import Path

from protos import air_pb2 as pb

PROGRESS = "progress"
STOP_REASON = "stop_reason"


def job_dir(spool: Path, job_id: int) -> Path:
    return spool / f"job{job_id}"


def prepare(spool: Path, job_id: int, uid: int, gid: int) -> Path:
    """The job's progress folder on this node, writable by its owner."""
    folder = job_dir(spool, job_id) / PROGRESS
    folder.mkdir(parents=True, exist_ok=True)
    if uid != os.getuid():
        os.chown(folder.parent, uid, gid)
        os.chown(folder, uid, gid)
    return folder


def environment(spool: Path, job_id: int) -> dict[str, str]:
    base = job_dir(spool, job_id)
    return {"AIR_PROGRESS_DIR": str(base / PROGRESS), "AIR_STOP_REASON_FILE": str(base / STOP_REASON)}


def write_stop_reason(spool: Path, job_id: int, reason: str) -> None:
    base = job_dir(spool, job_id)
    if not base.is_dir():
        return
    tmp = base / f".{STOP_REASON}.tmp"
    tmp.write_text(reason + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, base / STOP_REASON)


def collect(spool: Path, now: float, sent: dict[int, float]) -> list[pb.JobProgress]:
    """Every job here that reports: the age of its newest report, and rank 0's report when it changed
    since `sent` (job id -> mtime of the last one sent; updated)."""
    out = []
    seen = set()
    for folder in spool.glob(f"job*/{PROGRESS}"):
        try:
            job_id = int(folder.parent.name[3:])
        except ValueError:
            continue
        seen.add(job_id)
        newest, report = 0.0, ""
        for f in folder.glob("rank*.json"):
            try:
                mtime = f.stat().st_mtime
            except OSError:
                continue
            newest = max(newest, mtime)
            if f.name == "rank0.json" and mtime != sent.get(job_id):
                try:
                    report = f.read_text()
                    sent[job_id] = mtime
                except OSError:
                    report = ""
        if newest:
            out.append(pb.JobProgress(job_id=job_id, age_s=max(0.0, now - newest), report=report))
    for gone in set(sent) - seen:
        del sent[gone]
    return out
