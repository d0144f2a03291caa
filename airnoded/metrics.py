"""The node daemon's Prometheus metrics: its GPUs, NVLink and InfiniBand ports, health events, ranks
and its conversation with the controller. GPU readings are the health monitor's latest (taken every
health_interval_s); ports are read from sysfs at each scrape. Every series carries the node's name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from air.airnoded.health import IB_COUNTERS, ib_counters, ib_port_states

if TYPE_CHECKING:
    from air.airnoded.agent import Agent

RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class NodeMetrics:
    """What the agent counts as it happens."""

    def __init__(self, node: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.heartbeat_rtt = Histogram("air_node_heartbeat_rtt_seconds", "Round trip of a heartbeat to airctld",
                                       ["node"], buckets=RTT_BUCKETS, registry=self.registry).labels(node)
        self.heartbeat_failures = Counter("air_node_heartbeat_failures", "Heartbeats that got no answer",
                                          ["node"], registry=self.registry).labels(node)
        self.unkillable = Counter("air_node_unkillable_runs", "Runs given up because their processes outlived "
                                  "SIGKILL (the node drains: Kill task failed)", ["node"],
                                  registry=self.registry).labels(node)
        self.fences = Counter("air_node_fences", "Times the node stopped its runs for want of word from airctld",
                              ["node"], registry=self.registry).labels(node)


class NodeCollector:
    def __init__(self, agent: "Agent"):
        self.agent = agent

    def describe(self):
        return []

    def collect(self):
        a = self.agent
        node = a.node.name
        gpus = {g.index: g for g in a.gpus.inventory()}
        status = list(a.monitor.latest)
        util = GaugeMetricFamily("air_gpu_utilization_ratio", "GPU utilisation (0 to 1)", labels=["node", "gpu"])
        mem = GaugeMetricFamily("air_gpu_memory_used_bytes", "GPU memory in use", labels=["node", "gpu"])
        total = GaugeMetricFamily("air_gpu_memory_total_bytes", "GPU memory", labels=["node", "gpu"])
        temp = GaugeMetricFamily("air_gpu_temperature_celsius", "GPU temperature", labels=["node", "gpu"])
        power = GaugeMetricFamily("air_gpu_power_watts", "GPU power draw", labels=["node", "gpu"])
        for index, g in sorted(gpus.items()):
            total.add_metric([node, str(index)], g.memory_mb * 1024 * 1024)
        for s in status:
            labels = [node, str(s.index)]
            util.add_metric(labels, s.utilization / 100.0)
            mem.add_metric(labels, s.memory_used_mb * 1024 * 1024)
            temp.add_metric(labels, s.temperature_c)
            power.add_metric(labels, s.power_w)
        yield from (util, mem, total, temp, power)
        xids = CounterMetricFamily("air_gpu_xid_errors", "XID events since the daemon started",
                                   labels=["node", "gpu", "xid"])
        for (gpu, xid), n in sorted(a.monitor.xid_counts().items()):
            xids.add_metric([node, str(gpu), str(xid)], n)
        yield xids
        ecc = CounterMetricFamily("air_gpu_ecc_uncorrected_errors", "Uncorrectable (double-bit) ECC errors, volatile",
                                  labels=["node", "gpu"])
        for gpu, n in sorted(a.gpus.ecc_uncorrected().items()):
            ecc.add_metric([node, str(gpu)], n)
        yield ecc
        link_up = GaugeMetricFamily("air_gpu_nvlink_up", "1 if the NVLink link is up", labels=["node", "gpu", "link"])
        for (gpu, link), up in sorted(a.gpus.link_states().items()):
            link_up.add_metric([node, str(gpu), str(link)], 1 if up else 0)
        yield link_up
        link_errors = CounterMetricFamily("air_gpu_nvlink_errors", "NVLink error counters",
                                          labels=["node", "gpu", "link", "counter"])
        for (gpu, link, counter), n in sorted(a.gpus.link_errors().items()):
            link_errors.add_metric([node, str(gpu), str(link), counter], n)
        yield link_errors
        yield from self._infiniband(node)
        events = CounterMetricFamily("air_node_health_events", "Health events since the daemon started, by kind; "
                                     "critical ones drain the node", labels=["node", "kind", "critical"])
        for (kind, critical), n in sorted(a.monitor.event_counts.copy().items()):
            events.add_metric([node, kind, "true" if critical else "false"], n)
        yield events
        ranks = GaugeMetricFamily("air_node_running_ranks", "Processes the node runs for jobs: batch scripts and "
                                  "step ranks", labels=["node", "kind"])
        ranks.add_metric([node, "batch"], len(a.launcher.running()))
        ranks.add_metric([node, "step"], a.steps.rank_count())
        yield ranks
        lease = GaugeMetricFamily("air_node_seconds_since_controller", "Seconds since airctld last answered "
                                  "(the node fences itself past fence_timeout_s)", labels=["node"])
        lease.add_metric([node], a.seconds_since_controller())
        yield lease

    def _infiniband(self, node: str):
        root = self.agent.node.ib_root
        up = GaugeMetricFamily("air_ib_port_up", "1 if the InfiniBand port is ACTIVE", labels=["node", "port"])
        errors = CounterMetricFamily("air_ib_port_errors", "InfiniBand port error counters (sysfs)",
                                     labels=["node", "port", "counter"])
        if root is not None:
            for port, state in ib_port_states(root).items():
                up.add_metric([node, port], 1 if state.endswith("ACTIVE") else 0)
            for port, values in ib_counters(root).items():
                for counter in IB_COUNTERS:
                    if counter in values:
                        errors.add_metric([node, port, counter], values[counter])
        yield up
        yield errors
