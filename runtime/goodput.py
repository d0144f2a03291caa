"""Where a run's time goes, as its training loop sees it: the run's side of goodput.

The loop's reports mark its steps (one report a step): the time from one to the next is training,
less what the checkpointer blocked the loop for meanwhile; what comes before the first is starting
(process start, torch, rendezvous, the model) and restoring (Checkpointer.restore). Rank 0 keeps
the run's last step and its training time in CHECKPOINT_DIR/runs/run-N.progress, rewritten in place
at most every PROGRESS_EVERY_S, so that the next run, once it knows which step it restored, can tell
how many steps the one before it computed past that step and lost: work done twice. Every report
carries the figures ("goodput"), for the controller to add up with its own view (queued, down).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

PROGRESS_EVERY_S = 0.05
_RECORD = 64   # bytes: "step train_s" padded, one pwrite in place


class Ledger:
    def __init__(self, run: int):
        self.run = run
        self.first_step_time = 0.0   # wall time the first step of this run ended
        self.train_s = 0.0
        self.ckpt_s = 0.0            # the loop blocked by checkpoint saves
        self.ckpt_pre_s = 0.0        # of which before the first step
        self.restore_s = 0.0
        self.restored_step = 0
        self.steps = 0               # computed by this run
        self.last_step = 0
        self.lost_steps = 0          # of the run before this one: computed past the step this one restored
        self.lost_s = 0.0
        self._last = 0.0             # monotonic time of the previous step
        self._blocked = 0.0          # checkpoint time since then
        self._fd: int | None = None
        self._written = 0.0

    # ------------------------------------------------------------ the loop and the checkpointer

    def stepped(self, step: int) -> None:
        now = time.monotonic()
        if self._last:
            self.train_s += max(0.0, now - self._last - self._blocked)
        else:
            self.first_step_time = time.time()
        self._last, self._blocked = now, 0.0
        self.steps += 1
        self.last_step = step
        if self._fd is not None and now - self._written >= PROGRESS_EVERY_S:
            self._save_progress(now)

    def blocked(self, seconds: float) -> None:
        self.ckpt_s += seconds
        if self._last:
            self._blocked += seconds
        else:   # before the first step: the controller takes it out of starting
            self.ckpt_pre_s += seconds

    def restored(self, step: int, seconds: float, runs_dir: Path | None) -> None:
        """The checkpoint of `step` was loaded in `seconds`; what the latest earlier run computed past it
        (from its progress file, when this is rank 0 and it left one) is lost work."""
        self.restore_s += seconds
        self.restored_step = step
        if runs_dir is None:
            return
        earlier = _latest_progress(runs_dir, self.run)
        if earlier is not None:
            last_step, train_s, steps = earlier
            if last_step > step and steps > 0:
                self.lost_steps = last_step - step
                self.lost_s = min(train_s, self.lost_steps * train_s / steps)

    def keep_progress(self, runs_dir: Path) -> None:
        """Rank 0: keep this run's progress file in the checkpoint directory's runs folder."""
        try:
            self._fd = os.open(runs_dir / f"run-{self.run}.progress",
                               os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:
            self._fd = None   # best effort: without it, the next run counts no lost work

    def _save_progress(self, now: float) -> None:
        text = f"{self.last_step} {self.train_s:.6f} {self.steps}".encode().ljust(_RECORD)[:_RECORD]
        try:
            os.pwrite(self._fd, text, 0)
        except OSError:
            pass
        self._written = now

    # ------------------------------------------------------------ out

    def figures(self) -> dict:
        return {"run": self.run, "first_step_time": self.first_step_time, "train_s": round(self.train_s, 3),
                "ckpt_s": round(self.ckpt_s, 3), "ckpt_pre_s": round(self.ckpt_pre_s, 3),
                "restore_s": round(self.restore_s, 3),
                "restored_step": self.restored_step, "steps": self.steps, "lost_steps": self.lost_steps,
                "lost_s": round(self.lost_s, 3)}


def _latest_progress(runs_dir: Path, run: int) -> tuple[int, float, int] | None:
    """(last step, training seconds, steps) of the highest-numbered earlier run that left a progress file."""
    best = None
    try:
        names = os.listdir(runs_dir)
    except OSError:
        return None
    for name in names:
        if name.startswith("run-") and name.endswith(".progress") and name[4:-9].isascii() and name[4:-9].isdigit():
            number = int(name[4:-9])
            if number < run and (best is None or number > best):
                best = number
    if best is None:
        return None
    try:
        with open(runs_dir / f"run-{best}.progress", "rb") as f:
            step, train_s, steps = f.read(_RECORD).split()[:3]
        return int(step), float(train_s), int(steps)
    except (OSError, ValueError):
        return None
