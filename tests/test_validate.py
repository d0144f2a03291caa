"""Request limits and environment filtering, pure."""
import pytest

from air.protos.config import ControllerConfig
from air.airctld.errors import InvalidRequest
from air.airctld.validate import check_request, filtered_environment
from air.protos import air_pb2 as pb

CC = ControllerConfig(max_script_bytes=1000, max_env_bytes=100)


def _req(**kw):
    base = dict(script="#!/bin/sh\ntrue\n", workdir="/home/u", name="j")
    base.update(kw)
    return pb.JobRequest(**base)


def test_good_request_passes():
    check_request(_req(environment={"A": "1"}, argv=["x"]), CC)
    check_request(_req(nodes=3, het=[pb.HetComponent(name="a", nodes=1), pb.HetComponent(name="b", nodes=2)]), CC)


@pytest.mark.parametrize("kw,message", [
    (dict(script=""), "the batch script is empty"),
    (dict(script="#!/bin/sh\n" + "x" * 1000), "bytes; the limit is 1000"),
    (dict(script="echo hi\n"), "must start with a #! line"),
    (dict(workdir="relative/dir"), "is not an absolute path"),
    (dict(mem_per_node_mb=1 << 50), "--mem=1125899906842624M: at most 1073741824M"),
    (dict(mem_per_gpu_mb=(1 << 30) + 1), "--mem-per-gpu=1073741825M: at most"),
    (dict(name="n" * 300), "at most 256 printable characters"),
    (dict(name="bad\nname"), "at most 256 printable characters"),
    (dict(name="\u009b2J\u009bH"), "at most 256 printable characters"),   # (CSI: a terminal's escape)
    (dict(name="txt\u202egnp.exe"), "at most 256 printable characters"),   # (a bidi override)
    (dict(comment="a\x7fb"), "--comment: at most"),
    (dict(output="/tmp/a\0b"), "without NUL or newline"),
    (dict(environment={"BIG": "x" * 200}), "the environment is 205 bytes; the limit is 100"),
    (dict(environment={"1BAD": "x"}), "environment variable name '1BAD' is not valid"),
    (dict(argv=["a"] * 2000), "2000 script arguments; the limit is 1024"),
    (dict(nodes=3, het=[pb.HetComponent(name="a", nodes=1), pb.HetComponent(name="b", nodes=1)]),
     "ask for 2 nodes in all, each at least 1; the job for 3"),
    (dict(nodes=1, het=[pb.HetComponent(name="a", nodes=1), pb.HetComponent(name="b", nodes=0)]),
     "ask for 1 nodes in all, each at least 1"),
    (dict(nodes=1, het=[pb.HetComponent(name="a", nodes=1)]), "has 2 to 128 components, not 1"),
    (dict(nodes=2, het=[pb.HetComponent(name="a" * 300, nodes=1), pb.HetComponent(nodes=1)]),
     "component name 'aaaa"),
    (dict(nodes=2, het=[pb.HetComponent(name="a\u202eb", nodes=1), pb.HetComponent(name="c", nodes=1)]),
     "component name 'a\\\\u202eb'"),
    (dict(nodes=2, array="0-3", het=[pb.HetComponent(nodes=1), pb.HetComponent(nodes=1)]),
     "a heterogeneous job cannot be an array"),
    (dict(rlimits={"NOFILE": 10, "LOCKS": 5}), "'LOCKS' is not a limit"),
    (dict(rlimits={"CORE": -2}), "resource limit CORE = -2: a count, or -1"),
])
def test_limits_name_field_and_bound(kw, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(")):
        check_request(_req(**kw), CC)


def test_loader_hooks_and_listed_variables_are_dropped():
    env = {"LD_PRELOAD": "/tmp/evil.so", "LD_AUDIT": "x", "LD_LIBRARY_PATH": "/opt/cuda/lib64",
           "SECRET_TOKEN": "t", "PATH": "/usr/bin"}
    assert filtered_environment(env, ("SECRET_TOKEN",)) == {"LD_LIBRARY_PATH": "/opt/cuda/lib64", "PATH": "/usr/bin"}
