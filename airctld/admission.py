"""Admission: a request turned into the job it makes, once, with every default settled (partition,
node and task counts, time limit, account, QOS, name, environment), or refused with one clear
reason and nothing changed. The controller stores and schedules what this returns; policy, store,
formats and node daemons read the settled job.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from air.airctld import deps, nodefilter, scheduler
from air.airctld.accounting import Accounting
from air.airctld.errors import Denied, InvalidRequest
from air.airctld.model import DEFAULT_ACCOUNT, Job, evolve
from air.airctld.policy import Policy, user_name
from air.airctld.validate import check_request, filtered_environment
from air.protos import air_pb2 as pb
from air.protos import arrays
from air.protos.config import Config
from air.protos.credential import Identity
from air.protos.states import Reason

# The batch script of airrun's own allocation: airrun's steps run on the nodes; this shell only holds
# them until airrun gives them back, through airctld, as its step ended (SIGUSR1: it succeeded, SIGUSR2:
# it failed). Users' signals go to the steps (see Controller.cancel), so only airctld signals it.
ALLOCATION_SCRIPT = """#!/bin/sh
trap 'exit 0' USR1
trap 'exit 1' USR2
while :; do sleep 60 & wait $!; done
"""


@dataclass(frozen=True)
class Admission:
    """What admission needs, given explicitly: the configuration, the policy and the account tree, the
    nodes' features, and three views of the controller's state (node names, each node's (GPUs, CPUs),
    whether a job id exists), each safe to call without the controller's lock held."""
    config: Config
    policy: Policy
    accounting: Accounting
    features: Mapping[str, frozenset]
    node_names: Callable[[], Iterable[str]]
    capacity: Callable[[], dict[str, tuple[int, int]]]
    job_exists: Callable[[int], bool]
    clock: Callable[[], float]

    def admit(self, req: pb.JobRequest, who: Identity) -> tuple[Job, list[int] | None]:
        """The job a request makes, every default settled, and its array task indices (None when it is
        not an array); or the refusal (a RequestError), with nothing changed."""
        if req.allocation:   # airrun's own: the shell that holds the nodes is airctld's, not the caller's
            if req.script or req.argv or req.array:
                raise InvalidRequest("an allocation (airrun outside a job) has no script, arguments or array")
            own = pb.JobRequest()
            own.CopyFrom(req)
            own.script, own.no_requeue, own.retries, req = ALLOCATION_SCRIPT, True, 0, own
            for signals_its_shell in ("warn_signal", "warn_time_s", "warn_batch_only", "warn_steps_only",
                                      "hang_timeout_s"):   # (only airctld's release signals that shell)
                own.ClearField(signals_its_shell)
        check_request(req, self.config.controller)
        part = self.config.partition(req.partition)
        if part is None:
            if req.partition:
                known = ", ".join(p.name for p in self.config.partitions)
                raise InvalidRequest(f"partition {req.partition!r} does not exist; partitions: {known}")
            raise InvalidRequest("no partition given and the cluster has no default partition")
        try:   # -w, -x, -C: what can never be met is refused now; -w alone sets the node count
            nodes, eligible = nodefilter.settle(req, part.name, part.nodes, self.features, self.node_names())
        except nodefilter.ConstraintError as e:
            raise InvalidRequest(str(e)) from None
        tasks = req.ntasks_per_node or 1
        cpus = tasks * (req.cpus_per_task or 1)
        limit = req.time_limit_s or part.default_time_s
        capacity = self.capacity()
        within = evolve(part, nodes=tuple(n for n in part.nodes if n in eligible)) if len(eligible) < len(part.nodes) \
            else part
        why = scheduler.infeasible(nodes, req.gpus_per_node, cpus, limit, within, capacity)
        if why:
            raise InvalidRequest(why)
        account = self.policy.account_for(who, req.account, self.accounting)
        gpus = nodes * req.gpus_per_node
        if req.exclusive:   # it holds every GPU of its nodes: at least the fewest any of them has
            sizes = [capacity[n][0] for n in eligible if n in capacity and capacity[n][0] >= req.gpus_per_node]
            gpus = max(gpus, nodes * min(sizes, default=0))
        qos = req.qos or self.config.scheduler.default_qos   # recorded: history shows the QOS it ran under
        self._check_policy(req, who, account, qos, part, gpus, limit)
        env = filtered_environment(req.environment, self.config.controller.drop_env)
        tasks, throttle = None, 0
        if req.array:
            try:
                tasks, throttle = arrays.parse(req.array)
            except ValueError as e:
                raise InvalidRequest(str(e)) from None
            if len(tasks) > self.config.controller.max_array_tasks:
                raise InvalidRequest(f"--array={req.array} makes {len(tasks)} tasks; the limit is "
                                     f"{self.config.controller.max_array_tasks} (max_array_tasks)")
        if account != req.account or len(env) != len(req.environment) or throttle != req.array_max_running \
                or qos != req.qos or (req.nodelist and nodes != req.nodes):
            req = _amended(req, account, qos, env, throttle)
            if req.nodelist:
                req.nodes = nodes
        job = Job(job_id=0, uid=who.uid, gid=who.gid, user=user_name(who.uid),
                  name=req.name or "batch", partition=part.name, num_nodes=nodes,
                  gpus_per_node=req.gpus_per_node, cpus_per_node=cpus, time_limit_s=limit,
                  submit_time=self.clock(), request=req, hold=req.hold,
                  reason=Reason.JOB_HELD_USER if req.hold else Reason.NONE)
        return job, tasks

    def _check_policy(self, req: pb.JobRequest, who: Identity, account: str, qos_name: str, part, gpus: int,
                      limit: int) -> None:
        """The limits a job could never pass, refused at submit: QOS, quotas, partition accounts,
        nice, and a dependency that names no job."""
        charged = account or DEFAULT_ACCOUNT
        qos = self.config.qos_named(qos_name)
        if qos is None:
            raise InvalidRequest(f"QOS {qos_name!r} does not exist; QOS: {', '.join(q.name for q in self.config.qos)}")
        self.policy.check_qos(who, qos, charged)
        if req.nice < 0 and not self.policy.is_operator(who):
            raise Denied(f"--nice={req.nice}: only root and operators may raise a job's priority (a negative nice)")
        if qos.max_time_s and limit > qos.max_time_s:
            raise InvalidRequest(f"time limit {limit} s is over QOS {qos_name}'s maximum of {qos.max_time_s} s")
        for cap, what in ((qos.max_gpus_per_user, "per user"), (qos.max_gpus_per_account, "per account")):
            if cap and gpus > cap:
                raise InvalidRequest(f"{gpus} GPUs requested, but QOS {qos_name} allows {cap} {what}")
        chains, quotas = self.accounting.account_chains()
        for a in chains.get(charged, ()):
            if quotas.get(a) and gpus > quotas[a]:
                raise InvalidRequest(f"{gpus} GPUs requested, but account {a} has a quota of {quotas[a]} GPUs")
        if part.accounts and charged not in part.accounts:
            raise Denied(f"partition {part.name} is open to accounts {', '.join(part.accounts)} only; "
                         f"this job is charged to {account or 'no account'}")
        try:
            dep = deps.parse(req.dependency)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        count = sum(len(t.job_ids) for t in dep.terms) if dep else 0
        limit = self.config.controller.max_dependencies
        if count > limit:
            raise InvalidRequest(f"--dependency names {count} jobs; the limit is {limit} (max_dependencies)")
        for job_id in sorted(dep.job_ids if dep else ()):
            if not self.job_exists(job_id):
                raise InvalidRequest(f"dependency on job {job_id}, which does not exist")


def _amended(req: pb.JobRequest, account: str, qos: str, env: dict[str, str], throttle: int) -> pb.JobRequest:
    out = pb.JobRequest()
    out.CopyFrom(req)
    out.account = account
    out.qos = qos
    out.array_max_running = throttle
    out.environment.clear()
    out.environment.update(env)
    return out
