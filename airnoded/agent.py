"""The node daemon's conversation with airctld: register, heartbeat, report exits, obey kills."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time

import grpc
import psutil

from airctld.config import Config, NodeConfig
from airnoded import progress
from airnoded.cgroups import JobCgroups
from airnoded.gpus import GpuBackend, GpuError
from airnoded.health import HealthMonitor
from airnoded.launcher import Launcher
from airnoded.procs import killpg_all
from airnoded.steps import StepError, StepRunner
from protos import air_pb2 as pb
from protos import air_pb2_grpc as rpc

log = logging.getLogger("airnoded")

CALL_TIMEOUT_S = 5.0


class Agent:
    def __init__(self, config: Config, node: NodeConfig, gpus: GpuBackend, auth=None):
        self.config = config
        self.auth = auth or config.controller.authenticator()
        self.node = node
        self.gpus = gpus
        self.interval = config.controller.heartbeat_interval_s
        self.cgroups = JobCgroups(node.name)
        self.launcher = Launcher(node.name, node.spool, self._exited, self.cgroups)
        self.steps = StepRunner(node.name, node.address, self.cgroups, node.spool)
        self._progress_sent: dict[int, float] = {}
        self._exits: dict[int, pb.JobExit] = {}   # reported exits not yet acknowledged
        self._health: list[pb.HealthEvent] = []   # health events not yet delivered
        self.monitor = HealthMonitor(node.name, gpus, node.ib_root, node.health_program, node.health_interval_s,
                                     node.health_timeout_s, self._health_event, node.max_gpu_temp_c)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        channel = grpc.insecure_channel(config.controller.address)
        self._registry = rpc.NodeRegistryStub(channel)
        self._registered = False

    def describe(self) -> pb.Node:
        cpus = self.node.cpus or os.cpu_count() or 1
        memory = self.node.memory_mb or psutil.virtual_memory().total // (1024 * 1024)
        return pb.Node(name=self.node.name, address=self.node.endpoint, cpus=cpus, memory_mb=memory,
                       gpus=self.gpus.inventory())

    def _health_event(self, event: pb.HealthEvent) -> None:
        log.warning("health: %s%s: %s", f"GPU {event.gpu} " if event.gpu >= 0 else "", event.signal, event.message)
        with self._lock:
            self._health.append(event)
        if event.critical:
            self._wake.set()

    def _exited(self, exit: pb.JobExit) -> None:
        with self._lock:
            self._exits[exit.job_id] = exit
        self._wake.set()  # report at once rather than at the next beat

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self._registered:
                    reply = self._registry.Register(pb.RegisterRequest(node=self.describe()),
                                                    timeout=CALL_TIMEOUT_S, metadata=self.auth.metadata())
                    self.interval = reply.heartbeat_interval_s or self.interval
                    self._registered = True
                    log.info("registered with %s", self.config.controller.address)
                self._beat()
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    log.error("the controller refused this node: %s", e.details())
                else:
                    log.warning("controller %s unreachable: %s", self.config.controller.address,
                                e.code().name)
            self._wake.wait(self.interval)
            self._wake.clear()

    def _beat(self) -> None:
        with self._lock:
            exits = list(self._exits.values())
            health = list(self._health)
        reply = self._registry.Heartbeat(
            pb.HeartbeatRequest(name=self.node.name, running=self.launcher.running(), exits=exits, health=health,
                                gpus=self.monitor.latest, ongoing=self.monitor.ongoing(),
                                progress=progress.collect(self.node.spool, time.time(), self._progress_sent)),
            timeout=CALL_TIMEOUT_S, metadata=self.auth.metadata())
        if not reply.reregister:
            with self._lock:
                del self._health[:len(health)]
        if reply.reregister:
            self._registered = False
            self._wake.set()
            return
        with self._lock:
            for job_id in reply.acked:
                self._exits.pop(job_id, None)
        for job_id in reply.kill:
            log.warning("job %d is not running here as far as the controller knows; killing it", job_id)
            self.launcher.signal(job_id, 0, self.config.controller.kill_wait_s)
            self.steps.signal(job_id, 0)

    def remove_job_dir(self, job_id: int) -> None:
        """A job's folder on a node where only its ranks ran (the batch node's goes with the script)."""
        if job_id not in self.launcher.running() and not self.steps.has_ranks(job_id):
            shutil.rmtree(progress.job_dir(self.node.spool, job_id), ignore_errors=True)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.cgroups.close()


class AgentService:
    """NodeAgent: what airctld asks of this node."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.service_uid = agent.config.controller.service_uid()

    def _controller_only(self, context) -> None:
        who = self.agent.auth.identify(context)
        if not who.is_root and who.uid != self.service_uid:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"only the controller may call the node agent (caller uid {who.uid})")

    def Launch(self, request: pb.LaunchRequest, context):
        self._controller_only(context)
        self.agent.launcher.launch(request.job)
        return pb.LaunchReply()

    def Signal(self, request: pb.SignalRequest, context):
        self._controller_only(context)
        if request.reason:
            progress.write_stop_reason(self.agent.node.spool, request.job_id, request.reason)
        batch = self.agent.launcher.signal(request.job_id, request.signal, request.grace_s, request.batch_only)
        if request.batch_only:
            return pb.SignalReply(found=batch)
        if request.signal == 0:
            self.agent.steps.forget_job(request.job_id)
            threading.Timer(request.grace_s + 1.0, self.agent.remove_job_dir, (request.job_id,)).start()
        # steps get the signal at once; on a stop, SIGTERM now and SIGKILL with the batch script's group
        groups = self.agent.steps.groups(request.job_id)
        ranks = self.agent.steps.signal(request.job_id, request.signal or signal.SIGTERM)
        if request.signal == 0 and groups:
            # SIGKILL after the grace time to these ranks only: a requeued run of the job may have
            # started new ones here by then
            threading.Timer(request.grace_s, killpg_all, (groups, signal.SIGKILL)).start()
        return pb.SignalReply(found=batch or ranks)

    def InjectFault(self, request: pb.FaultRequest, context):
        self._controller_only(context)
        gpus = self.agent.gpus
        if not getattr(gpus, "simulated", False):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"node {self.agent.node.name} has real GPUs; faults are injected only into simulated ones")
        try:
            gpus.inject(request, time.time())
        except GpuError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.agent.monitor.check(time.time())  # seen at once, not at the next interval
        return pb.FaultReply()

    def PrepareStep(self, request: pb.Step, context):
        self._controller_only(context)
        return pb.PrepareStepReply(free_port=self.agent.steps.prepare(request))

    def RunStep(self, request: pb.RunStepRequest, context):
        who = self.agent.auth.identify(context)
        try:
            events, stop = self.agent.steps.run(request.job_id, request.step_id, who.uid)
        except StepError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except PermissionError as e:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        context.add_callback(stop)  # airrun went away (Ctrl-C, a failed rank elsewhere): kill the ranks
        yield from events
