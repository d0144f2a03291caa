"""Command lines read without click (aircli.argv), held to click's own reading of the same argv, for
airbatch and airq: where argv answers, click must give the command the same parameters; where click
would refuse or do something else (help), argv must leave it to click."""
import os
import subprocess
import sys

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air.aircli import argv as fast
from air.aircli import batch, cancel, queue
from air.aircli.client import CliError
from air.aircli.options import FLAG_KINDS, OPTIONS, SLURM_ONLY

VALUED = [o.long for o in OPTIONS if o.kind not in FLAG_KINDS] + ["--wrap", "--config"]
FLAGS = [o.long for o in OPTIONS if o.kind in FLAG_KINDS] + ["--parsable", "--test-only"]
SHORT_VALUED = [o.short for o in OPTIONS if o.short and o.kind not in FLAG_KINDS]
SHORT_FLAGS = [o.short for o in OPTIONS if o.short and o.kind in FLAG_KINDS]
WORDS = ["job.sh", "train.sh", "4", "1:00:00", "a b", "", ":", "node[01-02]", "x=y", "é", "-", "--", "-5",
         "-x", "--nodes", "-h", "--help", "--frobnicate", "-Z", "--hold=1", "-HW", "-Nfoo", "--job-name=",
         "--job-name=-x", "-J=x"] + [long for long, _, _ in SLURM_ONLY[:6]] + \
        [short for _, short, _ in SLURM_ONLY if short][:4]


def click_reading(argv: list[str], tool=batch):
    """The parameters click gives the tool's callback for argv, or "refused" (an error, or help)."""
    try:
        return tool.command.make_context("airbatch", list(argv)).params
    except (click.ClickException, click.exceptions.Exit, CliError):
        return "refused"


def batchargs(argv: list[str]):
    return fast.read(argv, batch.options(), script=True)


def queueargs(argv: list[str]):
    return fast.read(argv, fast.rows_table(queue.OPTIONS))


def everyday_token_lists():
    """Options in the forms people and scripts write, then maybe a script and its arguments."""
    option = st.one_of(
        st.tuples(st.sampled_from(VALUED), st.sampled_from(["4", "1:00", "gpu", "a b", "", "x=y", "é"]))
        .map(lambda p: [f"{p[0]}={p[1]}"] if p[1] == "" else [p[0], p[1]]),
        st.tuples(st.sampled_from(VALUED), st.sampled_from(["4", "-1", "a=b", ""])).map(lambda p: [f"{p[0]}={p[1]}"]),
        st.tuples(st.sampled_from(SHORT_VALUED), st.sampled_from(["4", "gpu", "1:00"]))
        .flatmap(lambda p: st.sampled_from([[p[0], p[1]], [p[0] + p[1]]])),
        st.sampled_from(FLAGS + SHORT_FLAGS).map(lambda f: [f]),
    )
    tail = st.one_of(st.just([]), st.lists(st.sampled_from(WORDS), max_size=4).map(lambda rest: ["job.sh"] + rest))
    return st.tuples(st.lists(option, max_size=6), tail).map(lambda p: [t for o in p[0] for t in o] + p[1])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORDS + VALUED + FLAGS + SHORT_VALUED + SHORT_FLAGS),
                          st.text(max_size=6)), max_size=8))
def test_where_batchargs_reads_a_command_line_click_reads_it_the_same(argv):
    fast = batchargs(argv)
    if fast is not None:
        assert click_reading(argv) == fast, argv


@settings(max_examples=300, deadline=None)
@given(everyday_token_lists())
def test_batchargs_reads_every_everyday_command_line_as_click_does(argv):
    assert batchargs(argv) == click_reading(argv), argv


AIRQ_VALUED = [n for names, _, takes, _ in queue.OPTIONS if takes for n in names]
AIRQ_FLAGS = [n for names, _, takes, _ in queue.OPTIONS if not takes for n in names]


def _any_argv(tool, extra: list[str]):
    names = [n for names, _, _, _ in tool.OPTIONS for n in names]
    return st.lists(st.one_of(st.sampled_from(WORDS + names + extra), st.text(max_size=6)), max_size=8)


@pytest.mark.parametrize("tool,reader,extra", [
    (queue, lambda argv: queueargs(argv), ["-hl", "-uroot", "--user=", "-v"]),
    (cancel, lambda argv: cancelargs(argv), ["12", "7_3", "-vb", "-uroot"]),
], ids=["airq", "aircancel"])
def test_where_argv_reads_a_command_line_click_reads_it_the_same(tool, reader, extra):
    @settings(max_examples=400, deadline=None)
    @given(_any_argv(tool, extra))
    def check(argv):
        mine = reader(argv)
        if mine is not None:
            assert click_reading(argv, tool) == mine, argv
    check()


# airq's options, as its manual page and scripts know them (the table builds both readers: a name lost
# or misspelt there would be lost from both, and only this list sees it)
AIRQ_NAMES = ("-u --user --me -t --states -j --jobs -n --name -h --noheader -o --format -O --Format -p --partition "
              "--json -r --array -l --long --priority --start").split()


# what each of them means: the parameter of airq's listing it sets (its names), and whether it takes a value
AIRQ_MEANING = {"users": ("-u --user", True), "me": ("--me", False), "states": ("-t --states", True),
                "jobs": ("-j --jobs", True), "names": ("-n --name", True), "noheader": ("-h --noheader", False),
                "fmt": ("-o --format", True), "long_fmt": ("-O --Format", True),
                "partitions": ("-p --partition", True), "as_json": ("--json", False),
                "expand_arrays": ("-r --array", False), "long_": ("-l --long", False),
                "show_priority": ("--priority", False), "show_start": ("--start", False), "config": ("--config", True)}


def test_airq_takes_the_options_it_always_took_by_the_same_names_either_way():
    shown = {name for p in queue.command.params if not p.hidden for name in p.opts}
    assert shown == set(AIRQ_NAMES)
    meaning = {name: (param, takes) for param, (names, takes) in AIRQ_MEANING.items() for name in names.split()}
    assert {name: (p.name, p.takes_value) for name, p in fast.rows_table(queue.OPTIONS).items()} == meaning
    assert {(p.name, not p.is_flag) for p in queue.command.params} == set(meaning.values())


def _airq_option(name: str, value: str) -> list[list[str]]:
    """The forms people write an option of airq's with its value in."""
    attached = f"{name}={value}" if name.startswith("--") else name + value
    return [[name, value], [attached]] if value else [[attached]] if name.startswith("--") else [[name, "x"]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(AIRQ_VALUED), st.sampled_from(["root", "R,PD", "1,2", "%i %j", "", "é"]))
    .flatmap(lambda p: st.sampled_from(_airq_option(*p))),
    st.sampled_from(AIRQ_FLAGS).map(lambda f: [f])), max_size=5).map(lambda groups: [t for g in groups for t in g]))
def test_argv_reads_every_everyday_airq_command_line_as_click_does(argv):
    assert queueargs(argv) == click_reading(argv, queue), argv


AIRCANCEL_VALUED = [n for names, _, takes, _ in cancel.OPTIONS if takes for n in names]
AIRCANCEL_FLAGS = [n for names, _, takes, _ in cancel.OPTIONS if not takes for n in names]
# aircancel's options, as scancel's manual page names them, with the parameter each sets and whether it
# takes a value (the table builds both readers: only a list outside it sees a name lost or swapped)
AIRCANCEL_MEANING = {"user": ("-u --user", True), "states": ("-t --state", True), "name": ("-n --name", True),
                     "sig": ("-s --signal", True), "batch": ("-b --batch", False), "full": ("-f --full", False),
                     "verbose": ("-v --verbose", False), "config": ("--config", True)}


def cancelargs(argv: list[str]):
    return fast.read(argv, fast.rows_table(cancel.OPTIONS), positional="ids")


def test_aircancel_takes_the_options_it_always_took_by_the_same_names_either_way():
    meaning = {name: (param, takes) for param, (names, takes) in AIRCANCEL_MEANING.items() for name in names.split()}
    assert {name: (p.name, p.takes_value) for name, p in fast.rows_table(cancel.OPTIONS).items()} == meaning
    options = [p for p in cancel.command.params if isinstance(p, click.Option)]
    assert {(p.name, not p.is_flag) for p in options} == set(meaning.values())
    assert {n for p in options if not p.hidden for n in p.opts} == set(meaning) - {"--config"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(AIRCANCEL_VALUED), st.sampled_from(["root", "R,PD", "USR1", "", "é"]))
    .flatmap(lambda p: st.sampled_from(_airq_option(*p))),
    st.sampled_from(AIRCANCEL_FLAGS).map(lambda f: [f]),
    st.sampled_from(["12", "12_3", "12,13", "x"]).map(lambda i: [i])), max_size=6)
    .map(lambda groups: [t for g in groups for t in g]))
def test_argv_reads_every_everyday_aircancel_command_line_as_click_does(argv):
    assert cancelargs(argv) == click_reading(argv, cancel), argv


@pytest.mark.parametrize("prog,argv,sent", [
    ("aircancel", ["12", "13_4"], {"filter": {"job_ids": [12], "array_tasks": [{"array_job_id": 13, "task_id": 4}]},
                                   "signal": 0, "batch_only": False, "steps_only": False}),
    ("aircancel", ["-u", "0", "-t", "PD", "-n", "x"], {"filter": {"uids": [0], "names": ["x"], "phases": [1],
                                                                  "results": []},
                                                       "signal": 0, "batch_only": False, "steps_only": False}),
    ("aircancel", ["-s", "USR1", "5"], {"filter": {"job_ids": [5]}, "signal": 10, "batch_only": False,
                                        "steps_only": False}),
    ("scancel", ["-s", "USR1", "5"], {"filter": {"job_ids": [5]}, "signal": 10, "batch_only": False,
                                      "steps_only": True}),
    ("scancel", ["-f", "-s", "USR1", "5"], {"filter": {"job_ids": [5]}, "signal": 10, "batch_only": False,
                                            "steps_only": False}),
    ("scancel", ["-b", "-s", "USR1", "5"], {"filter": {"job_ids": [5]}, "signal": 10, "batch_only": True,
                                            "steps_only": False}),
    ("scancel", ["--signal=KILL", "5"], {"filter": {"job_ids": [5]}, "signal": 9, "batch_only": False,
                                         "steps_only": False}),
    ("aircancel", ["13_4"], {"filter": {"array_tasks": [{"array_job_id": 13, "task_id": 4}]}, "signal": 0,
                             "batch_only": False, "steps_only": False}),
    ("aircancel", ["-u", "0", "12", "-t", "R"], {"filter": {"job_ids": [12], "uids": [0], "phases": [2],
                                                            "results": []},
                                                 "signal": 0, "batch_only": False, "steps_only": False}),
])
def test_aircancel_and_scancel_send_what_scancel_means_on_either_path(monkeypatch, capsys, prog, argv, sent):
    """The request as written out by hand, from the fast path and from click's (a signal without -b or
    -f goes to the steps only under scancel's name, as Slurm's scancel sends it)."""
    from air.aircli import client
    from air.aircli.client import run
    requests = []

    class Fake:
        def __init__(self, config=None):
            pass

        def cancel_fields(self, request, timeout=30.0):
            assert timeout == 120   # (a bulk cancel's time, as before)
            requests.append(request)
            return {"job_ids": [5]}
    monkeypatch.setattr(client, "Client", Fake)
    assert cancelargs(argv) is not None
    assert cancel.start(prog, argv) == 0
    assert run(cancel.command, prog, argv) == 0
    from air.protos import protowire, schemas
    wire = [protowire.encode(schemas.CancelRequest, r) for r in requests]   # (an empty list is no field)
    assert wire == [protowire.encode(schemas.CancelRequest, sent)] * 2, requests


@pytest.mark.parametrize("argv, error", [
    ([], "no job given: aircancel ID... or -u USER, -n NAME, -t STATES"),
    ([""], "Invalid value for 'ID': '' names no job"),
    ([","], "Invalid value for 'ID': ',' names no job"),
    (["-t", "ALL"], "no job given: aircancel ID... or -u USER, -n NAME, -t STATES"),
    (["-s", "USR1"], "no job given: aircancel ID... or -u USER, -n NAME, -t STATES"),
    (["-u", ""], "Invalid value for '-u': an empty value; give one, or leave the option out"),
    (["-n", "x", "-u", " "], "Invalid value for '-u': an empty value; give one, or leave the option out"),
    (["-u", "0", "-n", ""], "Invalid value for '-n': an empty value; give one, or leave the option out"),
    (["5", "-t", ""], "Invalid value for '-t': an empty value; give one, or leave the option out"),
    (["", "-n", "x"], "Invalid value for 'ID': '' names no job"),
    ([",", "-u", "0"], "Invalid value for 'ID': ',' names no job"),
])
def test_an_aircancel_that_names_no_job_or_leaves_a_filter_empty_cancels_nothing(monkeypatch, capsys, argv, error):
    """(An empty filter is every job: a cancel by root of the whole cluster; an option given empty would
    widen what the rest names, as `-n x -u "$U"` with U unset.) On either path."""
    from air.aircli import client
    from air.aircli.client import run

    class Fake:
        def __init__(self, config=None):
            pass

        def cancel_fields(self, request, timeout=30.0):
            raise AssertionError(f"sent {request}")
    monkeypatch.setattr(client, "Client", Fake)
    assert cancel.start("aircancel", argv) == 1
    assert run(cancel.command, "aircancel", argv) == 1
    assert capsys.readouterr().err.splitlines() == [f"aircancel: error: {error}"] * 2


@pytest.mark.parametrize("argv, option", [(["²"], "'ID'"), (["٣"], "'ID'"), (["1_²"], "'ID'"),
                                          (["-s", "²", "5"], "'-s'"),
                                          (["1" * 5000], "'ID'"), (["-s", "9" * 5000, "5"], "'-s'")])
def test_digits_int_cannot_read_are_refused_in_one_line(capsys, argv, option):
    assert cancel.start("aircancel", argv) == 1
    assert capsys.readouterr().err.startswith(f"aircancel: error: Invalid value for {option}")


@pytest.mark.parametrize("tool, prog, argv", [
    ("batch", "airbatch", ["-N", "²", "--wrap", "true"]),
    ("batch", "airbatch", ["--array", "1-²", "--wrap", "true"]),
    ("batch", "airbatch", ["--array", "1-3%" + "9" * 5000, "--wrap", "true"]),
    ("batch", "airbatch", ["--signal", "USR1@²", "--wrap", "true"]),
    ("queue", "airq", ["-j", "²"]),
    ("queue", "airq", ["-O", "JobID:²"]),
    ("queue", "airq", ["-u", "9" * 5000]),
    ("queue", "airq", ["-j", "٣"]),
    ("batch", "airbatch", ["-N", "٣", "--wrap", "true"]),
])
def test_numbers_int_cannot_read_are_one_line_in_every_tool(tmp_path, capsys, tool, prog, argv):
    """("²" is a digit to str.isdigit, and int() refuses it; int() refuses 4,300 digits and more.)"""
    config = tmp_path / "air.toml"
    config.write_text('[controller]\naddress = "127.0.0.1:9"\nauth = "none"\n')
    module = {"batch": batch, "queue": queue}[tool]
    assert module.start(prog, ["--config", str(config), *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and err.count("\n") == 1 and "cannot reach" not in err, err


@pytest.mark.parametrize("argv", [["hold", ""], ["release", ","], ["requeue", ""],
                                  ["update", "JobId=,", "TimeLimit=1"]])
def test_aircontrol_refuses_a_job_id_that_names_no_job(monkeypatch, capsys, argv):
    """(An empty filter is every job the caller may act on: `aircontrol requeue ""` by root, the cluster.)"""
    from air.aircli import client, control
    from air.aircli.client import run

    class Fake:
        def __init__(self, config=None):
            pass

        def __getattr__(self, name):
            raise AssertionError(f"called {name}")
    monkeypatch.setattr(client, "Client", Fake)
    assert run(control.command, "aircontrol", argv) == 1
    assert "names no job" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["--", "5"], ["-vb", "5"], ["-s"], ["-s", "-9", "5"],
                                  ["--verbose=1", "5"], ["-Q", "5"]])
def test_aircancels_help_mistakes_and_rare_forms_are_left_to_click(argv):
    assert cancelargs(argv) is None


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["--", "job.sh"], ["-HW", "job.sh"], ["--hold=yes", "job.sh"],
                                  ["--nodes"], ["-J", "-x", "job.sh"], ["--frobnicate", "job.sh"],
                                  ["--gpu-bind", "closest", "job.sh"], ["-v", "job.sh"]])
def test_help_mistakes_and_rare_forms_are_left_to_click(argv):
    assert batchargs(argv) is None


@pytest.mark.parametrize("argv", [["--help"], ["-hl"], ["job.sh"], ["-u"], ["-u", "-h"], ["--me=1"], ["--", "-h"]])
def test_airqs_help_mistakes_and_rare_forms_are_left_to_click(argv):
    assert queueargs(argv) is None


def test_a_value_click_refuses_is_refused_in_the_same_words_either_way(tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    for argv in (["--nodes", "0", str(script)], ["-t", "soon", str(script)], ["--wrap", "true", str(script)]):
        assert batch.start("airbatch", argv) == 1
        fast = capsys.readouterr().err
        from air.aircli.client import run
        assert run(batch.command, "airbatch", argv) == 1
        assert capsys.readouterr().err == fast and fast.startswith("airbatch: error: "), (argv, fast)


@pytest.mark.parametrize("tool,prog,argv,helps", [
    ("batch", "airbatch", ["-H", "-N", "1", "--wrap", "true"], "--job-name"),
    ("queue", "airq", ["-u", "root", "-h"], "--noheader"),
    ("cancel", "aircancel", ["-u", "root", "-v", "12", "13_1"], "--signal"),
])
def test_an_everyday_command_never_imports_click(tmp_path, tool, prog, argv, helps):
    """(The point of aircli.argv: a third of a short command's start.) A call to a controller that is not
    there fails with its one line, and neither click nor protobuf was loaded; help still comes from click."""
    config = tmp_path / "air.toml"
    config.write_text('[controller]\naddress = "127.0.0.1:9"\nauth = "none"\n')
    code = (f"import sys\nfrom air.aircli import {tool}\n"
            f"code = {tool}.start({prog!r}, sys.argv[1:])\n"
            "print(code, 'click' in sys.modules, 'google' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "--config", str(config), *argv],
                         capture_output=True, text=True, cwd="/")
    assert out.stdout.split() == ["1", "False", "False"], out
    assert "cannot reach airctld" in out.stderr
    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd="/")
    assert out.stdout.split()[-3:-1] == ["0", "True"] and helps in out.stdout, out


def test_shell_completion_is_clicks_whatever_the_command_line():
    code = "import sys\nfrom air.aircli import batch\nsys.exit(batch.start('airbatch', sys.argv[1:]))"
    completing = dict(os.environ, _AIRBATCH_COMPLETE="bash_source")
    out = subprocess.run([sys.executable, "-c", code, "--wrap", "true"], capture_output=True, text=True, cwd="/",
                         env=completing)
    assert out.returncode == 0 and "complete -o nosort -F _airbatch_completion airbatch" in out.stdout, out


def test_an_interrupted_airbatch_ends_as_an_interrupted_click_command(tmp_path, monkeypatch, capsys):
    """Ctrl-C: exit 130 and a new line on stderr after the terminal's ^C, on either path."""
    from air.aircli.client import run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(batch, "_read_script", interrupted)
    argv = ["-H", str(tmp_path / "job.sh")]
    assert batchargs(argv) is not None
    assert batch.start("airbatch", argv) == 130
    fast = capsys.readouterr()
    assert run(batch.command, "airbatch", argv) == 130
    assert capsys.readouterr() == fast and fast.err == "\n"
