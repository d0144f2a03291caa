"""Bad input: one clear line on stderr, a non-zero exit, and nothing changed in the store."""
import pytest



def _refused(cluster, *args, expect: str, tool: str = "airbatch"):
    before = cluster.db_rows()
    proc = cluster.cli(tool, *args, check=False)
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"{tool}: error: ") and expect in lines[0], lines[0]
    assert cluster.db_rows() == before
    return lines[0]


def test_unknown_directive_names_option_and_line(cluster):
    script = cluster.write_script("bad.sh", "#!/bin/sh\n#SBATCH --nodes=1\n#AIR --frobnicate=3\necho hi\n")
    _refused(cluster, str(script), expect="line 3: unknown option --frobnicate: #AIR --frobnicate=3")


def test_unknown_command_line_option(cluster):
    script = cluster.write_script("ok.sh", "#!/bin/sh\ntrue\n")
    _refused(cluster, "--frobnicate", str(script), expect="--frobnicate")


@pytest.mark.parametrize("value", ["1:2:3:4", "abc", "-5", "0"])
def test_malformed_time(cluster, value):
    script = cluster.write_script("ok.sh", "#!/bin/sh\ntrue\n")
    _refused(cluster, f"--time={value}", str(script), expect="--time")


def test_malformed_time_in_directive(cluster):
    script = cluster.write_script("t.sh", "#!/bin/sh\n#SBATCH -t 2-xx\ntrue\n")
    _refused(cluster, str(script), expect="line 2: --time: time '2-xx' is not one of M, M:S, H:M:S")


def test_missing_script(cluster):
    _refused(cluster, "no-such-script.sh", expect="cannot read script no-such-script.sh: No such file or directory")


def test_binary_script(cluster):
    path = cluster.work / "binary.sh"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)))
    _refused(cluster, str(path), expect="is a binary file")


def test_script_over_one_mib(cluster):
    script = cluster.write_script("big.sh", "#!/bin/sh\n" + ("# padding line\n" * 80000))
    _refused(cluster, str(script), expect="the limit is 1048576")


def test_unknown_partition(cluster):
    script = cluster.write_script("ok.sh", "#!/bin/sh\ntrue\n")
    _refused(cluster, "-p", "nosuch", str(script), expect="partition 'nosuch' does not exist; partitions: gpu")


def test_more_nodes_than_the_partition_has(cluster):
    _refused(cluster, "-N", "3", "--wrap", "true", expect="3 nodes requested, but partition gpu has only 2")


def test_unknown_job_id(cluster):
    _refused(cluster, "show", "job", "424242", tool="aircontrol", expect="job 424242 does not exist")
    _refused(cluster, "424242", tool="aircancel", expect="job 424242 does not exist")
    _refused(cluster, "-j", "x1", tool="airq", expect="'x1' is not a job id")


def test_bad_format_field(cluster):
    _refused(cluster, "-o", "%i %Y", tool="airq", expect="unknown format field %Y")


def test_controller_down(cluster, tmp_path):
    conf = tmp_path / "air.toml"
    conf.write_text(cluster.config.read_text().replace(cluster.controller, f"{cluster.base_address}:6999"))
    before = cluster.db_rows()
    for tool, args in [("airq", []), ("airbatch", ["--wrap", "true"]), ("aircancel", ["1"]), ("airinfo", [])]:
        proc = cluster.cli(tool, *args, check=False, env={"AIR_CONF": str(conf)}, env_conf=False)
        assert proc.returncode != 0
        assert proc.stderr.splitlines() == [proc.stderr.strip()]
        assert proc.stderr.startswith(f"{tool}: error: cannot reach airctld at {cluster.base_address}:6999")
    assert cluster.db_rows() == before


def test_bad_configuration_stops_the_daemon_naming_the_key(cluster, tmp_path):
    import subprocess
    import sys
    conf = tmp_path / "air.toml"
    conf.write_text(cluster.config.read_text().replace("kill_wait_s = 5", "kill_wait_s = 5\nkil_wait = 3"))
    proc = subprocess.run([sys.executable, "-m", "air.airctld", "--config", str(conf)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode != 0
    assert "unknown key 'kil_wait' in [controller]" in proc.stderr
    conf.write_text(cluster.config.read_text().replace('gpus = "sim:4"', 'gpus = "sim:four"'))
    proc = subprocess.run([sys.executable, "-m", "air.airnoded", "--config", str(conf), "--name", "node01"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "gpus = 'sim:four'" in proc.stderr
    # an address grpcio cannot bind (it raises for some, returns 0 for others): one line, not a traceback
    import re
    text = re.sub(r'state_dir = ".*"', f'state_dir = "{tmp_path / "state"}"', cluster.config.read_text())
    conf.write_text(text.replace(cluster.controller, "nonexistent.invalid:6999").replace('auth = "none"',
                                                                                         'auth = "munge"'))
    proc = subprocess.run([sys.executable, "-m", "air.airctld", "--config", str(conf)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "airctld: error: cannot listen on nonexistent.invalid:6999" in proc.stderr
