"""The tools' connection to airctld, and the one-line error every failure becomes."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

import click

if TYPE_CHECKING:   # (the generated code is imported when a Client is made, not by every command's start)
    from air.protos import air_pb2 as pb


class CliError(click.ClickException):
    """A failure the user sees as one line on stderr, with a non-zero exit; `status`: the gRPC status
    name when the controller answered so (UNAVAILABLE: it could not be reached)."""

    def __init__(self, message: str, status: str = ""):
        super().__init__(message)
        self.status = status


def run(command: click.Command, prog: str, argv: list[str] | None = None) -> int:
    """Run a click command, turning every failure into `prog: error: message` and exit 1."""
    try:   # without standalone mode, click returns an Exit's code instead of raising it
        code = command.main(args=argv, prog_name=prog, standalone_mode=False)
        return code if isinstance(code, int) and not isinstance(code, bool) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.Abort:
        return 130
    except click.ClickException as e:
        print(f"{prog}: error: {_one_line(e.format_message())}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


def _one_line(text: str) -> str:
    return " ".join(text.split())


def entry(command: click.Command, prog: str) -> Callable[[], None]:
    def main() -> None:
        sys.exit(run(command, prog))
    return main


class Client:
    """The Controller service at the configured address: one typed method per RPC (the generated stub's,
    with the credential attached), every failure a CliError."""

    def __init__(self, config_path: str | None = None):
        from air.protos import config as configuration
        import grpc
        from air.protos import air_pb2_grpc as rpc
        from air.protos.credential import signed
        try:
            self.config = configuration.load(config_path)
        except configuration.ConfigError as e:
            raise CliError(str(e)) from None
        self.address = self.config.controller.address
        limit = self.config.controller.max_message_bytes
        channel = grpc.insecure_channel(self.address, options=[
            ("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", -1)])
        self._auth = self.config.controller.authenticator()
        self._stub = rpc.ControllerStub(signed(channel, self._auth, self.address))
        self._grpc = grpc

    def submit(self, request: pb.SubmitRequest, timeout: float = 30.0) -> pb.SubmitReply:
        return self._call(self._stub.Submit, request, timeout)

    def cancel(self, request: pb.CancelRequest, timeout: float = 30.0) -> pb.CancelReply:
        return self._call(self._stub.Cancel, request, timeout)

    def hold(self, request: pb.HoldRequest, timeout: float = 30.0) -> pb.CancelReply:
        return self._call(self._stub.Hold, request, timeout)

    def requeue(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.CancelReply:
        return self._call(self._stub.Requeue, request, timeout)

    def update_job(self, request: pb.UpdateJobRequest, timeout: float = 30.0) -> pb.CancelReply:
        return self._call(self._stub.UpdateJob, request, timeout)

    def list_jobs(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.ListJobsReply:
        return self._call(self._stub.ListJobs, request, timeout)

    def get_job(self, request: pb.GetJobRequest, timeout: float = 30.0) -> pb.Job:
        return self._call(self._stub.GetJob, request, timeout)

    def list_nodes(self, request: pb.ListNodesRequest, timeout: float = 30.0) -> pb.ListNodesReply:
        return self._call(self._stub.ListNodes, request, timeout)

    def get_node(self, request: pb.GetNodeRequest, timeout: float = 30.0) -> pb.Node:
        return self._call(self._stub.GetNode, request, timeout)

    def create_step(self, request: pb.StepSpec, timeout: float = 30.0) -> pb.Step:
        return self._call(self._stub.CreateStep, request, timeout)

    def end_step(self, request: pb.StepEnd, timeout: float = 30.0) -> pb.CancelReply:
        return self._call(self._stub.EndStep, request, timeout)

    def keep_alive(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.KeepAliveReply:
        return self._call(self._stub.KeepAlive, request, timeout)

    def update_node(self, request: pb.UpdateNodeRequest, timeout: float = 30.0) -> pb.Node:
        return self._call(self._stub.UpdateNode, request, timeout)

    def inject_fault(self, request: pb.FaultRequest, timeout: float = 30.0) -> pb.FaultReply:
        return self._call(self._stub.InjectFault, request, timeout)

    def pending(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.PendingReply:
        return self._call(self._stub.Pending, request, timeout)

    def shares(self, request: pb.SharesRequest, timeout: float = 30.0) -> pb.SharesReply:
        return self._call(self._stub.Shares, request, timeout)

    def update_account(self, request: pb.AccountRequest, timeout: float = 30.0) -> pb.SharesReply:
        return self._call(self._stub.UpdateAccount, request, timeout)

    def reports(self, request: pb.ReportsRequest, timeout: float = 30.0) -> pb.ReportsReply:
        return self._call(self._stub.Reports, request, timeout)

    def history(self, request: pb.HistoryRequest, timeout: float = 30.0) -> pb.HistoryReply:
        return self._call(self._stub.History, request, timeout)

    def _call(self, method, request, timeout: float):
        from air.protos.credential import CredentialError
        grpc = self._grpc
        try:
            return method(request, timeout=timeout)
        except CredentialError as e:
            raise CliError(str(e)) from None
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise CliError(f"cannot reach airctld at {self.address}: is it running? "
                               f"({_one_line(e.details() or 'unavailable')})", "UNAVAILABLE") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise CliError(f"airctld at {self.address} did not answer within {timeout:g} s",
                               "UNAVAILABLE") from None
            raise CliError(e.details() or code.name, code.name) from None
