"""Checkpoints and runs: a stale run of a job, still writing beside a newer run into the same checkpoint
directory, can never spoil the newer run's state. Real files and real torch.distributed.checkpoint;
the runs are Checkpointers with their own run numbers (as $AIR_RESTART_COUNT gives them), in this
process where one rank is enough, and real ranks on gloo where agreement between ranks matters.

    python tests/test_checkpoint_runs.py DIR OUT   (a rank of the two-rank stale run; RANK etc. in env)
"""
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from air import runtime  # noqa: E402
from air.runtime import checkpoint  # noqa: E402
from air.runtime.checkpoint import Checkpointer, StaleRunError  # noqa: E402

pytestmark = pytest.mark.serial   # (its torch ranks take both cores: run alone, see scripts/test.sh)


def _ctx(directory: Path, run: int) -> runtime.Context:
    return runtime.Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), job_id="7",
                           restart_count=run, checkpoint_dir=directory,
                           stop=runtime.StopSignal(False, signals=()))


class Run:
    """One run of the job: its Checkpointer and a model whose weights say which run wrote them at
    which step (run * 1000 + step)."""

    def __init__(self, directory: Path, run: int, keep: int = 2, async_save: bool = False):
        self.run = run
        self.ctx = _ctx(directory, run)
        self.ckpt = Checkpointer(self.ctx, keep=keep, async_save=async_save)
        self.state = {"model": torch.nn.Linear(2, 2)}

    def save(self, step: int, **kw):
        with torch.no_grad():
            self.state["model"].weight.fill_(self.run * 1000 + step)
        self.ckpt.save(step, self.state, **kw)
        self.ckpt.wait()

    def restore(self) -> tuple[int, float]:
        """The step restored, and the weight value loaded (who wrote it)."""
        step = self.ckpt.restore(self.state)
        return step, float(self.state["model"].weight[0, 0].detach())


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))


def _complete(directory: Path, name: str) -> bool:
    return (directory / name / "COMPLETE").exists()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_stale_run_cannot_make_a_checkpoint_count_once_a_newer_run_registered(tmp_path, monkeypatch, async_save):
    stale = Run(tmp_path, 1, async_save=async_save)
    stale.save(10)
    stale.save(20)
    newer = []
    real_save = checkpoint.dcp.save

    def save_then_newer_run_starts(*args, **kwargs):   # run 2 starts while run 1 writes step 30's data
        real_save(*args, **kwargs)
        if not newer:
            newer.append(Run(tmp_path, 2))

    monkeypatch.setattr(checkpoint.dcp, "save", save_then_newer_run_starts)
    with pytest.raises(StaleRunError, match="run 1 is stale: run 2 uses .*step 30 is refused"):
        stale.save(30)
    assert (tmp_path / "runs" / "run-2").exists()
    assert not _complete(tmp_path, "step-000000030-run1")     # the data is there, but it never counts
    assert stale.ckpt.last_step == 20 and stale.ctx.stop.requested() and stale.ctx.stop.reason == "Superseded"
    # a later save of the stale run writes nothing at all, not even data files
    with pytest.raises(StaleRunError):
        stale.save(40)
    assert not (tmp_path / "step-000000040-run1").exists()
    assert newer[0].restore() == (20, 1020.0)


def test_a_stale_run_never_deletes_a_newer_runs_checkpoints(tmp_path, monkeypatch):
    stale = Run(tmp_path, 1, keep=2)
    stale.save(10)
    stale.save(20)
    newer = Run(tmp_path, 2, keep=3)
    assert newer.restore() == (20, 1020.0)
    for step in (25, 30, 35):
        newer.save(step)
    (tmp_path / "step-000000040-run2").mkdir()            # run 2's save in flight
    (tmp_path / "step-000000040-run2" / "__0_0.distcp").write_bytes(b"partial")
    # run 1 looked for newer runs an instant before run 2 registered (so it saw none), and now
    # completes its step 50 and purges, keeping 2
    monkeypatch.setattr(stale.ckpt, "newest_run", lambda: 1)
    stale.save(50)
    assert {"step-000000025-run2", "step-000000030-run2", "step-000000035-run2",
            "step-000000040-run2"} <= set(_names(tmp_path)), _names(tmp_path)
    assert Run(tmp_path, 3).restore() == (35, 2035.0)


def test_restore_prefers_the_newest_run_over_a_stale_runs_later_step(tmp_path, monkeypatch):
    stale = Run(tmp_path, 1)
    stale.save(10)
    stale.save(20)
    real_marker = checkpoint._write_marker
    newer = []

    def newer_run_starts_just_before_complete(path, step, run):
        newer.append(Run(tmp_path, 2))
        assert newer[0].restore() == (20, 1020.0)    # step 30 of run 1 is not complete yet
        real_marker(path, step, run)

    monkeypatch.setattr(checkpoint, "_write_marker", newer_run_starts_just_before_complete)
    stale.save(30)                                   # lost the race by an instant: COMPLETE is there
    monkeypatch.setattr(checkpoint, "_write_marker", real_marker)
    assert _complete(tmp_path, "step-000000030-run1")
    newer[0].save(25)
    assert Run(tmp_path, 3).restore() == (25, 2025.0)
    assert Run(tmp_path, 2).restore() == (25, 2025.0)


def test_a_crash_between_data_and_complete_leaves_the_checkpoint_uncounted(tmp_path, monkeypatch, caplog):
    first = Run(tmp_path, 1)
    first.save(10)
    second = Run(tmp_path, 2)
    assert second.restore() == (10, 1010.0)
    second.save(25)

    def crash(path, step, run):
        raise OSError("node lost its disk")

    monkeypatch.setattr(checkpoint, "_write_marker", crash)
    with pytest.raises(OSError):
        second.save(30)
    monkeypatch.undo()
    assert (tmp_path / "step-000000030-run2" / ".metadata").exists()
    assert not _complete(tmp_path, "step-000000030-run2")
    third = Run(tmp_path, 3)
    assert third.restore() == (25, 2025.0)
    assert "step-000000030-run2 is incomplete" in caplog.text
    third.save(35)
    assert _names(tmp_path) == ["step-000000025-run2", "step-000000035-run3"]


def test_checkpoints_written_before_runs_were_recorded_still_restore(tmp_path):
    old = Run(tmp_path, 0)
    old.save(10)
    old.save(20)
    for step in (10, 20):   # the layout from before: step-N, "step N" in COMPLETE, no runs/
        (tmp_path / f"step-{step:09d}-run0").rename(tmp_path / f"step-{step:09d}")
        (tmp_path / f"step-{step:09d}" / "COMPLETE").write_text(f"step {step}\n")
    (tmp_path / "runs" / "run-0").unlink()
    (tmp_path / "runs").rmdir()
    assert _names(tmp_path) == ["step-000000010", "step-000000020"]
    run = Run(tmp_path, 4)
    assert run.restore() == (20, 20.0)
    run.save(25)
    assert _names(tmp_path) == ["step-000000020", "step-000000025-run4"]
    assert (tmp_path / "step-000000025-run4" / "COMPLETE").read_text() == "step 25\nrun 4\n"
    assert Run(tmp_path, 5).restore() == (25, 4025.0)


def test_every_rank_of_a_stale_run_refuses_and_none_hangs(tmp_path):
    """Two ranks on gloo, asynchronous saves: run 2 registers while run 1 writes step 10's data (rank
    0 sees it before COMPLETE and tells rank 1), then run 1 tries step 15 (both refuse up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), AIR_RESTART_COUNT="1")
        procs.append(subprocess.Popen([sys.executable, __file__, str(tmp_path / "ckpt"), str(tmp_path / "out")],
                                      env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        assert p.returncode == 0, err[-3000:]
    for rank in range(2):
        assert (tmp_path / f"out.rank{rank}").read_text().split() == ["10:stale", "15:stale"]
    ckpt = tmp_path / "ckpt"
    assert _names(ckpt) == ["step-000000005-run1", "step-000000010-run1"]
    assert _complete(ckpt, "step-000000005-run1") and not _complete(ckpt, "step-000000010-run1")
    assert sorted(n for n in os.listdir(ckpt / "runs") if not n.endswith(".progress")) == ["run-1", "run-2"]


def _stale_rank(directory: str, out: str) -> None:
    ctx = runtime.init(checkpoint_dir=directory)
    ckpt = Checkpointer(ctx, keep=2, async_save=True)
    state = {"model": torch.nn.Linear(2, 2)}
    real_save = checkpoint.dcp.save

    def save_then_run_2_registers(*args, **kwargs):
        real_save(*args, **kwargs)
        if ctx.is_main:
            checkpoint._register(Path(directory) / "runs", 2)

    results = []
    ckpt.save(5, state)
    ckpt.wait()
    checkpoint.dcp.save = save_then_run_2_registers
    for step in (10, 15):
        try:
            ckpt.save(step, state)
            ckpt.wait()
            results.append(f"{step}:ok")
        except StaleRunError:
            results.append(f"{step}:stale")
    Path(f"{out}.rank{ctx.rank}").write_text("\n".join(results) + "\n")


if __name__ == "__main__":
    _stale_rank(sys.argv[1], sys.argv[2])
