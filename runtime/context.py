"""init(): the job and rank environment, the device, and torch.distributed when there are several ranks."""
from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from air.runtime.goodput import Ledger
from air.runtime.report import Reporter, peak_flops
from air.runtime.stop import StopSignal


@dataclass
class Context:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    job_id: str
    restart_count: int
    checkpoint_dir: Path
    stop: StopSignal = field(repr=False, default=None)
    reporter: Reporter = field(repr=False, default=None)
    ledger: Ledger = field(repr=False, default=None)

    def report(self, step: int, **values) -> dict:
        """Progress for airq -l, aircontrol show job and airstat, and the heartbeat of hang detection."""
        return self.reporter.report(step, **values)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else default


def _leave_groups() -> None:
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:   # (at exit, nothing more can be done about it)
        pass


def init(checkpoint_dir: str | None = None) -> Context:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (as airrun and torchrun set them), pick cuda:LOCAL_RANK when GPUs
    are visible and CPU otherwise, and initialise torch.distributed (NCCL on GPU, gloo on CPU)."""
    rank = _env_int("RANK", _env_int("SLURM_PROCID", 0))
    world = _env_int("WORLD_SIZE", _env_int("SLURM_NTASKS", 1))
    local = _env_int("LOCAL_RANK", _env_int("SLURM_LOCALID", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
        # At exit (after a Checkpointer's last write: atexit runs its hooks newest first), leave the
        # groups before the interpreter tears down what their threads use: a group left for the C++
        # destructors can abort a finished rank ("terminate called without an active exception"),
        # and the job would end FAILED after training to the end
        atexit.register(_leave_groups)
    # SIGUSR2 dumps every thread's Python stack to stderr (the job's output): what the controller
    # asks for before it ends a job that stopped making progress (--hang-timeout)
    if hasattr(signal, "SIGUSR2"):
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
    job_id = os.environ.get("AIR_JOB_ID", "local")
    where = checkpoint_dir or os.environ.get("AIR_CHECKPOINT_DIR") or \
        os.path.join(os.environ.get("AIR_SUBMIT_DIR", os.getcwd()), f"air-ckpt-{job_id}")
    run = _env_int("AIR_RESTART_COUNT", 0)
    ledger = Ledger(run)
    return Context(rank=rank, world_size=world, local_rank=local, device=device, job_id=job_id,
                   restart_count=run, checkpoint_dir=Path(where), stop=StopSignal(world > 1),
                   reporter=Reporter(rank, world, peak=peak_flops(torch.cuda.get_device_name(device))
                                     if device.type == "cuda" else 0.0, ledger=ledger),
                   ledger=ledger)
