"""The record of runs given up, kept in the spool across node daemon restarts."""
import os

from air.airnoded import givenup
from air.airnoded.givenup import GivenUp


def test_runs_given_up_are_kept_for_the_next_daemon_and_forgotten_once_their_groups_go(tmp_path):
    first = GivenUp(tmp_path)
    first.add((7, 0))
    first.add((9, 2))
    first.add((7, 0))
    again = GivenUp(tmp_path)                  # a daemon started again
    assert (7, 0) in again and (9, 2) in again and (7, 1) not in again
    again.discard((7, 0))                      # its group emptied and went
    again.keep_only({(9, 2), (11, 0)})         # what a starting daemon still finds
    assert (tmp_path / givenup.FILE).read_text() == "9 2\n"
    assert os.stat(tmp_path / givenup.FILE).st_mode & 0o777 == 0o600


def test_a_record_that_is_not_a_plain_file_of_roots_is_not_read(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("5 0\n")
    (tmp_path / givenup.FILE).symlink_to(target)
    assert (5, 0) not in GivenUp(tmp_path)     # a link is never followed: the groups are watched anew
    (tmp_path / givenup.FILE).unlink()
    (tmp_path / givenup.FILE).write_bytes(b"\xff\xfe 1\n5 0\nx y\n-1 2\n")
    assert (5, 0) not in GivenUp(tmp_path)     # not ASCII: nothing of it is trusted


def test_lines_that_are_no_run_are_skipped_and_the_record_is_bounded(tmp_path):
    (tmp_path / givenup.FILE).write_text("5 0\nx y\n-1 2\n6\n\n")
    record = GivenUp(tmp_path)
    assert (5, 0) in record
    for i in range(givenup.MAX_KEPT + 10):
        record.add((100 + i, 0))
    assert len(GivenUp(tmp_path)._runs) == givenup.MAX_KEPT


class _Launcher:
    def __init__(self):
        self.abandoned = []

    def kill_again(self, job_id, run):
        return [123]

    def starting(self):
        return set()

    def abandon(self, job_id, run, detail):
        self.abandoned.append((job_id, run))
        return True


def _agent(tmp_path, monkeypatch):
    """The parts of a node daemon's agent that give a run up, with the rest faked."""
    import threading
    from air.airnoded import agent as agent_module
    from air.airnoded.killwatch import KillWatch

    class Steps:
        def kill_again(self, job_id, run):
            return []

    class Metrics:
        class unkillable:
            @staticmethod
            def inc():
                pass

    monkeypatch.setattr(agent_module, "_all_stuck", lambda pids: True)
    a = object.__new__(agent_module.Agent)
    a._lock, a._wake, a._health, a._drains, a._health_count = threading.Lock(), threading.Event(), [], {}, 0
    a.launcher, a.steps, a.metrics = _Launcher(), Steps(), Metrics()
    a.kill_watch, a.given_up = KillWatch(60), GivenUp(tmp_path)
    a.node = type("Node", (), {"name": "n1"})()
    return a


def test_a_run_is_recorded_as_given_up_only_once_the_controller_has_taken_its_drain(tmp_path, monkeypatch):
    a = _agent(tmp_path, monkeypatch)
    a.kill_watch.killed((7, 0))
    a._maybe_give_up(7, 0)
    assert [e.signal for e in a._health] == ["Kill task failed"] and a.launcher.abandoned == [(7, 0)]
    assert (7, 0) not in GivenUp(tmp_path)          # a daemon started now drains again: nothing was sent
    a._delivered(list(a._health))                   # a heartbeat carried it
    assert not a._health and (7, 0) in GivenUp(tmp_path)


def test_a_run_given_up_by_an_earlier_daemon_is_given_up_again_without_a_second_drain(tmp_path, monkeypatch):
    GivenUp(tmp_path).add((7, 0))                   # the earlier daemon's record
    a = _agent(tmp_path, monkeypatch)               # adopted the run again, and kills it as stale
    a.kill_watch.killed((7, 0))
    a._maybe_give_up(7, 0)
    assert a._health == [] and a.launcher.abandoned == [(7, 0)]


def _xid(n):
    from air.protos import air_pb2 as pb
    return pb.HealthEvent(gpu=0, signal="XID 13", critical=False, message=f"xid {n}")


def test_a_drain_queued_while_a_heartbeat_was_under_way_stays_queued_for_the_next(tmp_path, monkeypatch):
    from air.airnoded import agent as agent_module
    a = _agent(tmp_path, monkeypatch)
    for n in range(agent_module.MAX_HEALTH_EVENTS):   # a backlog while the controller is away
        a._health_event(_xid(n))
    beat = list(a._health)                            # a heartbeat's snapshot, then its call
    a.kill_watch.killed((7, 0))
    a._maybe_give_up(7, 0)                            # meanwhile: a run given up, its drain queued,
    for n in range(5):                                # and a job's XIDs past the bound
        a._health_event(_xid(1000 + n))
    a._delivered(beat)                                # the heartbeat's events were taken
    assert (7, 0) not in GivenUp(tmp_path)            # the drain was not among them: not recorded,
    assert [e.signal for e in a._health if e.critical] == ["Kill task failed"]   # and still to be sent
    for n in range(3 * agent_module.MAX_HEALTH_EVENTS):   # a flood of XIDs never pushes it out
        a._health_event(_xid(n))
    assert [e.signal for e in a._health if e.critical] == ["Kill task failed"]
    assert len(a._health) == agent_module.MAX_HEALTH_EVENTS
    # a heartbeat carries them oldest first, each numbered once, so that the controller takes a number
    # once whatever it gets again (NodeReports._health_not_taken)
    numbers = [e.number for e in a._health]
    assert numbers == sorted(set(numbers)) and numbers[0] > 0
    assert numbers[-1] == 4 * agent_module.MAX_HEALTH_EVENTS + 5 + 1   # every event numbered, the drain too
    a._delivered(list(a._health))
    assert (7, 0) in GivenUp(tmp_path) and not a._health
