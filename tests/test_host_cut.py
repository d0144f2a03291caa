"""A host cut off the network fences itself: its node daemon stops its jobs before the controller's
node timeout, so the run the controller then starts elsewhere never overlaps the first; once the host
is back, the node's health history says it fenced. Real daemons, each node in a network namespace of
its own joined to the controller's bridge (bench/chaos_cluster.py), all inside a private network and
mount namespace of the test's own (`unshare`): cutting the host is taking its link down, and nothing
touches this machine's network."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_TIMEOUT = 10.0

SCRIPT = """#!/bin/sh
echo "start $AIR_RESTART_COUNT $$ $AIR_NODENAME" >> {out}
trap 'echo "stop $AIR_RESTART_COUNT" >> {out}; exit 0' TERM
while :; do sleep 0.2; done
"""


def scenario(folder: Path) -> dict:
    """(In the private namespaces.) Cut the host of a running job's node; what happened, as JSON."""
    import psutil
    sys.path.insert(0, str(ROOT / "bench"))
    from chaos_cluster import Cluster, _wait
    cluster = Cluster(folder, nodes=2, gpus_per_node=2, node_timeout=NODE_TIMEOUT, heartbeat=1.0)
    out = folder / "job.out"
    try:
        cluster.up()
        script = folder / "job.sh"
        script.write_text(SCRIPT.format(out=out))
        job_id = int(cluster.cli("airbatch", "--parsable", "-o", "/dev/null", "--gpus-per-node=2",
                                 str(script)).split(";")[0])
        first = _wait(lambda: out.exists() and out.read_text().split(), 30, "the job to start")
        pid, node = int(first[2]), first[3]
        cut = time.monotonic()
        cluster.net.cut(node)
        _wait(lambda: not psutil.pid_exists(pid), 30, "the cut host to stop its job")
        stopped_after = time.monotonic() - cut
        _wait(lambda: "start 1" in out.read_text(), 60, "the job to run again")
        cluster.net.restore(node)

        def fenced() -> list[str]:
            conn = sqlite3.connect(folder / "state" / "air.db")
            try:
                return [m for (m,) in conn.execute("SELECT message FROM node_events WHERE node = ? AND "
                                                   "signal = 'fenced'", (node,))]
            finally:
                conn.close()
        history = _wait(fenced, 30, "the fence in the cut node's health history")
        job = cluster.job(job_id)
        cluster.cli("aircancel", str(job_id))
        return {"node": node, "stopped_after": stopped_after, "lines": out.read_text().splitlines(),
                "history": history, "job_nodes": job["nodes"], "restart_count": job["restart_count"],
                "last_stop_reason": job["last_stop_reason"]}
    finally:
        cluster.down()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip")
                    or not shutil.which("munged"), reason="a host cut needs root, unshare, ip and munged")
def test_a_host_cut_off_stops_its_job_before_the_node_timeout_and_says_so_once_back(tmp_path):
    os.chmod(tmp_path, 0o755)
    proc = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "--", sys.executable,
                           __file__, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    # the node fenced itself: the controller could not reach it, and its node timeout had not passed
    assert seen["stopped_after"] < NODE_TIMEOUT, seen
    lines = seen["lines"]
    assert lines[0].startswith("start 0") and lines[1] == "stop 0" and lines[2].startswith("start 1"), lines
    assert lines[2].split()[3] != seen["node"] and seen["job_nodes"] != [seen["node"]], seen
    assert seen["restart_count"] == 1 and seen["last_stop_reason"] == "NodeFail", seen
    assert any("no word from the controller for" in m for m in seen["history"]), seen["history"]


if __name__ == "__main__":
    print(json.dumps(scenario(Path(sys.argv[1]))))
