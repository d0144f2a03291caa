"""Calls from airctld to node daemons (the NodeAgent service), one channel per node."""
from __future__ import annotations

import threading

import grpc

from air.protos.config import Config
from air.protos import air_pb2 as pb
from air.protos import air_pb2_grpc as rpc
from air.protos.credential import signed

CALL_TIMEOUT_S = 10.0
SIGNAL_WAIT_S = 5.0   # a stop, for a daemon that restarts


class NodeClients:
    def __init__(self, config: Config, auth=None):
        self.auth = auth or config.controller.authenticator()
        self._max = config.controller.max_message_bytes
        self._stubs: dict[str, rpc.NodeAgentStub] = {}
        self._names = {n.endpoint: n.name for n in config.nodes}   # credentials are made for a node by name
        self._lock = threading.Lock()

    def _stub(self, address: str) -> rpc.NodeAgentStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = grpc.insecure_channel(address, options=[
                    ("grpc.max_send_message_length", self._max),
                    ("grpc.max_receive_message_length", self._max)])
                channel = signed(channel, self.auth, self._names.get(address, address))
                stub = self._stubs[address] = rpc.NodeAgentStub(channel)
            return stub

    def launch(self, address: str, job: pb.Job) -> None:
        self._stub(address).Launch(pb.LaunchRequest(job=job, batch=True), timeout=CALL_TIMEOUT_S)

    def prepare_step(self, address: str, step: pb.Step) -> pb.PrepareStepReply:
        return self._stub(address).PrepareStep(step, timeout=CALL_TIMEOUT_S)

    def inject_fault(self, address: str, fault: pb.FaultRequest) -> None:
        self._stub(address).InjectFault(fault, timeout=CALL_TIMEOUT_S)

    def signal(self, address: str, job_id: int, run: int, signal: int, grace_s: float, batch_only: bool = False,
               reason: str = "", steps_only: bool = False) -> bool:
        reply = self._stub(address).Signal(pb.SignalRequest(job_id=job_id, run=run, signal=signal, grace_s=grace_s,
                                                            batch_only=batch_only, reason=reason,
                                                            steps_only=steps_only and signal != 0),
                                           # a daemon that restarts is back within seconds: a stop waits for it
                                           # a little (a dead node must not hold the controller's action
                                           # threads; the stops it missed go again when it registers), a
                                           # user's signal, sent once, as long as any call
                                           timeout=SIGNAL_WAIT_S if signal == 0 else CALL_TIMEOUT_S,
                                           wait_for_ready=True)
        return reply.found
