"""GPU inventory behind one interface: NVML on hosts that have NVIDIA GPUs, simulated elsewhere."""
from __future__ import annotations

import uuid
from typing import Protocol

from protos import air_pb2 as pb

SIM_NAME = "NVIDIA H100 80GB HBM3 (simulated)"
SIM_MEMORY_MB = 81559


class GpuError(Exception):
    pass


class GpuBackend(Protocol):
    def inventory(self) -> list[pb.Gpu]: ...


class SimulatedGpus:
    """GPUs described by the configuration; UUIDs are stable for a node name and index."""

    def __init__(self, count: int, node: str):
        self._gpus = [pb.Gpu(index=i, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{i}.air')}",
                             name=SIM_NAME, memory_mb=SIM_MEMORY_MB) for i in range(count)]

    def inventory(self) -> list[pb.Gpu]:
        return list(self._gpus)


class NvmlGpus:
    def __init__(self):
        try:
            import pynvml
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, driver not loaded, ...
            raise GpuError(f"NVML is not available on this host ({e}); "
                           "set gpus = \"none\" or \"sim:N\" for this node") from None
        self._nvml = pynvml

    def inventory(self) -> list[pb.Gpu]:
        nvml = self._nvml
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            out.append(pb.Gpu(index=i, uuid=_text(nvml.nvmlDeviceGetUUID(h)), name=_text(name),
                              memory_mb=nvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)))
        return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_backend(spec: str, node: str) -> GpuBackend:
    """`nvml`, `none`, or `sim:N` (the config's gpus key, already checked on load)."""
    if spec == "nvml":
        return NvmlGpus()
    if spec == "none":
        return SimulatedGpus(0, node)
    return SimulatedGpus(int(spec.split(":", 1)[1]), node)
