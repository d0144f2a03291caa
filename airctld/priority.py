"""Multifactor job priority, pure (Slurm's priority/multifactor, with the same factor names).

    priority = W_age * age + W_fairshare * fairshare + W_jobsize * jobsize
             + W_partition * partition + W_qos * qos - nice

Every factor is in [0, 1]: age is the time pending over max_age (capped at 1); fairshare is the
classic factor of the job's (account, user) association (see fairshare.py); jobsize is the job's
GPUs over the cluster's (CPUs, for a job without GPUs); partition and qos are the priority of the
job's partition and QOS over the highest configured one. The weights come from [scheduler].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from air.protos.config import PartitionConfig, QosConfig, SchedulerConfig
from air.airctld.model import Job


@dataclass(frozen=True)
class Factors:
    job_id: int
    priority: int
    age: float
    fairshare: float
    jobsize: float
    partition: float
    qos: float
    nice: int


def association(job: Job) -> tuple[str, str]:
    """The (account, user) leaf a job is charged to."""
    return (job.account, job.user)


def job_qos(job: Job, default: str) -> str:
    """The QOS a job runs under: its own, settled at admission; `default` for a job without one."""
    return job.request.qos or default


class PriorityModel:
    """Everything a pass needs to price jobs, gathered once: weights, the fairshare of each
    association, and the cluster's size."""

    def __init__(self, sched: SchedulerConfig, partitions: Mapping[str, PartitionConfig],
                 qos: Mapping[str, QosConfig], fairshare: Mapping[tuple[str, str], float],
                 total_gpus: int, total_cpus: int):
        self.sched = sched
        top_part = max((p.priority for p in partitions.values()), default=0)
        top_qos = max((q.priority for q in qos.values()), default=0)
        self.part_factor = {p.name: (p.priority / top_part if top_part else 0.0) for p in partitions.values()}
        self.qos_factor = {q.name: (q.priority / top_qos if top_qos else 0.0) for q in qos.values()}
        self.fairshare = fairshare
        self.total_gpus = max(total_gpus, 1)
        self.total_cpus = max(total_cpus, 1)

    def factors(self, job: Job, now: float) -> Factors:
        s = self.sched
        age = min(1.0, max(0.0, now - job.submit_time) / s.max_age_s)
        fs = self.fairshare.get(association(job), 1.0)
        if job.gpus_per_node:
            size = min(1.0, job.num_nodes * job.gpus_per_node / self.total_gpus)
        else:
            size = min(1.0, job.num_nodes * job.cpus_per_node / self.total_cpus)
        part = self.part_factor.get(job.partition, 0.0)
        qos = self.qos_factor.get(job_qos(job, s.default_qos), 0.0)
        nice = job.request.nice
        value = (s.weight_age * age + s.weight_fairshare * fs + s.weight_jobsize * size
                 + s.weight_partition * part + s.weight_qos * qos - nice)
        return Factors(job.job_id, int(round(value)), age, fs, size, part, qos, nice)

    def priorities(self, jobs: Iterable[Job], now: float) -> dict[int, int]:
        """job_id -> priority for many jobs: the same sum as factors(), written for speed."""
        s = self.sched
        w_age, w_fs, w_size = s.weight_age / s.max_age_s, s.weight_fairshare, s.weight_jobsize
        age_cap = s.max_age_s
        fs_of, part_of, qos_of = self.fairshare.get, self.part_factor.get, self.qos_factor.get
        w_part, w_qos, default_qos = s.weight_partition, s.weight_qos, s.default_qos
        gpus, cpus = self.total_gpus, self.total_cpus
        out = {}
        for job in jobs:
            req = job.request
            waited = now - job.submit_time
            waited = age_cap if waited > age_cap else (waited if waited > 0 else 0.0)
            if job.gpus_per_node:
                size = job.num_nodes * job.gpus_per_node / gpus
            else:
                size = job.num_nodes * job.cpus_per_node / cpus
            value = (w_age * waited + w_fs * fs_of((job.account, job.user), 1.0)
                     + w_size * (size if size < 1.0 else 1.0) + w_part * part_of(job.partition, 0.0)
                     + w_qos * qos_of(job_qos(job, default_qos), 0.0) - req.nice)
            out[job.job_id] = int(round(value))
        return out
