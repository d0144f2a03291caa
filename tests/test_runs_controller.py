"""The controller and runs, with a store on disk, a clock in the test's hands and no node daemons:
a stale run's exit, report or step never counts for the current run, the node is told to kill
it, and a requeued job starts again only once its last run is surely gone from every node."""
import pytest

from air.airctld import events
from air.airctld.errors import Conflict
from air.airctld.model import NodeAlloc
from air.airctld.nodes import CALL_TIMEOUT_S
from fakeclock import Clock, build as _build
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, NodeState, Reason

ROOT = Identity(0, 0)



def _running_on(c, clock, node, **request):
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=4, **request), ROOT)
    job = c.jobs.get(job_id)
    return c._commit([(job, events.start(job, clock.now, (NodeAlloc(node, (0, 1, 2, 3), 1),)))],
                     clock.now, 0)[0]


def _beat(c, node, runs=(), exits=(), progress=()):
    return c.heartbeat(pb.HeartbeatRequest(name=node, running=sorted({j for j, _ in runs}),
                                           runs=[pb.RunRef(job_id=j, run=r) for j, r in runs],
                                           exits=list(exits), progress=list(progress)))


def test_a_stale_runs_exit_and_report_never_count_for_the_current_run(controller):
    c, clock = controller
    job = _running_on(c, clock, "n1")
    requeued = c._commit([(job, events.node_lost(job, clock.now, Reason.NODE_FAIL, "test"))], clock.now, 0)[0]
    again = c._commit([(requeued, events.start(requeued, clock.now, (NodeAlloc("n1", (0, 1, 2, 3), 1),)))],
                      clock.now, 0)[0]
    assert again.restart_count == 1
    reply = _beat(c, "n1", runs=[(job.job_id, 0), (job.job_id, 1)],
                  exits=[pb.JobExit(job_id=job.job_id, run=0, exit_code=0)],
                  progress=[pb.JobProgress(job_id=job.job_id, run=0, report='{"step": 99}')])
    now = c.jobs.get(job.job_id)
    assert now.phase == JobPhase.RUNNING and now.restart_count == 1          # run 0's end says nothing of run 1
    assert job.job_id not in c.latest_report                                   # nor does its report
    assert [(r.job_id, r.run) for r in reply.stale] == [(job.job_id, 0)]      # the node is told to kill it
    assert job.job_id in reply.acked                                           # and may forget the exit
    _beat(c, "n1", runs=[(job.job_id, 1)], exits=[pb.JobExit(job_id=job.job_id, run=1, exit_code=0)])
    assert c.jobs.get(job.job_id).phase == JobPhase.DONE                       # the current run's exit counts


def test_a_requeued_job_waits_until_its_last_run_is_gone_from_every_node(controller):
    c, clock = controller
    clock.now += CALL_TIMEOUT_S   # (a controller up for a while: no launch of an earlier one may be out)
    job = _running_on(c, clock, "n1")
    _beat(c, "n1", runs=[(job.job_id, 0)])
    c._commit([(job, events.node_lost(job, clock.now, Reason.NODE_FAIL, "GPU fault"))], clock.now, 0)
    clock.now += 1
    c.tick()
    assert c.jobs.get(job.job_id).phase == JobPhase.PENDING                    # run 0 may still be alive on n1
    _beat(c, "n1", runs=[(job.job_id, 0)])                                     # and it is: still waiting
    clock.now += 1
    c.tick()
    assert c.jobs.get(job.job_id).phase == JobPhase.PENDING
    _beat(c, "n1", runs=[])                                                    # n1 answers without it
    clock.now += 1
    c._dirty = True
    c.tick()
    assert c.jobs.get(job.job_id).phase == JobPhase.RUNNING


def test_a_requeued_job_on_a_silent_node_waits_for_that_nodes_fence(controller):
    c, clock = controller
    job = _running_on(c, clock, "n1")
    _beat(c, "n1", runs=[(job.job_id, 0)])
    silent_since = clock.now
    c._commit([(job, events.node_lost(job, clock.now, Reason.NODE_FAIL, "airrun lost n1"))], clock.now, 0)
    cc = c.config.controller
    gone_by = silent_since + cc.fence_after_s + cc.fence_grace_s + cc.heartbeat_interval_s
    while clock.now < gone_by - 0.5:
        clock.now += 0.5
        _beat(c, "n2")
        c.tick()
        assert c.jobs.get(job.job_id).phase == JobPhase.PENDING, clock.now - silent_since
    clock.now = gone_by + 0.1
    _beat(c, "n2")
    c._dirty = True
    c.tick()
    started = c.jobs.get(job.job_id)
    assert started.phase == JobPhase.RUNNING and started.restart_count == 1


def test_a_stale_runs_airrun_starts_no_step(controller):
    c, clock = controller
    job = _running_on(c, clock, "n1")
    requeued = c._commit([(job, events.node_lost(job, clock.now, Reason.NODE_FAIL, "t"))], clock.now, 0)[0]
    c._commit([(requeued, events.start(requeued, clock.now, (NodeAlloc("n2", (0, 1, 2, 3), 1),)))], clock.now, 0)
    with pytest.raises(Conflict, match="airrun of run 0 of job .*, which is on run 1 now"):
        c.create_step(pb.StepSpec(job_id=job.job_id, argv=["true"], environment={"AIR_RESTART_COUNT": "0"}),
                      ROOT)
    step = c.create_step(pb.StepSpec(job_id=job.job_id, argv=["true"], environment={"AIR_RESTART_COUNT": "1"}),
                         ROOT)
    assert step.run == 1


def test_exit_76_is_a_lost_node_only_when_a_step_of_the_run_reached_another_node(controller):
    """Any script can exit 76, airrun's code for "a node of my step stopped answering". Without a step
    of this run on another node it is the script's own failure: no requeue, and no node is suspected."""
    c, clock = controller
    own = _running_on(c, clock, "n1")
    c.create_step(pb.StepSpec(job_id=own.job_id, argv=["true"]), ROOT)     # a step on the batch node only
    _beat(c, "n1", runs=[(own.job_id, 0)], exits=[pb.JobExit(job_id=own.job_id, run=0, exit_code=76)])
    ended = c.jobs.get(own.job_id)
    assert ended.phase == JobPhase.DONE and ended.exit_code == 76 and ended.restart_count == 0
    assert c.suspect == {}

    def two_nodes():
        job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", nodes=2, gpus_per_node=4), ROOT)
        job = c.jobs.get(job_id)
        c._commit([(job, events.start(job, clock.now, (NodeAlloc("n1", (0, 1, 2, 3), 1),
                                                        NodeAlloc("n2", (0, 1, 2, 3), 1))))], clock.now, 0)
        return job_id

    home = two_nodes()      # two nodes, but its step stayed on the batch node: n2 took no part
    c.create_step(pb.StepSpec(job_id=home, argv=["true"], nodelist=["n1"]), ROOT)
    _beat(c, "n1", runs=[(home, 0)], exits=[pb.JobExit(job_id=home, run=0, exit_code=76)])
    assert c.jobs.get(home).phase == JobPhase.DONE and c.jobs.get(home).exit_code == 76
    assert c.suspect == {}

    job_id = two_nodes()
    c.create_step(pb.StepSpec(job_id=job_id, argv=["true"], nodes=2), ROOT)
    _beat(c, "n1", runs=[(job_id, 0)], exits=[pb.JobExit(job_id=job_id, run=0, exit_code=76)])
    lost = c.jobs.get(job_id)
    assert lost.phase == JobPhase.PENDING and lost.last_stop_reason == Reason.NODE_FAIL
    assert set(c.suspect) == {"n2"}                       # the step's other node, until it is heard from
    _beat(c, "n2")
    assert c.suspect == {}


def test_a_wall_clock_set_forward_or_back_kills_no_node_and_hangs_no_job(tmp_path):
    """Silence is measured on the monotonic clock: an hour's jump of the wall clock (NTP stepping it,
    an operator's `date -s`) neither marks nodes that keep answering DOWN nor takes a job that keeps
    reporting for hung; only real silence, monotonic time passing, does."""
    wall, mono = Clock(), Clock()
    c = _build(tmp_path, wall, mono)
    try:
        job_id = _running_on(c, wall, "n1", hang_timeout_s=60).job_id
        for jump in (3600, -7200, 3600):
            wall.now += jump      # the clock is set; the next heartbeat has not come yet
            mono.now += 1
            c.tick()
            assert c.jobs.get(job_id).phase == JobPhase.RUNNING and c.jobs.get(job_id).reason != Reason.HUNG, jump
            assert {n.name: n.state for n in c.nodes.values()} == {"n1": NodeState.UP, "n2": NodeState.UP}
            _beat(c, "n1", runs=[(job_id, 0)], progress=[pb.JobProgress(job_id=job_id, run=0, report='{"step": 1}')])
            _beat(c, "n2")
        mono.now += 16                                        # n2 silent past node_timeout_s, n1 answers
        _beat(c, "n1", runs=[(job_id, 0)])
        c.tick()
        assert c.nodes["n2"].state == NodeState.DOWN and c.nodes["n1"].state == NodeState.UP
        mono.now += 45                                        # n1's job: no report for 61 s of real time
        _beat(c, "n1", runs=[(job_id, 0)])
        c.tick()
        assert c.jobs.get(job_id).reason == Reason.HUNG
    finally:
        c.stop()


def test_a_restarted_controller_gives_a_long_running_job_a_full_hang_timeout(tmp_path):
    """After a restart, no report has arrived yet: the job is not taken for hung because it started
    long ago, only once it stays silent for its --hang-timeout from the controller's start."""
    wall, mono = Clock(), Clock()
    c = _build(tmp_path, wall, mono)
    job_id = _running_on(c, wall, "n1", hang_timeout_s=60).job_id
    c.stop()
    wall.now += 3600
    mono.now = 5.0                                            # a new process: its own monotonic origin
    c = _build(tmp_path, wall, mono)
    try:
        _beat(c, "n1", runs=[(job_id, 0)])
        c.tick()
        assert c.jobs.get(job_id).phase == JobPhase.RUNNING and c.jobs.get(job_id).reason != Reason.HUNG
        mono.now += 61
        _beat(c, "n1", runs=[(job_id, 0)])
        c.tick()
        assert c.jobs.get(job_id).reason == Reason.HUNG
    finally:
        c.stop()


def test_a_requeued_job_waits_for_the_silent_nodes_fence_on_the_monotonic_clock(tmp_path):
    """The fence deadline is monotonic: the wall clock set an hour forward starts no second run while
    the silent node may still run the first; monotonic time reaching the deadline does."""
    wall, mono = Clock(), Clock()
    c = _build(tmp_path, wall, mono)
    try:
        job = _running_on(c, wall, "n1")
        _beat(c, "n1", runs=[(job.job_id, 0)])
        silent_since = mono.now
        c._commit([(job, events.node_lost(job, wall.now, Reason.NODE_FAIL, "airrun lost n1"))], wall.now, 0)
        wall.now += 3600
        mono.now += 0.5
        _beat(c, "n2")
        c._dirty = True
        c.tick()
        assert c.jobs.get(job.job_id).phase == JobPhase.PENDING
        cc = c.config.controller
        mono.now = silent_since + cc.fence_after_s + cc.fence_grace_s + cc.heartbeat_interval_s + 0.1
        _beat(c, "n2")
        c._dirty = True
        c.tick()
        assert c.jobs.get(job.job_id).phase == JobPhase.RUNNING
    finally:
        c.stop()
