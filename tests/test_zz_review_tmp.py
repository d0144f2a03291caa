"""TEMPORARY (reviewer): an airrun stopped (Ctrl-Z) for 10 s, then continued, on a quiet healthy step."""
import os, signal, subprocess, time
from cluster import BIN, wait_for
from test_steps import _step_processes


def test_airrun_paused_10s_keeps_its_step(cluster):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    proc = subprocess.Popen([str(BIN / "airrun"), "-N", "1", "-w", "node02", "-J", "quiet", "sleep", "77.5"],
                            env=env, cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(_step_processes()) == 1, timeout=30, what="the rank on node02")
        time.sleep(1)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(10)
        os.kill(proc.pid, signal.SIGCONT)
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=15)
            print("REVIEW: airrun ended rc", proc.returncode, "after", round(time.monotonic() - t0, 1), "s:", err)
        except subprocess.TimeoutExpired:
            print("REVIEW: airrun still running 15 s after SIGCONT")
        print("REVIEW: rank processes left:", len(_step_processes()))
    finally:
        proc.kill()
    wait_for(lambda: not _step_processes(), timeout=30, what="no rank left")

NODE_TIMEOUT = 30.0   # (the controller does not take the node down while its daemon is frozen 10 s)


def test_node_daemon_frozen_10s_then_thawed_keeps_its_step(cluster):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", AIR_CONF=str(cluster.config), AIR_JOB_ID="")
    proc = subprocess.Popen([str(BIN / "airrun"), "-N", "1", "-w", "node02", "-J", "quiet", "sleep", "77.5"],
                            env=env, cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen = cluster.pids[2]
    try:
        wait_for(lambda: len(_step_processes()) == 1, timeout=30, what="the rank on node02")
        time.sleep(1)
        os.kill(frozen, signal.SIGSTOP)
        time.sleep(10)
        os.kill(frozen, signal.SIGCONT)
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=15)
            print("REVIEW2: airrun ended rc", proc.returncode, "after", round(time.monotonic() - t0, 1), "s:", err)
        except subprocess.TimeoutExpired:
            print("REVIEW2: airrun still running 15 s after SIGCONT")
        print("REVIEW2: rank processes left:", len(_step_processes()))
    finally:
        os.kill(frozen, signal.SIGCONT)
        proc.kill()
    wait_for(lambda: not _step_processes(), timeout=30, what="no rank left")
