"""The AIR training runtime: what a job's script calls.

    ctx = runtime.init()
    sampler = runtime.ResumableSampler(len(dataset), seed=0, rank=ctx.rank, world_size=ctx.world_size)
    ckpt = runtime.Checkpointer(ctx, every_steps=100)
    state = {"model": model, "optim": optim, "sampler": sampler}
    start = ckpt.restore(state)           # 0, or the step of the newest complete checkpoint
    for step in range(start + 1, total + 1):
        ...
        ckpt.maybe_save(step, state)
        if ctx.stop.requested():          # SIGTERM on any rank; every rank agrees on this step
            ckpt.save(step, state, blocking=True)
            break
"""
from air.runtime import early   # noqa: F401  (first: catches SIGTERM while torch is still importing)
from air.runtime.checkpoint import Checkpointer
from air.runtime.context import Context, init
from air.runtime.data import ResumableSampler
from air.runtime.parallel import average_gradients, broadcast_parameters
from air.runtime.report import Reporter, peak_flops, transformer_flops_per_token
from air.runtime.stop import REQUEUE_EXIT, StopSignal

__all__ = ["Checkpointer", "Context", "REQUEUE_EXIT", "Reporter", "ResumableSampler", "StopSignal",
           "average_gradients", "broadcast_parameters", "init", "peak_flops", "transformer_flops_per_token"]
