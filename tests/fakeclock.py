"""A clock in the test's hands, and a controller built in-process on it (a store on disk, two nodes
that only heartbeats play, no daemons)."""
from air.airctld.controller import Controller
from air.airctld.store import Store
from air.protos import air_pb2 as pb
from air.protos import config as cfg


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class NoNodes:
    """Node calls that reach nobody: the test plays the nodes through heartbeats."""
    def __init__(self):
        self.launched = []

    def launch(self, address, job):
        self.launched.append((job.job_id, job.restart_count))

    def signal(self, *args, **kwargs):
        return True

    def prepare_step(self, address, step):
        return pb.PrepareStepReply(free_port=1)


def build(tmp_path, wall, mono, **controller) -> Controller:
    """`controller`: settings of [controller] other than these."""
    conf = cfg.parse({"controller": {"auth": "none", "state_dir": str(tmp_path), "node_timeout_s": 15,
                                     "heartbeat_interval_s": 2, **controller},
                      "nodes": [{"name": "n1", "address": "127.0.0.9", "gpus": "sim:4"},
                                {"name": "n2", "address": "127.0.0.10", "gpus": "sim:4"}],
                      "partitions": [{"name": "p", "nodes": "n[1-2]", "default": True}]})
    c = Controller(conf, Store(str(tmp_path / "air.db")), clock=wall, monotonic=mono)
    c.clients = NoNodes()
    for name in ("n1", "n2"):
        c.register(pb.Node(name=name, address=c.config.node(name).endpoint, cpus=8, memory_mb=1024,
                           gpus=[pb.Gpu(index=i) for i in range(4)]))
    return c
