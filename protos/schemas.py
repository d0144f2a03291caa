"""The messages a short command sends and reads through protos.protowire, as air.proto defines them.
tests/test_protowire.py checks each, field by field, against the generated code: a field added to
one of them in air.proto fails that test until it is added here."""
from __future__ import annotations

from air.protos.protowire import (BOOL, DOUBLE, ENUM, INT32, INT64, MAP, MESSAGE, STRING, UINT32, UINT64, Field,
                                  Message)

SERVICE = "air.v1.Controller"

HetComponent = Message("HetComponent", (
    Field("name", 1, STRING), Field("nodes", 2, UINT32)))

JobRequest = Message("JobRequest", (
    Field("name", 1, STRING), Field("script", 2, STRING), Field("argv", 3, STRING, repeated=True),
    Field("partition", 4, STRING), Field("account", 5, STRING), Field("nodes", 6, UINT32),
    Field("gpus_per_node", 7, UINT32), Field("ntasks_per_node", 8, UINT32), Field("cpus_per_task", 9, UINT32),
    Field("time_limit_s", 10, UINT64), Field("output", 11, STRING), Field("error", 12, STRING),
    Field("workdir", 13, STRING), Field("environment", 14, MAP, key=STRING, value=STRING),
    Field("hold", 15, BOOL), Field("dependency", 16, STRING), Field("no_requeue", 17, BOOL),
    Field("retries", 18, UINT32), Field("qos", 19, STRING), Field("nice", 20, INT32), Field("array", 21, STRING),
    Field("array_max_running", 22, UINT32), Field("switches", 23, UINT32), Field("switches_wait_s", 24, UINT64),
    Field("warn_signal", 25, INT32), Field("warn_time_s", 26, UINT64), Field("warn_batch_only", 27, BOOL),
    Field("begin_time", 28, DOUBLE), Field("mem_per_node_mb", 29, UINT64), Field("mem_per_gpu_mb", 30, UINT64),
    Field("hang_timeout_s", 31, UINT64), Field("submit_line", 32, STRING), Field("submit_host", 33, STRING),
    Field("comment", 34, STRING), Field("wckey", 35, STRING), Field("mail_type", 36, STRING),
    Field("mail_user", 37, STRING), Field("open_truncate", 38, BOOL), Field("warn_steps_only", 39, BOOL),
    Field("nodelist", 40, STRING, repeated=True), Field("exclude", 41, STRING, repeated=True),
    Field("constraint", 42, STRING), Field("exclusive", 43, BOOL), Field("allocation", 44, BOOL),
    Field("het", 45, MESSAGE, repeated=True, message=HetComponent),
    Field("rlimits", 46, MAP, key=STRING, value=INT64)))

SubmitRequest = Message("SubmitRequest", (
    Field("job", 1, MESSAGE, message=JobRequest), Field("test_only", 2, BOOL)))

SubmitReply = Message("SubmitReply", (
    Field("job_id", 1, UINT64), Field("message", 2, STRING)))

ArrayTask = Message("ArrayTask", (
    Field("array_job_id", 1, UINT64), Field("task_id", 2, UINT32)))

JobFilter = Message("JobFilter", (
    Field("job_ids", 1, UINT64, repeated=True), Field("uids", 2, UINT32, repeated=True),
    Field("phases", 3, ENUM, repeated=True), Field("results", 4, ENUM, repeated=True),
    Field("names", 5, STRING, repeated=True), Field("include_old", 6, BOOL),
    Field("array_tasks", 7, MESSAGE, repeated=True, message=ArrayTask), Field("with_progress", 8, BOOL),
    Field("partitions", 9, STRING, repeated=True), Field("rendered", 10, BOOL), Field("expand_arrays", 11, BOOL)))

Job = Message("Job", None)   # (kept as its bytes: a reply's jobs are read with protobuf, where they are read)

ListJobsReply = Message("ListJobsReply", (
    Field("jobs", 1, MESSAGE, repeated=True, message=Job), Field("rendered", 2, STRING)))

CancelRequest = Message("CancelRequest", (
    Field("filter", 1, MESSAGE, message=JobFilter), Field("signal", 2, INT32), Field("batch_only", 3, BOOL),
    Field("steps_only", 4, BOOL), Field("release", 5, UINT32)))

CancelReply = Message("CancelReply", (
    Field("job_ids", 1, UINT64, repeated=True),))

# RPC -> (request, reply), for the calls made through protowire
RPCS = {"Submit": (SubmitRequest, SubmitReply), "ListJobs": (JobFilter, ListJobsReply),
        "Cancel": (CancelRequest, CancelReply)}
