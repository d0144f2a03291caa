"""Identity and permissions on a cluster that uses MUNGE: real munged, real users, real daemons."""
import os
import pwd
import subprocess
import sys
import time

import grpc
import pytest

from cluster import LocalCluster
from munged import Munged, started_for_test_users
from air.protos import air_pb2 as pb
from air.protos import air_pb2_grpc as rpc
from air.protos.credential import binding, request_bytes
from air.protos.munge import Munge

ACCOUNTS = """
[[accounts]]
name = "ml"
users = ["airtest-a"]

[[accounts]]
name = "vision"
users = ["airtest-b", "@airtest-op"]
"""


@pytest.fixture(scope="module")
def munged():
    m = started_for_test_users()
    yield m
    m.stop()


def CLUSTER(request):
    munged = request.getfixturevalue("munged")
    return LocalCluster(options=("--auth", "munge", "--munge-socket", munged.socket, "--operator", "airtest-op",
                                 "--private-jobs"), extra_config=ACCOUNTS)



def _stub(cluster):
    return rpc.ControllerStub(grpc.insecure_channel(cluster.controller))


def test_job_runs_as_its_owner_with_the_owners_groups(cluster):
    a = pwd.getpwnam("airtest-a")
    script = cluster.write_script("id.sh", "#!/bin/sh\nid -u\nid -g\necho $USER $HOME\n")
    job_id = cluster.submit(script, user="airtest-a")
    job = cluster.wait_state(job_id, "COMPLETED")
    assert job["user"] == "airtest-a" and job["uid"] == a.pw_uid and job["account"] == "ml"
    out = cluster.work / f"air-{job_id}.out"
    assert out.read_text().split("\n")[:3] == [str(a.pw_uid), str(a.pw_gid), f"airtest-a {a.pw_dir}"]
    st = os.stat(out)
    assert (st.st_uid, st.st_gid) == (a.pw_uid, a.pw_gid)


def test_only_owner_root_and_operators_may_cancel_or_signal(cluster):
    script = cluster.write_script("sleepy.sh", "#!/bin/sh\nsleep 60\n")
    first = cluster.submit(script, user="airtest-a")
    cluster.wait_state(first, "RUNNING")
    for args in ([str(first)], ["-s", "USR1", str(first)]):
        proc = cluster.cli("aircancel", *args, user="airtest-b", check=False)
        assert proc.returncode != 0
        assert proc.stderr.strip() == (f"aircancel: error: job {first} belongs to airtest-a (uid "
                                       f"{pwd.getpwnam('airtest-a').pw_uid}); you may cancel or signal only "
                                       "your own jobs")
    assert cluster.job(first)["state"] == "RUNNING"
    cluster.cli("aircancel", str(first), user="airtest-op")          # an operator may
    cluster.wait_state(first, "CANCELLED")
    second = cluster.submit(script, user="airtest-a")
    cluster.cli("aircancel", str(second))                               # root may
    cluster.wait_state(second, "CANCELLED")


def test_private_jobs_hide_other_users_jobs(cluster):
    held = cluster.submit(cluster.write_script("h.sh", "#!/bin/sh\ntrue\n"), "-H", user="airtest-a")
    seen_by_b = cluster.cli("airq", "-h", "-o", "%i", user="airtest-b").stdout.split()
    assert str(held) not in seen_by_b
    proc = cluster.cli("aircontrol", "show", "job", str(held), user="airtest-b", check=False)
    assert proc.returncode != 0 and "keeps jobs private" in proc.stderr
    assert str(held) in cluster.cli("airq", "-h", "-o", "%i", user="airtest-op").stdout.split()
    assert str(held) in cluster.cli("airq", "-h", "-o", "%i", user="airtest-a").stdout.split()
    cluster.cli("aircancel", str(held))


def test_account_the_user_is_not_in_is_refused(cluster):
    before = cluster.db_rows()
    proc = cluster.cli("airbatch", "-A", "vision", "--wrap", "true", user="airtest-a", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "airbatch: error: user airtest-a may not charge account vision; their accounts: ml"
    proc = cluster.cli("airbatch", "-A", "nosuch", "--wrap", "true", user="airtest-a", check=False)
    assert "account 'nosuch' does not exist" in proc.stderr
    assert cluster.db_rows() == before
    # membership through a group: airtest-op's own group is listed as @airtest-op
    job_id = cluster.submit(cluster.write_script("t.sh", "#!/bin/sh\ntrue\n"), "-A", "vision", user="airtest-op")
    assert cluster.job(job_id)["account"] == "vision"
    cluster.wait_state(job_id, "COMPLETED")   # (its end is an event row: not in a later test's count)


def _refused(cluster, metadata, expect):
    before = cluster.db_rows()
    req = pb.SubmitRequest(job=pb.JobRequest(script="#!/bin/sh\ntrue\n", workdir="/tmp"))
    with pytest.raises(grpc.RpcError) as e:
        _stub(cluster).Submit(req, metadata=metadata, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
    assert expect in e.value.details()
    assert cluster.db_rows() == before


def test_bad_credentials_are_refused_and_change_nothing(cluster, munged):
    _refused(cluster, (), "carries no MUNGE credential")
    _refused(cluster, (("air-uid", "0"), ("air-gid", "0")), "carries no MUNGE credential")
    other = Munged().start()
    try:
        forged = Munge(other.socket).encode()
    finally:
        other.stop()
    _refused(cluster, (("air-cred", forged),), "invalid")
    good = Munge(munged.socket)
    req = pb.ListNodesRequest()
    cred = good.encode(binding("/air.v1.Controller/ListNodes", cluster.controller, request_bytes(req)))
    _stub(cluster).ListNodes(req, metadata=(("air-cred", cred),), timeout=10)
    _refused(cluster, (("air-cred", cred),), "replayed")
    short = Munge(munged.socket, ttl=1).encode()
    time.sleep(2.5)
    _refused(cluster, (("air-cred", short),), "expired")
    _refused(cluster, (("air-cred", "MUNGE:not-a-credential:"),), "refused")


def test_a_credential_is_made_with_libmunge_found_by_its_soname_or_else_searched_for(munged):
    """A tool's start does not pay for ctypes.util's search (and its import of subprocess) when the
    loader finds libmunge; where it does not, the search finds it. Both credentials are munged's."""
    code = ("import sys; from air.protos import munge\nif sys.argv[2] != '-': munge.SONAME = sys.argv[2]\n"
            "cred = munge.Munge(sys.argv[1]).encode(b'x')\n"
            "print(munge.Munge(sys.argv[1]).decode(cred)[2], 'ctypes.util' in sys.modules)")
    for soname, searched in (("-", "False"), ("libmunge-not-here.so.9", "True")):
        out = subprocess.run([sys.executable, "-c", code, munged.socket, soname], capture_output=True, text=True,
                             timeout=30)
        assert out.stdout.split() == ["b'x'", searched], out.stderr


def test_node_calls_need_root_credentials(cluster, munged):
    """A user cannot pose as a node daemon, nor ask a node daemon to launch anything."""
    a = pwd.getpwnam("airtest-a")
    code = (
        "import grpc, sys\n"
        "from air.protos import air_pb2 as pb, air_pb2_grpc as rpc\n"
        "from air.protos.credential import MungeCredentials, signed\n"
        f"auth = MungeCredentials({munged.socket!r})\n"
        "out = []\n"
        f"reg = rpc.NodeRegistryStub(signed(grpc.insecure_channel('{cluster.controller}'), auth, "
        f"'{cluster.controller}'))\n"
        f"agent = rpc.NodeAgentStub(signed(grpc.insecure_channel('{cluster.node(0)}'), auth, 'node01'))\n"
        "for call, req in ((reg.Heartbeat, pb.HeartbeatRequest(name='node01')),\n"
        "                  (agent.Launch, pb.LaunchRequest(job=pb.Job(job_id=999)))):\n"
        "    try:\n"
        "        call(req, timeout=10)\n"
        "        out.append('allowed')\n"
        "    except grpc.RpcError as e:\n"
        "        out.append(e.code().name)\n"
        "print(' '.join(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          user=a.pw_uid, group=a.pw_gid, extra_groups=[], cwd="/tmp",
                          env={**os.environ, "PYTHONPATH": str(cluster.config.parent.parent)})
    assert proc.stdout.split() == ["PERMISSION_DENIED", "PERMISSION_DENIED"], proc.stderr


def test_auth_none_refuses_a_non_loopback_address(cluster, tmp_path):
    conf = tmp_path / "air.toml"
    text = cluster.config.read_text().replace('auth = "munge"', 'auth = "none"')
    conf.write_text(text.replace(f'address = "{cluster.controller}"', 'address = "10.11.12.13:6817"'))
    proc = subprocess.run([sys.executable, "-m", "air.airctld", "--config", str(conf)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode != 0
    assert 'auth = "none" is allowed only on a loopback address, not 10.11.12.13:6817' in proc.stderr


def test_oversized_message_is_refused_in_one_line(cluster):
    before = cluster.db_rows()
    script = cluster.write_script("huge.sh", "#!/bin/sh\n" + "#" * (9 * 1024 * 1024) + "\ntrue\n")
    proc = cluster.cli("airbatch", str(script), user="airtest-a", check=False)
    assert proc.returncode != 0 and len(proc.stderr.splitlines()) == 1
    assert "larger than max" in proc.stderr or "too large" in proc.stderr
    assert cluster.db_rows() == before


def test_hold_and_release_are_the_owners_or_an_operators(cluster):
    job_id = cluster.submit(cluster.write_script("hr.sh", "#!/bin/sh\ntrue\n"), "-H", user="airtest-a")
    proc = cluster.cli("aircontrol", "release", str(job_id), user="airtest-b", check=False)
    assert proc.returncode != 0 and "you may hold or release only your own jobs" in proc.stderr
    assert cluster.job(job_id)["reason"] == "JobHeldUser"
    cluster.cli("aircontrol", "release", str(job_id), user="airtest-a")
    cluster.wait_state(job_id, "COMPLETED")
    proc = cluster.cli("aircontrol", "hold", str(job_id), user="airtest-a", check=False)
    assert proc.returncode != 0 and f"job {job_id} is completed; cannot hold or release it" in proc.stderr
    held = cluster.submit(cluster.write_script("hr2.sh", "#!/bin/sh\nsleep 30\n"), "-H", user="airtest-a")
    cluster.cli("aircontrol", "release", str(held), user="airtest-op")
    cluster.wait_state(held, "RUNNING")
    cluster.cli("aircancel", str(held))


def test_history_shows_a_user_only_their_own_jobs_where_jobs_are_private(cluster):
    script = cluster.write_script("quick.sh", "#!/bin/sh\ntrue\n")
    a_job = cluster.submit(script, "--job-name=secret-plan", user="airtest-a")
    b_job = cluster.submit(script, user="airtest-b")
    cluster.wait_state(a_job, "COMPLETED")
    cluster.wait_state(b_job, "COMPLETED")

    def ids(who, *args):
        out = cluster.cli("airacct", "-P", "-n", "-X", "-o", "JobID", *args, user=who).stdout
        return out.split()

    assert str(b_job) in ids("airtest-b", "-a") and str(a_job) not in ids("airtest-b", "-a")
    assert ids("airtest-b", "-j", str(a_job)) == [] and ids("airtest-b", "-u", "airtest-a") == []
    assert str(a_job) in ids("airtest-op", "-a") and str(a_job) in ids("airtest-a")
    for who in ("airtest-a", "airtest-op"):   # the owner and an operator see the command that submitted it
        line = cluster.cli("airacct", "-P", "-n", "-X", "-j", str(a_job), "-o", "SubmitLine", user=who).stdout
        assert line.startswith("airbatch --parsable --job-name=secret-plan"), (who, line)
