"""A node's part of a step, without a cluster: what a user can do to a node daemon through airrun
(attach to someone else's step, go away mid-stream, ask for too much) leaves the daemon's threads,
counts and other users' steps as they were."""
import os
import threading
import time

import pytest

from air.airnoded import steps
from air.airnoded.steps import StepError, StepLimit, StepRunner
from air.protos import air_pb2 as pb

OWNER = os.getuid()


def _step(job_id=1, step_id=0, ranks=1, argv=("sh", "-c", "echo hi"), run=0, uid=OWNER):
    return pb.Step(job_id=job_id, step_id=step_id, run=run, uid=uid, gid=os.getgid(), world_size=ranks,
                   master_addr="127.0.0.1", master_port=1,
                   nodes=[pb.StepNode(node="n1", address="127.0.0.1:1", ranks=list(range(ranks)),
                                      gpu_sets=[""] * ranks)],
                   spec=pb.StepSpec(job_id=job_id, argv=list(argv), workdir="/tmp"))


@pytest.fixture
def runner(tmp_path):
    idle = []
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    r = StepRunner("n1", "127.0.0.1", spool=spool, max_tasks_per_node=4, max_streams_per_user=2,
                   on_idle=lambda job, run: idle.append((job, run)))
    r.idle = idle
    return r


def _drain(events, timeout=10.0):
    out, done = [], threading.Event()

    def read():
        out.extend(events)
        done.set()
    threading.Thread(target=read, daemon=True).start()
    assert done.wait(timeout), "the stream did not end"
    return out


def test_a_step_runs_its_ranks_and_gives_back_everything(runner):
    runner.prepare(_step(ranks=2, argv=("sh", "-c", 'echo "rank $RANK"')))
    events, stop = runner.run(1, 0, OWNER)
    got = _drain(events)
    assert sorted(e.data for e in got if e.data) == [b"rank 0\n", b"rank 1\n"]
    assert [e.exit_code for e in got if e.exited] == [0, 0]
    assert runner.runs() == [] and runner._user_streams == {} and runner._ranks == 0
    assert runner.idle == [(1, 0)]


def test_beats_only_for_an_airrun_that_asks_first_and_on_every_quiet_spell(runner, monkeypatch):
    monkeypatch.setattr(steps.keepalive, "BEAT_S", 0.2)
    runner.prepare(_step(argv=("sh", "-c", "sleep 1.1; echo done")))
    got = _drain(runner.run(1, 0, OWNER, beats=True)[0])
    assert got[0].beat and not got[0].data   # at once: airrun knows this daemon beats
    kinds = ["beat" if e.beat else "exit" if e.exited else e.data for e in got]
    assert kinds.count("beat") >= 4 and kinds[-2:] == [b"done\n", "exit"], kinds   # a beat a quiet 0.2 s
    assert not any(e.beat and (e.data or e.exited) for e in got)
    runner.prepare(_step(step_id=1, argv=("sh", "-c", "sleep 0.5; echo done")))
    assert not any(e.beat for e in _drain(runner.run(1, 1, OWNER)[0]))   # an airrun from before beats


def test_airrun_going_away_ends_the_stream_and_frees_its_thread(runner):
    runner.prepare(_step(argv=("sleep", "30")))
    events, stop = runner.run(1, 0, OWNER)
    reader = threading.Thread(target=lambda: list(events), daemon=True)
    reader.start()
    time.sleep(0.3)
    stop()              # what gRPC calls when airrun's stream is cancelled
    reader.join(5)
    assert not reader.is_alive(), "the server thread serving the stream is stuck"
    assert runner.runs() == [] and runner._user_streams == {} and runner._ranks == 0


def test_another_user_cannot_take_or_spoil_a_prepared_step(runner):
    runner.prepare(_step(uid=4242))
    with pytest.raises(PermissionError):
        runner.run(1, 0, 4343)
    assert (1, 0) in runner._prepared          # still there for its owner
    with pytest.raises(StepError):
        runner.run(1, 9, 4242)


def test_too_many_ranks_or_steps_are_refused_and_nothing_is_held(runner):
    runner.prepare(_step(ranks=5))
    with pytest.raises(StepLimit, match="asks for 5 ranks on n1; the limit is 4"):
        runner.run(1, 0, OWNER)
    assert runner._user_streams == {} and runner._ranks == 0
    held = []
    for step_id in (1, 2):
        runner.prepare(_step(step_id=step_id, argv=("sleep", "30")))
        held.append(runner.run(1, step_id, OWNER))
    runner.prepare(_step(step_id=3))
    with pytest.raises(StepLimit, match="has 2 steps running on n1 already"):
        runner.run(1, 3, OWNER)
    for _, stop in held:
        stop()
    assert runner._user_streams == {} and runner._ranks == 0


def test_a_rank_that_cannot_start_is_reported_and_counts_are_returned(runner):
    runner.prepare(_step(argv=("sh", "-c", "exit 0"), ranks=1))
    step = runner._prepared[(1, 0)]
    step.spec.environment["BAD"] = "a\0b"     # the kernel refuses it: Popen raises ValueError
    events, stop = runner.run(1, 0, OWNER)
    got = _drain(events)
    assert [e.exit_code for e in got if e.exited] == [126]
    assert runner._user_streams == {} and runner._ranks == 0


def test_output_faster_than_airrun_reads_waits_and_arrives_whole(runner, monkeypatch):
    monkeypatch.setattr(steps, "MAX_QUEUED", 8)
    runner.prepare(_step(argv=("sh", "-c", "i=0; while [ $i -lt 200 ]; do echo $i; i=$((i+1)); done")))
    events, stop = runner.run(1, 0, OWNER)
    time.sleep(0.5)      # the rank has printed everything and exited while nobody read
    got = _drain(events)
    assert [e.data for e in got if e.data] == [f"{i}\n".encode() for i in range(200)]
    assert got[-1].exited


def test_signals_and_kills_name_a_run_and_never_reach_a_newer_one(runner):
    runner.prepare(_step(run=1, argv=("sleep", "30")))
    events, stop = runner.run(1, 0, OWNER)
    assert runner.runs() == [(1, 1)]
    assert runner.signal(1, 0, 9) is False       # a message about run 0 arrives late: run 1 keeps running
    assert runner.has_ranks(1, 1)
    assert runner.signal(1, 1, 9) is True
    assert [e.exit_signal for e in _drain(events) if e.exited] == [9]


@pytest.mark.parametrize("queued,width,pause,again", [
    (8, 5, 0.002, False),          # a short queue: most of what was read is not queued yet
    (None, 95, 0.0005, False),     # the default queue, full of long lines: a leftover of hundreds of KiB
    (None, 95, 0.0005, True),      # and the next daemon stops too before airrun is back
])
def test_a_daemon_stopping_mid_output_leaves_every_byte_to_the_next(runner, monkeypatch, queued, width, pause, again):
    """`systemctl restart airnoded` while a rank prints faster than airrun reads, in the middle of a
    line: what the stopping daemon read and airrun did not take goes to the next daemon, which
    passes it on before anything newer; airrun sees every byte once, in order."""
    monkeypatch.setattr(steps, "DRAIN_S", 0.5)
    if queued:
        monkeypatch.setattr(steps, "MAX_QUEUED", queued)
    lines = 6000
    script = (f'i=0; while [ $i -lt {lines} ]; do printf "line %0{width}d\\n" $i; i=$((i+1)); done; '
              'printf "half a line"; sleep 1.5; echo ", then the rest"; echo "the end" >&2')
    runner.prepare(_step(argv=("sh", "-c", script)))
    events, stop = runner.run(1, 0, OWNER)
    got, slow_done = [], threading.Event()

    def slow_airrun():
        for event in events:
            got.append(event)
            time.sleep(pause)
        slow_done.set()
    threading.Thread(target=slow_airrun, daemon=True).start()
    time.sleep(0.5)
    runner.detach()
    assert slow_done.wait(5), "the stopping daemon's stream did not end"
    assert not any(e.exited for e in got)
    successor = StepRunner("n1", "127.0.0.1", spool=runner.spool, max_tasks_per_node=4)
    assert successor.adopt(runner.spool) == {(1, 0)}
    if again:   # stopped again before airrun attached: everything goes on to a third daemon
        time.sleep(0.3)
        successor.detach()
        successor = StepRunner("n1", "127.0.0.1", spool=runner.spool, max_tasks_per_node=4)
        assert successor.adopt(runner.spool) == {(1, 0)}
    events, stop = successor.attach(1, 0, OWNER)
    got += _drain(events, timeout=20)
    out = b"".join(e.data for e in got if e.data and not e.stderr).decode()
    expected = "".join(f"line {i:0{width}d}\n" for i in range(lines)) + "half a line, then the rest\n"
    if out != expected:
        have = out.splitlines()
        first = next(k for k, (a, b) in enumerate(zip(have, expected.splitlines())) if a != b)
        raise AssertionError(f"{len(have)} lines; the first that differs, #{first}: {have[first - 1:first + 2]}")
    assert [e.data for e in got if e.stderr] == [b"the end\n"]
    assert [(e.exited, e.exit_code) for e in got if e.exited] == [(True, 0)]


def test_a_step_whose_shepherd_died_with_its_ranks_while_no_daemon_ran_ends_at_adoption(runner):
    """A host-level kill of everything but the spool (ranks and shepherd) while the daemon was away:
    the next daemon finds the step's records, reports its ranks gone and holds nothing for it."""
    runner.prepare(_step(ranks=2, argv=("sleep", "30")))
    events, stop = runner.run(1, 0, OWNER)
    threading.Thread(target=lambda: list(events), daemon=True).start()
    stream = next(iter(runner._live))
    runner.detach()
    shepherd, groups = stream.herd.pid, list(stream.herd.pids.values())
    os.kill(shepherd, 9)   # first: it records no exit of its ranks
    for pgid in groups:
        os.killpg(pgid, 9)
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{p}") for p in [shepherd, *groups]) and time.monotonic() < deadline:
        time.sleep(0.05)
    successor = StepRunner("n1", "127.0.0.1", spool=runner.spool, max_tasks_per_node=4)
    successor.adopt(runner.spool)
    events, stop = successor.attach(1, 0, OWNER)
    got = _drain(events, timeout=5)
    assert sorted((e.rank, e.exit_signal) for e in got if e.exited) == [(0, 9), (1, 9)]
    assert successor.runs() == [] and successor._ranks == 0 and not successor.has_ranks(1, 0)


def test_a_rank_the_fence_stopped_says_so_and_one_that_was_killed_otherwise_does_not(runner):
    """The node's fence marks a run before it signals it: the rank's exit says it was fenced, so airrun
    ends with ExitCode.NODE_LOST (a requeue), not with the rank's signal (a failure of the job's own)."""
    from air.airnoded import fence, jobfiles
    runner.prepare(_step(job_id=3, argv=("sleep", "30")))
    events, stop = runner.run(3, 0, OWNER)
    fence.mark_fenced(jobfiles.job_dir(runner.spool, 3, 0))
    assert runner.signal(3, 0, 15)
    assert [(e.exit_signal, e.fenced) for e in _drain(events) if e.exited] == [(15, True)]
    runner.prepare(_step(job_id=4, argv=("sleep", "30")))
    events, stop = runner.run(4, 0, OWNER)
    assert runner.signal(4, 0, 15)
    assert [(e.exit_signal, e.fenced) for e in _drain(events) if e.exited] == [(15, False)]


def test_an_airrun_attaching_after_a_daemon_restart_gets_beats_when_it_asks(runner, monkeypatch):
    monkeypatch.setattr(steps.keepalive, "BEAT_S", 0.2)
    runner.prepare(_step(argv=("sh", "-c", "sleep 1.5; echo done")))
    events, stop = runner.run(1, 0, OWNER)
    threading.Thread(target=lambda: list(events), daemon=True).start()
    time.sleep(0.3)
    runner.detach()
    successor = StepRunner("n1", "127.0.0.1", spool=runner.spool, max_tasks_per_node=4)
    assert successor.adopt(runner.spool) == {(1, 0)}
    got = _drain(successor.attach(1, 0, OWNER, beats=True)[0])
    assert got[0].beat and sum(e.beat for e in got) >= 3, got   # at once, then on each quiet spell
    assert [e.data for e in got if e.data] == [b"done\n"] and [e.exit_code for e in got if e.exited] == [0]


def test_an_outbox_says_quiet_after_its_timeout_and_still_hands_out_what_comes():
    from air.airnoded.outbox import QUIET, Outbox
    box = Outbox(4, 1000)
    began = time.monotonic()
    assert box.get(0.2) is QUIET and time.monotonic() - began >= 0.2
    event = pb.StepEvent(rank=1, data=b"x\n")
    threading.Timer(0.1, lambda: box.put(event, lambda: False)).start()
    assert box.get(5.0) is event   # (woken by the put, not at the timeout)
    box.close()
    assert box.get(0.2) is None and box.get() is None
