"""Data parallelism whose arithmetic does not depend on the run.

DistributedDataParallel rebuilds its gradient buckets after the first iteration of every run, so the
first step after a resume reduces gradients in a different layout than the same step did in an
uninterrupted run, and ring all-reduce adds the ranks' values in an order that depends on where an
element falls in the buffer: the results differ in the last bits. average_gradients reduces one flat
buffer of every gradient in parameter order, the same layout every step of every run, so a resumed
run stays bit-identical to an uninterrupted one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def average_gradients(model: torch.nn.Module) -> None:
    """Average every parameter's gradient over the ranks (call after backward, before the optimizer)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def broadcast_parameters(model: torch.nn.Module, src: int = 0) -> None:
    """Start every rank from rank `src`'s weights."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for p in model.parameters():
            dist.broadcast(p.data, src)
