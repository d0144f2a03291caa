"""A controller restart in the middle of a multi-node step: the runs go on, their steps finish, their
output and exits arrive, airq is right. On a fresh cluster of its own (the node timeout long
enough that the nodes, which fence themselves at half of it, outlast the restart)."""
from cluster import wait_for

# the nodes fence themselves at 12 s: a restart on a busy 2-core host takes several
CLUSTER = dict(node_timeout=24.0)


def test_controller_kill9_during_a_two_node_step_keeps_the_step_and_its_output(cluster):
    """airrun streams from both nodes while airctld is killed and restarted: the step goes on, every
    rank's every line arrives, the job's exit reaches the new controller, airq is right."""
    script = cluster.write_script("step2.sh", "#!/bin/sh\n"
                                  "airrun -N 2 --ntasks-per-node 1 sh -c "
                                  "'i=1; while [ $i -le 16 ]; do echo \"$RANK $i\"; i=$((i+1)); sleep 0.5; done'\n")
    job_id = cluster.submit(script, "-N", "2", "--gpus-per-node=1")
    cluster.wait_state(job_id, "RUNNING")
    out = cluster.work / f"air-{job_id}.out"
    wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 4, what="the step's output")
    cluster.kill_controller()
    cluster.start_controller()
    assert cluster.job(job_id)["state"] == "RUNNING"
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=30)
    lines = out.read_text().splitlines()
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["restart_count"] == 0, \
        (job["exit_code"], job["exit_signal"], job["reason_detail"], lines[-6:])
    for rank in ("0", "1"):
        assert [line.split()[1] for line in lines if line.split()[0] == rank] == [str(i) for i in range(1, 17)]
    assert cluster.cli("airq", "-j", str(job_id), "-h", "-t", "all", "-o", "%t").stdout.strip() == "CD"
