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
