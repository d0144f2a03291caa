"""Being told to stop: SIGTERM (what launchers send; never SIGUSR1, which NCCL uses) sets a flag, and
`requested()` makes every rank agree, so that all stop at the same step and none waits in a collective.

The node daemon writes why (Preempted, TimeLimit, Requeued, NodeFail, ...) to $AIR_STOP_REASON_FILE
before it signals, so the job knows the real cause instead of guessing from the clock. A job that
stopped for requeue exits with REQUEUE_EXIT, which the controller reads as "stopped cleanly, run
me again" (when the job allows requeue).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

from air.runtime import early

REQUEUE_EXIT = 75   # EX_TEMPFAIL: stopped cleanly for requeue


def stop_reason() -> str:
    path = os.environ.get("AIR_STOP_REASON_FILE", "")
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class StopSignal:
    def __init__(self, distributed: bool, signals=(signal.SIGTERM,)):
        self.distributed = distributed
        self._flag = threading.Event()
        self.reason = ""
        if early.received.is_set():   # told to stop before init() could listen
            self.reason = stop_reason() or "SIGTERM"
            self._flag.set()
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                signal.signal(sig, self._handler)

    def _handler(self, signum, frame) -> None:
        self.reason = stop_reason() or signal.Signals(signum).name
        self._flag.set()

    def request(self, reason: str = "requested") -> None:
        self.reason = reason
        self._flag.set()

    def requested(self) -> bool:
        """True on every rank if any rank was told to stop (one all-reduce when distributed)."""
        local = self._flag.is_set()
        if not self.distributed:
            return local
        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def exit(self) -> None:
        """End the process as stopped for requeue (after the checkpoint)."""
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()
        sys.exit(REQUEUE_EXIT)
