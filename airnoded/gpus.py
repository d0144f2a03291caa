"""GPU inventory behind one interface: NVML on hosts that have NVIDIA GPUs, simulated elsewhere."""
from __future__ import annotations

import logging
import threading
import uuid
from typing import Protocol

from air.protos import air_pb2 as pb
from air.protos import signals

log = logging.getLogger("airnoded")

SIM_NAME = "NVIDIA H100 80GB HBM3 (simulated)"
SIM_MEMORY_MB = 81559
SIM_IDLE_TEMP_C = 35
SIM_IDLE_POWER_W = 70.0
SIM_NVLINKS = 18          # an H100 SXM's


class GpuError(Exception):
    pass


class GpuBackend(Protocol):
    simulated: bool

    def inventory(self) -> list[pb.Gpu]: ...

    def take_xids(self) -> list[tuple[int, int]]:
        """(gpu, xid) events since the last call."""

    def faults(self, now: float) -> list[pb.HealthEvent]:
        """Critical conditions that appeared since the last call (ECC, remapped rows, NVLink)."""

    def telemetry(self) -> list[pb.GpuStatus]:
        """Utilisation, temperature, power and memory in use of every GPU, now."""

    def link_states(self) -> dict[tuple[int, int], bool]:
        """(gpu, NVLink link) -> whether it is up, as of the last faults() call."""

    def link_errors(self) -> dict[tuple[int, int, str], int]:
        """(gpu, link, counter) -> NVLink error count (replay, recovery, crc_flit, crc_data), as of the
        last faults() call."""

    def ecc_uncorrected(self) -> dict[int, int]:
        """gpu -> uncorrectable ECC errors (volatile) seen, as of the last faults() call."""

    def device_minors(self) -> dict[int, int]:
        """gpu -> the minor number of its device file, /dev/nvidia<minor> (major NVIDIA_MAJOR): what a
        job's devices cgroup denies it when the GPU is not the job's."""


class SimulatedGpus:
    """GPUs described by the configuration; UUIDs are stable for a node name and index."""

    simulated = True

    def __init__(self, count: int, node: str):
        self._xids: list[tuple[int, int]] = []
        self._faults: list[pb.HealthEvent] = []
        self._gpus = [pb.Gpu(index=i, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{i}.air')}",
                             name=SIM_NAME, memory_mb=SIM_MEMORY_MB) for i in range(count)]
        self._temps = [SIM_IDLE_TEMP_C] * count
        self._links_down: set[tuple[int, int]] = set()
        self._ecc: dict[int, int] = {}

    def link_states(self) -> dict[tuple[int, int], bool]:
        return {(g.index, link): (g.index, link) not in self._links_down
                for g in self._gpus for link in range(SIM_NVLINKS)}

    def link_errors(self) -> dict[tuple[int, int, str], int]:
        return {}

    def ecc_uncorrected(self) -> dict[int, int]:
        return {g.index: self._ecc.get(g.index, 0) for g in self._gpus}

    def telemetry(self) -> list[pb.GpuStatus]:
        return [pb.GpuStatus(index=i, utilization=0, temperature_c=t, power_w=SIM_IDLE_POWER_W)
                for i, t in enumerate(self._temps)]

    def inventory(self) -> list[pb.Gpu]:
        return list(self._gpus)

    def device_minors(self) -> dict[int, int]:
        return {g.index: g.index for g in self._gpus}

    def inject(self, fault: pb.FaultRequest, now: float) -> None:
        """What `aircontrol node fault` asks for, delivered the way the real signals arrive."""
        if fault.gpu >= len(self._gpus) or fault.gpu < -1:
            raise GpuError(f"GPU {fault.gpu} does not exist on this node ({len(self._gpus)} GPUs)")
        if fault.xid:
            self._xids.append((fault.gpu, fault.xid))
        if fault.ecc_dbe:
            self._ecc[fault.gpu] = self._ecc.get(fault.gpu, 0) + 1
            self._faults.append(pb.HealthEvent(gpu=fault.gpu, signal=signals.ECC_DBE, critical=True, time=now,
                                               message="uncorrectable (double-bit) ECC error"))
        if fault.HasField("nvlink_down"):
            self._links_down.add((fault.gpu, fault.nvlink_down))
            self._faults.append(pb.HealthEvent(gpu=fault.gpu, signal=signals.nvlink_down(fault.nvlink_down),
                                               critical=True, time=now, message="NVLink link is down"))
        if fault.HasField("temperature_c"):
            if fault.gpu < 0:
                raise GpuError("--temp needs --gpu")
            self._temps[fault.gpu] = fault.temperature_c
        if fault.ib_down:
            self._faults.append(pb.HealthEvent(gpu=-1, signal=signals.ib_port(fault.ib_down, "DOWN"), critical=True,
                                               time=now, message=f"InfiniBand port {fault.ib_down} is DOWN"))

    def take_xids(self) -> list[tuple[int, int]]:
        out, self._xids = self._xids, []
        return out

    def faults(self, now: float) -> list[pb.HealthEvent]:
        out, self._faults = self._faults, []
        return out


NVLINK_ERROR_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY"), ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
                         ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"), ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"))


class NvmlGpus:
    simulated = False

    def __init__(self):
        try:
            import pynvml
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, driver not loaded, ...
            raise GpuError(f"NVML is not available on this host ({e}); "
                           "set gpus = \"none\" or \"sim:N\" for this node") from None
        self._nvml = pynvml
        self._ecc_seen: dict[int, int] = {}
        self._links_down: set[tuple[int, int]] = set()
        self._xids: list[tuple[int, int]] = []
        self._link_state: dict[tuple[int, int], bool] = {}
        self._link_errors: dict[tuple[int, int, str], int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._watch_xids, name="xid", daemon=True).start()

    def _watch_xids(self) -> None:
        """XIDs as they happen: nvmlEventSetWait on a thread of its own."""
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for i in range(nvml.nvmlDeviceGetCount()):
                try:
                    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i), nvml.nvmlEventTypeXidCriticalError,
                                                  events)
                except nvml.NVMLError:
                    continue
            while True:
                try:
                    data = nvml.nvmlEventSetWait(events, 5000)
                except nvml.NVMLError_Timeout:
                    continue
                index = nvml.nvmlDeviceGetIndex(data.device)
                with self._lock:
                    self._xids.append((index, int(data.eventData)))
        except nvml.NVMLError:
            return

    def take_xids(self) -> list[tuple[int, int]]:
        with self._lock:
            out, self._xids = self._xids, []
        return out

    def faults(self, now: float) -> list[pb.HealthEvent]:
        nvml, out = self._nvml, []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                dbe = nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                       nvml.NVML_VOLATILE_ECC)
                if dbe > self._ecc_seen.get(i, 0):
                    out.append(pb.HealthEvent(gpu=i, signal=signals.ECC_DBE, critical=True, time=now,
                                              message=f"{dbe} uncorrectable ECC errors (volatile)"))
                self._ecc_seen[i] = dbe
            except nvml.NVMLError:
                pass
            try:
                _, _, _, failure = nvml.nvmlDeviceGetRemappedRows(h)
                if failure:
                    out.append(pb.HealthEvent(gpu=i, signal=signals.ROW_REMAP_FAILURE, critical=True, time=now,
                                              message="row remapping failed"))
            except nvml.NVMLError:
                pass
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active = nvml.nvmlDeviceGetNvLinkState(h, link)
                except nvml.NVMLError:
                    break
                self._link_state[(i, link)] = bool(active)
                if active:
                    for name, counter in NVLINK_ERROR_COUNTERS:
                        try:
                            self._link_errors[(i, link, name)] = nvml.nvmlDeviceGetNvLinkErrorCounter(
                                h, link, getattr(nvml, counter))
                        except (nvml.NVMLError, AttributeError):
                            continue
                if not active and (i, link) not in self._links_down:
                    self._links_down.add((i, link))
                    out.append(pb.HealthEvent(gpu=i, signal=signals.nvlink_down(link), critical=True, time=now,
                                              message="NVLink link is down"))
        return out

    def link_states(self) -> dict[tuple[int, int], bool]:
        return dict(self._link_state)

    def link_errors(self) -> dict[tuple[int, int, str], int]:
        return dict(self._link_errors)

    def ecc_uncorrected(self) -> dict[int, int]:
        return dict(self._ecc_seen)

    def telemetry(self) -> list[pb.GpuStatus]:
        nvml, out = self._nvml, []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            status = pb.GpuStatus(index=i)
            for read in (lambda: setattr(status, "utilization", nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                         lambda: setattr(status, "temperature_c",
                                         nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                         lambda: setattr(status, "power_w", nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                         lambda: setattr(status, "memory_used_mb",
                                         nvml.nvmlDeviceGetMemoryInfo(h).used // (1024 * 1024))):
                try:
                    read()
                except nvml.NVMLError:   # not supported on this GPU: left at 0
                    pass
            out.append(status)
        return out

    def inventory(self) -> list[pb.Gpu]:
        nvml = self._nvml
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            out.append(pb.Gpu(index=i, uuid=_text(nvml.nvmlDeviceGetUUID(h)), name=_text(name),
                              memory_mb=nvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)))
        return out

    def device_minors(self) -> dict[int, int]:
        nvml = self._nvml
        try:
            return {i: nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(i))
                    for i in range(nvml.nvmlDeviceGetCount())}
        except nvml.NVMLError as e:   # (not on every platform): no GPU is denied by the devices cgroup
            log.warning("GPU device minor numbers not available from NVML (%s): jobs are kept to their GPUs by "
                        "CUDA_VISIBLE_DEVICES only", e)
            return {}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_backend(spec: str, node: str) -> GpuBackend:
    """`nvml`, `none`, or `sim:N` (the config's gpus key, already checked on load)."""
    if spec == "nvml":
        return NvmlGpus()
    if spec == "none":
        return SimulatedGpus(0, node)
    return SimulatedGpus(int(spec.split(":", 1)[1]), node)
