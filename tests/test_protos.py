"""The committed generated code matches protos/air.proto (generated as air/protos/air.proto, the
name it is installed under)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = ("python -m grpc_tools.protoc -Iair/protos=protos --python_out=OUT --grpc_python_out=OUT "
              "air/protos/air.proto, then copy OUT/air/protos/air_pb2*.py into protos/")


def test_generated_code_is_current(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iair/protos=protos", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", "air/protos/air.proto"], cwd=ROOT, check=True)
    for name in ("air_pb2.py", "air_pb2_grpc.py"):
        fresh = (tmp_path / "air" / "protos" / name).read_text()
        assert fresh == (ROOT / "protos" / name).read_text(), f"protos/{name} is stale: {REGENERATE}"


def test_the_state_enums_are_air_protos():
    """protos/states.py writes the proto enums out (a short command does not import protobuf): each
    has every value of air.proto's, by the same number, with the name less the enum's prefix."""
    from air.protos import air_pb2 as pb
    from air.protos import states
    for mine, proto, prefix in ((states.JobPhase, pb.JobPhase, "JOB_PHASE_"),
                                (states.JobResult, pb.JobResult, "JOB_RESULT_"),
                                (states.Reason, pb.Reason, "REASON_"),
                                (states.NodeState, pb.NodeState, "NODE_STATE_")):
        want = [(v.name, v.number) for v in proto.DESCRIPTOR.values]
        assert [(prefix + m.name, m.value) for m in mine] == want, mine.__name__
