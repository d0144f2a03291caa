"""Node health on a real cluster: injected GPU faults, a fake InfiniBand sysfs tree, a health program."""
import os

from air.airnoded.health import classify_xid, ib_port_faults
from cluster import LocalCluster, wait_for


def CLUSTER(request):
    probe = LocalCluster()
    program = probe.root / "health.sh"
    program.write_text('#!/bin/sh\nf="$(dirname "$0")/unhealthy-$AIR_NODENAME"\n'
                       'if [ -e "$f" ]; then cat "$f"; exit 1; fi\nexit 0\n')
    os.chmod(program, 0o755)
    probe.options = ("--health-program", str(program))
    return probe


def _node(cluster, name):
    text = cluster.cli("aircontrol", "show", "node", name).stdout
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv and not kv.startswith("Gpu")), text


def _wait_drained(cluster, name, timeout=5):
    return wait_for(lambda: (n := _node(cluster, name))[0]["State"] in ("DRAIN", "DRNG") and n[1],
                    timeout=timeout, what=f"{name} to drain")


def _resume(cluster, name):
    cluster.cli("aircontrol", "node", "resume", name)
    # (a job waiting for the node may be given it by the pass the resume calls: idle or allocated, not drained)
    assert _node(cluster, name)[0]["State"] in ("IDLE", "MIX", "ALLOC")


def test_xid_79_drains_the_node_and_fails_the_job_on_that_gpu(cluster):
    job_id = cluster.submit(cluster.write_script("long.sh", "#!/bin/sh\nsleep 60\n"), "--gpus-per-node=4",
                            "-N", "1", "--no-requeue")
    job = cluster.wait_state(job_id, "RUNNING")
    name = job["nodes"][0]
    cluster.cli("aircontrol", "node", "fault", name, "--gpu", "2", "--xid", "79")
    shown = _wait_drained(cluster, name, timeout=5)    # within a heartbeat or two (before the node timeout)
    assert "Reason=GPU 2: XID 79 (GPU fell off the bus)" in shown.replace("\n   ", " ")
    job = cluster.wait_state(job_id, "NODE_FAIL", timeout=5)
    assert job["reason"] == "NodeFail" and f"GPU 2 of {name}: XID 79" in job["reason_detail"]
    assert "drain" in cluster.cli("airinfo", "-N", "-h", "-o", "%N %t").stdout
    # no new job lands on the drained node
    # (it holds the other node for as long as the test needs: the next job can go only where we resume)
    other = cluster.submit(cluster.write_script("one.sh", "#!/bin/sh\nsleep 60\n"), "--gpus-per-node=4")
    assert cluster.wait_state(other, "RUNNING")["nodes"] != [name]
    blocked = cluster.submit(cluster.write_script("two.sh", "#!/bin/sh\ntrue\n"), "--gpus-per-node=4")
    wait_for(lambda: cluster.job(blocked)["state"] == "PENDING" and cluster.job(blocked)["reason"] != "None",
             what="a job with nowhere to go")
    _resume(cluster, name)
    assert cluster.wait_state(blocked, "COMPLETED")["nodes"] == [name]
    cluster.cli("aircancel", str(other))
    cluster.wait_state(other, "CANCELLED")


def test_application_xid_is_recorded_but_does_not_drain(cluster):
    cluster.cli("aircontrol", "node", "fault", "node01", "--gpu", "0", "--xid", "13")
    import time
    time.sleep(2.5)
    assert _node(cluster, "node01")[0]["State"] == "IDLE"
    import sqlite3
    conn = sqlite3.connect(cluster.dir / "state" / "air.db")
    rows = conn.execute("SELECT gpu, signal, critical FROM node_events WHERE node = 'node01' "
                        "AND signal = 'XID 13'").fetchall()
    assert rows == [(0, "XID 13", 0)]


def test_ecc_and_nvlink_faults_drain(cluster):
    for args, signal in ((["--ecc-dbe"], "ECC DBE"), (["--nvlink-down", "2"], "NVLink 2 down")):
        cluster.cli("aircontrol", "node", "fault", "node02", "--gpu", "1", *args)
        shown = _wait_drained(cluster, "node02")
        assert f"GPU 1: {signal}" in shown
        _resume(cluster, "node02")


def test_ib_port_going_down_in_sysfs_drains(cluster):
    port = cluster.dir / "ib" / "node01" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    import time
    time.sleep(2)
    assert _node(cluster, "node01")[0]["State"] == "IDLE"
    (port / "state").write_text("1: DOWN\n")
    shown = _wait_drained(cluster, "node01")
    assert "node: IB mlx5_0/1 DOWN" in shown
    (port / "state").write_text("4: ACTIVE\n")
    _resume(cluster, "node01")


def test_health_program_failure_drains_with_its_message(cluster):
    flag = cluster.root / "unhealthy-node02"
    flag.write_text("nvidia-smi reports GPU 3 in a bad state\n")
    try:
        shown = _wait_drained(cluster, "node02")
        assert "health program (nvidia-smi reports GPU 3 in a bad state)" in shown
    finally:
        flag.unlink()
    _resume(cluster, "node02")


def test_only_operators_resume_and_real_gpus_refuse_faults(cluster):
    cluster.cli("aircontrol", "node", "drain", "node02", "--reason", "maintenance")
    proc = cluster.cli("aircontrol", "node", "resume", "node02", user="nobody", check=False)
    assert proc.returncode != 0 and "only root and operators" in proc.stderr
    _resume(cluster, "node02")
    proc = cluster.cli("aircontrol", "node", "fault", "node02", "--gpu", "9", "--xid", "79", check=False)
    assert proc.returncode != 0 and "GPU 9 does not exist" in proc.stderr


def test_ib_error_counters_are_recorded_and_a_flapping_port_is_critical(tmp_path):
    from air.airnoded.gpus import SimulatedGpus
    from air.airnoded.health import HealthMonitor
    counters = tmp_path / "mlx5_0" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    (counters.parent / "state").write_text("4: ACTIVE\n")
    (counters / "symbol_error").write_text("0\n")
    (counters / "link_downed").write_text("1\n")
    seen = []
    monitor = HealthMonitor("n1", SimulatedGpus(0, "n1"), tmp_path, "", 1.0, 1.0, seen.append)
    monitor.check(0.0)
    assert seen == []                                  # the first reading is the baseline
    (counters / "symbol_error").write_text("7\n")
    monitor.check(1.0)
    assert [(e.signal, e.message, e.critical) for e in seen] == [("IB mlx5_0/1 errors", "symbol_error +7", False)]
    (counters / "link_downed").write_text("6\n")
    monitor.check(2.0)
    assert seen[-1].signal == "IB mlx5_0/1 flapping" and seen[-1].critical
    assert "5 times" in seen[-1].message


def test_xid_policy_and_ib_reader(tmp_path):
    assert classify_xid(1, 79, 0, 0).critical and not classify_xid(1, 13, 0, 0).critical
    assert not classify_xid(1, 63, 0, 0).critical and classify_xid(1, 63, 1, 0).critical
    for xid in (48, 64, 74, 94, 95):
        assert classify_xid(0, xid, 0, 0).critical
    for xid in (13, 31, 43, 45, 68, 109):
        assert not classify_xid(0, xid, 0, 0).critical
    for dev, port, state in (("mlx5_0", "1", "4: ACTIVE"), ("mlx5_1", "1", "2: INIT")):
        d = tmp_path / dev / "ports" / port
        d.mkdir(parents=True)
        (d / "state").write_text(state + "\n")
    assert ib_port_faults(tmp_path) == {"mlx5_1/1": "2: INIT"}
    assert ib_port_faults(tmp_path / "missing") == {}
