"""gRPC handlers for airctld: decode, check the caller, call the controller, map errors to statuses."""
from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time

import grpc

from air.airctld.controller import Controller
from air.airctld.errors import RequestError
from air.airctld.events import TransitionError
from air.protos import air_pb2 as pb
from air.protos.states import NodeState

log = logging.getLogger("airctld")


class _Received:
    """A request as parsed, with the bytes it came in (what a caller's credential is bound to)."""
    __slots__ = ("message", "data")

    def __init__(self, message, data: bytes):
        self.message, self.data = message, data


def _received(message_type):
    """A deserializer that keeps the request's bytes beside the message (see _Received)."""
    def parse(data: bytes) -> _Received:
        return _Received(message_type.FromString(data), data)
    return parse


def _handle(fn):
    @functools.wraps(fn)
    def wrapper(self, request, context):
        began, code = time.perf_counter(), None
        me = threading.get_ident()
        self.c.rpcs_in_flight.add(me)   # (all workers busy: see Controller._inactive)
        data = None
        if isinstance(request, _Received):
            request, data = request.message, request.data
        try:
            who = self.auth.identify(context, f"/{self.SERVICE}/{fn.__name__}", request, self.target, data)
            try:
                reply = fn(self, request, context, who)
                code = grpc.StatusCode.OK
                return reply
            except RequestError as e:
                code = e.code
                context.abort(e.code, str(e))
            except TransitionError as e:
                code = grpc.StatusCode.FAILED_PRECONDITION
                context.abort(code, str(e))
            except sqlite3.Error as e:   # a read that failed (writes fail as StoreFailed, a RequestError)
                log.error("%s: the store failed: %s", fn.__name__, e)
                code = grpc.StatusCode.INTERNAL
                context.abort(code, f"the controller could not read its store: {e}")
        finally:
            self.c.rpcs_in_flight.discard(me)
            if code is None:   # the caller was refused, or an error of our own (gRPC answers UNKNOWN)
                code = getattr(context, "code", lambda: None)() or grpc.StatusCode.UNKNOWN
            self.c.metrics.rpc(fn.__name__, code.name, time.perf_counter() - began)
    return wrapper


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_job_list(encoded_jobs: list[bytes]) -> bytes:
    """A ListJobsReply on the wire, from jobs already encoded (field 1, length-delimited)."""
    return b"".join(b"\x0a" + _varint(len(e)) + e for e in encoded_jobs)


def encode_rows(rows: str) -> bytes:
    """A ListJobsReply with its rendered rows (field 2, length-delimited) on the wire: one copy of
    the rows (some MB for a large queue), where building the message and serializing it made three."""
    data = rows.encode()
    return b"\x12" + _varint(len(data)) + data if data else b""


class ControllerService:
    SERVICE = "air.v1.Controller"

    def __init__(self, controller: Controller, auth):
        self.c = controller
        self.auth = auth
        self.target = controller.config.controller.address   # what credentials must be made for

    @_handle
    def Submit(self, request: pb.SubmitRequest, context, who):
        job_id, message = self.c.submit(request.job, who, test_only=request.test_only)
        return pb.SubmitReply(job_id=job_id, message=message)

    @_handle
    def Cancel(self, request: pb.CancelRequest, context, who):
        return pb.CancelReply(job_ids=self.c.cancel(request.filter, request.signal, who, request.batch_only,
                                                    request.steps_only, request.release))

    @_handle
    def KeepAlive(self, request: pb.JobFilter, context, who):
        return pb.KeepAliveReply(job_ids=self.c.keep_alive(request, who),
                                 inactive_limit_s=self.c.config.controller.inactive_limit_s)

    @_handle
    def Requeue(self, request: pb.JobFilter, context, who):
        return pb.CancelReply(job_ids=self.c.requeue(request, who))

    @_handle
    def UpdateJob(self, request: pb.UpdateJobRequest, context, who):
        return pb.CancelReply(job_ids=self.c.update_time_limit(request.filter, request.time_limit_s,
                                                               request.time_limit_change, who))

    @_handle
    def Hold(self, request: pb.HoldRequest, context, who):
        return pb.CancelReply(job_ids=self.c.hold(request.filter, request.hold, who))

    @_handle
    def ListJobs(self, request: pb.JobFilter, context, who):
        """Encoded here: the jobs from their kept encodings, or their kept rows (plain airq)."""
        if request.rendered:
            return encode_rows(self.c.list_rows(request, who))
        return encode_job_list(self.c.list_jobs(request, who))

    @_handle
    def GetJob(self, request: pb.GetJobRequest, context, who):
        return self.c.job_view(request.job_id, who)

    @_handle
    def Reports(self, request: pb.ReportsRequest, context, who):
        return pb.ReportsReply(reports=self.c.job_reports(request.job_id, who))

    @_handle
    def History(self, request: pb.HistoryRequest, context, who):
        return self.c.history(request, who)

    @_handle
    def ListNodes(self, request, context, who):
        parts = [pb.Partition(name=p.name, nodes=p.nodes, default=p.default, up=p.up,
                              max_time_s=p.max_time_s, default_time_s=p.default_time_s)
                 for p in self.c.config.partitions]
        return pb.ListNodesReply(nodes=self.c.node_views(), partitions=parts)

    @_handle
    def CreateStep(self, request: pb.StepSpec, context, who):
        try:
            return self.c.create_step(request, who)
        except grpc.RpcError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"a node of the step did not answer: {e.details()}")

    @_handle
    def EndStep(self, request: pb.StepEnd, context, who):
        return pb.CancelReply(job_ids=[request.job_id] if self.c.end_step(request, who) else [])

    @_handle
    def UpdateNode(self, request: pb.UpdateNodeRequest, context, who):
        self.c.update_node(request.name, NodeState(request.state), request.reason, who)
        return self.GetNode.__wrapped__(self, pb.GetNodeRequest(name=request.name), context, who)

    @_handle
    def InjectFault(self, request: pb.FaultRequest, context, who):
        try:
            self.c.inject_fault(request, who)
        except grpc.RpcError as e:
            context.abort(e.code(), e.details())
        return pb.FaultReply()

    @_handle
    def Pending(self, request: pb.JobFilter, context, who):
        return pb.PendingReply(jobs=self.c.pending_views(request, who))

    @_handle
    def Shares(self, request: pb.SharesRequest, context, who):
        return pb.SharesReply(rows=self.c.share_rows(request))

    @_handle
    def UpdateAccount(self, request: pb.AccountRequest, context, who):
        self.c.update_account(request, who)
        return pb.SharesReply(rows=self.c.share_rows(pb.SharesRequest()))

    @_handle
    def GetNode(self, request: pb.GetNodeRequest, context, who):
        for node in self.c.node_views():
            if node.name == request.name:
                return node
        context.abort(grpc.StatusCode.NOT_FOUND, f"node {request.name} does not exist")


class RegistryService:
    SERVICE = "air.v1.NodeRegistry"

    def __init__(self, controller: Controller, auth):
        self.c = controller
        self.auth = auth
        self.target = controller.config.controller.address
        self.service_uid = controller.config.controller.service_uid()

    def _daemon_only(self, context, who) -> None:
        if not who.is_root and who.uid != self.service_uid:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"only node daemons (root) may call this; the caller is uid {who.uid}")

    @_handle
    def Register(self, request: pb.RegisterRequest, context, who):
        self._daemon_only(context, who)
        self.c.register(request.node)
        return pb.RegisterReply(heartbeat_interval_s=self.c.config.controller.heartbeat_interval_s)

    @_handle
    def Heartbeat(self, request: pb.HeartbeatRequest, context, who):
        self._daemon_only(context, who)
        return self.c.heartbeat(request)


def _identity(x):
    return x


def handlers(controller: Controller, auth) -> list[grpc.GenericRpcHandler]:
    """Both services, with ListJobs answering from pre-encoded jobs."""
    cs, rs = ControllerService(controller, auth), RegistryService(controller, auth)
    unary = grpc.unary_unary_rpc_method_handler
    controller_methods = {
        "Submit": unary(cs.Submit, _received(pb.SubmitRequest), pb.SubmitReply.SerializeToString),
        "Cancel": unary(cs.Cancel, _received(pb.CancelRequest), pb.CancelReply.SerializeToString),
        "Requeue": unary(cs.Requeue, _received(pb.JobFilter), pb.CancelReply.SerializeToString),
        "Hold": unary(cs.Hold, _received(pb.HoldRequest), pb.CancelReply.SerializeToString),
        "UpdateJob": unary(cs.UpdateJob, _received(pb.UpdateJobRequest), pb.CancelReply.SerializeToString),
        "ListJobs": unary(cs.ListJobs, _received(pb.JobFilter), _identity),
        "GetJob": unary(cs.GetJob, _received(pb.GetJobRequest), pb.Job.SerializeToString),
        "ListNodes": unary(cs.ListNodes, _received(pb.ListNodesRequest), pb.ListNodesReply.SerializeToString),
        "CreateStep": unary(cs.CreateStep, _received(pb.StepSpec), pb.Step.SerializeToString),
        "EndStep": unary(cs.EndStep, _received(pb.StepEnd), pb.CancelReply.SerializeToString),
        "KeepAlive": unary(cs.KeepAlive, _received(pb.JobFilter), pb.KeepAliveReply.SerializeToString),
        "UpdateNode": unary(cs.UpdateNode, _received(pb.UpdateNodeRequest), pb.Node.SerializeToString),
        "InjectFault": unary(cs.InjectFault, _received(pb.FaultRequest), pb.FaultReply.SerializeToString),
        "GetNode": unary(cs.GetNode, _received(pb.GetNodeRequest), pb.Node.SerializeToString),
        "Reports": unary(cs.Reports, _received(pb.ReportsRequest), pb.ReportsReply.SerializeToString),
        "History": unary(cs.History, _received(pb.HistoryRequest), pb.HistoryReply.SerializeToString),
        "Pending": unary(cs.Pending, _received(pb.JobFilter), pb.PendingReply.SerializeToString),
        "Shares": unary(cs.Shares, _received(pb.SharesRequest), pb.SharesReply.SerializeToString),
        "UpdateAccount": unary(cs.UpdateAccount, _received(pb.AccountRequest), pb.SharesReply.SerializeToString),
    }
    registry_methods = {
        "Register": unary(rs.Register, _received(pb.RegisterRequest), pb.RegisterReply.SerializeToString),
        "Heartbeat": unary(rs.Heartbeat, _received(pb.HeartbeatRequest), pb.HeartbeatReply.SerializeToString),
    }
    return [grpc.method_handlers_generic_handler("air.v1.Controller", controller_methods),
            grpc.method_handlers_generic_handler("air.v1.NodeRegistry", registry_methods)]
