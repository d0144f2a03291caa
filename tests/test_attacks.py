"""Attacks by ordinary users on a real cluster with MUNGE: each test is one attack, run as an
unprivileged user, and checks that nothing changed on disk or in the store and that any refusal
is one clear line.

The node daemons run as root (this test runs as root), as they do on a real cluster.
"""
import json
import os
import pwd
import stat
import subprocess
import sys
import time

import grpc
import pytest

from cluster import LocalCluster, wait_for
from munged import started_for_test_users
from air.protos import air_pb2 as pb
from air.protos import air_pb2_grpc as rpc
from air.protos.credential import MungeCredentials

ACCOUNTS = """
[[accounts]]
name = "ml"
users = ["airtest-a", "airtest-b", "airtest-op"]
"""


@pytest.fixture(scope="module")
def munged():
    m = started_for_test_users()
    yield m
    m.stop()


def CLUSTER(request):
    # jobs are NOT private here: scripts, environments and arguments must stay private anyway
    munged = request.getfixturevalue("munged")
    return LocalCluster(options=("--auth", "munge", "--munge-socket", munged.socket, "--operator", "airtest-op"),
                        extra_config=ACCOUNTS)


@pytest.fixture
def secret(tmp_path):
    """A file only root may read, in a folder only root may enter (like /etc/munge/munge.key)."""
    folder = tmp_path / "root-only"
    folder.mkdir(mode=0o700)
    path = folder / "munge.key"
    path.write_text('{"step": 424242, "key": "TOP-SECRET-KEY-MATERIAL"}\n')   # would pass as a report
    os.chmod(path, 0o600)
    os.chmod(tmp_path, 0o755)
    return path



def _snapshot(path):
    st = os.lstat(path)
    return path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _spool(cluster, node="node01"):
    return cluster.dir / "spool" / node


def _log(cluster, node="node01"):
    return (cluster.dir / "log" / f"{node}.log").read_text(errors="replace")


def _as_user(cluster, user, code, munged):
    """Run Python `code` as `user`, with a MUNGE authenticator `auth` ready; its stdout, stripped."""
    entry = pwd.getpwnam(user)
    prelude = ("import grpc, json, sys\n"
               "from air.protos import air_pb2 as pb, air_pb2_grpc as rpc\n"
               "from air.protos.credential import MungeCredentials, signed\n"
               f"auth = MungeCredentials({munged.socket!r})\n"
               "def err(e):\n"
               "    return e.code().name + ': ' + e.details()\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/tmp",
                          env={**os.environ, "PYTHONPATH": str(cluster.config.parent.parent)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_progress_file_linked_to_a_root_only_file_is_never_read(cluster, secret):
    before = _snapshot(secret)
    script = cluster.write_script("link.sh", f"""#!/bin/sh
ln -s {secret} "$AIR_PROGRESS_DIR/rank0.json"
ln {secret} "$AIR_PROGRESS_DIR/rank1.json" 2>/dev/null   # a hard link, where the kernel allows one
sleep 6
""")
    job_id = cluster.submit(script, user="airtest-a")
    node = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    time.sleep(3)   # several heartbeats with the link in place
    for user in ("airtest-a", None):
        shown = cluster.cli("aircontrol", "show", "job", str(job_id), user=user).stdout
        listed = cluster.cli("airq", "-l", "--json", user=user).stdout
        assert not [s for s in ("TOP-SECRET", "424242") for text in (shown, listed) if s in text]
    assert f"job {job_id}: progress report ignored: rank0.json is a symbolic link" in _log(cluster, node)
    cluster.wait_state(job_id, "COMPLETED")
    assert json.loads(cluster.cli("airstat", str(job_id), "--json", user="airtest-a").stdout)["step"] == []
    assert _snapshot(secret) == before


def test_links_planted_for_the_stop_reason_script_and_pid_files_are_never_followed(cluster, secret):
    before = _snapshot(secret)
    script = cluster.write_script("plant.sh", f"""#!/bin/sh
base=$(dirname "$AIR_STOP_REASON_FILE")
stat -c 'jobdir %u %a' "$base"
for name in stop_reason .stop_reason.tmp pgid .pgid.tmp script .script.tmp; do
  if ln -sf {secret} "$base/$name" 2>/dev/null; then echo "planted $name"; else echo "refused $name"; fi
done
mv "$base/progress" "$base/moved" 2>/dev/null && echo "moved progress" || echo "refused move"
echo ready
sleep 30
""")
    job_id = cluster.submit(script, "--requeue", user="airtest-a")
    out = cluster.work / f"air-{job_id}.out"
    wait_for(lambda: out.exists() and "ready" in out.read_text(), what="the job to try its links")
    lines = out.read_text().splitlines()
    assert lines[0] == "jobdir 0 711"
    assert [line for line in lines if line.startswith(("planted", "moved"))] == []
    # a stop writes the reason, and a requeued run on the same node makes its folder anew
    cluster.cli("aircontrol", "requeue", str(job_id))
    wait_for(lambda: cluster.job(job_id)["restart_count"] >= 1, what="the requeue")
    wait_for(lambda: out.exists() and out.read_text().count("ready") == 2, timeout=30, what="the second run")
    lines = out.read_text().splitlines()
    assert [line for line in lines if line.startswith(("planted", "moved"))] == []
    cluster.cli("aircancel", str(job_id))
    cluster.wait_state(job_id, "CANCELLED")
    assert _snapshot(secret) == before


def test_fifo_huge_and_malformed_progress_files_leave_the_node_up_and_other_jobs_running(cluster, secret):
    """One job cycles every kind of bad report through rank0.json while another user's job runs on
    the same node; the node keeps beating, the other job finishes, and a new job starts there."""
    other = cluster.submit(cluster.write_script("steady.sh", "#!/bin/sh\nsleep 14\necho steady done\n"),
                           "--gpus-per-node=1", user="airtest-b")
    node = cluster.wait_state(other, "RUNNING")["nodes"][0]
    # the other node is taken whole, so the hostile job lands beside the steady one
    filler = cluster.submit(cluster.write_script("filler.sh", "#!/bin/sh\nsleep 60\n"), "--gpus-per-node=4",
                            user="airtest-b")
    assert cluster.wait_state(filler, "RUNNING")["nodes"][0] != node
    bad = cluster.write_script("bad.sh", f"""#!/bin/sh
d=$AIR_PROGRESS_DIR
r=$d/rank0.json
turn() {{ sleep 2; rm -rf "$r"; }}
mkfifo "$r"; turn
truncate -s 200M "$r"; turn
printf '\\377\\376{{"step": 1}}' > "$r"; turn
printf '{{"step": ' > "$r"; turn
printf '[1, 2, 3]' > "$r"; turn
ln -s /dev/zero "$r"; turn
ln -s {secret} "$r"; turn
mkdir "$r"; turn
i=0; while [ $i -lt 3000 ]; do : > "$d/rank$i.junk"; i=$((i + 1)); done
echo '{{"step": 7, "loss": 1.5}}' > "$d/rank0.tmp" && mv "$d/rank0.tmp" "$r"
sleep 3
""")
    job_id = cluster.submit(bad, "--gpus-per-node=1", user="airtest-a")
    assert cluster.wait_state(job_id, "RUNNING")["nodes"] == [node]
    bad_node = node
    deadline = time.monotonic() + 40
    while cluster.job(job_id)["state"] == "RUNNING" and time.monotonic() < deadline:
        states = {n["name"]: n["state"] for n in json.loads(cluster.cli("airinfo", "-N", "--json").stdout)["nodes"]}
        assert states[bad_node] in ("mix", "alloc", "idle"), states   # up: not down, not drained
        time.sleep(0.5)
    ended = cluster.wait_state(job_id, "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", timeout=30)
    assert ended["state"] == "COMPLETED", (ended, (cluster.work / f"air-{job_id}.out").read_text())
    assert cluster.wait_state(other, "COMPLETED")
    cluster.cli("aircancel", str(filler))
    assert (cluster.work / f"air-{other}.out").read_text().strip() == "steady done"
    log = _log(cluster, bad_node)
    for problem in ("is a FIFO", "is 209715200 bytes; the limit is 65536", "is not UTF-8",
                    "is not a JSON object (Expecting value", "is not a JSON object (not a JSON object)",
                    "is a symbolic link", "is not a regular file"):
        assert f"job {job_id}: progress report ignored: rank0.json {problem}" in log, problem
    assert "Traceback" not in log
    # the good report at the end got through: the reader was never wedged
    assert json.loads(cluster.cli("airstat", str(job_id), "--json").stdout)["step"] == [7]
    again = cluster.submit(cluster.write_script("after.sh", "#!/bin/sh\necho fine\n"), user="airtest-b")
    cluster.wait_state(again, "COMPLETED")
    assert b"TOP-SECRET-KEY-MATERIAL" in _snapshot(secret)[0]


class HungFuse:
    """A FUSE filesystem whose server never answers (what a job's own fusermount and a server that
    sleeps make): whoever looks into it waits until the server goes. Mounted by root here, as the
    tests have no fusermount; the kernel treats the mount the same."""

    def __init__(self, where):
        self.where = where
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        subprocess.run(["mount", "-t", "fuse", "-o", f"fd={self.fd},rootmode=40000,user_id=0,group_id=0",
                        "hung", str(where)], pass_fds=(self.fd,), check=True, capture_output=True)

    def close(self):
        os.close(self.fd)   # the server is gone: what waited in the mount gets ENOTCONN
        subprocess.run(["umount", "-l", str(self.where)], check=False, capture_output=True)


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
def test_a_fuse_mount_that_never_answers_in_the_progress_folder_never_holds_up_the_node(cluster):
    """A job mounts a FUSE filesystem on its progress folder whose server never answers. A root daemon
    that looked in there would hang its heartbeat, fence the node and stop every job on it; instead
    the node keeps beating, says why it does not read the folder, and the job stops when cancelled."""
    job_id = cluster.submit(cluster.write_script("fuse.sh", "#!/bin/sh\nsleep 120\n"),
                            "--gpus-per-node=1", user="airtest-a")
    node = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    progress = _spool(cluster, node) / f"job{job_id}.0" / "progress"
    wait_for(lambda: progress.is_dir(), what="the progress folder")
    fuse = HungFuse(progress)
    try:
        time.sleep(2 * cluster.node_timeout)   # past the fence and the node timeout
        states = {n["name"]: n["state"] for n in json.loads(cluster.cli("airinfo", "-N", "--json").stdout)["nodes"]}
        assert states[node] in ("mix", "alloc"), states
        job = cluster.job(job_id)
        assert job["state"] == "RUNNING" and job["restart_count"] == 0, job
        assert f"job {job_id}: progress folder unreadable: progress is on another filesystem than its folder " \
               "(a mount)" in _log(cluster, node)
        cluster.cli("aircancel", str(job_id))   # (its stop reason is not written into the mount either)
        assert cluster.wait_state(job_id, "CANCELLED", timeout=20)
    finally:
        fuse.close()


def test_other_users_never_see_a_jobs_script_environment_or_arguments(cluster, munged):
    script = cluster.write_script("secret.sh", "#!/bin/sh\n# PASSWORD-IN-SCRIPT\nsleep 30\n")
    job_id = int(cluster.cli("airbatch", "--parsable", str(script), "ARG-SECRET", user="airtest-a",
                             env={"API_TOKEN": "ENV-SECRET"}).stdout)
    cluster.wait_state(job_id, "RUNNING")
    secrets = ("PASSWORD-IN-SCRIPT", "ARG-SECRET", "ENV-SECRET")
    for args in (("aircontrol", "show", "job", str(job_id)), ("aircontrol", "show", "job", str(job_id), "--json"),
                 ("airq", "--json"), ("airq", "-l", "--json"), ("airq", "-o", "%all") , ("airq", "--priority", "--json"),
                 ("airq", "--start")):
        out = cluster.cli(*args, user="airtest-b", check=False).stdout
        assert not [s for s in secrets if s in out], args
    code = (f"stub = rpc.ControllerStub(signed(grpc.insecure_channel({cluster.controller!r}), auth, {cluster.controller!r}))\n"
            f"job = stub.GetJob(pb.GetJobRequest(job_id={job_id}), timeout=10)\n"
            "raw = stub.ListJobs(pb.JobFilter(), timeout=10).SerializeToString()\n"
            "print(json.dumps([job.request.script, dict(job.request.environment), list(job.request.argv),\n"
            "                  job.request.workdir, job.request.output, raw.hex()]))\n")
    for user, sees in (("airtest-b", False), ("airtest-a", True), ("airtest-op", True)):
        script_text, env, argv, workdir, output, raw = json.loads(_as_user(cluster, user, code, munged))
        assert ("PASSWORD-IN-SCRIPT" in script_text) is sees, user
        assert (env.get("API_TOKEN") == "ENV-SECRET") is sees, user
        assert (argv == ["ARG-SECRET"]) is sees, user
        assert workdir == str(cluster.work)          # paths and names stay visible, as in Slurm
        for s in secrets:                             # listings carry them to nobody, owner included
            assert s.encode().hex() not in raw, (user, s)
    cluster.cli("aircancel", str(job_id))


def test_captured_credential_cannot_be_replayed_on_another_method_request_or_node(cluster, munged):
    job_id = cluster.submit(cluster.write_script("victim.sh", "#!/bin/sh\nsleep 30\n"), user="airtest-a")
    cluster.wait_state(job_id, "RUNNING")
    before = cluster.db_rows()
    auth = MungeCredentials(munged.socket)
    listing = pb.JobFilter(job_ids=[job_id])
    cred = dict(auth.metadata("/air.v1.Controller/ListJobs", cluster.controller, listing.SerializeToString(deterministic=True)))
    controller = rpc.ControllerStub(grpc.insecure_channel(cluster.controller))
    node = {n: rpc.NodeAgentStub(grpc.insecure_channel(a)) for n, a in (("node01", cluster.node(0)), ("node02", cluster.node(1)))}

    def refused(call, request, credential, expect):
        with pytest.raises(grpc.RpcError) as e:
            call(request, metadata=tuple(credential.items()), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        assert expect in e.value.details() and "\n" not in e.value.details()

    # a credential made for listing one job, used to cancel it (another method)
    refused(controller.Cancel, pb.CancelRequest(filter=listing), cred,
            "made for another method (/air.v1.Controller/ListJobs), not /air.v1.Controller/Cancel")
    # one made to list one job, used to list everything (another request)
    cred = dict(auth.metadata("/air.v1.Controller/ListJobs", cluster.controller, listing.SerializeToString(deterministic=True)))
    refused(controller.ListJobs, pb.JobFilter(), cred, "made for another request")
    # the very bytes it was made for, sent to another method that takes the same message
    cred = dict(auth.metadata("/air.v1.Controller/ListJobs", cluster.controller, listing.SerializeToString(deterministic=True)))
    refused(controller.Requeue, listing, cred,
            "made for another method (/air.v1.Controller/ListJobs), not /air.v1.Controller/Requeue")
    # the controller's signal to node01, taken to node02 (another node)
    kill = pb.SignalRequest(job_id=job_id, signal=9)
    cred = dict(auth.metadata("/air.v1.NodeAgent/Signal", "node01", kill.SerializeToString(deterministic=True)))
    refused(node["node02"].Signal, kill, cred, "made for another receiver (node01), not node02")
    # and one with no binding at all (as before credentials were bound)
    refused(controller.ListJobs, listing, {"air-cred": auth.munge.encode()}, "no binding in its payload")
    assert cluster.job(job_id)["state"] == "RUNNING"
    assert cluster.db_rows() == before
    cluster.cli("aircancel", str(job_id))


def test_a_credential_bound_to_the_bytes_sent_passes_whatever_order_they_keep_a_map_in(cluster, munged, monkeypatch):
    """airbatch writes its own bytes (protos.protowire). A map's keys in another order than this
    protobuf's deterministic serialization (upb's today; another version or backend may differ) still
    authenticate: the controller checks the credential against the bytes it received."""
    from air.aircli.client import CliError, Client
    from air.protos import protowire, schemas
    monkeypatch.setattr(protowire, "_map_order", lambda key: key.encode())   # plain byte order
    values = {"job": {"script": "#!/bin/sh\ntrue\n", "workdir": str(cluster.work), "hold": True,
                      "environment": {"TERM": "xterm", "TERM_PROGRAM": "x", "LANG": "C", "LANGUAGE": "en"}}}
    data = protowire.encode(schemas.SubmitRequest, values)
    assert data != pb.SubmitRequest.FromString(data).SerializeToString(deterministic=True)   # (the case)
    before = cluster.db_rows()
    with pytest.raises(CliError) as e:   # (root has no account here: past its credential, refused for that)
        Client(str(cluster.config))._send("/air.v1.Controller/Submit", data, 30)
    assert str(e.value) == "user root belongs to no account; ask an administrator to add them to one"
    assert cluster.db_rows() == before


def test_a_user_cannot_call_the_node_daemons_rpcs(cluster, munged):
    job_id = cluster.submit(cluster.write_script("target.sh", "#!/bin/sh\nsleep 30\n"), user="airtest-a")
    node = cluster.wait_state(job_id, "RUNNING")["nodes"][0]
    address = cluster.node(0) if node == "node01" else cluster.node(1)
    code = (f"node = rpc.NodeAgentStub(signed(grpc.insecure_channel({address!r}), auth, {node!r}))\n"
            "out = []\n"
            f"for call, req in ((node.Signal, pb.SignalRequest(job_id={job_id}, signal=9)),\n"
            f"                  (node.Launch, pb.LaunchRequest(job=pb.Job(job_id={job_id}, uid=0))),\n"
            f"                  (node.PrepareStep, pb.Step(job_id={job_id}, uid=0)),\n"
            "                  (node.InjectFault, pb.FaultRequest(gpu=0, xid=79))):\n"
            "    try:\n"
            "        call(req, timeout=10)\n"
            "        out.append('allowed')\n"
            "    except grpc.RpcError as e:\n"
            "        out.append(err(e))\n"
            "print('\\n'.join(out))\n")
    uid = pwd.getpwnam("airtest-b").pw_uid
    out = _as_user(cluster, "airtest-b", code, munged).splitlines()
    assert out == [f"PERMISSION_DENIED: only the controller may call the node agent (caller uid {uid})"] * 4
    assert cluster.job(job_id)["state"] == "RUNNING"
    cluster.cli("aircancel", str(job_id))


def test_a_step_asking_for_100000_ranks_is_refused_in_one_line(cluster):
    script = cluster.write_script("wide.sh", "#!/bin/sh\nairrun --ntasks-per-node 100000 true\necho rc=$?\n")
    job_id = cluster.submit(script, user="airtest-a")
    cluster.wait_state(job_id, "COMPLETED", "FAILED")
    out = (cluster.work / f"air-{job_id}.out").read_text().splitlines()
    assert out == ["airrun: error: 100000 tasks per node asked for; the limit is 512 (max_tasks_per_node)", "rc=1"]


@pytest.mark.parametrize("args, expect", [
    (("--array=0-20000",), "at most 10000 tasks in one array"),
    (("--dependency=afterok:" + ":".join(str(i) for i in range(1, 1100)),), "the limit is 1000 (max_dependencies)"),
    (("--qos=" + "q" * 300,), "at most 256 printable characters (max_name_chars)"),
    (("-A", "a" * 300), "at most 256 printable characters (max_name_chars)"),
])
def test_requests_over_a_bound_are_refused_in_one_line_and_change_nothing(cluster, args, expect):
    before = cluster.db_rows()
    proc = cluster.cli("airbatch", *args, "--wrap", "true", user="airtest-a", check=False)
    assert proc.returncode != 0
    assert len(proc.stderr.splitlines()) == 1 and expect in proc.stderr, proc.stderr
    assert cluster.db_rows() == before


def test_job_folders_are_root_owned_and_removed_from_every_node_when_the_run_ends(cluster):
    script = cluster.write_script("two.sh", """#!/bin/sh
airrun sh -c 'stat -c "%n %u %a" "$(dirname "$AIR_PROGRESS_DIR")" "$AIR_PROGRESS_DIR"; echo "{}" > "$AIR_PROGRESS_DIR/rank$RANK.json"'
""")
    job_id = cluster.submit(script, "-N", "2", user="airtest-a")
    cluster.wait_state(job_id, "COMPLETED")
    uid = pwd.getpwnam("airtest-a").pw_uid
    lines = sorted((cluster.work / f"air-{job_id}.out").read_text().split("\n"))
    for node in ("node01", "node02"):
        base = _spool(cluster, node) / f"job{job_id}.0"
        assert f"{base} 0 711" in lines and f"{base}/progress {uid} 700" in lines, lines
    wait_for(lambda: not any((_spool(cluster, n) / f"job{job_id}.0").exists() for n in ("node01", "node02")),
             timeout=10, what="the job's folders to go from both nodes")
