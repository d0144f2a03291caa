"""Pure parsing: #AIR/#SBATCH directives, the option table, time formats, --export."""
import pytest

from aircli.options import OptionError, export_environment, from_environment, parse_directives, parse_tokens
from airctld.timefmt import format_duration, parse_duration


@pytest.mark.parametrize("text,seconds", [
    ("30", 1800), ("5:30", 330), ("1:02:03", 3723), ("2-0", 172800), ("1-2", 93600),
    ("1-2:30", 95400), ("1-2:30:15", 95415), ("UNLIMITED", 0), ("infinite", 0),
])
def test_slurm_time_forms(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1:2:3:4", "-5", "0", "1-", "1:xx", "0:00"])
def test_bad_times_name_the_valid_forms(text):
    with pytest.raises(ValueError, match="time"):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(0, "0:00"), (59, "0:59"), (3723, "1:02:03"), (93784, "1-02:03:04")])
def test_elapsed_format(seconds, text):
    assert format_duration(seconds) == text


def test_directives_stop_at_the_first_command_and_skip_comments():
    script = """#!/bin/bash
# a comment
#SBATCH --job-name=train -N 2
#AIR --gpus-per-node=8   # trailing comment
#SBATCH --time 1-00:00:00

#SBATCH -p gpu
module load cuda
#SBATCH --nodes=9
"""
    assert parse_directives(script) == {"name": "train", "nodes": 2, "gpus_per_node": 8, "time": 86400,
                                        "partition": "gpu"}


def test_unknown_directive_names_option_and_line():
    with pytest.raises(OptionError, match=r"^line 3: unknown option --mem-bogus: #SBATCH --mem-bogus=1$"):
        parse_directives("#!/bin/sh\n#SBATCH -N 1\n#SBATCH --mem-bogus=1\n")


def test_short_forms_gres_flags_and_values():
    assert parse_tokens(["-N2", "-c", "4", "--gres=gpu:h100:4", "-H", "-J", "x y", "-t1:00"]) == {
        "nodes": 2, "cpus_per_task": 4, "gpus_per_node": 4, "hold": True, "name": "x y", "time": 60}
    assert parse_tokens(["--gpus-per-node=h100:2"]) == {"gpus_per_node": 2}


@pytest.mark.parametrize("tokens,message", [
    (["--nodes=0"], "--nodes='0': give a whole number of at least 1"),
    (["--nodes"], "--nodes needs a value"),
    (["--hold=yes"], "--hold takes no value"),
    (["--gres=fpga:1"], "only gpu"),
    (["stray"], "unexpected argument 'stray'"),
    (["--array=9-1"], "empty range"),
    (["--switches=x"], "give N"),
    (["--switches=2@soon"], "--switches: time 'soon'"),
    (["--signal=FOO"], "unknown signal 'FOO'"),
    (["--signal=USR1@x"], "whole seconds"),
    (["--nice=low"], "--nice='low': give a whole number"),
])
def test_bad_values_are_named(tokens, message):
    with pytest.raises(OptionError, match=message):
        parse_tokens(tokens)


def test_scheduling_options():
    assert parse_tokens(["--qos=high", "--nice=-5", "-a", "0-9%2", "--switches=1@10:00", "--signal=B:USR1@90",
                         "-d", "afterok:1?singleton"]) == {
        "qos": "high", "nice": -5, "array": "0-9%2", "switches": (1, 600), "signal": (10, 90, True),
        "dependency": "afterok:1?singleton"}
    assert parse_tokens(["--signal=TERM"]) == {"signal": (15, 60, False)}
    assert parse_tokens(["--switches=2"]) == {"switches": (2, 0)}


def test_environment_input_variables():
    assert from_environment({"SBATCH_PARTITION": "debug", "AIRBATCH_TIMELIMIT": "10"}) == {
        "partition": "debug", "time": 600}
    with pytest.raises(OptionError, match=r"\$SBATCH_TIMELIMIT"):
        from_environment({"SBATCH_TIMELIMIT": "soon"})


def test_export_forms():
    env = {"A": "1", "B": "2"}
    assert export_environment("ALL", env) == env
    assert export_environment("", env) == env
    assert export_environment("NONE", env) == {}
    assert export_environment("A,C=3", env) == {"A": "1", "C": "3"}
    assert export_environment("ALL,C=3", env) == {"A": "1", "B": "2", "C": "3"}
    with pytest.raises(OptionError):
        export_environment("NONE,1BAD", env)
