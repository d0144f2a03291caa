"""`aircontrol local up`'s configuration: simulated GPUs by default, this host's real ones with --nvml."""
import subprocess
import sys
from pathlib import Path

from air.aircli.local import write_config
from air.protos.config import load

BIN = Path(sys.executable).parent


def test_the_local_cluster_simulates_gpus_unless_told_to_read_this_hosts_through_nvml(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    simulated = load(str(write_config(tmp_path / "a", 2, 4, 8, "127.0.0.1", 10.0)))
    assert [n.gpus for n in simulated.nodes] == ["sim:4", "sim:4"]
    real = load(str(write_config(tmp_path / "b", 1, 0, 8, "127.0.0.1", 10.0, gpus="nvml")))
    assert [n.gpus for n in real.nodes] == ["nvml"]


def test_nvml_with_more_than_one_node_is_refused_in_one_line_and_starts_nothing(tmp_path):
    r = subprocess.run([str(BIN / "aircontrol"), "local", "up", "--nvml", "--nodes", "2", "--dir", str(tmp_path / "c")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "one node with --nvml" in r.stderr and not (tmp_path / "c").exists(), r.stderr


def test_a_second_local_cluster_on_the_addresses_of_a_running_one_is_refused_and_spoils_nothing(cluster, tmp_path):
    # its controller would fail to listen while the running one answered for it
    base = cluster.controller.rpartition(":")[0]
    proc = subprocess.run([str(BIN / "aircontrol"), "local", "up", "--nodes", "2", "--dir", str(tmp_path / "second"),
                           "--base-address", base], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith(f"aircontrol: error: {cluster.controller} is taken"), \
        proc.stderr
    assert not (tmp_path / "second" / "pids").exists()
    assert "2   idle" in cluster.cli("airinfo").stdout   # (the running cluster, as it was)
