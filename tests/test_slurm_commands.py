"""Slurm's command names as front ends (aircontrol slurm-commands install): written only where an
admin asks, never over a file that is not AIR's, and each is the AIR tool under Slurm's name."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.aircli import slurm

BIN = Path(sys.executable).parent
NAMES = ["sbatch", "srun", "squeue", "scancel", "sinfo", "sacct", "scontrol"]


def _aircontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "aircontrol"), *args], capture_output=True, text=True, timeout=60)


def _run(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(folder / args[0]), *args[1:]], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))


def test_none_is_installed_by_default():
    assert sorted(slurm.FRONT_ENDS) == sorted(NAMES)
    assert not [n for n in NAMES if (BIN / n).exists()]


def test_install_writes_each_command_and_uninstall_removes_only_those(tmp_path):
    proc = _aircontrol("slurm-commands", "install", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NAMES)
    assert all(os.access(tmp_path / n, os.X_OK) for n in NAMES)
    assert _run(tmp_path, "scontrol", "show", "hostnames", "node[01-03]").stdout == "node01\nnode02\nnode03\n"
    inside = _run(tmp_path, "scontrol", "show", "hostnames", env={"SLURM_JOB_NODELIST": "gpu[7,9]"})
    assert inside.stdout == "gpu7\ngpu9\n"
    assert "JobIDRaw" in _run(tmp_path, "sacct", "-e").stdout
    bad = _run(tmp_path, "sbatch", "--no-such-option", "x.sh")
    assert bad.returncode == 1 and bad.stderr.startswith("sbatch: error: ") and bad.stderr.count("\n") == 1
    (tmp_path / "notes").write_text("mine")
    assert _aircontrol("slurm-commands", "install", "--dir", str(tmp_path)).returncode == 0   # again: ours
    assert _aircontrol("slurm-commands", "uninstall", "--dir", str(tmp_path)).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["notes"]


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_slurm_already_there_is_never_replaced_unless_forced(tmp_path, kind):
    real = tmp_path / "real-sbatch"
    real.write_text("#!/bin/sh\necho slurm\n")
    if kind == "file":
        (tmp_path / "sbatch").write_text(real.read_text())
    else:
        (tmp_path / "sbatch").symlink_to(real)
    proc = _aircontrol("slurm-commands", "install", "--dir", str(tmp_path))
    assert proc.returncode == 1 and "sbatch exist and are not AIR's" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real-sbatch", "sbatch"]   # nothing written
    assert _aircontrol("slurm-commands", "uninstall", "--dir", str(tmp_path)).returncode == 0
    assert (tmp_path / "sbatch").exists() and real.read_text() == "#!/bin/sh\necho slurm\n"
    assert _aircontrol("slurm-commands", "install", "--dir", str(tmp_path), "--force").returncode == 0
    assert slurm._ours(tmp_path / "sbatch") and real.read_text() == "#!/bin/sh\necho slurm\n"


def test_a_folder_others_may_write_to_is_refused_unless_forced(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)   # no sticky bit: anyone could swap the commands root runs
    proc = _aircontrol("slurm-commands", "install", "--dir", str(shared))
    assert proc.returncode == 1 and "writable by its group or by others" in proc.stderr
    assert list(shared.iterdir()) == []
    os.chmod(shared, 0o1777)  # sticky: only the owner of a file may replace it
    assert _aircontrol("slurm-commands", "install", "--dir", str(shared)).returncode == 0
    assert all(os.stat(shared / n).st_mode & 0o777 == 0o755 for n in NAMES)
