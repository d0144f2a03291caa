"""airrun and a node daemon that goes quiet for a while, on a cluster whose node timeout (30 s, so a
fence time of 15 s) outlasts the pause: the step is not airrun's to end."""
import os
import signal
import subprocess
import time

import psutil

from cluster import BIN, wait_for

CLUSTER = dict(node_timeout=30.0)   # (read by the cluster fixture)


def _ranks():
    return [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) == "sleep 19.25"]


def test_a_node_daemon_paused_past_airruns_silence_but_within_the_fence_keeps_its_step(cluster):
    # silent 10 s: lost for airrun after 8 s (its failures elsewhere would be held), given up only after
    # the fence time more; back before that, the step goes on and ends well
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    proc = subprocess.Popen([str(BIN / "airrun"), "-N", "1", "-w", "node02", "-J", "paused", "sleep", "19.25"],
                            env=env, cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon = cluster.pids[2]   # node02's airnoded
    try:
        wait_for(lambda: len(_ranks()) == 1, timeout=30, what="the rank on node02")
        time.sleep(1)   # (the stream's first beat has reached airrun)
        os.kill(daemon, signal.SIGSTOP)
        try:
            time.sleep(10)
        finally:
            os.kill(daemon, signal.SIGCONT)
        _, err = proc.communicate(timeout=40)
        assert proc.returncode == 0, err
    finally:
        proc.kill()
