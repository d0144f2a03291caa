"""Being told to stop: SIGTERM (what launchers send; never SIGUSR1, which NCCL uses) sets a flag, and
`requested()` makes every rank agree, so that all stop at the same step and none waits in a collective."""
from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist


class StopSignal:
    def __init__(self, distributed: bool, signals=(signal.SIGTERM,)):
        self.distributed = distributed
        self._flag = threading.Event()
        self.reason = ""
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                signal.signal(sig, self._handler)

    def _handler(self, signum, frame) -> None:
        self.reason = signal.Signals(signum).name
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
