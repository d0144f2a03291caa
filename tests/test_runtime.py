"""The runtime: checkpoints that resume to bit-identical results, as real separate runs."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.serial   # (its torch ranks take both cores: run alone, see scripts/test.sh)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _run(world: int, ckpt: Path, out: Path, *args: str, run: int = 0) -> list[int]:
    """One run (number `run`, as $AIR_RESTART_COUNT) of tests/runtime_train.py with `world` ranks (gloo on
    loopback); the exit codes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), AIR_RESTART_COUNT=str(run))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "runtime_train.py"), "--dir", str(ckpt),
                                       "--out", str(out), *args], env=env, stderr=subprocess.PIPE, text=True))
    codes = []
    for p in procs:
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()   # a rank whose peer died waits in a collective: that is what a node failure looks like
            p.wait()
        codes.append(p.returncode)
    return codes


def _checkpoints(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))


def _steps(out: Path, rank: int) -> dict[int, str]:
    """The batch indices of each step; a step re-run after a resume replaces the earlier record."""
    seen = {}
    for line in (out.parent / f"{out.name}.rank{rank}.log").read_text().splitlines():
        step, idx = line.split(" ")
        seen[int(step)] = idx
    return seen


@pytest.mark.parametrize("world, mode", [(2, "sync"), (2, "async")])   # one rank: test_training, and below
def test_interrupted_runs_end_bit_identical(tmp_path, world, mode):
    base = tmp_path / "base"
    flags = ["--async-save"] if mode == "async" else []
    assert _run(world, tmp_path / "ckpt-base", base, "--steps", "20", *flags) == [0] * world
    # run 0 stopped cleanly at step 7 (as SIGTERM would), run 1 killed abruptly at 13, run 2 finished
    run = tmp_path / "run"
    ckpt = tmp_path / "ckpt-run"
    assert _run(world, ckpt, run, "--steps", "20", "--stop-at", "7", *flags) == [0] * world
    assert _checkpoints(ckpt) == ["step-000000005-run0", "step-000000007-run0"]
    assert 9 in _run(world, ckpt, run, "--steps", "20", "--crash-at", "13", *flags, run=1)
    if mode == "sync":
        assert (ckpt / "step-000000010-run1" / "COMPLETE").exists()
    # async: the step-10 write may have been cut off by the crash; then the run resumes from step 7
    assert _run(world, ckpt, run, "--steps", "20", *flags, run=2) == [0] * world
    a, b = torch.load(f"{base}.pt"), torch.load(f"{run}.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for rank in range(world):
        assert _steps(run, rank) == _steps(base, rank)   # no batch skipped or repeated
    assert _checkpoints(ckpt) == ["step-000000015-run2", "step-000000020-run2"]   # the newest two
    assert sorted(os.listdir(ckpt / "runs")) == ["run-0", "run-0.progress", "run-1", "run-1.progress", "run-2", "run-2.progress"]


def test_incomplete_or_damaged_newest_checkpoint_is_skipped(tmp_path):
    ckpt, base, run = tmp_path / "ckpt", tmp_path / "base", tmp_path / "run"
    assert _run(1, tmp_path / "ckpt-base", base, "--steps", "15") == [0]
    assert _run(1, ckpt, run, "--steps", "10") == [0]
    # a write interrupted at step 15 (no COMPLETE), and a "complete" one at 12 whose metadata is damaged
    # (named as before runs were recorded, so they count as run 0, the run of this one)
    (ckpt / "step-000000015").mkdir()
    (ckpt / "step-000000015" / "__0_0.distcp").write_bytes(b"partial")
    (ckpt / "step-000000012").mkdir()
    (ckpt / "step-000000012" / ".metadata").write_bytes(b"\x00garbage")
    (ckpt / "step-000000012" / "COMPLETE").write_text("step 12\n")
    proc = subprocess.run([sys.executable, str(HERE / "runtime_train.py"), "--dir", str(ckpt), "--out", str(run),
                           "--steps", "15"], env=dict(os.environ), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "step-000000015 is incomplete" in proc.stderr and "step-000000012 cannot be read" in proc.stderr
    a, b = torch.load(f"{base}.pt"), torch.load(f"{run}.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_keep_must_leave_a_fallback(tmp_path):
    sys.path.insert(0, str(ROOT))
    from air import runtime
    ctx = runtime.init(checkpoint_dir=str(tmp_path))
    with pytest.raises(ValueError, match="keep at least 2"):
        runtime.Checkpointer(ctx, keep=1)
