"""The controller's own faults, in-process with a store on disk and a clock in the test's hands (no node
daemons): requests racing the passes, a store that cannot write, a node that does not answer a launch."""
import sqlite3
import sys
import threading
import time
import traceback

import grpc
import pytest

from air.protos import config as cfg
from air.airctld.controller import Controller
from air.airctld.errors import StoreFailed
from air.airctld.nodes import CALL_TIMEOUT_S
from air.airctld.service import ControllerService
from air.airctld.store import Store
from fakeclock import Clock
from air.protos import air_pb2 as pb
from air.protos.credential import Identity
from air.protos.states import JobPhase, JobResult, NodeState, Reason

ROOT = Identity(0, 0)
DISK_FULL = "database or disk is full"



class FailingStore(Store):
    """A store on disk whose next statement that starts with `fail_on` fails as a full disk would."""

    def __init__(self, path):
        super().__init__(path)
        self.fail_on = None
        real = self.db.execute

        def execute(sql, *args, **kw):
            if self.fail_on and sql.startswith(self.fail_on):
                self.fail_on = None
                raise sqlite3.OperationalError(DISK_FULL)
            return real(sql, *args, **kw)
        self.db.execute = execute

    def set_pending_reasons(self, changes):
        if self.fail_on == "reasons":
            self.fail_on = None
            raise sqlite3.OperationalError(DISK_FULL)
        super().set_pending_reasons(changes)


class Unanswered(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"


class Clients:
    """Node daemons that do not answer the first `silent` launches."""

    def __init__(self, silent=0):
        self.silent = silent
        self.launches = []
        self.signals = []

    def launch(self, address, job):
        self.launches.append((job.job_id, job.restart_count))
        if len(self.launches) <= self.silent:
            raise Unanswered()

    def signal(self, address, job_id, run, signal, grace, batch_only=False, why="", steps_only=False):
        self.signals.append((job_id, run, signal))
        return True


@pytest.fixture
def make(tmp_path):
    conf = cfg.parse({"controller": {"auth": "none", "state_dir": str(tmp_path), "min_job_age_s": 60},
                      "nodes": [{"name": "n1", "address": "127.0.0.9", "gpus": "sim:4"}],
                      "partitions": [{"name": "p", "nodes": "n1", "default": True}]})
    made = []

    def build(clients=None, store=None):
        clock = Clock()
        c = Controller(conf, store or FailingStore(str(tmp_path / "air.db")), clock=clock, monotonic=clock,
                       clients=clients)
        n = c.nodes["n1"]
        c.nodes["n1"] = n.__class__(**{**n.__dict__, "cpus": 64, "state": NodeState.UP,
                                       "gpus": tuple(pb.Gpu(index=i) for i in range(4))})
        made.append(c)
        return c
    yield build, tmp_path / "air.db"
    for c in made:
        c.stop()


def _request(**kw):
    return pb.JobRequest(script="#!/bin/sh\ntrue\n", workdir="/tmp", **kw)


def _on_disk(path):
    """What another connection sees committed: (jobs, event rows)."""
    db = sqlite3.connect(path)
    try:
        return [r for r in db.execute("SELECT id, phase, reason FROM jobs ORDER BY id")], \
            db.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        db.close()


def _in_memory(c):
    return sorted((j.job_id, j.phase, j.restart_count, j.reason) for j in c.jobs)


# ------------------------------------------------------------ requests racing the passes

def test_a_burst_of_submissions_concurrent_with_passes_and_readers_never_raises(make, monkeypatch):
    build, path = make
    c = build(Clients())
    monkeypatch.setattr(c.launcher, "launch", lambda job: None)
    c.store.db.execute("PRAGMA synchronous=OFF")   # submissions as fast as the controller takes them
    errors, submitted = [], []
    stop = threading.Event()

    def guarded(fn):
        def body():
            try:
                while not stop.is_set():
                    fn()
            except Exception:   # anything at all is a failure of the test
                errors.append(traceback.format_exc())
                stop.set()
        return threading.Thread(target=body, daemon=True)

    def submit():
        k = len(submitted)
        req = _request(gpus_per_node=1, name=f"j{k % 7}", hold=k % 5 == 0, array="0-49" if k % 2 else "",
                       dependency="singleton" if k % 3 == 0 else "")
        job_id = c.submit(req, ROOT)[0]
        submitted.extend(c._arrays.get(job_id, [job_id]))
        if k % 11 == 0:
            c.submit(_request(gpus_per_node=1), ROOT, test_only=True)

    def passes():
        c.clock.now += 6.0   # usage is charged on each tick
        c._dirty = True
        c.tick()

    def read():
        c.share_rows(pb.SharesRequest())
        c.pending_views(pb.JobFilter(), ROOT)
        c.list_jobs(pb.JobFilter(), ROOT)

    def end_some():   # starts free resources for the next pass
        with c._lock:
            running = [j.job_id for j in c.jobs.in_phase(JobPhase.RUNNING)][:2]
        if running:
            c.cancel(pb.JobFilter(job_ids=running), 0, ROOT)
            for job_id in running:
                job = c.jobs.get(job_id)
                c.heartbeat(pb.HeartbeatRequest(name="n1", exits=[pb.JobExit(job_id=job_id, run=job.restart_count,
                                                                             exit_signal=15)]))

    threads = [guarded(submit), guarded(submit), guarded(passes), guarded(read), guarded(end_some)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # threads switch all the time: an unlocked iteration is soon caught
    try:
        for t in threads:
            t.start()
        stop.wait(6.0)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        sys.setswitchinterval(interval)
    assert errors == [], errors[0]
    assert len(submitted) > 50
    on_disk = {row[0]: row[1] for row in _on_disk(path)[0]}
    for job_id in submitted:   # every job accepted is on disk, and in memory until done a while
        assert job_id in on_disk and (job_id in c.jobs or on_disk[job_id] == int(JobPhase.DONE))


# ------------------------------------------------------------ a store that cannot write

def test_a_submit_whose_commit_fails_is_rolled_back_with_one_clear_error_and_the_next_works(make):
    build, path = make
    c = build()
    first, _ = c.submit(_request(), ROOT)
    memory, disk = _in_memory(c), _on_disk(path)
    c.store.fail_on = "COMMIT"
    with pytest.raises(StoreFailed) as failed:
        c.submit(_request(array="0-3"), ROOT)
    assert str(failed.value) == f"the controller could not write its store: {DISK_FULL}; nothing was changed"
    assert failed.value.code == grpc.StatusCode.INTERNAL
    assert _in_memory(c) == memory and _on_disk(path) == disk and not c.store.db.conn.in_transaction
    assert list(c._arrays) == []
    second, _ = c.submit(_request(), ROOT)   # the next request works, and is on disk
    assert second == first + 1 and c.jobs.get(second).phase == JobPhase.PENDING
    assert [row[0] for row in _on_disk(path)[0]] == [first, second]


def test_a_real_full_database_fails_the_request_clearly_and_changes_nothing(make):
    build, path = make
    c = build()
    first, _ = c.submit(_request(), ROOT)
    memory, disk = _in_memory(c), _on_disk(path)
    pages = c.store.db.execute("PRAGMA page_count").fetchone()[0]
    c.store.db.execute(f"PRAGMA max_page_count = {pages}")   # no page more: SQLite's own SQLITE_FULL
    big = "#!/bin/sh\n" + "# padding\n" * 3000
    with pytest.raises(StoreFailed, match=f"could not write its store: {DISK_FULL}; nothing was changed"):
        c.submit(pb.JobRequest(script=big, workdir="/tmp"), ROOT)
    assert _in_memory(c) == memory and _on_disk(path) == disk
    c.store.db.execute("PRAGMA max_page_count = 1073741823")   # space again
    assert c.submit(pb.JobRequest(script=big, workdir="/tmp"), ROOT)[0] == first + 1


def test_the_service_answers_a_failed_commit_with_one_status(make):
    build, _ = make
    c = build()

    class Auth:
        def identify(self, *args):
            return ROOT

    class Context:
        def abort(self, code, details):
            self.status = (code, details)
            raise RuntimeError("aborted")

    service, context = ControllerService(c, Auth()), Context()
    c.store.fail_on = "COMMIT"
    with pytest.raises(RuntimeError, match="aborted"):
        service.Submit(pb.SubmitRequest(job=_request()), context)
    assert context.status == (grpc.StatusCode.INTERNAL,
                              f"the controller could not write its store: {DISK_FULL}; nothing was changed")
    assert service.Submit(pb.SubmitRequest(job=_request()), Context()).job_id == 1


@pytest.mark.parametrize("fail_on", ["reasons", "COMMIT"])
def test_a_pass_whose_commit_fails_leaves_memory_as_it_was_and_the_next_pass_starts_the_job(make, monkeypatch,
                                                                                           fail_on):
    build, path = make
    c = build(Clients())
    launched = []
    monkeypatch.setattr(c.launcher, "launch", lambda job: launched.append(job.job_id))
    starts, _ = c.submit(_request(gpus_per_node=4), ROOT)
    waits, _ = c.submit(_request(gpus_per_node=4), ROOT)   # gets a pending reason in the same transaction
    memory, disk = _in_memory(c), _on_disk(path)
    c.store.fail_on = fail_on
    with pytest.raises(StoreFailed):
        c._schedule(c.clock())
    assert _in_memory(c) == memory and _on_disk(path) == disk and launched == []
    assert c.jobs.get(starts).phase == JobPhase.PENDING and not c._launching
    c.clock.now += 1
    c._schedule(c.clock())
    assert c.jobs.get(starts).phase == JobPhase.RUNNING and launched == [starts]
    assert c.jobs.get(waits).reason == Reason.RESOURCES
    assert [row[1] for row in _on_disk(path)[0]] == [int(JobPhase.RUNNING), int(JobPhase.PENDING)]


def test_a_heartbeat_whose_commit_fails_drains_nothing_and_is_answered_again(make):
    build, path = make
    c = build(Clients())
    critical = pb.HealthEvent(gpu=0, signal="XID 79", message="fell off the bus", critical=True, time=1.0)
    c.store.fail_on = "COMMIT"
    with pytest.raises(StoreFailed):
        c.heartbeat(pb.HeartbeatRequest(name="n1", health=[critical]))
    assert c.nodes["n1"].state == NodeState.UP
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[critical]))   # the node sends its events again
    assert c.nodes["n1"].state == NodeState.DRAIN and "XID 79" in c.nodes["n1"].reason


def test_health_events_sent_again_after_a_lost_answer_are_taken_once_and_alike_ones_each(make):
    """A node sends its events until a heartbeat carrying them is answered; the answer can be lost after
    the commit. The copies are neither recorded again nor drain the node again (an operator may have
    resumed it meanwhile); two alike faults seen in one check are two events, each recorded."""
    build, _ = make
    c = build(Clients())

    def beat(started_ns, seq, *events):
        c.heartbeat(pb.HeartbeatRequest(name="n1", health=list(events), boot_id="b1", started_ns=started_ns,
                                        seq=seq))

    def xids():
        return [(e["time"], e["gpu"], e["signal"], e["critical"]) for e in c.store.node_events("n1")
                if e["signal"].startswith("XID")]

    def event(number, gpu, xid, time, critical=False):
        return pb.HealthEvent(number=number, gpu=gpu, signal=f"XID {xid}", message="m", time=time, critical=critical)

    first = [event(1, 1, 13, 5.0), event(2, 1, 13, 5.0), event(3, 0, 79, 5.0, critical=True)]
    c.store.fail_on = "COMMIT"   # the first try is not recorded: its copy must be
    with pytest.raises(StoreFailed):
        beat(10, 1, *first)
    assert xids() == [] and c.nodes["n1"].state == NodeState.UP
    beat(10, 2, *first)
    assert xids() == [(5.0, 1, "XID 13", 0), (5.0, 1, "XID 13", 0), (5.0, 0, "XID 79", 1)]
    assert c.nodes["n1"].state == NodeState.DRAIN
    c.update_node("n1", NodeState.UP, "", ROOT)   # the operator resumes it; the answer to beat 2 was lost
    beat(10, 3, *first, event(4, 2, 13, 6.0))
    assert xids()[3:] == [(6.0, 2, "XID 13", 0)] and c.nodes["n1"].state == NodeState.UP
    beat(10, 4, event(5, 1, 13, 5.0))   # (beat 3 answered) a fault alike the first, again: an event of its own
    assert xids()[4:] == [(5.0, 1, "XID 13", 0)]
    beat(20, 1, event(1, 1, 13, 5.0))   # a daemon started after it numbers its own events from 1
    assert xids()[5:] == [(5.0, 1, "XID 13", 0)]
    beat(20, 2, event(2, 3, 13, float("nan")))   # a time that is not a number is the controller's
    assert xids()[6:] == [(c.clock(), 3, "XID 13", 0)]
    beat(20, 3, event(2 ** 64 - 1, 3, 13, 7.0))   # a number far ahead (a daemon's bug): taken, and it hides
    beat(20, 4, event(3, 3, 13, 8.0))             # no later event
    assert xids()[7:] == [(7.0, 3, "XID 13", 0), (8.0, 3, "XID 13", 0)]


def test_health_events_sent_again_to_a_restarted_controller_are_taken_once(make):
    """The controller took a heartbeat's events (the commit done), then stopped before its answer left:
    the node sends them again to the controller that starts next. Recorded once and not draining the
    node again, which an operator resumed meanwhile; a new event in the same heartbeat is taken."""
    build, _ = make
    c = build(Clients())
    xid = pb.HealthEvent(number=1, gpu=0, signal="XID 79", message="m", time=5.0, critical=True)
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b1", started_ns=10, seq=1))
    assert c.nodes["n1"].state == NodeState.DRAIN
    c.update_node("n1", NodeState.UP, "", ROOT)
    c.stop()
    c = build(Clients())   # the next controller, on the same store
    c.store.fail_on = "INSERT OR REPLACE INTO health_taken"   # (copies alone write nothing: this one stays)
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b1", started_ns=10, seq=2))
    c.store.fail_on = None
    later = pb.HealthEvent(number=2, gpu=1, signal="XID 13", message="m", time=6.0)
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid, later], boot_id="b1", started_ns=10, seq=3))
    assert [e["signal"] for e in c.store.node_events("n1") if e["signal"].startswith("XID")] == ["XID 79", "XID 13"]
    assert c.nodes["n1"].state == NodeState.UP
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b2", started_ns=20, seq=1))   # (a new daemon
    assert c.nodes["n1"].state == NodeState.DRAIN                                                  # numbers anew)


def test_health_events_of_a_heartbeat_rolled_back_are_taken_by_the_next_controller(make):
    """What the store keeps as taken is written with the events, in the heartbeat's transaction: a
    heartbeat whose commit failed leaves nothing taken, and its copy is recorded, and drains the node,
    at the controller that starts next. A daemon's start time past SQLite's integers is kept all the same."""
    build, _ = make
    c = build(Clients())
    xid = pb.HealthEvent(number=1, gpu=0, signal="XID 79", message="m", time=5.0, critical=True)
    c.store.fail_on = "COMMIT"
    with pytest.raises(StoreFailed):
        c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b1", started_ns=10, seq=1))
    c.stop()
    c = build(Clients())
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b1", started_ns=10, seq=2))
    assert [e["signal"] for e in c.store.node_events("n1") if e["signal"].startswith("XID")] == ["XID 79"]
    assert c.nodes["n1"].state == NodeState.DRAIN
    late = pb.HealthEvent(number=1, gpu=1, signal="XID 13", message="m", time=6.0)
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[late], boot_id="b2", started_ns=2 ** 64 - 1, seq=1))
    c.stop()
    c = build(Clients())
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[late], boot_id="b2", started_ns=2 ** 64 - 1, seq=2))
    assert [e["signal"] for e in c.store.node_events("n1") if e["signal"].startswith("XID")] == ["XID 79", "XID 13"]


def test_health_events_of_a_heartbeat_answered_register_again_are_taken_when_sent_again(make):
    """A heartbeat of a node the controller takes as down is answered `reregister`, its events not
    taken: the node sends them again once registered, and they are recorded and drain it then."""
    build, _ = make
    c = build(Clients())
    n = c.nodes["n1"]
    c.nodes["n1"] = n.__class__(**{**n.__dict__, "state": NodeState.DOWN})
    xid = pb.HealthEvent(number=1, gpu=0, signal="XID 79", message="m", time=5.0, critical=True)
    reply = c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b1", started_ns=10, seq=1))
    assert reply.reregister
    c.nodes["n1"] = n.__class__(**{**n.__dict__, "state": NodeState.UP})   # (registered again)
    c.heartbeat(pb.HeartbeatRequest(name="n1", health=[xid], boot_id="b1", started_ns=10, seq=2))
    assert [(e["signal"], e["critical"]) for e in c.store.node_events("n1")] == [("XID 79", 1)]
    assert c.nodes["n1"].state == NodeState.DRAIN


def _beating_agent(c, tmp_path, answer):
    """A node daemon's Agent, bare but for its heartbeat (Agent._beat) to the controller `c` in this
    process: `answer(request, reply)` is what the daemon gets back (or raises)."""
    import threading
    from types import SimpleNamespace

    from air.airnoded import agent as agent_module
    from air.airnoded.givenup import GivenUp

    class Registry:
        @staticmethod
        def Heartbeat(req, timeout):
            return answer(req, c.heartbeat(req))

    a = object.__new__(agent_module.Agent)
    a._lock, a._wake, a._health, a._drains, a._exits = threading.Lock(), threading.Event(), [], {}, {}
    a._health_count = 0
    a.given_up, a.node, a._registry, a.interval = GivenUp(tmp_path), SimpleNamespace(name="n1"), Registry(), 1.0
    a._boot_id, a._started_ns, a._seq = "b1", 10, 0
    a._runs_here = lambda: []
    a.launcher = SimpleNamespace(runs_here=lambda: [])
    a.monitor = SimpleNamespace(latest=[], ongoing=lambda: [])
    a._progress = lambda runs, began, ending=(): []
    a.metrics = SimpleNamespace(heartbeat_rtt=SimpleNamespace(observe=lambda seconds: None))
    a._renew = lambda began: None
    return a


def _xid(gpu, critical=False):
    return pb.HealthEvent(gpu=gpu, signal="XID 79" if critical else "XID 13", message="m", time=5.0, critical=critical)


def _xid_rows(c):
    return [(e["gpu"], e["signal"]) for e in c.store.node_events("n1") if e["signal"].startswith("XID")]


def test_a_node_daemon_sends_its_events_again_after_a_lost_answer_and_the_controller_takes_them_once(make, tmp_path):
    """The node daemon's own heartbeat (Agent._beat) against the controller in this process: the answer
    to a committed heartbeat is lost on its way back, so the daemon keeps its events and sends them
    again with the next; the controller records each once, and a later event is recorded too."""
    build, _ = make
    c = build(Clients())
    lost = []   # per heartbeat: whether its answer is lost after the controller took it

    class Lost(Exception):
        pass

    def answer(req, reply):
        if lost.pop(0):
            raise Lost()
        return reply

    a = _beating_agent(c, tmp_path, answer)
    a._health_event(_xid(1))
    a._health_event(_xid(1))   # the same fault twice in one check: two events
    a._health_event(_xid(0, critical=True))
    lost.append(True)
    with pytest.raises(Lost):
        a._beat(0.0)
    assert len(a._health) == 3   # not answered: kept, to be sent again
    c.update_node("n1", NodeState.UP, "", ROOT)   # an operator resumes the node meanwhile
    a._health_event(_xid(2))
    lost.append(False)
    a._beat(0.0)
    assert a._health == []
    assert _xid_rows(c) == [(1, "XID 13"), (1, "XID 13"), (0, "XID 79"), (2, "XID 13")]
    assert c.nodes["n1"].state == NodeState.UP   # the copy of the XID 79 did not drain it again


def test_a_heartbeat_carries_a_bounded_number_of_health_events_and_the_rest_go_with_the_next(make, tmp_path,
                                                                                          monkeypatch):
    """A daemon with more health events queued than a heartbeat may carry sends its oldest, the rest with
    the next beats, none lost or taken twice. A heartbeat that carries more than the controller takes
    (another version's bound, or a daemon's bug: a message of them, written under the controller's lock,
    would hold up every node's heartbeat) has the first so many taken, and the daemon keeps the rest,
    a drain for a run given up among them, to send them again."""
    from air.airctld import node_reports
    from air.airnoded import agent as agent_module
    from air.protos import signals
    monkeypatch.setattr(agent_module, "MAX_HEALTH_PER_BEAT", 3)
    monkeypatch.setattr(node_reports, "MAX_HEALTH_PER_BEAT", 3)
    build, _ = make
    c = build(Clients())
    carried, left = [], []

    def answer(req, reply):
        carried.append(len(req.health))
        left.append(reply.health_left)
        return reply

    a = _beating_agent(c, tmp_path, answer)
    for gpu in range(7):   # a backlog while the controller was away
        a._health_event(_xid(gpu))
    while a._health:
        a._beat(0.0)
    assert carried == [3, 3, 1] and left == [0, 0, 0]
    assert _xid_rows(c) == [(gpu, "XID 13") for gpu in range(7)]   # each once, oldest first

    monkeypatch.setattr(agent_module, "MAX_HEALTH_PER_BEAT", 5)   # a daemon that sends more than is taken
    carried.clear(), left.clear()
    for gpu in range(10, 17):
        a._health_event(_xid(gpu))
    drain = pb.HealthEvent(gpu=-1, signal=signals.KILL_TASK_FAILED, critical=True, time=6.0, message="stuck")
    a._health_event(drain, drain_for=(7, 0))
    a._beat(0.0)
    a._beat(0.0)
    assert carried == [5, 5] and left == [2, 2]
    assert (7, 0) not in a.given_up and len(a._health) == 2   # its drain not taken yet: kept, not given up
    a._beat(0.0)
    assert carried == [5, 5, 2] and left == [2, 2, 0] and a._health == []
    assert (7, 0) in a.given_up and c.nodes["n1"].state == NodeState.DRAIN
    assert _xid_rows(c)[7:] == [(gpu, "XID 13") for gpu in range(10, 17)]   # each once, in order


def test_copies_in_a_heartbeat_are_taken_once_and_its_gpu_readings_are_the_nodes_gpus(make):
    """A daemon sends a run's exit and its progress once a beat, and a reading for each of its GPUs. A
    heartbeat that carries copies (a daemon's bug, or a hostile one: each copy was a job end or a row
    written under the controller's lock) ends the job once, with one event, keeps one report a job, and
    keeps readings for no more GPUs than the node registered."""
    build, _ = make
    c = build(Clients())
    done, runs_on = _start(c), _start(c)
    _beat(c, (done, 0), (runs_on, 0))
    end = pb.JobExit(job_id=done, run=0, exit_code=3)
    reports = [pb.JobProgress(job_id=j, run=0, report=f'{{"step": {i}}}') for j in (runs_on, done) for i in range(5)]
    reply = c.heartbeat(pb.HeartbeatRequest(name="n1", running=[runs_on], runs=[pb.RunRef(job_id=runs_on, run=0)],
                                            exits=[end, end, end], progress=reports,
                                            gpus=[pb.GpuStatus(index=i % 4) for i in range(1000)]))
    assert list(reply.acked) == [done]
    ended = [e for e in c.store.events(done) if e["old_state"] == "RUNNING"]
    assert [e["new_state"] for e in ended] == ["FAILED"] and c.jobs.get(done).exit_code == 3
    rows = c.store.db.execute("SELECT job_id, report FROM reports ORDER BY rowid").fetchall()
    assert rows == [(runs_on, '{"step": 0}'), (done, '{"step": 0}')]
    assert [g.index for g in c.node_views()[0].gpu_status] == [0, 1, 2, 3]   # (what airinfo shows)


def test_an_older_runs_exit_or_report_first_in_a_heartbeat_hides_nothing_of_the_current_run(make):
    """(The copies above are taken once per job, but only among the current run's: an older run's exit
    or report that comes first is not the job's.) The exit is acked, and the daemon drops it then: a
    current run's exit passed over would be a job's end lost."""
    from air.airctld.model import evolve
    build, _ = make
    c = build(Clients())
    job = _start(c)
    _beat(c, (job, 0))
    c.jobs.put(evolve(c.jobs.get(job), restart_count=1))   # (its run 1 now runs on n1)
    reply = c.heartbeat(pb.HeartbeatRequest(
        name="n1", running=[job], runs=[pb.RunRef(job_id=job, run=1)],
        exits=[pb.JobExit(job_id=job, run=0, exit_code=9), pb.JobExit(job_id=job, run=1, exit_code=3)],
        progress=[pb.JobProgress(job_id=job, run=0, report='{"run": 0}'),
                  pb.JobProgress(job_id=job, run=1, report='{"run": 1}')]))
    assert list(reply.acked) == [job]
    assert c.jobs.get(job).phase == JobPhase.DONE and c.jobs.get(job).exit_code == 3
    assert c.store.db.execute("SELECT report FROM reports").fetchall() == [('{"run": 1}',)]


# ------------------------------------------------------------ a node that does not answer a launch

def _start(c, **kw):
    job_id, _ = c.submit(_request(gpus_per_node=1, **kw), ROOT)
    c._schedule(c.clock())
    return job_id


def _wait(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _beat(c, *runs):
    return c.heartbeat(pb.HeartbeatRequest(name="n1", running=sorted({j for j, _ in runs}),
                                           runs=[pb.RunRef(job_id=j, run=r) for j, r in runs]))


def test_a_launch_that_times_out_is_retried_then_left_to_the_nodes_heartbeats(make):
    """The node never answers the launch (3 tries of the same run). Its heartbeats decide: a run they
    report goes on (the node had started it: nothing is lost), one they do not is requeued with the
    launch's timeouts as its reason."""
    build, _ = make
    clients = Clients(silent=100)
    c = build(clients)
    c.clock.now += CALL_TIMEOUT_S   # (up for a while: no launch of an earlier controller may be out)
    c.launcher.backoff_s = (0.01, 0.01)
    started = _start(c)
    _wait(lambda: not c._launching, "the tries")
    assert clients.launches == [(started, 0)] * 3   # the same run each time: a node runs it once at most
    for _ in range(3):                              # the node had started it after all
        reply = _beat(c, (started, 0))
        assert not reply.stale and not reply.kill
    assert c.jobs.get(started).phase == JobPhase.RUNNING and started not in c._unanswered
    never = _start(c)
    _wait(lambda: not c._launching, "the tries")
    _beat(c, (started, 0))
    assert c.jobs.get(never).phase == JobPhase.RUNNING   # one heartbeat without it: it may be late
    _beat(c, (started, 0))
    job = c.jobs.get(never)
    assert job.phase == JobPhase.PENDING and job.restart_count == 1 and job.last_stop_reason == Reason.LAUNCH_FAILED
    assert job.reason_detail == "launch of run 0 on n1 timed out 3 times, and n1 does not have it"
    assert [e["detail"] for e in c.store.events(never)][-1] == job.reason_detail
    assert c.jobs.get(started).phase == JobPhase.RUNNING and not c._unanswered
    # the node starts run 0 after all, later still: it is stale, and killed
    reply = _beat(c, (started, 0), (never, 0))
    assert [(r.job_id, r.run) for r in reply.stale] == [(never, 0)] and list(reply.kill) == [never]


def test_a_launch_answered_on_a_retry_runs_and_a_job_that_may_not_requeue_ends_launch_failed(make):
    build, _ = make
    clients = Clients(silent=1)
    c = build(clients)
    c.clock.now += CALL_TIMEOUT_S   # (up for a while: no launch of an earlier controller may be out)
    c.launcher.backoff_s = (0.01, 0.01)
    job_id = _start(c)
    _wait(lambda: not c._launching, "the launch")
    assert clients.launches == [(job_id, 0), (job_id, 0)] and c.jobs.get(job_id).phase == JobPhase.RUNNING
    clients.silent = 10
    other = _start(c, no_requeue=True)
    _wait(lambda: not c._launching, "the tries")
    _beat(c, (job_id, 0))
    _beat(c, (job_id, 0))
    job = c.jobs.get(other)
    assert job.phase == JobPhase.DONE and job.result == JobResult.FAILED and job.reason == Reason.LAUNCH_FAILED
    assert job.restart_count == 0 and "launch of run 0 on n1 timed out 3 times" in job.reason_detail


def test_a_node_starts_a_run_once_when_its_launch_is_retried_while_the_first_is_still_starting(tmp_path):
    from air.airnoded.launcher import Launcher
    launcher = Launcher("n1", tmp_path, lambda exit: None)
    release, spawned = threading.Event(), []

    def slow_spawn(job):   # the first launch is slow: the controller's call times out and it retries
        spawned.append(job.restart_count)
        release.wait(10)
        raise OSError(28, "No space left on device")
    launcher._spawn = slow_spawn
    job = pb.Job(job_id=5, restart_count=0, request=pb.JobRequest(script="#!/bin/sh\n", workdir=str(tmp_path)))
    first = threading.Thread(target=launcher.launch, args=(job,))
    first.start()
    _wait(lambda: spawned, "the first launch to start spawning")
    launcher.launch(job)   # the retry: a no-op while the same run is being started
    release.set()
    first.join(10)
    assert spawned == [0]
