"""Goodput: the breakdown of a job's time against hand-worked cases and its invariant (the categories
cover the wall time, none below zero), the runtime's ledger of lost work across runs, and the
controller's reading of figures a job wrote (hostile input)."""
import json
import math

import pytest
from hypothesis import example, given, strategies as st

from air.airctld import goodput
from air.runtime import goodput as runtime_goodput


def _fig(**kw) -> str:
    return json.dumps(kw)


def test_two_runs_worked_by_hand():
    runs = [goodput.Run(10, 110, _fig(run=0, first_step_time=25, restore_s=5, train_s=60, ckpt_s=10)),
            goodput.Run(130, 200, _fig(run=1, first_step_time=140, restore_s=3, train_s=50, ckpt_s=2,
                                       lost_s=12, lost_steps=4))]
    g = goodput.breakdown(0.0, runs, now=999)
    assert g.queued_s == 10 and g.down_s == 20 and g.wall_s == 190
    assert g.starting_s == 10 + 7 and g.restoring_s == 8 and g.checkpoint_s == 12
    assert g.lost_s == 12 and g.lost_steps == 4 and g.training_s == 110 - 12
    assert g.other_s == pytest.approx((100 - 85) + (70 - 62))
    assert g.ettr == pytest.approx(98 / 190) and not g.partial


def test_a_run_without_figures_is_other_and_partial():
    g = goodput.breakdown(0.0, [goodput.Run(5, 50, "")], now=60)
    assert g.partial and g.other_s == 45 and g.training_s == 0 and g.ettr == 0


def test_a_running_job_counts_to_now_and_a_pending_one_only_waits():
    g = goodput.breakdown(0.0, [goodput.Run(10, 0, _fig(run=0, first_step_time=12, train_s=30))], now=50)
    assert g.wall_s == 40 and g.training_s == 30 and g.starting_s == 2 and g.other_s == 8
    assert goodput.breakdown(5.0, [], now=65).queued_s == 60


any_seconds = st.floats(0, 1e7)
run_spec = st.tuples(st.floats(0, 1000), st.floats(0, 1000), st.booleans(),
                     st.fixed_dictionaries({}, optional={"first_step_time": st.floats(0, 1e4), "restore_s": any_seconds,
                                                         "train_s": any_seconds, "ckpt_s": any_seconds,
                                                         "ckpt_pre_s": any_seconds, "lost_s": any_seconds}))


@given(st.floats(0, 100), st.lists(run_spec, min_size=1, max_size=5))
@example(0.0, [(0.0, 162.97470508289285, True, {"train_s": 1656321.0})])   # a training time a float above the wall
def test_the_categories_cover_the_wall_time_whatever_a_job_claims(submit_offset, specs):
    """Whatever figures the runs claim (a job writes them: too much time, times before its start), the
    parts are never negative and add up to the wall time: no category is inflated past it."""
    runs, t = [], 1000.0
    for gap, length, has, claims in specs:
        start, end = t + gap, t + gap + length
        claims = dict(claims, first_step_time=start + claims.get("first_step_time", 0.0) - 5e3)
        runs.append(goodput.Run(start, end, json.dumps(dict(claims, run=len(runs))) if has else ""))
        t = end
    g = goodput.breakdown(1000.0 - submit_offset, runs, now=t)
    parts = [g.starting_s, g.restoring_s, g.training_s, g.checkpoint_s, g.lost_s, g.down_s, g.other_s]
    assert all(p >= 0 for p in parts) and g.queued_s >= 0
    assert sum(parts) == pytest.approx(g.wall_s, abs=1e-6 * max(1.0, g.wall_s))
    assert g.wall_s == pytest.approx(t - runs[0].start)
    assert g.down_s == pytest.approx(sum(b.start - a.end for a, b in zip(runs, runs[1:])))
    assert 0 <= g.ettr <= 1


def test_every_reader_of_a_report_takes_numbers_only():
    """airq -l, airstat and the metrics read reports through one helper: a 400-digit step, NaN, text,
    a nest 100,000 deep, or not an object at all, gives nothing, and never raises."""
    from air.aircli.formats import progress_of
    from air.aircli.stat import series
    from air.protos import air_pb2 as pb
    from air.protos.reports import report_numbers
    big = '{"step": 1' + '0' * 400 + ', "loss": NaN, "mfu": 0.5, "name": "x", "ok": true}'
    assert report_numbers(big) == {"mfu": 0.5}
    assert report_numbers("[" * 100_000) == {} and report_numbers("[1]") == {} and report_numbers("") == {}
    assert progress_of(pb.Job(progress=big)) == {"mfu": 0.5}
    assert series([big, '{"step": 3, "loss": 1.5}'])["step"] == [3]


def test_metrics_read_a_report_a_job_wrote_as_numbers_only():
    from air.airctld.metrics import _report
    assert _report('{"step": 1' + '0' * 400 + ', "loss": 2.5}') == {"loss": 2.5}
    assert _report('{"step": NaN, "mfu": "x", "time": true}') == {}


@pytest.mark.parametrize("report,expected", [
    ("", ""), ("not json", ""), ("[1, 2]", ""), ('{"goodput": 5}', ""),
    ('{"goodput": {"train_s": NaN}}', ""), ('{"goodput": {"train_s": -1}}', ""),
    ('{"goodput": {"train_s": true}}', ""), ('{"goodput": {"train_s": 1e300}}', ""),
    ('{"goodput": {"train_s": 12.5, "evil": "x" , "run": 2}}', '{"run":2.0,"train_s":12.5}'),
    ('{"goodput": {"train_s": 1' + '0' * 400 + '}}', ""), ('{"goodput": {"run": 1, "train_s": 1e999}}', '{"run":1.0}'),
    ("[" * 100000, ""),
])
def test_figures_a_job_wrote_are_read_as_numbers_only(report, expected):
    assert goodput.figures_from_report(report) == expected


def test_live_figures_must_be_the_current_runs():
    report = json.dumps({"step": 9, "goodput": {"run": 1, "train_s": 3.0}})
    assert goodput.live_figures(report, 1) and not goodput.live_figures(report, 2)


def test_the_ledger_counts_what_the_run_before_computed_past_the_restored_step(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(runtime_goodput.time, "monotonic", lambda: clock[0])
    first = runtime_goodput.Ledger(0)
    first.keep_progress(tmp_path)
    first.restored(0, 0.5, tmp_path)
    for step in range(1, 11):   # ten steps of 2 s; a checkpoint at step 6 blocks the loop 1 s
        clock[0] += 2.0 + (1.0 if step == 7 else 0.0)
        if step == 7:
            first.blocked(1.0)
        first.stepped(step)
    assert first.train_s == pytest.approx(18.0) and first.ckpt_s == 1.0 and first.steps == 10
    # the run dies at step 10; the next restores step 6: steps 7..10 were computed for nothing
    second = runtime_goodput.Ledger(1)
    second.restored(6, 2.5, tmp_path)
    assert second.lost_steps == 4 and second.lost_s == pytest.approx(4 * 18.0 / 10)
    f = second.figures()
    assert f["restore_s"] == 2.5 and f["restored_step"] == 6 and f["run"] == 1
    # a run that restored its predecessor's last step lost nothing; a rank but 0 reads nothing
    third = runtime_goodput.Ledger(2)
    third.restored(10, 1.0, tmp_path)
    assert third.lost_steps == 0 and third.lost_s == 0
    other = runtime_goodput.Ledger(1)
    other.restored(6, 1.0, None)
    assert other.lost_steps == 0 and not math.isnan(other.lost_s)
