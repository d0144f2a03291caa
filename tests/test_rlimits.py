"""Resource limits (ulimit) go from where a job is submitted to its batch script and, through airrun,
to its tasks, as Slurm's PropagateResourceLimits does, but MEMLOCK (RDMA needs the node's), and never
above the node's own hard limits."""
import json
import os
import resource
import subprocess
import sys

import pytest

from air.protos import rlimits
from cluster import BIN


def test_which_limits_are_set():
    wanted = {"NOFILE": 512, "CORE": -1, "MEMLOCK": 64, "STACK": 8 << 20, "BOGUS": 1, "CPU": -5}
    n = rlimits.NAMES
    assert sorted(rlimits.to_apply(wanted, ("ALL",), ("MEMLOCK",))) == sorted(
        [[n["NOFILE"], 512], [n["CORE"], -1], [n["STACK"], 8 << 20]])   # (unknown names, bad values: left out)
    assert rlimits.to_apply(wanted, ("NOFILE", "MEMLOCK"), ()) == [[n["MEMLOCK"], 64], [n["NOFILE"], 512]]
    assert rlimits.to_apply(wanted, ("NONE",), ()) == []
    with pytest.raises(ValueError, match="'BOGUS' is not a limit"):
        rlimits.check(["NOFILE", "BOGUS"], "x")


def test_a_limit_above_the_nodes_hard_limit_is_set_at_the_hard_limit():
    # what the shepherd does in a job's process before it runs the job: here in a child whose hard
    # NOFILE is 300 and CORE 0; asked for 1000 files, unlimited core files, and 100 files soft
    code = ("import json, resource, sys\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from shepherd import set_limits\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (200, 300))\n"
            "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
            "set_limits(json.loads(sys.argv[2]))\n"
            "print(json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_CORE),"
            " resource.getrlimit(resource.RLIMIT_FSIZE)]))\n")
    from air.airnoded import shepherd
    folder = os.path.dirname(shepherd.__file__)
    asked = [[resource.RLIMIT_NOFILE, 1000], [resource.RLIMIT_CORE, -1], [resource.RLIMIT_FSIZE, 4096]]
    out = subprocess.run([sys.executable, "-c", code, folder, json.dumps(asked)], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [[300, 300], [0, 0], [4096, json.loads(out)[2][1]]]
    asked = [[resource.RLIMIT_NOFILE, 100]]
    out = subprocess.run([sys.executable, "-c", code, folder, json.dumps(asked)], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out)[0] == [100, 300]


def test_the_submitters_limits_reach_the_batch_script_and_the_steps_tasks_but_memlock(cluster):
    daemon_memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]   # (the daemons started with this test's)
    assert daemon_memlock == resource.RLIM_INFINITY or daemon_memlock > 32 * 1024   # (the submitter's below)
    script = cluster.write_script("limits.sh", "#!/bin/sh\n"
                                  "echo batch $(ulimit -S -n) $(ulimit -S -s) $(ulimit -S -l)\n"
                                  "airrun -N 2 --ntasks-per-node=1 sh -c 'echo task $(ulimit -S -n) $(ulimit -S -l)'\n")
    env = dict(os.environ, AIR_CONF=str(cluster.config), PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    proc = subprocess.run(["sh", "-c", f"ulimit -S -n 777 && ulimit -S -s 4096 && ulimit -S -l 32 && "
                                       f"exec airbatch --parsable -N 2 {script}"],
                          capture_output=True, text=True, cwd=cluster.work, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip())
    assert cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=60)["state"] == "COMPLETED"
    lines = (cluster.work / f"air-{job_id}.out").read_text().split("\n")
    memlock = "unlimited" if daemon_memlock == resource.RLIM_INFINITY else str(daemon_memlock // 1024)
    assert lines[0] == f"batch 777 4096 {memlock}", lines   # MEMLOCK is the node's, not the submitter's 32
    assert sorted(line for line in lines if line.startswith("task")) == [f"task 777 {memlock}"] * 2, lines

