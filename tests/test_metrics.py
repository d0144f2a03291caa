"""Prometheus metrics on a live local cluster: both daemons' /metrics, scraped over HTTP and parsed with
prometheus_client's own parser, show what the cluster is doing (checked against what the test did),
and every metric the Grafana dashboard's queries use is one AIR exposes."""
import json
import re
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from cluster import wait_for



def _controller(cluster):
    return f"http://{cluster.base_address}:9817/metrics"


def _node(cluster, index):
    return f"http://{cluster.host(index)}:9818/metrics"
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
DASHBOARD = Path(__file__).resolve().parent.parent / "etc" / "grafana" / "air-dashboard.json"


def scrape(url: str) -> dict[str, list]:
    """{family name: [(sample name, labels, value), ...]}, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=")
        text = reply.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return out


def value(metrics: dict, family: str, sample: str | None = None, **labels) -> float | None:
    found = [v for name, got, v in metrics.get(family, [])
             if (sample is None or name == sample) and all(got.get(k) == str(w) for k, w in labels.items())]
    return sum(found) if found else None


def test_both_endpoints_show_what_the_cluster_does(cluster):
    # an InfiniBand port on node01, as sysfs shows one: ACTIVE, with errors counted
    port = cluster.dir / "ib" / "node01" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    for name, n in (("symbol_error", 7), ("link_downed", 0), ("port_rcv_errors", 2)):
        (port / "counters" / name).write_text(f"{n}\n")
    before = scrape(_controller(cluster))
    submitted_before = value(before, "air_job_submissions", "air_job_submissions_total") or 0
    # a job that reports training progress as the runtime does (rank 0's JSON in its progress folder)
    script = cluster.write_script("trainer.sh", "#!/bin/sh\n"
                                  "now=$(date +%s)\n"
                                  "printf '{\"step\": 42, \"time\": %s, \"rank\": 0, \"tokens_per_s\": 1234.5, "
                                  "\"mfu\": 0.41, \"loss\": 2.5, \"checkpoint_time\": %s}' $now $((now - 30)) "
                                  "> \"$AIR_PROGRESS_DIR/rank0.json\"\n"
                                  "sleep 60\n")
    trainer = cluster.submit(script, "-N", "1", "--gpus-per-node=2")
    held = cluster.submit(script, "-H")
    failing = cluster.submit(cluster.write_script("fail.sh", "#!/bin/sh\nexit 3\n"))
    cluster.wait_state(trainer, "RUNNING")
    cluster.wait_state(failing, "FAILED")
    node, = cluster.job(trainer)["nodes"]

    c = wait_for(lambda: (m := scrape(_controller(cluster))) and value(m, "air_job_training_step", job_id=trainer) and m,
                 timeout=20, what="the trainer's progress in the controller's metrics")
    # jobs by state, pending reason, user
    assert value(c, "air_jobs_by_state", state="RUNNING") == 1
    assert value(c, "air_jobs_by_state", state="PENDING") == 1
    assert value(c, "air_jobs", state="RUNNING", partition="gpu", account="default") == 1
    assert value(c, "air_jobs_pending", reason="JobHeldUser", partition="gpu") == 1
    assert value(c, "air_user_jobs", user="root", state="RUNNING") == 1
    assert value(c, "air_user_gpus_allocated", user="root") == 2
    # counters: three submissions, two starts (one ended FAILED)
    assert value(c, "air_job_submissions", "air_job_submissions_total") == submitted_before + 3
    assert value(c, "air_job_ends", "air_job_ends_total", result="FAILED") >= 1
    assert value(c, "air_job_starts", "air_job_starts_total", partition="gpu") >= 2
    assert value(c, "air_job_submit_to_start_seconds", "air_job_submit_to_start_seconds_count") >= 2
    assert value(c, "air_job_queue_wait_seconds", "air_job_queue_wait_seconds_bucket", le="86400.0") >= 2
    # GPUs and nodes
    assert value(c, "air_partition_gpus", partition="gpu", state="total") == 8
    assert value(c, "air_partition_gpus", partition="gpu", state="allocated") == 2
    assert value(c, "air_nodes", state="mix") == 1 and value(c, "air_nodes", state="idle") == 1
    assert value(c, "air_fairshare_factor", account="default") is not None
    # the scheduler, RPCs by method and code, the store
    assert value(c, "air_scheduler_pass_duration_seconds", "air_scheduler_pass_duration_seconds_count") >= 1
    assert value(c, "air_rpc_requests", "air_rpc_requests_total", method="Submit", code="OK") >= 3
    assert value(c, "air_rpc_requests", "air_rpc_requests_total", method="Heartbeat", code="OK") >= 1
    assert value(c, "air_store_commit_duration_seconds", "air_store_commit_duration_seconds_count") >= 3
    # the trainer's progress, from its report
    assert value(c, "air_job_training_step", job_id=trainer, user="root") == 42
    assert value(c, "air_job_tokens_per_second", job_id=trainer) == 1234.5
    assert value(c, "air_job_mfu_ratio", job_id=trainer) == 0.41
    assert 29 <= value(c, "air_job_seconds_since_checkpoint", job_id=trainer) < 60
    assert value(c, "air_job_gpus", job_id=trainer) == 2

    # a refused request is counted with its code
    assert cluster.cli("aircancel", "999999", check=False).returncode != 0
    c = scrape(_controller(cluster))
    assert value(c, "air_rpc_requests", "air_rpc_requests_total", method="Cancel", code="NOT_FOUND") == 1 or \
        value(c, "air_rpc_requests", "air_rpc_requests_total", method="Cancel", code="INVALID_ARGUMENT") == 1

    # node01: GPUs, ports, ranks, heartbeats
    n = scrape(_node(cluster, 0))
    assert value(n, "air_gpu_temperature_celsius", node="node01", gpu=0) == 35
    assert value(n, "air_gpu_memory_total_bytes", node="node01", gpu=3) > 80e9
    assert value(n, "air_gpu_utilization_ratio", node="node01", gpu=0) == 0
    assert value(n, "air_gpu_nvlink_up", node="node01", gpu=0, link=0) == 1
    assert value(n, "air_ib_port_up", node="node01", port="mlx5_0/1") == 1
    assert value(n, "air_ib_port_errors", "air_ib_port_errors_total", node="node01", port="mlx5_0/1",
                 counter="symbol_error") == 7
    assert value(n, "air_node_heartbeat_rtt_seconds", "air_node_heartbeat_rtt_seconds_count", node="node01") >= 1
    assert value(n, "air_node_seconds_since_controller", node="node01") < 10
    batch_here = 1 if node == "node01" else 0
    assert value(n, "air_node_running_ranks", node="node01", kind="batch") == batch_here

    # faults: an XID and a downed NVLink on node02 drain it, and both daemons say so
    cluster.cli("aircontrol", "node", "fault", "node02", "--gpu", "1", "--xid", "79")
    cluster.cli("aircontrol", "node", "fault", "node02", "--gpu", "2", "--nvlink-down", "5")
    n2 = wait_for(lambda: (m := scrape(_node(cluster, 1)))
                  and value(m, "air_gpu_nvlink_up", gpu=2, link=5) == 0 and m, what="node02's NVLink down")
    assert value(n2, "air_gpu_xid_errors", "air_gpu_xid_errors_total", node="node02", gpu=1, xid=79) == 1
    assert value(n2, "air_node_health_events", "air_node_health_events_total", kind="xid", critical="true") == 1
    assert value(n2, "air_gpu_nvlink_up", gpu=2, link=4) == 1
    c = wait_for(lambda: (m := scrape(_controller(cluster))) and value(m, "air_node_drained", node="node02") and m,
                 what="node02 drained in the controller's metrics")
    assert value(c, "air_node_drained", node="node02", signal="xid") == 1
    assert value(c, "air_partition_gpus", partition="gpu", state="drained") == 4
    cluster.cli("aircancel", str(trainer), str(held))
    cluster.cli("aircontrol", "node", "resume", "node02")


def test_the_dashboard_queries_only_metrics_air_exposes(cluster):
    """Every air_* name in etc/grafana/air-dashboard.json's queries is a family (or a family's
    sample) that one of the two daemons serves."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", []) if "expr" in t]
    assert len(exprs) >= 20, "the dashboard's panels have queries"
    used = {name for e in exprs for name in re.findall(r"\bair_[a-z0-9_]+", e)}
    served = set()
    for url in (_controller(cluster), _node(cluster, 0)):   # a family with no series yet still names itself, with its type
        with urllib.request.urlopen(url, timeout=10) as reply:
            for family in text_string_to_metric_families(reply.read().decode()):
                served.add(family.name)
                served.update(family.name + s for s in SAMPLE_SUFFIXES.get(family.type, ()))
    unknown = sorted(used - served)
    assert not unknown, f"the dashboard queries metrics AIR does not serve: {unknown}"
    titles = {p.get("title", "") for p in _panels(dashboard)}
    for row in ("Queue", "Nodes and GPUs", "Health", "Scheduler", "Training", "Goodput"):
        assert any(row.lower() in t.lower() for t in titles), f"no {row} section"


def _panels(dashboard: dict):
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def test_a_stalled_scraper_does_not_block_the_next(cluster):
    """One thread serves /metrics; a connection that sends nothing is dropped after a few seconds."""
    import socket
    stalled = socket.create_connection((cluster.base_address, 9817))
    try:
        began = time.monotonic()
        scrape(_controller(cluster))
        assert time.monotonic() - began < 8
    finally:
        stalled.close()
