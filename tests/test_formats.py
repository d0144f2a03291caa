"""squeue/sinfo-style rendering."""
from air.aircli import formats
from air.protos import squeue
from air.protos import air_pb2 as pb


def _jobs():
    return [
        pb.Job(job_id=12, user="alice", partition="gpu", phase=pb.JOB_PHASE_PENDING, reason=pb.REASON_RESOURCES,
               request=pb.JobRequest(name="a-very-long-job-name", nodes=2, gpus_per_node=4)),
        pb.Job(job_id=13, user="bob", partition="gpu", phase=pb.JOB_PHASE_RUNNING, start_time=1000.0,
               time_limit_s=3600, request=pb.JobRequest(name="run", nodes=2),
               allocation=[pb.NodeAlloc(node="node01"), pb.NodeAlloc(node="node02")]),
        pb.Job(job_id=14, user="bob", partition="gpu", phase=pb.JOB_PHASE_DONE, result=pb.JOB_RESULT_NODE_FAIL,
               reason=pb.REASON_NODE_FAIL, start_time=1000.0, end_time=1065.0, request=pb.JobRequest(name="x"),
               allocation=[pb.NodeAlloc(node="node03")]),
    ]


def test_squeue_default_columns():
    items = squeue.compile_format(squeue.SQUEUE_DEFAULT, squeue.job_fields(now=1125.0))
    assert squeue.render(items, _jobs(), header=True) == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "                12       gpu a-very-l    alice PD       0:00      2 (Resources)",
        "                13       gpu      run      bob  R       2:05      2 node[01-02]",
        "                14       gpu        x      bob NF       1:05      1 node03",
    ]


def test_custom_format_left_and_right_alignment():
    items = squeue.compile_format("%i|%-6u|%.6T|%l|%b|%r", squeue.job_fields(now=0))
    assert squeue.render(items, _jobs()[:2], header=False) == [
        "12|alice |PENDIN|UNLIMITED|gres/gpu:4|Resources",
        "13|bob   |RUNNIN|1:00:00|N/A|None",
    ]


def test_node_state_names():
    def node(**kw):
        return pb.Node(cpus=8, gpus=[pb.Gpu(index=i) for i in range(4)], state=pb.NODE_STATE_UP, **kw)
    assert formats.node_state(node()) == "idle"
    assert formats.node_state(node(gpus_alloc=2, cpus_alloc=2)) == "mix"
    assert formats.node_state(node(gpus_alloc=4, cpus_alloc=4)) == "alloc"
    assert formats.node_state(node(cpus_alloc=8)) == "alloc"
    assert formats.node_state(pb.Node(state=pb.NODE_STATE_DOWN)) == "down"
    assert formats.node_state(pb.Node(state=pb.NODE_STATE_DRAIN, gpus_alloc=1)) == "drng"


def test_squeue_long_field_names_as_percent_fields():
    fmt = squeue.long_format("JobID:6,Name,State:.10,NumNodes:3")
    assert fmt == "%6i %20j %.10T %3D"
    items = squeue.compile_format(fmt, squeue.job_fields(now=1125.0))
    assert squeue.render(items, _jobs()[1:2], header=True) == [
        "JOBID  NAME                      STATE NOD",
        "13     run                     RUNNING 2"]
    for bad in ("JobID,Bogus", "JobID:x", ""):
        try:
            squeue.long_format(bad)
        except squeue.FormatError as e:
            assert "\n" not in str(e)
        else:
            raise AssertionError(f"-O {bad!r} was taken")


def test_partition_as_scontrol_shows_it():
    part = pb.Partition(name="gpu", nodes=["node01", "node02"], default=True, up=True, max_time_s=86400)
    nodes = [pb.Node(name="node01", cpus=32, gpus=[pb.Gpu(index=i) for i in range(4)]),
             pb.Node(name="node02", cpus=32, gpus=[pb.Gpu(index=i) for i in range(4)]),
             pb.Node(name="node03", cpus=8)]
    assert formats.partition_keyvalues(part, nodes) == [
        "PartitionName=gpu",
        "   Default=YES State=UP",
        "   MaxTime=1-00:00:00 DefaultTime=NONE",
        "   Nodes=node[01-02]",
        "   TotalNodes=2 TotalCPUs=64 TotalGPUs=8"]
