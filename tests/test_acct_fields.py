"""airacct's pure parts: sacct's time forms, records (runs, batch steps, steps), fields and output."""
import datetime as dt

import pytest

from air.aircli import acct_fields, slurmtime
from air.protos import air_pb2 as pb
from air.protos.states import JobPhase, JobResult, Reason

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 26, 17, 19, 34, tzinfo=UTC).timestamp()


def at(*fields) -> float:
    return dt.datetime(*fields, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("text, expected", [
    ("now", NOW),
    ("now-7days", NOW - 7 * 86400),
    ("now-7d", NOW - 7 * 86400),
    ("now+90", NOW + 90),
    ("now-2hours", NOW - 7200),
    ("now-1week", NOW - 7 * 86400),
    ("now-30minutes", NOW - 1800),
    ("today", at(2026, 11, 26)),
    ("midnight", at(2026, 11, 26)),
    ("noon", at(2026, 11, 26, 12)),
    ("teatime", at(2026, 11, 26, 16)),
    ("tomorrow", at(2026, 11, 27)),
    ("2026-11-01", at(2026, 11, 1)),
    ("2026-11-01T08:30", at(2026, 11, 1, 8, 30)),
    ("2026-11-01T08:30:15", at(2026, 11, 1, 8, 30, 15)),
    ("08:30", at(2026, 11, 26, 8, 30)),
    ("8:30:05", at(2026, 11, 26, 8, 30, 5)),
    ("5:00pm", at(2026, 11, 26, 17)),
    ("12:15am", at(2026, 11, 26, 0, 15)),
    ("11/20", at(2026, 11, 20)),
    ("11/20/25", at(2025, 11, 20)),
    ("11.20.2025", at(2025, 11, 20)),
    ("1120", at(2026, 11, 20)),
    ("112025", at(2025, 11, 20)),
    ("11/20-08:30", at(2026, 11, 20, 8, 30)),
    ("1120-08:30:05", at(2026, 11, 20, 8, 30, 5)),
    ("11.20.25-23:59", at(2025, 11, 20, 23, 59)),
])
def test_sacct_time_forms(text, expected):
    assert slurmtime.parse(text, NOW, UTC) == expected


@pytest.mark.parametrize("text", ["yesterday-ish", "now-7fortnights", "2026-13-01", "25:00", "13:00pm", "",
                                  "11/31", "now*2", "11/20-", "11/20-8:30pm", "11/20-25:00"])
def test_a_bad_time_is_one_clear_error(text):
    with pytest.raises(slurmtime.TimeError) as e:
        slurmtime.parse(text, NOW, UTC)
    assert "\n" not in str(e.value) and repr(text) in str(e.value)


def _job(**kw) -> pb.Job:
    request = pb.JobRequest(name="train", account="ml", qos="normal", nodes=2, gpus_per_node=4, ntasks_per_node=2,
                            cpus_per_task=4, workdir="/home/a", submit_line="airbatch -N2 train.sh")
    base = dict(job_id=42, request=request, uid=1000, gid=1000, user="alice", partition="gpu", time_limit_s=3600,
                submit_time=at(2026, 11, 26, 9), phase=JobPhase.DONE, result=JobResult.COMPLETED,
                start_time=at(2026, 11, 26, 10), end_time=at(2026, 11, 26, 11, 30), restart_count=2,
                allocation=[pb.NodeAlloc(node="node03", gpus=[0, 1, 2, 3], cpus=8),
                            pb.NodeAlloc(node="node04", gpus=[0, 1, 2, 3], cpus=8)])
    base.update(kw)
    return pb.Job(**base)


def _requeued_twice() -> pb.HistoryJob:
    runs = [pb.HistoryRun(run=0, start_time=at(2026, 11, 26, 9, 5), end_time=at(2026, 11, 26, 9, 20),
                          reason=Reason.PREEMPTED, allocation=[pb.NodeAlloc(node="node01", gpus=[0], cpus=8),
                                                               pb.NodeAlloc(node="node02", gpus=[0], cpus=8)]),
            pb.HistoryRun(run=1, start_time=at(2026, 11, 26, 9, 30), end_time=at(2026, 11, 26, 9, 50),
                          reason=Reason.JOB_LOST, allocation=[pb.NodeAlloc(node="node01", gpus=[0], cpus=8),
                                                              pb.NodeAlloc(node="node02", gpus=[0], cpus=8)])]
    steps = [pb.HistoryStep(step_id=0, run=1, start_time=at(2026, 11, 26, 9, 31), nodes="node[01-02]", ntasks=4,
                            command="/usr/bin/python train.py --steps 10"),
             pb.HistoryStep(step_id=1, run=2, start_time=at(2026, 11, 26, 10, 1), nodes="node[03-04]", ntasks=4,
                            command="python train.py"),
             pb.HistoryStep(step_id=2, run=2, start_time=at(2026, 11, 26, 11), nodes="node04", ntasks=1,
                            command="hostname")]
    return pb.HistoryJob(job=_job(), runs=runs, steps=steps)


COLS = "JobID,JobIDRaw,JobName,State,ExitCode,Start,End,NodeList,NTasks,AllocTRES"


def _parsable(jobs, duplicates=False, allocations=False, fmt=COLS, now=NOW):
    rows = acct_fields.records(jobs, duplicates, allocations)
    return acct_fields.render(rows, acct_fields.columns(fmt), now, header=False, delimiter="|")


def _t(*fields) -> str:
    return slurmtime.stamp(at(*fields))


def test_a_requeued_job_is_one_record_with_its_last_runs_steps_and_each_run_with_duplicates():
    job = [_requeued_twice()]
    last = _t(2026, 11, 26, 10), _t(2026, 11, 26, 11, 30)
    assert _parsable(job) == [
        f"42|42|train|COMPLETED|0:0|{last[0]}|{last[1]}|node[03-04]||billing=16,cpu=16,gres/gpu=8,node=2",
        f"42.batch|42.batch|batch|COMPLETED|0:0|{last[0]}|{last[1]}|node03|1|billing=8,cpu=8,gres/gpu=4,node=1",
        f"42.1|42.1|python|COMPLETED|0:0|{_t(2026, 11, 26, 10, 1)}|{last[1]}|node[03-04]|4|"
        "billing=16,cpu=16,gres/gpu=8,node=2",
        f"42.2|42.2|hostname|COMPLETED|0:0|{_t(2026, 11, 26, 11)}|{last[1]}|node04|1|billing=8,cpu=8,gres/gpu=4,node=1",
    ]
    with_runs = _parsable(job, duplicates=True, fmt="JobID,State,Start,End,NodeList")
    assert with_runs == [
        f"42|PREEMPTED|{_t(2026, 11, 26, 9, 5)}|{_t(2026, 11, 26, 9, 20)}|node[01-02]",
        f"42.batch|PREEMPTED|{_t(2026, 11, 26, 9, 5)}|{_t(2026, 11, 26, 9, 20)}|node01",
        f"42|NODE_FAIL|{_t(2026, 11, 26, 9, 30)}|{_t(2026, 11, 26, 9, 50)}|node[01-02]",
        f"42.batch|NODE_FAIL|{_t(2026, 11, 26, 9, 30)}|{_t(2026, 11, 26, 9, 50)}|node01",
        f"42.0|NODE_FAIL|{_t(2026, 11, 26, 9, 31)}|{_t(2026, 11, 26, 9, 50)}|node[01-02]",
        f"42|COMPLETED|{last[0]}|{last[1]}|node[03-04]",
        f"42.batch|COMPLETED|{last[0]}|{last[1]}|node03",
        f"42.1|COMPLETED|{_t(2026, 11, 26, 10, 1)}|{last[1]}|node[03-04]",
        f"42.2|COMPLETED|{_t(2026, 11, 26, 11)}|{last[1]}|node04",
    ]
    assert _parsable(job, duplicates=True, allocations=True, fmt="JobID,State,RestartCnt") == [
        "42|PREEMPTED|2", "42|NODE_FAIL|2", "42|COMPLETED|2"]


def test_fields_of_a_job_as_sacct_prints_them():
    entry = pb.HistoryJob(job=_job(exit_code=0, exit_signal=9, result=JobResult.CANCELLED, array_job_id=40,
                                   array_task_id=2), cancelled=True, cancelled_by=1001)
    fmt = ("JobID,JobIDRaw,User,Account,Partition,QOS,State,ExitCode,Elapsed,Timelimit,NNodes,ReqTRES,"
           "RestartCnt,WorkDir,SubmitLine,Submit,Eligible")
    line = _parsable([entry], allocations=True, fmt=fmt)
    assert line == [f"40_2|42|alice|ml|gpu|normal|CANCELLED by 1001|0:9|01:30:00|01:00:00|2|"
                    f"billing=16,cpu=16,gres/gpu=8,node=2|2|/home/a|airbatch -N2 train.sh|"
                    f"{_t(2026, 11, 26, 9)}|{_t(2026, 11, 26, 9)}"]
    pending = pb.HistoryJob(job=_job(phase=JobPhase.PENDING, result=JobResult.NONE, start_time=0, end_time=0,
                                     allocation=[], reason=Reason.PRIORITY, time_limit_s=0, restart_count=0))
    assert _parsable([pending], fmt="JobID,State,Start,End,Elapsed,NodeList,Timelimit,Reason") == [
        "42|PENDING|Unknown|Unknown|00:00:00|None assigned|UNLIMITED|Priority"]
    running = pb.HistoryJob(job=_job(phase=JobPhase.RUNNING, result=JobResult.NONE, end_time=0,
                                     start_time=NOW - 90061))
    assert _parsable([running], allocations=True, fmt="State,End,Elapsed") == ["RUNNING|Unknown|1-01:01:01"]


def test_columns_widths_and_cut_values():
    rows = acct_fields.records([_requeued_twice()], False, True)
    lines = acct_fields.render(rows, acct_fields.columns("jobid,JobName%3,state%-12,Account%4"), NOW)
    assert lines == ["JobID        Job State        Acco",
                     "------------ --- ------------ ----",
                     "42           tr+ COMPLETED      ml"]
    parsable = acct_fields.render(rows, acct_fields.columns("JobID,State"), NOW, delimiter="|", trailing=True)
    assert parsable == ["JobID|State|", "42|COMPLETED|"]


def test_an_unknown_field_is_refused_naming_it():
    with pytest.raises(acct_fields.FormatError, match="unknown field 'JobNme'"):
        acct_fields.columns("JobID,JobNme")
    with pytest.raises(acct_fields.FormatError):
        acct_fields.columns("JobName%x")


def test_a_users_text_never_reaches_the_terminal_raw():
    entry = _requeued_twice()
    entry.job.request.name = "evil\x1b[2J\nname"
    line, = _parsable([entry], allocations=True, fmt="JobName")
    assert line == "evil?[2J?name"


def test_json_has_sacct_top_level_shape_and_steps_under_their_job():
    out = acct_fields.to_json([_requeued_twice()], NOW, duplicates=True)
    assert set(out) == {"jobs", "meta", "errors", "warnings"}
    assert [j["state"]["current"] for j in out["jobs"]] == [["PREEMPTED"], ["NODE_FAIL"], ["COMPLETED"]]
    last = out["jobs"][-1]
    assert [s["step"]["id"] for s in last["steps"]] == ["42.batch", "42.1", "42.2"]
    assert last["exit_code"]["status"] == ["SUCCESS"] and last["restart_cnt"] == 2
    assert last["time"]["limit"] == {"set": True, "infinite": False, "number": 60}
    assert {t["type"]: t["count"] for t in last["tres"]["allocated"]} == {"billing": 16, "cpu": 16, "gres": 8,
                                                                          "node": 2}
