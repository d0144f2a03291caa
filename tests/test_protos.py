"""The committed generated code matches protos/air.proto."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_current(tmp_path):
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "air.proto").write_bytes((ROOT / "protos" / "air.proto").read_bytes())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--grpc_python_out=.",
                    "protos/air.proto"], cwd=tmp_path, check=True)
    for name in ("air_pb2.py", "air_pb2_grpc.py"):
        fresh = (tmp_path / "protos" / name).read_text()
        assert fresh == (ROOT / "protos" / name).read_text(), \
            f"protos/{name} is stale: regenerate with `python -m grpc_tools.protoc -I. --python_out=. " \
            f"--grpc_python_out=. protos/air.proto`"
