"""Node health: which GPU and network signals are critical, and the monitor that watches them.

The policy (classify_xid, ib_port_faults) is pure or reads only files; the monitor polls the GPU
backend, the InfiniBand ports in sysfs and the admin's health program on an interval, and hands
new events to the agent, which sends them with the next heartbeat.
"""
from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from air.protos import air_pb2 as pb
from air.protos import signals

log = logging.getLogger("airnoded")

# XIDs that mean the GPU (or its memory, or its link) needs attention before it runs another job.
CRITICAL_XIDS = {48: "double-bit ECC error", 64: "ECC page retirement failure", 74: "NVLink error",
                 79: "GPU fell off the bus", 94: "contained ECC error", 95: "uncontained ECC error"}
CRITICAL_ON_REPEAT = {63: "ECC page retirement or row remapping"}
# XIDs an application causes (bad memory access, a killed context): recorded, never drain.
APPLICATION_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
                    45: "preemptive cleanup", 68: "video processor exception", 109: "context switch timeout"}


def classify_xid(gpu: int, xid: int, seen_before: int, now: float) -> pb.HealthEvent:
    if xid in CRITICAL_XIDS:
        return pb.HealthEvent(gpu=gpu, signal=signals.xid(xid), message=CRITICAL_XIDS[xid], critical=True, time=now)
    if xid in CRITICAL_ON_REPEAT:
        return pb.HealthEvent(gpu=gpu, signal=signals.xid(xid), message=CRITICAL_ON_REPEAT[xid],
                              critical=seen_before > 0, time=now)
    what = APPLICATION_XIDS.get(xid, "not classified")
    return pb.HealthEvent(gpu=gpu, signal=signals.xid(xid), message=what, critical=False, time=now)


def ib_port_states(root: Path) -> dict[str, str]:
    """Every port under an /sys/class/infiniband-shaped tree, with its state: {"mlx5_0/1": "4: ACTIVE"}."""
    states = {}
    if not root.is_dir():
        return states
    for state_file in sorted(root.glob("*/ports/*/state")):
        port = f"{state_file.parents[2].name}/{state_file.parent.name}"
        try:
            states[port] = state_file.read_text(errors="replace").strip()[:64]
        except OSError as e:
            states[port] = f"unreadable ({e.strerror})"
    return states


def ib_port_faults(root: Path) -> dict[str, str]:
    """Ports that are not ACTIVE: {"mlx5_0/1": "1: DOWN"}."""
    return {port: state for port, state in ib_port_states(root).items() if not state.endswith("ACTIVE")}


# InfiniBand error counters watched on every check (sysfs ports/*/counters/*). Rises are recorded;
# a port whose link went down more than IB_FLAP_LIMIT times since the daemon started is flapping.
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")
IB_FLAP_LIMIT = 3


def ib_counters(root: Path) -> dict[str, dict[str, int]]:
    """{"mlx5_0/1": {"link_downed": 0, ...}} for every port with a counters folder."""
    out: dict[str, dict[str, int]] = {}
    if not root.is_dir():
        return out
    for folder in sorted(root.glob("*/ports/*/counters")):
        port = f"{folder.parents[2].name}/{folder.parent.name}"
        values = {}
        for name in IB_COUNTERS:
            try:
                values[name] = int((folder / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        out[port] = values
    return out


class HealthMonitor:
    def __init__(self, node: str, gpus, ib_root: Path | None, program: str, interval_s: float, timeout_s: float,
                 report: Callable[[pb.HealthEvent], None], max_temp_c: int = 0):
        self.node = node
        self.gpus = gpus
        self.ib_root = ib_root
        self.program = program
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.report = report
        self._ib_down: dict[str, str] = {}
        self._ib_counts: dict[str, dict[str, int]] | None = None
        self._ib_base: dict[str, dict[str, int]] = {}
        self._ib_flapping: set[str] = set()
        self._program_failing = False
        self.max_temp_c = max_temp_c
        self._hot: set[int] = set()
        self.latest: list[pb.GpuStatus] = []
        self._xids: dict[tuple[int, int], int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()   # the monitor thread and fault injection both check
        self.cpu_seconds = 0.0
        self.event_counts: dict[tuple[str, bool], int] = {}   # (signal kind, critical) -> events so far

    def start(self) -> None:
        threading.Thread(target=self._run, name="health", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.thread_time()
            try:
                self.check(time.time())
            except Exception:
                log.exception("health check failed")
            self.cpu_seconds += time.thread_time() - started
            self._stop.wait(self.interval_s)

    def check(self, now: float) -> None:
        with self._lock:
            self._check(now)

    def _report(self, event: pb.HealthEvent) -> None:
        key = (signals.kind_of(event.signal).label, event.critical)
        self.event_counts[key] = self.event_counts.get(key, 0) + 1
        self.report(event)

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """(gpu, xid) -> how many times it was seen since the daemon started."""
        with self._lock:
            return dict(self._xids)

    def _check(self, now: float) -> None:
        for gpu, xid in self.gpus.take_xids():
            seen = self._xids.get((gpu, xid), 0)
            self._xids[(gpu, xid)] = seen + 1
            self._report(classify_xid(gpu, xid, seen, now))
        for event in self.gpus.faults(now):
            self._report(event)
        self.latest = self.gpus.telemetry()
        if self.max_temp_c:
            for status in self.latest:
                hot = status.temperature_c > self.max_temp_c
                if hot and status.index not in self._hot:
                    self._report(pb.HealthEvent(gpu=status.index, signal=signals.THERMAL, critical=True, time=now,
                                               message=f"{status.temperature_c} C, over the limit of "
                                                       f"{self.max_temp_c} C"))
                (self._hot.add if hot else self._hot.discard)(status.index)
        if self.ib_root is not None:
            down = ib_port_faults(self.ib_root)
            for port, state in down.items():
                if port not in self._ib_down:
                    self._report(pb.HealthEvent(gpu=-1, signal=signals.ib_port(port, state),
                                               message=f"InfiniBand port {port} is {state}, not ACTIVE",
                                               critical=True, time=now))
            self._ib_down = down
            self._check_ib_counters(now)
        if self.program:
            self._run_program(now)

    def _check_ib_counters(self, now: float) -> None:
        counts = ib_counters(self.ib_root)
        if self._ib_counts is None:      # the first reading is the baseline
            self._ib_counts = {port: dict(v) for port, v in counts.items()}
            self._ib_base = {port: dict(v) for port, v in counts.items()}
            return
        for port, values in counts.items():
            before = self._ib_counts.get(port, {})
            rises = {k: v - before.get(k, v) for k, v in values.items() if v > before.get(k, v)}
            if rises:
                self._report(pb.HealthEvent(gpu=-1, signal=signals.ib_errors(port), critical=False, time=now,
                                           message=", ".join(f"{k} +{n}" for k, n in sorted(rises.items()))))
            downs = values.get("link_downed", 0) - self._ib_base.get(port, {}).get("link_downed", 0)
            if downs > IB_FLAP_LIMIT and port not in self._ib_flapping:
                self._ib_flapping.add(port)
                self._report(pb.HealthEvent(gpu=-1, signal=signals.ib_flapping(port), critical=True, time=now,
                                           message=f"link went down {downs} times since the daemon started"))
        self._ib_counts = {port: dict(v) for port, v in counts.items()}

    def ongoing(self) -> list[str]:
        """Conditions that still hold: IB ports not ACTIVE, hot GPUs, a failing health program."""
        with self._lock:
            return ([f"IB {port}" for port in sorted(self._ib_down)] + [f"thermal GPU {i}" for i in sorted(self._hot)]
                    + (["health program"] if self._program_failing else []))

    def _run_program(self, now: float) -> None:
        try:
            proc = subprocess.run([self.program], capture_output=True, text=True, timeout=self.timeout_s,
                                  env={**os.environ, "AIR_NODENAME": self.node})
            failing, text = proc.returncode != 0, (proc.stdout + proc.stderr).strip()
            text = text.splitlines()[0] if text else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            failing, text = True, f"no answer within {self.timeout_s:g} s"
        except OSError as e:
            failing, text = True, f"cannot run {self.program}: {e.strerror}"
        if failing and not self._program_failing:
            self._report(pb.HealthEvent(gpu=-1, signal=signals.HEALTH_PROGRAM, message=text, critical=True, time=now))
        self._program_failing = failing
