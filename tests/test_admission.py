"""Admission (airctld.admission) on its own, without a controller or a process: a request becomes the
job it makes with every default settled, or is refused with one reason."""
import pytest

from air.airctld.accounting import Accounting
from air.airctld.admission import Admission
from air.airctld.policy import Policy
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos import config as cfg
from air.protos.credential import Identity

ALICE = Identity(4242, 4242)


def _admission(existing=(), qos_default="normal", accounts=()):
    conf = cfg.parse({"controller": {"auth": "none", "state_dir": "/tmp"},
                      "scheduler": {"default_qos": qos_default}, "accounts": list(accounts),
                      "qos": [{"name": "normal"}, {"name": "high", "priority": 10}],
                      "nodes": [{"name": "n[1-3]", "address": "127.0.0.[9-11]", "gpus": "sim:4", "features": ["a100"]}],
                      "partitions": [{"name": "p", "nodes": "n[1-3]", "default": True, "default_time": "2:00:00"}]})
    accounting = Accounting(conf, Store(":memory:"), 1000.0, [])
    return Admission(conf, Policy(conf), accounting, {f"n{i}": frozenset({"a100"}) for i in (1, 2, 3)},
                     lambda: ["n1", "n2", "n3"], lambda: {f"n{i}": (4, 8) for i in (1, 2, 3)},
                     lambda job_id: job_id in existing, lambda: 1234.5)


def test_every_default_is_settled_once():
    job, tasks = _admission().admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ALICE)
    assert tasks is None
    assert (job.name, job.partition, job.num_nodes, job.gpus_per_node, job.cpus_per_node, job.time_limit_s) == \
        ("batch", "p", 1, 0, 1, 7200)
    assert (job.request.qos, job.account, job.uid, job.submit_time) == ("normal", "default", 4242, 1234.5)
    job, _ = _admission(qos_default="high").admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ALICE)
    assert job.request.qos == "high"   # the configured default, recorded with the job
    listed, _ = _admission().admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", nodelist=["n1", "n3"],
                                                 ntasks_per_node=2, cpus_per_task=3), ALICE)
    assert (listed.num_nodes, listed.request.nodes, listed.cpus_per_node) == (2, 2, 6)   # -w sets the count
    array, tasks = _admission().admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", array="0-9%2"), ALICE)
    assert tasks == list(range(10)) and array.request.array_max_running == 2


@pytest.mark.parametrize("request_fields,refusal", [
    (dict(partition="q"), "partition 'q' does not exist"),
    (dict(qos="gold"), "QOS 'gold' does not exist"),
    (dict(gpus_per_node=8), "8 GPUs per node requested, but no node in partition p has more than 4"),
    (dict(partition="zzz"), "partition 'zzz' does not exist"),
    (dict(dependency="afterok:77"), "dependency on job 77, which does not exist"),
    (dict(nodelist=["n9"]), "n9"),
    (dict(constraint="h100"), "h100"),
    (dict(nice=-5), "only root and operators"),
])
def test_what_can_never_run_is_refused(request_fields, refusal):
    with pytest.raises(Exception, match=refusal) as caught:
        _admission().admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", **request_fields), ALICE)
    assert type(caught.value).__name__ in ("InvalidRequest", "Denied")


def test_a_dependency_on_a_job_that_exists_is_taken():
    job, _ = _admission(existing={77}).admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp",
                                                           dependency="afterok:77"), ALICE)
    assert job.request.dependency == "afterok:77"


def test_the_account_is_settled_from_the_users_membership():
    ml = [{"name": "ml", "users": ["4242"]}, {"name": "bio", "users": ["4343"]}]
    job, _ = _admission(accounts=ml).admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), ALICE)
    assert job.request.account == "ml" and job.account == "ml"   # none asked: the one the user belongs to
    with pytest.raises(Exception, match="not a member|may not|belongs"):
        _admission(accounts=ml).admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", account="bio"), ALICE)
    with pytest.raises(Exception, match="belongs to no account"):
        _admission(accounts=ml).admit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp"), Identity(4444, 4444))
