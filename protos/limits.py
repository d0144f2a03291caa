"""A job's resource limits as the controller lays them out and the node daemons enforce them."""
from __future__ import annotations

MIB = 1024 * 1024


def memory_limit_bytes(mem_per_node_mb: int, mem_per_gpu_mb: int, gpus_here: int) -> int:
    """--mem (per node) or --mem-per-gpu times the job's GPUs on that node; 0 for no limit."""
    if mem_per_node_mb:
        return mem_per_node_mb * MIB
    if mem_per_gpu_mb and gpus_here:
        return mem_per_gpu_mb * gpus_here * MIB
    return 0
