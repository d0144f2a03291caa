"""A heterogeneous job (#SBATCH hetjob): which of its allocation's nodes are each component's."""
from __future__ import annotations

from typing import Sequence, TypeVar

from air.protos import air_pb2 as pb

T = TypeVar("T")


def groups(request: pb.JobRequest, allocation: Sequence[T]) -> list[tuple[pb.HetComponent, list[T]]]:
    """Each component with its part of the allocation: the next nodes, as many as it asked for (the
    batch node's first). Empty for a job that is not heterogeneous."""
    out, start = [], 0
    for component in request.het:
        out.append((component, list(allocation[start:start + component.nodes])))
        start += component.nodes
    return out
