"""The node daemon's heartbeat loop: an exit is reported at once on a quiet node, and on a busy one the
exits of the next BEAT_GAP_S go together (a beat costs both daemons the same whatever it carries)."""
import threading
import time
from types import SimpleNamespace

from air.airnoded import agent as module


def _agent(beats):
    agent = module.Agent.__new__(module.Agent)
    agent.interval = 30.0
    agent._registered = True
    agent._wake, agent._stopping = threading.Event(), threading.Event()
    agent._beat_began = float("-inf")
    agent.check_lease = lambda: None
    agent.config = SimpleNamespace(controller=SimpleNamespace(address="-"))

    agent._beat = beats.append   # (given when it began: the loop's own _begin_beat)
    return agent


def test_a_quiet_nodes_exit_goes_at_once_and_a_busy_nodes_exits_go_together():
    beats = []
    agent = _agent(beats)
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while not beats and time.monotonic() < deadline:   # the first beat, at start
            time.sleep(0.001)
        time.sleep(2 * module.BEAT_GAP_S)                    # quiet since
        woken = module.lease_clock()
        agent._wake.set()                                    # one exit
        while len(beats) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert beats[1] - woken < module.BEAT_GAP_S, "a quiet node's exit waited"
        stop = time.monotonic() + 20 * module.BEAT_GAP_S
        while time.monotonic() < stop:                       # an exit every millisecond
            agent._wake.set()
            time.sleep(0.001)
        busy = beats[2:]
        gaps = [b - a for a, b in zip(busy, busy[1:])]
        assert len(busy) >= 10 and min(gaps) >= module.BEAT_GAP_S * 0.99, gaps
        assert max(gaps) < 10 * module.BEAT_GAP_S, gaps      # (and no exit waits for the next regular beat, 30 s)
    finally:
        agent._stopping.set()
        agent._wake.set()
        loop.join(5)


def test_a_busy_nodes_beats_read_its_runs_progress_once_an_interval():
    """Reading every run's progress folder costs a node in proportion to its runs: beats that exits call
    every BEAT_GAP_S read it no more often than a quiet node's beats, once an interval."""
    reads = []
    agent = module.Agent.__new__(module.Agent)
    agent.interval = 1.0
    agent._progress_read = float("-inf")
    agent.progress = SimpleNamespace(collect=lambda now, runs, forget_others: reads.append(runs) or ["report"])
    beats = [i * module.BEAT_GAP_S for i in range(int(3.5 / module.BEAT_GAP_S))]   # 3.5 s of busy beats
    read_at = [t for t in beats if agent._progress([(7, 0), (8, 0)], t)]
    assert len(reads) == len(read_at) == 4 and read_at[0] == 0.0   # the first beat's, then about once a second
    assert all(0.99 <= b - a < 1.0 + 2 * module.BEAT_GAP_S for a, b in zip(read_at, read_at[1:])), read_at
    assert all(runs == [(7, 0), (8, 0)] for runs in reads)
    # a run whose exit goes in a beat: its last report goes with it, whenever the others were read
    reads.clear()
    assert agent._progress([(7, 0)], beats[-1] + module.BEAT_GAP_S, ending=[(8, 0)]) == ["report"]
    assert reads == [[(8, 0)]]
