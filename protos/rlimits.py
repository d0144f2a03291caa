"""Resource limits (ulimit) carried from where a job is submitted to its processes, as Slurm's
PropagateResourceLimits does: airbatch sends its own soft limits, airrun its own (the job's) for a
step's tasks, and the node daemon sets those the configuration propagates, each at most the node's
hard limit (a job never gets more than the node allows, only less).

MEMLOCK is not propagated by default: RDMA (NCCL over InfiniBand) pins memory, which a login node's
small default would forbid (as sites set Slurm's PropagateResourceLimitsExcept=MEMLOCK)."""
from __future__ import annotations

import resource
from typing import Iterable, Mapping

# Slurm's names (PropagateResourceLimits) -> the kernel's
NAMES = {"AS": resource.RLIMIT_AS, "CORE": resource.RLIMIT_CORE, "CPU": resource.RLIMIT_CPU,
         "DATA": resource.RLIMIT_DATA, "FSIZE": resource.RLIMIT_FSIZE, "MEMLOCK": resource.RLIMIT_MEMLOCK,
         "NOFILE": resource.RLIMIT_NOFILE, "NPROC": resource.RLIMIT_NPROC, "RSS": resource.RLIMIT_RSS,
         "STACK": resource.RLIMIT_STACK}
UNLIMITED = -1   # on the wire, as resource.RLIM_INFINITY


def capture() -> dict[str, int]:
    """This process's soft limits, by name."""
    out = {}
    for name, number in NAMES.items():
        soft, _ = resource.getrlimit(number)
        out[name] = UNLIMITED if soft == resource.RLIM_INFINITY else int(soft)
    return out


def check(names: Iterable[str], what: str) -> None:
    """A ValueError naming the first name that is not a limit's."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"{what}: {unknown[0][:40]!r} is not a limit ({', '.join(NAMES)})")


def to_apply(wanted: Mapping[str, int], propagate: Iterable[str], excepted: Iterable[str]) -> list[list[int]]:
    """The [kernel number, soft limit] pairs to set of `wanted` (names not known are left out): those
    `propagate` names ("ALL": every one), less `excepted`."""
    chosen = set(NAMES) if "ALL" in propagate else set(propagate)
    chosen -= set(excepted)
    return [[NAMES[name], int(value)] for name, value in sorted(wanted.items())
            if name in chosen and value >= UNLIMITED]

