"""What a sysadmin deploys: systemd units that verify, daemons that tell systemd when they serve."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc

from air.protos import air_pb2 as pb
from air.protos import air_pb2_grpc as rpc
from cluster import Block

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_units_pass_systemd_analyze_verify(tmp_path):
    verify = shutil.which("systemd-analyze")
    assert verify, "systemd-analyze is missing: scripts/test.sh installs Debian's systemd package"
    units = []
    for name in ("airctld", "airnoded"):
        text = (ROOT / "etc" / "systemd" / f"{name}.service").read_text()
        assert f"ExecStart=/usr/local/bin/{name} --config /etc/air/air.toml" in text
        assert "Type=notify" in text and "Restart=on-failure" in text and "munge.service" in text
        unit = tmp_path / f"{name}.service"   # the same unit, pointing at the installed program
        unit.write_text(text.replace(f"/usr/local/bin/{name}", str(BIN / name)))
        units.append(str(unit))
    proc = subprocess.run([verify, "verify", *units], capture_output=True, text=True, timeout=60)
    # verify exits 0 on some errors it "ignores": any line about our units is a failure too
    problems = [line for line in proc.stderr.splitlines() if "airctld" in line or "airnoded" in line]
    assert proc.returncode == 0 and not problems, proc.stderr


def test_controller_unit_is_hardened():
    text = (ROOT / "etc" / "systemd" / "airctld.service").read_text()
    for line in ("User=air", "ProtectSystem=strict", "StateDirectory=air", "NoNewPrivileges=yes", "PrivateTmp=yes"):
        assert line in text.splitlines()


def test_airctld_says_ready_only_once_it_serves():
    root = Path(tempfile.mkdtemp(prefix="air-notify-"))
    block = Block()
    try:
        conf = root / "air.toml"
        conf.write_text(f"""[controller]
address = "{block.address(1)}:6817"
state_dir = "{root / 'state'}"
auth = "none"
[[nodes]]
name = "node01"
address = "{block.address(2)}"
gpus = "sim:1"
[[partitions]]
name = "gpu"
nodes = "node01"
default = true
""")
        sock_path = str(root / "notify.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(sock_path)
            sock.settimeout(30)
            proc = subprocess.Popen([sys.executable, "-m", "air.airctld", "--config", str(conf)],
                                    env={**os.environ, "NOTIFY_SOCKET": sock_path},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                message = sock.recv(4096).decode()
                while message.startswith("STATUS="):   # (what it does before it serves: the store's check)
                    message = sock.recv(4096).decode()
                assert message.startswith("READY=1")
                # at the moment it says so, it answers
                stub = rpc.ControllerStub(grpc.insecure_channel(f"{block.address(1)}:6817"))
                reply = stub.ListNodes(pb.ListNodesRequest(), timeout=5,
                                       metadata=(("air-uid", "0"), ("air-gid", "0")))
                assert [n.name for n in reply.nodes] == ["node01"]
                proc.terminate()
                assert sock.recv(4096).decode() == "STOPPING=1"
                assert proc.wait(timeout=20) == 0
            finally:
                proc.kill()
                proc.wait()
    finally:
        block.release()
        shutil.rmtree(root, ignore_errors=True)
