"""A run's launch against stops, requeues and fence waits, in-process on a clock the test moves (no node
daemons): a launch that fails for a job asked to stop meanwhile ends as the stop said, a launch that
waited for a thread while the job was cancelled or requeued is never sent, and a requeued job's next run
never starts while a node still reports, or may still be handed, an earlier one."""
import grpc
import pytest

from air.airctld import events
from air.airctld.errors import Overtaken
from air.airctld.model import NodeAlloc
from air.airctld.nodes import CALL_TIMEOUT_S
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, NodeState, Reason

ROOT = Identity(0, 0)


class Refused(grpc.RpcError):
    def __init__(self, code=grpc.StatusCode.FAILED_PRECONDITION):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "refused"


def _beat(c, node, runs=(), exits=(), health=()):
    return c.heartbeat(pb.HeartbeatRequest(name=node, running=sorted({j for j, _ in runs}),
                                           runs=[pb.RunRef(job_id=j, run=r) for j, r in runs],
                                           exits=list(exits), health=list(health)))


def _requeued_and_stopped(c, clock, job):
    """The job requeued (aircontrol requeue), and its run's stop done: back in the queue."""
    c.requeue(pb.JobFilter(job_ids=[job.job_id]), ROOT)
    now = c.jobs.get(job.job_id)
    c._commit([(now, events.finished(now, clock.now, 0, 0))], clock.now, 0)


def _beats_then_pass(c, *nodes):
    """A heartbeat from each of `nodes` (none of the job's runs on them), then a scheduling pass."""
    for node in nodes:
        _beat(c, node)
    c._dirty = True
    c.tick()


def _start(c, clock, node="n1", **req):
    job_id, _ = c.submit(pb.JobRequest(script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=4, **req), ROOT)
    job = c.jobs.get(job_id)
    return c._commit([(job, events.start(job, clock.now, (NodeAlloc(node, (0, 1, 2, 3), 1),)))], clock.now, 0)[0]


@pytest.mark.parametrize("code", [grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE])
def test_requeue_asked_while_launch_fails_is_not_lost(controller, code):
    """aircontrol requeue (or a preemption) lands while the launch RPC is in flight; the launch then
    fails (refused, or its last try times out). The job must go back to the queue, not end DONE with
    no result."""
    c, clock = controller
    c.launcher.backoff_s = (0.0, 0.0)
    job = _start(c, clock)
    c._launching.add((job.job_id, job.restart_count))

    class Clients:
        calls = 0

        def launch(self, address, proto):
            Clients.calls += 1
            if Clients.calls == c.launcher.tries or code != grpc.StatusCode.UNAVAILABLE:
                c.requeue(pb.JobFilter(job_ids=[job.job_id]), ROOT)   # another RPC thread, meanwhile
            raise Refused(code)

        def signal(self, *a, **k):
            return True

    c.clients = Clients()
    c.launcher.launch(job)
    now = c.jobs.get(job.job_id)
    assert not (now.phase == JobPhase.DONE and now.result == JobResult.NONE), "job ended DONE with no result"
    assert now.phase == JobPhase.PENDING and now.restart_count == 1
    assert c.store.get_job(job.job_id) == now   # (as the store has it)


def test_no_second_run_while_a_live_node_still_reports_the_first(controller):
    """A GPU fault drains n1 and requeues the job; n1 goes on answering heartbeats and goes on
    reporting run 0 (its ranks do not die: a process stuck in the driver, or still checkpointing).
    n1 never fences (its lease is renewed by every answer), so its fence deadline says nothing: the job
    must not start run 1 on n2 while n1 still reports run 0."""
    c, clock = controller
    job = _start(c, clock, "n1")
    _beat(c, "n1", runs=[(job.job_id, 0)])
    _beat(c, "n1", runs=[(job.job_id, 0)],
          health=[pb.HealthEvent(gpu=0, signal="xid", message="XID 79", critical=True, time=clock.now)])
    assert c.nodes["n1"].state == NodeState.DRAIN
    assert c.jobs.get(job.job_id).phase == JobPhase.PENDING
    for _ in range(30):   # 15 s: n1 answers every 0.5 s, still with run 0
        clock.now += 0.5
        _beat(c, "n1", runs=[(job.job_id, 0)])
        _beat(c, "n2")
        c._dirty = True
        c.tick()
        now = c.jobs.get(job.job_id)
        assert now.phase == JobPhase.PENDING, \
            f"run {now.restart_count} started on {now.node_names} at +{clock.now - 1000:.1f} s " \
            "while n1 still reports run 0 alive"
    # what it waits for is shown (scontrol show job's ReasonDetail), beside the reason it was requeued with
    assert "its last run may still be on n1" in now.reason_detail and now.last_stop_reason == Reason.NODE_FAIL


class Recorder:
    def __init__(self):
        self.launched = []

    def launch(self, address, job):
        self.launched.append((address, job.job_id, job.restart_count))

    def signal(self, *a, **k):
        return True


def test_a_launch_still_queued_when_the_job_is_cancelled_is_never_sent(controller):
    """_schedule commits the start and queues Launcher.launch on the 16-thread pool; a cancel lands before the
    pool runs it (the pool busy with launches to a dead node). The script must not be started."""
    c, clock = controller
    c.clients = rec = Recorder()
    job = _start(c, clock, "n1")
    c._launching.add((job.job_id, job.restart_count))            # as _schedule does, before it queues Launcher.launch
    c.cancel(pb.JobFilter(job_ids=[job.job_id]), 0, ROOT)
    assert c.jobs.get(job.job_id).phase == JobPhase.COMPLETING
    c.launcher.launch(job)                          # the pool gets to it now
    assert rec.launched == [], f"a cancelled job's script was launched: {rec.launched}"


def test_a_queued_launch_of_run_0_never_lands_after_run_1_started_elsewhere(controller):
    """Run 0's launch to n1 is queued (or in flight); a GPU fault on n1 requeues the job; n1's next
    heartbeat (composed before the launch reaches it) has no run of the job, which clears the job's
    fence wait; the pass starts run 1 on n2. Then run 0's launch reaches n1: two runs at once."""
    c, clock = controller
    c.clients = rec = Recorder()
    job0 = _start(c, clock, "n1")
    c._launching.add((job0.job_id, job0.restart_count))
    _beat(c, "n1", health=[pb.HealthEvent(gpu=0, signal="xid", message="XID 79", critical=True, time=clock.now)])
    assert c.jobs.get(job0.job_id).phase == JobPhase.PENDING
    _beat(c, "n1")                           # no run of the job there (yet)
    clock.now += 1
    c._dirty = True
    c.tick()
    run1 = c.jobs.get(job0.job_id)
    started_elsewhere = run1.phase == JobPhase.RUNNING and run1.restart_count == 1
    c.launcher.launch(job0)                          # run 0's launch, queued behind others, goes now
    sent0 = [x for x in rec.launched if x[2] == 0]
    assert not (started_elsewhere and sent0), \
        f"run 1 started on {run1.node_names} and run 0 was then launched on n1: {rec.launched}"


def test_a_heartbeat_taken_after_a_newer_one_of_the_same_node_is_ignored(controller):
    # n1's heartbeat 1, sent before run 0 was there, waits for the controller's lock (held long by a big
    # request) while its daemon gives up on it and sends heartbeat 2: run 0 alive, a critical GPU fault
    # that requeues the job. Heartbeat 1, taken last, must not clear the job's fence wait on n1.
    c, clock = controller
    clock.now += CALL_TIMEOUT_S   # (a controller up for a while: no launch of an earlier one may be out)
    c.clients = Recorder()
    job = _start(c, clock, "n1")

    def beat(seq, started_ns=5, boot="b1", **kw):
        runs = kw.pop("runs", ())
        return c.heartbeat(pb.HeartbeatRequest(name="n1", running=sorted({j for j, _ in runs}),
                                               runs=[pb.RunRef(job_id=j, run=r) for j, r in runs],
                                               boot_id=boot, started_ns=started_ns, seq=seq, **kw))
    beat(2, runs=[(job.job_id, 0)],
         health=[pb.HealthEvent(gpu=0, signal="xid", message="XID 79", critical=True, time=clock.now)])
    assert c.jobs.get(job.job_id).phase == JobPhase.PENDING
    for late in (dict(seq=1), dict(seq=1, started_ns=4)):   # the older one, taken late; one of a daemon
        with pytest.raises(Overtaken):                       # that started before this one (same boot):
            beat(**late)                                     # refused, so that no lease is renewed on it
    clock.now += 1
    c._dirty = True
    c.tick()
    assert c.jobs.get(job.job_id).phase == JobPhase.PENDING   # still waits for n1's word on run 0
    beat(3)                      # the newest: run 0 gone from n1
    c._dirty = True
    c.tick()
    now = c.jobs.get(job.job_id)
    assert now.phase == JobPhase.RUNNING and now.restart_count == 1
    assert beat(1, started_ns=6).reregister is False   # a daemon started since: its count starts again
    beat(1, started_ns=1, boot="b2")   # a daemon after a reboot: taken (another boot's clock says nothing)
    with pytest.raises(Overtaken):
        beat(1, started_ns=1, boot="b2")


def test_a_requeued_job_waits_for_the_launch_of_its_earlier_run_to_return(controller):
    # the launch of run 0 to n1 is in flight (n1 slow to answer); meanwhile the job is requeued and n1's
    # heartbeat, sent before the launch reached it, has no run of the job. Run 1 must not start (on n2)
    # until that launch has returned: it may still start run 0 on n1.
    c, clock = controller
    clock.now += CALL_TIMEOUT_S   # (a controller up for a while: no launch of an earlier one may be out)
    job = _start(c, clock, "n1")
    c._launching.add((job.job_id, job.restart_count))
    seen = []

    class Slow(Recorder):
        def launch(self, address, proto):
            _requeued_and_stopped(c, clock, job)
            _beat(c, "n1")
            _beat(c, "n2")
            clock.now += 1
            c._dirty = True
            c.tick()
            seen.append(c.jobs.get(job.job_id))
            super().launch(address, proto)

    c.clients = Slow()
    c.launcher.launch(job)
    assert seen[0].phase == JobPhase.PENDING, f"run {seen[0].restart_count} started while run 0's launch was out"
    _beat(c, "n1")   # now n1 answers without the job, and no launch of it is out: run 1 may start
    clock.now += 1
    c._dirty = True
    c.tick()
    assert c.jobs.get(job.job_id).phase == JobPhase.RUNNING and c.jobs.get(job.job_id).restart_count == 1


def test_a_restarted_controller_waits_out_the_launches_its_predecessor_may_have_sent(controller):
    """airctld was killed just after it sent a run's launch, and started again: that launch may still
    reach n1 (its deadline is CALL_TIMEOUT_S). Until then n1's heartbeats without the run count for
    nothing: the job is not lost, nor started again elsewhere while n1 may still start it."""
    c, clock = controller   # (built at clock.now: as a controller that has just started)
    job = _start(c, clock, "n1")                  # running, as the store had it; its launch is out
    began = clock.now
    for _ in range(4):
        _beat(c, "n1")                            # n1 has not had the launch (yet)
        clock.now += 2
    assert clock.now < began + CALL_TIMEOUT_S and c.jobs.get(job.job_id).phase == JobPhase.RUNNING
    clock.now = began + CALL_TIMEOUT_S
    _beat(c, "n1")
    _beat(c, "n1")
    now = c.jobs.get(job.job_id)
    assert (now.phase, now.restart_count, now.last_stop_reason) == (JobPhase.PENDING, 1, Reason.JOB_LOST)


def test_a_requeued_job_waits_past_its_nodes_fence_while_a_launch_of_its_earlier_run_is_out(controller):
    """Run 0's launch to n1 is out (slow to reach it) when the job is requeued. n1 answers heartbeats
    without the run, and the deadline of its fence passes; but n1 never fenced (it answers), and the
    launch may still land there: run 1 waits until that launch has returned."""
    c, clock = controller
    clock.now += CALL_TIMEOUT_S   # (a controller up for a while)
    job = _start(c, clock, "n1")
    c._launching.add((job.job_id, 0))
    _beat(c, "n1")
    _beat(c, "n2")
    _requeued_and_stopped(c, clock, job)
    deadline = clock.now + c.config.controller.fenced_by_s
    while clock.now <= deadline + 1:
        clock.now += 1
        _beats_then_pass(c, "n1", "n2")
    assert c.jobs.get(job.job_id).phase == JobPhase.PENDING, "run 1 started while run 0's launch was out"
    c._launching.discard((job.job_id, 0))   # the launch returned (refused, or timed out)
    clock.now += 1
    _beats_then_pass(c, "n2")
    now = c.jobs.get(job.job_id)
    assert now.phase == JobPhase.RUNNING and now.restart_count == 1


def test_a_controller_just_started_keeps_a_requeued_jobs_wait_while_its_predecessors_launch_may_land(tmp_path):
    """airctld restarts while a requeued job waits for its last run's nodes. Its predecessor may have
    had a launch of that run out: neither heartbeats without the run nor the nodes' fence (5.5 s here)
    end the wait before that launch's deadline has passed."""
    from fakeclock import Clock, build
    clock = Clock()
    short = {"node_timeout_s": 6, "heartbeat_interval_s": 1}   # (fenced_by_s 5.5 s: shorter than a launch)
    c = build(tmp_path, clock, clock, **short)
    assert c.config.controller.fenced_by_s < CALL_TIMEOUT_S
    job = _start(c, clock, "n1")
    _requeued_and_stopped(c, clock, job)
    c.stop()
    clock.now += 1
    again = build(tmp_path, clock, clock, **short)   # the same store, a new controller
    try:
        began = clock.now
        while clock.now < began + CALL_TIMEOUT_S - 1:
            clock.now += 1
            _beats_then_pass(again, "n1", "n2")
        assert again.jobs.get(job.job_id).phase == JobPhase.PENDING, "run 1 started while a launch may land"
        clock.now = began + CALL_TIMEOUT_S + 0.5
        _beats_then_pass(again, "n1", "n2")
        now = again.jobs.get(job.job_id)
        assert now.phase == JobPhase.RUNNING and now.restart_count == 1
    finally:
        again.stop()


def test_a_job_waiting_on_a_fence_is_planned_for_after_it_whatever_the_wall_clock_reads(tmp_path):
    """The fence waits are on the monotonic clock, the plan on the wall clock (seconds since 1970 on a
    real host, against seconds since boot): a job that waits on a fence is planned for after it, not
    placed now and dropped when the plan is applied (which made every pass start again)."""
    from fakeclock import Clock, build
    wall, mono = Clock(1.7e9), Clock(1000.0)
    c = build(tmp_path, wall, mono)
    try:
        job = _start(c, wall, "n1")
        _beat(c, "n1", runs=[(job.job_id, 0)])
        _beat(c, "n2")
        c._commit([(job, events.node_lost(job, wall.now, Reason.NODE_FAIL, "GPU fault"))], wall.now, 0)
        assert c.fence_wait[job.job_id]["n1"] > mono.now
        wall.now += 1
        mono.now += 1
        c._dirty = True
        c.tick()
        assert c.jobs.get(job.job_id).phase == JobPhase.PENDING and not c.passes.dirty
    finally:
        c.stop()
