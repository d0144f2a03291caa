"""Reading what jobs' ranks report about their progress (runtime.Reporter writes the files).

The progress folder is the job owner's: everything in it is hostile input. Reports are read through
`jobfiles.OwnerDir` (no links, no FIFOs, no devices, the owner's own files, size-limited), must be
UTF-8 JSON objects, and a bad one is skipped with one log line naming the job; one job's files
never keep the node from reporting the others'.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from air.airnoded import jobfiles
from air.airnoded.jobfiles import UnsafeFile
from air.protos import air_pb2 as pb

log = logging.getLogger("airnoded")

PROGRESS = "progress"
STOP_REASON = "stop_reason"
MAX_REPORT_BYTES = 64 * 1024    # one rank's report
MAX_NAMES = 1024                # names looked at in one progress folder per beat
MAX_BEAT_BYTES = 1024 * 1024    # reports sent in one heartbeat, all jobs together; the rest wait a beat

job_dir = jobfiles.job_dir


def prepare(spool: Path, job_id: int, run: int, uid: int, gid: int) -> Path:
    """The run's progress folder on this node, writable by its owner only."""
    return make(jobfiles.ensure_job_dir(spool, job_id, run), uid, gid)


def make(run_folder: Path, uid: int, gid: int) -> Path:
    """prepare(), in a run folder made already."""
    return jobfiles.make_owner_dir(run_folder, PROGRESS, uid, gid)


def environment(spool: Path, job_id: int, run: int) -> dict[str, str]:
    base = job_dir(spool, job_id, run)
    return {"AIR_PROGRESS_DIR": str(base / PROGRESS), "AIR_STOP_REASON_FILE": str(base / STOP_REASON)}


def write_stop_reason(spool: Path, job_id: int, run: int, reason: str) -> None:
    """Why the run is being stopped, for the runtime to read; in root's own folder, never through a
    link, readable by the job's group only (the progress folder says whose it is)."""
    base = job_dir(spool, job_id, run)
    try:
        st = os.lstat(base)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        log.warning("job %d: %s is not the daemon's folder; no stop reason written", job_id, base)
        return
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        owner = jobfiles.lstat_beneath(fd, PROGRESS)   # (never entering a filesystem the job mounted there)
    except FileNotFoundError:
        return
    except UnsafeFile as e:
        log.warning("job %d: %s; no stop reason written", job_id, e)
        return
    finally:
        os.close(fd)
    jobfiles.write_root_file(base, STOP_REASON, reason.encode()[:256] + b"\n", 0o640,
                             owner=(os.geteuid(), owner.st_gid))


class ProgressReader:
    """Every job here that reports: the age of its newest report, and rank 0's report when it changed
    since the last one sent."""

    def __init__(self, spool: Path, max_report_bytes: int = MAX_REPORT_BYTES):
        self.spool = spool
        self.max_report_bytes = max_report_bytes
        self._sent: dict[tuple[int, int], float] = {}      # run -> mtime of the rank 0 report last sent
        self._refused: dict[tuple[int, int], set[str]] = {}   # run -> problems already logged

    def collect(self, now: float, runs: list[tuple[int, int]], forget_others: bool = True) -> list[pb.JobProgress]:
        """Runs are (job id, run). Reports beyond MAX_BEAT_BYTES in all wait for the next beat. With
        forget_others, `runs` are all the node's: what was sent of any other is forgotten."""
        out, room = [], MAX_BEAT_BYTES
        device = os.stat(self.spool).st_dev
        for key in runs:
            try:
                got = self._one(key, now, device, room)
            except Exception as e:   # whatever a job did to its folder, the others are still read
                self._refuse(key, f"progress folder unreadable: {e}")
                continue
            if got is not None:
                room -= len(got.report.encode())   # (bytes: what the heartbeat's size limit counts)
                out.append(got)
        if forget_others:
            for gone in set(self._sent) - set(runs):
                del self._sent[gone]
            for gone in set(self._refused) - set(runs):
                del self._refused[gone]
        return out

    def _one(self, key: tuple[int, int], now: float, device: int, room: int) -> pb.JobProgress | None:
        job_id, run = key
        try:
            folder = jobfiles.OwnerDir(job_dir(self.spool, job_id, run) / PROGRESS, device)
        except FileNotFoundError:
            return None
        with folder:
            newest, report = 0.0, ""
            names = [n for n in folder.names(MAX_NAMES) if n.startswith("rank") and n.endswith(".json")]
            for name in dict.fromkeys(["rank0.json", *names]):   # rank 0's always, however many files
                try:
                    mtime = folder.mtime(name)
                except UnsafeFile as e:
                    self._refuse(key, f"progress report ignored: {e}")
                    continue
                except OSError:
                    continue   # not there, or gone meanwhile
                newest = max(newest, mtime)
                if name == "rank0.json" and mtime != self._sent.get(key):
                    report = self._read_report(key, folder, name)
                    if len(report.encode()) > room:
                        report = ""   # sent at a later beat, when there is room
                    else:
                        self._sent[key] = mtime
        if not newest:
            return None
        return pb.JobProgress(job_id=job_id, run=run, age_s=max(0.0, now - newest), report=report)

    def _read_report(self, key: tuple[int, int], folder: jobfiles.OwnerDir, name: str) -> str:
        try:
            text = folder.read(name, self.max_report_bytes).decode("utf-8")
            if not isinstance(json.loads(text), dict):
                raise ValueError("not a JSON object")
            return text
        except FileNotFoundError:
            return ""
        except UnsafeFile as e:
            self._refuse(key, f"progress report ignored: {e}")
        except UnicodeDecodeError:
            self._refuse(key, f"progress report ignored: {name} is not UTF-8")
        except (ValueError, RecursionError) as e:
            self._refuse(key, f"progress report ignored: {name} is not a JSON object ({str(e)[:80]})")
        except OSError as e:
            self._refuse(key, f"progress report ignored: {name}: {e.strerror}")
        return ""

    def _refuse(self, key: tuple[int, int], problem: str) -> None:
        """One log line per run and problem, not one a beat; at most 16 lines for a run. Names a job
        chose are written with repr(), so they cannot forge log lines."""
        seen = self._refused.setdefault(key, set())
        if problem not in seen and len(seen) < 16:
            seen.add(problem)
            log.warning("job %d: %s", key[0], problem.encode("unicode_escape").decode())
