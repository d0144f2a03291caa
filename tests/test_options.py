"""Pure parsing: #AIR/#SBATCH directives, the option table, time formats, --export."""
import pytest

from air.aircli.options import (OptionError, export_environment, from_environment, parse_directives, parse_tokens,
                               resolve_tasks)
from air.protos.timefmt import format_duration, parse_duration


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
    # (more than the request's fields hold: one line, before anything is sent)
    (["--nice=-2147483648"], r"--nice='-2147483648': out of range \(from -2,147,483,647 to 2,147,483,647\)"),
    (["-N", "4294967296"], "--nodes='4294967296': out of range"),
    (["--gpus-per-node=h100:4294967296"], "out of range"),
    (["--mem=2000000T"], r"--mem='2000000T': out of range \(at most 1,099,511,627,776 MB\)"),
    (["-t", "99999999999"], r"--time='99999999999': out of range \(at most 71,582,788 minutes\)"),
    (["--switches=1@99999999999"], r"out of range \(at most 2,147,483,647 switches, waiting at most 35,791,394 minutes\)"),
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


def test_an_environment_variable_that_is_not_text_is_named_and_its_value_never_shown():
    with pytest.raises(OptionError, match=r"^environment variable 'TOKEN' is not UTF-8 text, which a job cannot"):
        export_environment("ALL", {"PATH": "/bin", "TOKEN": "s3cr\udcffet"})
    try:
        export_environment("ALL", {"TOKEN": "s3cr\udcffet"})
    except OptionError as e:
        assert "s3cr" not in str(e)
    assert export_environment("NONE", {"TOKEN": "s3cr\udcffet"}) == {}   # (not passed on: no matter)


def test_export_forms():
    env = {"A": "1", "B": "2"}
    assert export_environment("ALL", env) == env
    assert export_environment("", env) == env
    assert export_environment("NONE", env) == {}
    assert export_environment("A,C=3", env) == {"A": "1", "C": "3"}
    assert export_environment("ALL,C=3", env) == {"A": "1", "B": "2", "C": "3"}
    with pytest.raises(OptionError):
        export_environment("NONE,1BAD", env)
    # without ALL, Slurm's own variables stay (sbatch(1), srun(1): "Only SLURM_* variables from the user
    # environment will be defined"): srun --export=NONE inside a job still knows the job
    job = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "n[1-2]", "HOME": "/h", "SLURMX": "no"}
    assert export_environment("NONE", job) == {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "n[1-2]"}
    assert export_environment("HOME", job) == {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "n[1-2]", "HOME": "/h"}
    assert export_environment("ALL", job) == job


@pytest.mark.parametrize("given, expected", [
    ({"ntasks": 4}, {"nodes": 1, "ntasks_per_node": 4}),
    ({"ntasks": 8, "ntasks_per_node": 4}, {"nodes": 2, "ntasks_per_node": 4}),
    ({"ntasks": 8, "nodes": 2}, {"nodes": 2, "ntasks_per_node": 4}),
    ({"ntasks": 8, "nodes": 2, "gpus_per_task": 1}, {"nodes": 2, "ntasks_per_node": 4, "gpus_per_node": 4}),
    ({"ntasks_per_node": 2, "gpus_per_task": 3}, {"ntasks_per_node": 2, "gpus_per_node": 6}),
    ({"gpus_per_task": 2}, {"gpus_per_node": 2}),
    ({"gpus": 16, "nodes": 2}, {"nodes": 2, "gpus_per_node": 8}),
    ({"gpus": 4}, {"gpus_per_node": 4}),
    ({"ntasks": 2, "ntasks_per_node": 2, "gpus": 2, "gpus_per_node": 2},
     {"nodes": 1, "ntasks_per_node": 2, "gpus_per_node": 2}),
])
def test_totals_become_amounts_on_each_node(given, expected):
    """sbatch's totals (-n, -G) and per-task GPUs in AIR's terms, where every node of a job is alike."""
    from air.aircli.options import resolve_tasks
    assert resolve_tasks(given) == expected


@pytest.mark.parametrize("given, message", [
    ({"ntasks": 3, "nodes": 2}, "--ntasks=3 over 2 nodes: AIR runs the same number of tasks on each node"),
    ({"ntasks": 6, "ntasks_per_node": 4}, "--ntasks=6 is not a multiple of --ntasks-per-node=4"),
    ({"ntasks": 4, "nodes": 2, "ntasks_per_node": 1}, "disagree"),
    ({"gpus": 3, "nodes": 2}, "--gpus=3 over 2 nodes"),
    ({"gpus_per_task": 2, "ntasks_per_node": 2, "gpus_per_node": 2}, "--gpus-per-task gives 4 GPUs on each node"),
])
def test_totals_that_cannot_be_laid_out_evenly_are_refused(given, message):
    from air.aircli.options import resolve_tasks
    with pytest.raises(OptionError, match=message):
        resolve_tasks(given)


def test_sbatch_options_recorded_refused_or_checked():
    values = parse_directives("#!/bin/sh\n#SBATCH -n 2 --gpus-per-task=1 --comment='a b' --wckey=w1\n"
                              "#SBATCH --mail-type=END,FAIL --mail-user=a@b --open-mode=truncate -W\ntrue\n")
    assert values == {"ntasks": 2, "gpus_per_task": 1, "comment": "a b", "wckey": "w1", "mail_type": "END,FAIL",
                      "mail_user": "a@b", "open_mode": "truncate", "wait": True}
    assert parse_tokens(["--exclusive", "-C", "h100&ib", "-w", "node[01-02],gpu7,node01", "--exclude=node[03-04]"]) == {
        "exclusive": True, "constraint": "h100&ib", "nodelist": ["node01", "node02", "gpu7"],
        "exclude": ["node03", "node04"]}
    for tokens, message in ((["--exclusive=user"], "^--exclusive=user: AIR supports only --exclusive"),
                            (["-w", "/etc/hosts"], "^--nodelist=/etc/hosts: AIR takes a host list here, not a file$"),
                            (["-x", "node[1-100000000]"], "^--exclude=node.*: not a host list"),
                            (["-w", "node[01-"], "^--nodelist=node\\[01-: not a host list"),
                            (["-C", "a\nb"], "^--constraint: at most 1024 printable characters$"),
                            (["-C", "a\u202eb"], "^--constraint: at most 1024 printable characters$")):
        with pytest.raises(OptionError, match=message):
            parse_tokens(tokens)
    # -w without -N: as many nodes as it lists; with -N, -N stays (the controller refuses fewer)
    assert resolve_tasks({"nodelist": ["a", "b", "c"], "ntasks": 6}) == {"nodelist": ["a", "b", "c"], "nodes": 3,
                                                                          "ntasks_per_node": 2}
    assert resolve_tasks({"nodelist": ["a"], "nodes": 2}) == {"nodelist": ["a"], "nodes": 2}
    with pytest.raises(OptionError, match="give append or truncate"):
        parse_tokens(["--open-mode=overwrite"])


TORCHX_SCRIPT = """#!/bin/bash
#
# Generated by TorchX
#
#SBATCH --job-name=trainer-0 --requeue --ntasks-per-node=1 --cpus-per-task=2 --mem=1024
#SBATCH hetjob
#SBATCH --job-name=trainer-1 --requeue --ntasks-per-node=1 --cpus-per-task=4 --mem=512 --gpus-per-task=1
set -evx
#SBATCH --job-name=ignored
"""


def test_a_heterogeneous_script_is_split_into_its_components_and_run_as_one_job():
    from air.aircli.options import merge_het
    values = parse_directives(TORCHX_SCRIPT)
    components = values.pop("het")
    assert values == components[0] == {"name": "trainer-0", "requeue": True, "ntasks_per_node": 1,
                                        "cpus_per_task": 2, "mem": 1024}
    assert components[1]["name"] == "trainer-1" and components[1]["gpus_per_task"] == 1
    merged, sizes = merge_het(components)
    assert sizes == [("trainer-0", 1), ("trainer-1", 1)]
    # one job on both components' nodes, each node with the largest component's needs
    assert {k: merged[k] for k in ("nodes", "cpus_per_task", "mem", "gpus_per_node", "ntasks_per_node", "name")} \
        == {"nodes": 2, "cpus_per_task": 4, "mem": 1024, "gpus_per_node": 1, "ntasks_per_node": 1,
            "name": "trainer-0"}
    merged, sizes = merge_het([{"nodes": 2}, {"ntasks": 4, "ntasks_per_node": 2}, {}])
    assert sizes == [("", 2), ("", 2), ("", 1)] and merged["nodes"] == 5 and merged["ntasks_per_node"] == 2


@pytest.mark.parametrize("components,problem", [
    ([{}, {"partition": "other"}], "component 1: --partition differs"),
    ([{"time": 60}, {"time": 120}], "component 1: --time differs"),
    ([{}, {"exclude": ["n1"]}], "-x and -C apply to a heterogeneous job as a whole"),
    ([{"nodelist": ["n1"]}, {}], "-w is not supported for a heterogeneous job"),
    ([{"mem": 1024}, {"mem_per_gpu": 4096}], "--mem in one component and --mem-per-gpu in another"),
])
def test_what_a_heterogeneous_job_cannot_vary_is_refused(components, problem):
    from air.aircli.options import merge_het
    with pytest.raises(OptionError, match=problem):
        merge_het(components)
    assert merge_het([{"partition": "p", "time": 60}, {"partition": "p", "time": 60}])[0]["nodes"] == 2   # repeated


def test_too_many_components_are_refused():
    script = "#!/bin/sh\n" + "#SBATCH -N 1\n#SBATCH hetjob\n" * 128 + "#SBATCH -N 1\ntrue\n"
    with pytest.raises(OptionError, match="more than 128 components"):
        parse_directives(script)


def test_srun_takes_kill_on_bad_exit_as_slurm_writes_it_and_only_among_its_options():
    from air.aircli.run import command
    for words, expect in ((["--kill-on-bad-exit=1"], True), (["--kill-on-bad-exit=0"], False), (["-K"], True),
                          (["-K0"], False), (["--no-kill-on-bad-exit"], False), ([], True),
                          (["-w", "--kill-on-bad-exit=0"], True)):   # (there, a value of -w)
        with command.make_context("srun", [*words, "prog", "--kill-on-bad-exit=0"], resilient_parsing=True) as ctx:
            assert ctx.params["kill_on_bad_exit"] is expect, words
            assert ctx.params["command"][-1] == "--kill-on-bad-exit=0"   # the program's own word, untouched


def test_a_heterogeneous_step_puts_each_component_on_its_group():
    from air.aircli import hetstep
    from air.aircli.client import CliError
    from air.aircli.run import command
    assert hetstep.components(["-N", "1", "a", ":", "--output=x", "b", "c"]) == [["-N", "1", "a"],
                                                                                ["--output=x", "b", "c"]]
    assert hetstep.placed(command, "srun", ["a"], 1) == (["--het-group", "1", "a"], True)
    assert hetstep.placed(command, "srun", ["-w", "n3", "-K0", "a"], 1) == (["-w", "n3", "-K0", "a"], False)
    assert hetstep.placed(command, "srun", ["--het-group=0", "a"], 1) == (["--het-group=0", "a"], True)
    env = {"SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "n1", "SLURM_JOB_NODELIST_HET_GROUP_1": "n[2-3]"}
    assert hetstep.group_nodes(1, env) == "n[2-3]"
    with pytest.raises(CliError, match="give 0 to 1"):
        hetstep.group_nodes(2, env)
    with pytest.raises(CliError, match="not a heterogeneous job"):
        hetstep.run(command, "srun", ["a", ":", "b"], env={})
    with pytest.raises(CliError, match="3 components, and the job has 2"):
        hetstep.run(command, "srun", ["a", ":", "b", ":", "c"], env=env)
    with pytest.raises(CliError, match="an empty component"):
        hetstep.run(command, "srun", ["a", ":"], env=env)


# sbatch(1)'s options as its manual lists them (Slurm 24.05), written out here apart from the table in
# aircli/options.py: every one is taken by airbatch or refused as Slurm's, none is taken for a typo.
SBATCH_MANUAL = """
-A --account --acctg-freq -a --array --batch --bb --bbf -b --begin -D --chdir --cluster-constraint -M --clusters
--comment -C --constraint --container --container-id --contiguous -S --core-spec --cores-per-socket --cpu-freq
--cpus-per-gpu -c --cpus-per-task --deadline --delay-boot -d --dependency -m --distribution -e --error -x --exclude
--exclusive --export --export-file --extra -B --extra-node-info --get-user-env --gid --gpu-bind --gpu-freq -G --gpus
--gpus-per-node --gpus-per-socket --gpus-per-task --gres --gres-flags -h --help --hint -H --hold --ignore-pbs -i
--input -J --job-name --kill-on-invalid-dep -L --licenses --mail-type --mail-user --mcs-label --mem --mem-bind
--mem-per-cpu --mem-per-gpu --mincpus --network --nice -k --no-kill --no-requeue -F --nodefile -w --nodelist -N
--nodes -n --ntasks --ntasks-per-core --ntasks-per-gpu --ntasks-per-node --ntasks-per-socket --open-mode -o --output
-O --overcommit -s --oversubscribe --parsable -p --partition --power --prefer --priority --profile --propagate -q
--qos -Q --quiet --reboot --requeue --reservation --resv-ports --segment --signal --sockets-per-node --spread-job
--stepmgr --switches --test-only --thread-spec --threads-per-core -t --time --time-min --tmp --tres-bind
--tres-per-task --uid --usage --use-min-nodes -v --verbose -V --version -W --wait --wait-all-nodes --wckey --wrap
""".split()


def test_every_option_of_sbatchs_manual_is_taken_or_refused_as_slurms(tmp_path, capsys):
    from air.aircli.batch import command
    from air.aircli.client import run
    from air.aircli.options import SLURM_ONLY, SLURM_ONLY_NAMES
    takes_value = {long: value for long, _, value in SLURM_ONLY}
    taken = {p for param in command.params for p in param.opts if not getattr(param, "hidden", False)} | {"-h", "--help"}
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    for name in SBATCH_MANUAL:
        if name in taken:
            continue
        assert name in SLURM_ONLY_NAMES, f"{name} is neither taken nor refused as Slurm's"
        # on the command line (with a value where it takes one: refused all the same) and in a directive
        forms = [[name, str(script)]] + ([[f"{name}=1", str(script)] if name.startswith("--") else [name, "1"]]
                                         if takes_value[SLURM_ONLY_NAMES[name]] else [])
        for argv in forms:
            assert run(command, "sbatch", argv) == 1
            err = capsys.readouterr().err.splitlines()
            assert len(err) == 1 and err[0].startswith("sbatch: error: ") and "AIR does not support" in err[0] \
                and SLURM_ONLY_NAMES[name] in err[0], (argv, err)
        with pytest.raises(OptionError, match=f"{SLURM_ONLY_NAMES[name]} is an sbatch option AIR does not support"):
            parse_directives(f"#!/bin/sh\n#SBATCH {name}{'=1' if name.startswith('--') else ' 1'}\ntrue\n")
    # and a typo is still a typo
    assert run(command, "sbatch", ["--frobnicate", str(script)]) == 1
    assert "AIR does not support" not in capsys.readouterr().err


def test_sbatch_wait_reads_the_history_of_a_job_the_controller_has_let_go_of(monkeypatch):
    """sbatch -W polls the queue; a job that ended and was forgotten by the controller's memory meanwhile
    (a short min_job_age_s, or a controller away a while) is read from the history, not waited for
    for ever; a controller away is waited out."""
    from air.aircli import batch
    from air.aircli.client import CliError
    from air.protos import air_pb2 as pb
    monkeypatch.setattr("time.sleep", lambda s: None)

    class Client:
        calls = 0

        def list_jobs(self, filt):
            Client.calls += 1
            if Client.calls == 1:
                raise CliError("cannot reach airctld", "UNAVAILABLE")
            if Client.calls == 2:
                return pb.ListJobsReply(jobs=[pb.Job(job_id=7, phase=pb.JOB_PHASE_RUNNING)])
            return pb.ListJobsReply()

        def history(self, req):
            assert list(req.job_ids) == [7]
            return pb.HistoryReply(jobs=[pb.HistoryJob(job=pb.Job(job_id=7, phase=pb.JOB_PHASE_DONE,
                                                                  result=pb.JOB_RESULT_FAILED, exit_code=3))])

    assert batch._wait(Client(), 7) == 3 and Client.calls == 3
