"""The controller's jobs in memory, indexed by phase so that each pass touches only what it needs."""
from __future__ import annotations

import itertools
from typing import Iterator

from air.airctld.model import Job
from air.protos.states import ACTIVE_PHASES, JobPhase


# (an enum's member read from its class costs 0.1 us; put is called per job)
_PENDING, _DONE = JobPhase.PENDING, JobPhase.DONE


def _shown(job: Job) -> tuple:
    """What squeue's default row of a job shows, besides its request (see tests/test_queue_rows.py)."""
    return (job.phase, job.result, job.reason, job.partition, job.user, job.num_nodes, job.start_time,
            job.end_time, job.allocation, job.array_job_id, job.array_task_id)


class JobTable:
    def __init__(self, jobs: list[Job] = ()):
        self._jobs: dict[int, Job] = {}
        self._by_phase: dict[JobPhase, dict[int, None]] = {p: {} for p in JobPhase}  # ordered sets
        self._held: dict[int, None] = {}   # pending jobs held by their owner: no pass looks at them
        self._brief: dict[int, bytes] = {}
        self._rows: dict[int, tuple[Job, str]] = {}   # squeue's default row, with the job it shows
        # every job, in the table's order: its kept row while it is pending and no array's task (a
        # listing shows that row as it is), None otherwise (a listing looks at the job)
        self._plain: dict[int, str | None] = {}
        # jobs whose row may be kept (pending and ended ones; a pending array task is listed in its
        # array's row) and is not: what Controller.keep_rows renders, ahead of a listing
        self._unrendered: dict[int, None] = {}
        for job in jobs:
            self.put(job)

    def put(self, job: Job) -> None:
        old = self._jobs.get(job.job_id)
        if old is not None and old.phase != job.phase:
            del self._by_phase[old.phase][job.job_id]
        self._jobs[job.job_id] = job
        self._by_phase[job.phase][job.job_id] = None
        if job.hold and job.phase == _PENDING:
            self._held[job.job_id] = None
        else:
            self._held.pop(job.job_id, None)
        self._brief.pop(job.job_id, None)
        kept = self._rows.pop(job.job_id, None)
        self._plain[job.job_id] = None
        if kept is not None and kept[0] is old and old.request is job.request and _shown(old) == _shown(job):
            self._keep(job, kept[1])   # nothing the row shows changed (its priority, say)
        elif job.phase == _DONE or job.phase == _PENDING and not job.array_job_id:
            self._unrendered[job.job_id] = None
        else:
            self._unrendered.pop(job.job_id, None)

    def remove(self, job_id: int) -> None:
        self._plain.pop(job_id, None)   # (first: a listing never meets an id without its job)
        job = self._jobs.pop(job_id)
        del self._by_phase[job.phase][job_id]
        self._held.pop(job_id, None)
        self._brief.pop(job_id, None)
        self._rows.pop(job_id, None)
        self._unrendered.pop(job_id, None)

    def row(self, job: Job) -> str | None:
        """The job's row in squeue's default format, if one was kept for this very version of it."""
        return self.rows([job])[0]

    def rows(self, jobs: list[Job]) -> list[str | None]:
        """row() of each job."""
        get = self._rows.get
        return [kept[1] if job is not None and (kept := get(job.job_id)) is not None and kept[0] is job else None
                for job in jobs]

    def listing(self, horizon: float) -> tuple[list[str | None], list[Job | None], list[str | None]]:
        """What an unfiltered listing shows, in the table's order, as three lists: for every job its
        row if it is a plain pending one (`plain`), else None; then for each of those Nones in turn the
        job (None if it ended before `horizon`: not shown) and its row(). A queue of pending jobs is
        listed by copying one dict's values, without touching a job (100,000 jobs spread over memory:
        most of the time went to reading them), and no list of pairs is made (each pair would be
        tracked by the garbage collector and set off full collections over the table)."""
        plain = list(self._plain.values())
        if None not in plain:
            return plain, [], []
        done, jobs = JobPhase.DONE, self._jobs
        others = [job if (job := jobs[i]).phase != done or job.end_time >= horizon else None
                  for i, row in zip(self._plain, plain) if row is None]
        return plain, others, self.rows(others)

    def keep_row(self, job: Job, row: str) -> None:
        """Keep a row made without the controller's lock: tied to the version it shows, a row made
        from a job that has changed since is never shown for the new one (see row)."""
        if self._jobs.get(job.job_id) is job:
            self._keep(job, row)

    def unrendered(self, limit: int) -> list[Job]:
        """Up to `limit` jobs whose rows may be kept and are not, first offered first."""
        return [self._jobs[i] for i in itertools.islice(self._unrendered, limit)]

    def not_rendered(self, job: Job) -> None:
        """A job whose row could not be made: not offered again until it changes (a listing tries)."""
        if self._jobs.get(job.job_id) is job:
            self._unrendered.pop(job.job_id, None)

    def _keep(self, job: Job, row: str) -> None:
        self._rows[job.job_id] = (job, row)
        self._unrendered.pop(job.job_id, None)
        if job.phase == JobPhase.PENDING and not job.array_job_id:
            self._plain[job.job_id] = row

    def get(self, job_id: int) -> Job | None:
        return self._jobs.get(job_id)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def in_phase(self, phase: JobPhase) -> list[Job]:
        return [self._jobs[i] for i in self._by_phase[phase]]

    def schedulable(self) -> list[Job]:
        """Pending jobs that are not held."""
        held = self._held
        return [self._jobs[i] for i in self._by_phase[JobPhase.PENDING] if i not in held]

    def held(self) -> list[Job]:
        """Pending jobs held by their owner."""
        return [self._jobs[i] for i in self._held]

    def active(self) -> list[Job]:
        return [self._jobs[i] for p in ACTIVE_PHASES for i in self._by_phase[p]]

    def brief(self, job: Job, encode) -> bytes:
        """The job's cached short encoding for listings, made with `encode` when missing."""
        enc = self._brief.get(job.job_id)
        if enc is None:
            enc = encode(job)
            if self._jobs.get(job.job_id) is job:   # (a job read from the store is not kept)
                self._brief[job.job_id] = enc
        return enc
