"""A job's resource limits as the controller lays them out and the node daemons enforce them, and the
bounds on what a request may name, which the tools check first and the controller checks again."""
from __future__ import annotations

MIB = 1024 * 1024
MAX_CONSTRAINT_CHARS = 1024   # one --constraint
MAX_NODE_NAMES = 65536        # one -w or -x
MAX_HET_COMPONENTS = 128      # components of one heterogeneous job (#SBATCH hetjob)
MAX_HEALTH_PER_BEAT = 1000    # health events in one heartbeat: a node daemon sends its oldest so many
#                               (the rest in the next), the controller takes no more


def memory_limit_bytes(mem_per_node_mb: int, mem_per_gpu_mb: int, gpus_here: int) -> int:
    """--mem (per node) or --mem-per-gpu times the job's GPUs on that node; 0 for no limit."""
    if mem_per_node_mb:
        return mem_per_node_mb * MIB
    if mem_per_gpu_mb and gpus_here:
        return mem_per_gpu_mb * gpus_here * MIB
    return 0
MAX_FILTER_ITEMS = 10_000     # job ids, array tasks, users, names or partitions in one job filter
MAX_NAMED_JOBS = 20_000       # jobs the ids of one request stand for, each array's tasks counted
MAX_DIGITS = 18               # a number written in a command line, a configuration or a file


def is_number(text: str, most: int = MAX_DIGITS) -> bool:
    """Whether `text` is a number int() reads: ASCII digits, at most `most` of them. (str.isdigit
    says yes to "²", which int() refuses, and int() refuses 4,300 digits and more.)"""
    return 0 < len(text) <= most and text.isascii() and text.isdigit()
