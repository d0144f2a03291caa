"""The batch script's environment and output paths, compared with expected values."""
from air.airnoded.launcher import job_environment
from air.protos.outputs import expand_pattern, output_paths
from air.protos import air_pb2 as pb


def _job():
    return pb.Job(job_id=42, user="alice", partition="gpu",
                  request=pb.JobRequest(name="train", workdir="/home/alice/run", environment={"PATH": "/usr/bin"}),
                  allocation=[pb.NodeAlloc(node="node03", gpus=[2, 3], cpus=4),
                              pb.NodeAlloc(node="node04", gpus=[0, 1], cpus=4),
                              pb.NodeAlloc(node="node05", gpus=[0, 1], cpus=4)])


def test_batch_environment_golden():
    env = job_environment(_job(), "node03")
    assert {k: v for k, v in env.items() if k.startswith(("AIR_", "SLURM", "CUDA"))} == {
        "AIR_JOB_ID": "42", "AIR_JOB_NAME": "train", "AIR_JOB_NODELIST": "node[03-05]", "AIR_NNODES": "3",
        "AIR_GPUS_PER_NODE": "2", "AIR_SUBMIT_DIR": "/home/alice/run", "AIR_NODENAME": "node03",
        "AIR_JOB_PARTITION": "gpu", "CUDA_VISIBLE_DEVICES": "2,3",
        "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_JOB_NAME": "train", "SLURM_JOB_NODELIST": "node[03-05]",
        "SLURM_NODELIST": "node[03-05]", "SLURM_NNODES": "3", "SLURM_JOB_NUM_NODES": "3",
        "SLURM_SUBMIT_DIR": "/home/alice/run", "SLURM_JOB_PARTITION": "gpu", "SLURMD_NODENAME": "node03",
        "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "2,3", "AIR_RESTART_COUNT": "0", "SLURM_RESTART_COUNT": "0", "AIR_LAST_STOP_REASON": "",
        "SLURM_TASKS_PER_NODE": "1(x3)", "SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "0",
        "SLURM_JOB_GID": "0", "SLURM_OPEN_MODE": "a",
    }   # no SLURM_NTASKS without a task count asked for: Lightning would take the script for an srun task
    assert env["PATH"] == "/usr/bin"


def test_what_sbatch_sets_for_tasks_accounts_and_arrays():
    """As sbatch(1) documents them: 2 tasks a node on 3 nodes, an account, a QOS, the submit host, the
    cluster's name, and a task of --array=1-9:4 (tasks 1, 5, 9)."""
    job = _job()
    job.uid, job.gid, job.array_job_id, job.array_task_id = 1000, 100, 40, 5
    job.request.MergeFrom(pb.JobRequest(ntasks_per_node=2, cpus_per_task=6, account="ml", qos="high",
                                        submit_host="login1", array="1-9:4%2"))
    env = job_environment(job, "node04", cluster="big")
    assert {k: env[k] for k in env if k.startswith("SLURM_") and k not in
            ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES",
             "SLURM_JOB_NUM_NODES", "SLURM_SUBMIT_DIR", "SLURM_JOB_PARTITION", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS",
             "SLURM_RESTART_COUNT")} == {
        "SLURM_NTASKS": "6", "SLURM_NPROCS": "6", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x3)",
        "SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GID": "100", "SLURM_JOB_ACCOUNT": "ml", "SLURM_JOB_QOS": "high", "SLURM_SUBMIT_HOST": "login1",
        "SLURM_CLUSTER_NAME": "big", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "5",
        "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "9",
        "SLURM_ARRAY_TASK_STEP": "4", "SLURM_OPEN_MODE": "a"}


def test_a_heterogeneous_jobs_groups_are_the_next_nodes_of_its_allocation_each():
    job = _job()
    job.request.het.extend([pb.HetComponent(name="head", nodes=1), pb.HetComponent(name="workers", nodes=2)])
    env = job_environment(job, "node03")
    assert {k: v for k, v in env.items() if "HET" in k} == {
        "SLURM_HET_SIZE": "2",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "node03", "SLURM_NODELIST_HET_GROUP_0": "node03",
        "SLURM_JOB_NUM_NODES_HET_GROUP_0": "1", "SLURM_NNODES_HET_GROUP_0": "1", "SLURM_JOB_NAME_HET_GROUP_0": "head",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "node[04-05]", "SLURM_NODELIST_HET_GROUP_1": "node[04-05]",
        "SLURM_JOB_NUM_NODES_HET_GROUP_1": "2", "SLURM_NNODES_HET_GROUP_1": "2",
        "SLURM_JOB_NAME_HET_GROUP_1": "workers"}
    assert not any("HET" in k for k in job_environment(_job(), "node03"))
    # submitted from inside another heterogeneous job (its variables exported): none of that job's groups
    stale = {"SLURM_HET_SIZE": "4", "SLURM_JOB_NODELIST_HET_GROUP_3": "gone[1-2]", "SLURM_NNODES_HET_GROUP_3": "2",
             "SLURM_HETEROGENEOUS_NOT": "kept"}
    plain = _job()
    plain.request.environment.update(stale)
    assert {k: v for k, v in job_environment(plain, "node03").items() if "HET" in k} == {"SLURM_HETEROGENEOUS_NOT": "kept"}
    job.request.environment.update(stale)
    mine = job_environment(job, "node03")
    assert mine["SLURM_HET_SIZE"] == "2" and "SLURM_JOB_NODELIST_HET_GROUP_3" not in mine


def test_submitter_cannot_override_the_job_variables():
    job = _job()
    job.request.environment["CUDA_VISIBLE_DEVICES"] = "0,1,2,3,4,5,6,7"
    job.request.environment["AIR_JOB_ID"] = "1"
    env = job_environment(job, "node03")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["AIR_JOB_ID"] == "42"


def test_output_patterns():
    job = _job()
    assert expand_pattern("%x-%j-%u-%N-100%%.log", job, "node03") == "train-42-alice-node03-100%.log"
    assert expand_pattern("%q%j", job, "n") == "%q42"
    assert output_paths(job, "node03") == ("/home/alice/run/air-42.out", None)
    job.request.output, job.request.error = "/logs/%j.out", "err/%x.err"
    assert output_paths(job, "node03") == ("/logs/42.out", "/home/alice/run/err/train.err")


def test_restart_count_and_last_stop_reason():
    job = _job()
    job.restart_count, job.last_stop_reason = 2, pb.REASON_NODE_FAIL
    env = job_environment(job, "node03")
    assert (env["AIR_RESTART_COUNT"], env["SLURM_RESTART_COUNT"], env["AIR_LAST_STOP_REASON"]) == ("2", "2", "NodeFail")


def test_airrun_output_patterns_name_each_ranks_file_as_srun():
    from air.aircli.run import expand
    from air.protos import air_pb2 as pb
    step = pb.Step(job_id=42, step_id=3, nodes=[pb.StepNode(node="gpu01", ranks=[0, 1]),
                                                pb.StepNode(node="gpu02", ranks=[2, 3])])
    env = {"USER": "alice", "AIR_JOB_NAME": "train", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "2"}
    assert expand("%x-%J-%N-%n-%t-%u-%A_%a-100%%-%q.log", step, 3, env) == \
        "train-42.3-gpu02-1-3-alice-40_2-100%-%q.log"
    assert expand("%j.%s.%t", step, 0, {}) == "42.3.0"


def test_a_job_submitted_from_a_rank_of_another_keeps_none_of_that_jobs_variables():
    """sbatch run inside a task of a 4-node srun step of an array job: the new job (one node, no task
    count) sees its own, and none of the outer job's, step's or task's; a user's own settings stay."""
    outer = {"SLURM_JOB_ID": "99", "SLURM_JOBID": "99", "SLURM_NTASKS": "32", "SLURM_NTASKS_PER_NODE": "8",
             "SLURM_NPROCS": "32", "SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NODEID": "0",
             "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": "32", "SLURM_ARRAY_JOB_ID": "98",
             "SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "9", "SLURM_CPUS_PER_TASK": "6",
             "SLURM_TASKS_PER_NODE": "8(x4)", "SLURMD_NODENAME": "far", "AIR_STEP_ID": "0", "AIR_ARRAY_TASK_ID": "5",
             "SLURM_MPI_TYPE": "pmix", "SLURM_EXPORT_ENV": "ALL", "MY_SETTING": "1",
             "RANK": "3", "WORLD_SIZE": "32", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "NODE_RANK": "0",
             "GROUP_RANK": "0", "MASTER_ADDR": "outer01", "MASTER_PORT": "29500"}
    job = _job()
    job.request.environment.update(outer)
    env = job_environment(job, "node03")
    assert {k: env.get(k) for k in outer} == {
        "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_NTASKS": None, "SLURM_NTASKS_PER_NODE": None,
        "SLURM_NPROCS": None, "SLURM_PROCID": None, "SLURM_LOCALID": None, "SLURM_NODEID": None,
        "SLURM_STEP_ID": None, "SLURM_STEPID": None, "SLURM_STEP_NUM_TASKS": None, "SLURM_ARRAY_JOB_ID": None,
        "SLURM_ARRAY_TASK_ID": None, "SLURM_ARRAY_TASK_COUNT": None, "SLURM_CPUS_PER_TASK": None,
        "SLURM_TASKS_PER_NODE": "1(x3)", "SLURMD_NODENAME": "node03", "AIR_STEP_ID": None, "AIR_ARRAY_TASK_ID": None,
        "SLURM_MPI_TYPE": "pmix", "SLURM_EXPORT_ENV": "ALL", "MY_SETTING": "1",
        "RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None, "NODE_RANK": None,
        "GROUP_RANK": None, "MASTER_ADDR": None, "MASTER_PORT": None}
    # outside a rank, torch's names are a user's own and stay
    mine = _job()
    mine.request.environment.update({"MASTER_PORT": "29600", "RANK": "0"})
    assert {k: job_environment(mine, "node03").get(k) for k in ("MASTER_PORT", "RANK")} == {"MASTER_PORT": "29600",
                                                                                          "RANK": "0"}
