"""GPU telemetry, the thermal limit, and nodes that return by themselves once a condition clears
(with health_auto_resume on): never after an XID, never after an admin's drain."""
import time

from cluster import wait_for



CLUSTER = dict(options=("--health-auto-resume", "--max-gpu-temp", "85"))


def _shown(cluster, name):
    return cluster.cli("aircontrol", "show", "node", name).stdout.replace("\n   ", " ")


def _state(cluster, name):
    return dict(kv.split("=", 1) for kv in _shown(cluster, name).split() if kv.startswith("State="))["State"]


def test_telemetry_shows_per_gpu(cluster):
    shown = wait_for(lambda: "Temp=" in (s := _shown(cluster, "node01")) and s, what="GPU telemetry")
    assert "Gpu3=" in shown and "Util=0%" in shown and "Temp=35C" in shown and "Power=70W" in shown


def test_hot_gpu_drains_and_the_node_returns_once_it_cools(cluster):
    cluster.cli("aircontrol", "node", "fault", "node02", "--gpu", "1", "--temp", "95")
    shown = wait_for(lambda: "DRAIN" in (s := _shown(cluster, "node02")) and s, timeout=10, what="node02 to drain")
    assert "GPU 1: thermal (95 C, over the limit of 85 C)" in shown
    assert "Gpu1=" in shown and "Temp=95C" in shown
    time.sleep(2)
    assert _state(cluster, "node02") == "DRAIN"          # still hot: stays out
    cluster.cli("aircontrol", "node", "fault", "node02", "--gpu", "1", "--temp", "60")
    wait_for(lambda: _state(cluster, "node02") == "IDLE", timeout=10, what="node02 to return by itself")


def test_ib_port_back_active_returns_the_node(cluster):
    port = cluster.dir / "ib" / "node01" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    wait_for(lambda: _state(cluster, "node01") == "DRAIN", timeout=10, what="node01 to drain")
    (port / "state").write_text("4: ACTIVE\n")
    wait_for(lambda: _state(cluster, "node01") == "IDLE", timeout=10, what="node01 to return by itself")


def test_xid_and_admin_drains_wait_for_an_admin(cluster):
    cluster.cli("aircontrol", "node", "fault", "node01", "--gpu", "0", "--xid", "79")
    wait_for(lambda: _state(cluster, "node01") == "DRAIN", timeout=10, what="node01 to drain")
    cluster.cli("aircontrol", "node", "drain", "node02", "--reason", "cabling")
    time.sleep(3)
    assert _state(cluster, "node01") == "DRAIN" and _state(cluster, "node02") == "DRAIN"
    for name in ("node01", "node02"):
        cluster.cli("aircontrol", "node", "resume", name)
        assert _state(cluster, name) == "IDLE"
