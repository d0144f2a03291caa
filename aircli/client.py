"""The tools' connection to airctld, and the one-line error every failure becomes."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:   # (the generated code is imported when a Client is made, not by every command's start;
    import click    # click when a command is run through it: airbatch's common forms never load it)

    from air.protos import air_pb2 as pb


class CliError(Exception):
    """A failure the user sees as one line on stderr, with a non-zero exit; `status`: the gRPC status
    name when the controller answered so (UNAVAILABLE: it could not be reached)."""

    def __init__(self, message: str, status: str = ""):
        super().__init__(message)
        self.message = message
        self.status = status

    def format_message(self) -> str:
        return self.message


def bad_value(option: str, message: str) -> CliError:
    """A value an option cannot take, told as click's BadParameter tells it."""
    return CliError(f"Invalid value for {option}: {message}")


def run(command: click.Command, prog: str, argv: list[str] | None = None) -> int:
    """Run a click command, turning every failure into `prog: error: message` and exit 1."""
    return plain(lambda: _click_main(command, prog, argv), prog)


def start_tool(prog: str, argv: list[str], options: dict, command: Callable[[], click.Command],
               call: Callable[[dict], int], script: bool = False, positional: str | None = None) -> int:
    """A tool on argv: read by aircli.argv from the tool's `options` where it can, and call(params); else
    by click (`command()` makes the tool's click command, loading click, only then)."""
    from air.aircli.argv import completing, read
    params = None if completing(prog, os.environ) else read(argv, options, script, positional)
    if params is None:
        return run(command(), prog, argv)
    return plain(lambda: call(params), prog)


def click_options(rows) -> list[click.Option]:
    """click's options for a tool's rows of (names, parameter name, takes a value, help; None: hidden)."""
    import click
    return [click.Option([*names, name], is_flag=not takes_value, default=None if takes_value else False,
                         help=text, hidden=text is None) for names, name, takes_value, text in rows]


def _click_main(command: click.Command, prog: str, argv: list[str] | None) -> int:
    import click
    try:   # without standalone mode, click returns an Exit's code instead of raising it
        code = command.main(args=argv, prog_name=prog, standalone_mode=False)
        return code if isinstance(code, int) and not isinstance(code, bool) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.Abort:
        return 130
    except click.ClickException as e:
        raise CliError(e.format_message()) from None


def plain(call: Callable[[], int], prog: str) -> int:
    """call()'s exit code, every CliError made `prog: error: message` and exit 1."""
    try:
        return call()
    except CliError as e:
        print(f"{prog}: error: {_one_line(e.format_message())}", file=sys.stderr)
        return 1
    except BrokenPipeError:   # (a reader gone: exit 1 as click does, and no second error at exit's flush)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except (KeyboardInterrupt, EOFError):   # (as click's Abort: a new line after the terminal's ^C)
        print(file=sys.stderr)
        return 130


def _one_line(text: str) -> str:
    return " ".join(text.split())


def entry(command: click.Command, prog: str) -> Callable[[], None]:
    def main() -> None:
        sys.exit(run(command, prog))
    return main


class Client:
    """The Controller service at the configured address: one typed method per RPC (signed with the
    caller's credential, sent over aircli.wire), every failure a CliError."""

    def __init__(self, config_path: str | None = None):
        from air.protos import config as configuration
        from air.aircli.wire import Channel
        try:
            self.config = configuration.load(config_path)
        except configuration.ConfigError as e:
            raise CliError(str(e)) from None
        self.address = self.config.controller.address
        self._auth = self.config.controller.authenticator()
        self._channel = Channel(self.address, self.config.controller.max_message_bytes)

    def submit(self, request: pb.SubmitRequest, timeout: float = 30.0) -> pb.SubmitReply:
        return self._call("Submit", request, timeout)

    def submit_fields(self, request: dict, timeout: float = 30.0) -> dict:
        """Submit, without importing protobuf: a SubmitRequest and its reply as protos.protowire's
        dicts (protos.schemas.SubmitRequest and SubmitReply)."""
        return self._call_fields("Submit", request, timeout)

    def list_jobs_fields(self, request: dict, timeout: float = 30.0,
                         as_sent: frozenset[str] = frozenset()) -> dict:
        """ListJobs, without importing protobuf: a JobFilter as protos.protowire's dict, the reply as one
        (its jobs left as their bytes; `as_sent`: see protowire.decode)."""
        return self._call_fields("ListJobs", request, timeout, as_sent)

    def cancel(self, request: pb.CancelRequest, timeout: float = 30.0) -> pb.CancelReply:
        return self._call("Cancel", request, timeout)

    def cancel_fields(self, request: dict, timeout: float = 30.0) -> dict:
        """Cancel, without importing protobuf: a CancelRequest and its reply as protos.protowire's dicts."""
        return self._call_fields("Cancel", request, timeout)

    def hold(self, request: pb.HoldRequest, timeout: float = 30.0) -> pb.CancelReply:
        return self._call("Hold", request, timeout)

    def requeue(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.CancelReply:
        return self._call("Requeue", request, timeout)

    def update_job(self, request: pb.UpdateJobRequest, timeout: float = 30.0) -> pb.CancelReply:
        return self._call("UpdateJob", request, timeout)

    def list_jobs(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.ListJobsReply:
        return self._call("ListJobs", request, timeout)

    def get_job(self, request: pb.GetJobRequest, timeout: float = 30.0) -> pb.Job:
        return self._call("GetJob", request, timeout)

    def list_nodes(self, request: pb.ListNodesRequest, timeout: float = 30.0) -> pb.ListNodesReply:
        return self._call("ListNodes", request, timeout)

    def get_node(self, request: pb.GetNodeRequest, timeout: float = 30.0) -> pb.Node:
        return self._call("GetNode", request, timeout)

    def create_step(self, request: pb.StepSpec, timeout: float = 30.0) -> pb.Step:
        return self._call("CreateStep", request, timeout)

    def end_step(self, request: pb.StepEnd, timeout: float = 30.0) -> pb.CancelReply:
        return self._call("EndStep", request, timeout)

    def keep_alive(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.KeepAliveReply:
        return self._call("KeepAlive", request, timeout)

    def update_node(self, request: pb.UpdateNodeRequest, timeout: float = 30.0) -> pb.Node:
        return self._call("UpdateNode", request, timeout)

    def inject_fault(self, request: pb.FaultRequest, timeout: float = 30.0) -> pb.FaultReply:
        return self._call("InjectFault", request, timeout)

    def pending(self, request: pb.JobFilter, timeout: float = 30.0) -> pb.PendingReply:
        return self._call("Pending", request, timeout)

    def shares(self, request: pb.SharesRequest, timeout: float = 30.0) -> pb.SharesReply:
        return self._call("Shares", request, timeout)

    def update_account(self, request: pb.AccountRequest, timeout: float = 30.0) -> pb.SharesReply:
        return self._call("UpdateAccount", request, timeout)

    def reports(self, request: pb.ReportsRequest, timeout: float = 30.0) -> pb.ReportsReply:
        return self._call("Reports", request, timeout)

    def history(self, request: pb.HistoryRequest, timeout: float = 30.0) -> pb.HistoryReply:
        return self._call("History", request, timeout)

    def _call(self, name: str, request, timeout: float):
        from air.protos import air_pb2
        rpc = air_pb2.DESCRIPTOR.services_by_name["Controller"].methods_by_name[name]   # (a name it lacks: KeyError)
        if request.DESCRIPTOR is not rpc.input_type:
            raise TypeError(f"{name} takes a {rpc.input_type.name}, not a {request.DESCRIPTOR.name}")
        from air.protos.credential import request_bytes
        reply = self._send(f"/{rpc.containing_service.full_name}/{rpc.name}", request_bytes(request), timeout)
        reply_type = getattr(air_pb2, rpc.output_type.name)
        try:
            return reply_type.FromString(reply)
        except Exception:   # (a DecodeError: a reply that is not the message it should be)
            raise CliError(f"airctld at {self.address} sent a reply that is not a {reply_type.__name__}",
                           "INTERNAL") from None

    def _call_fields(self, name: str, request: dict, timeout: float,
                     as_sent: frozenset[str] = frozenset()) -> dict:
        from air.protos import protowire, schemas
        request_schema, reply_schema = schemas.RPCS[name]
        try:
            data = protowire.encode(request_schema, request)
        except ValueError as e:   # (a value its field cannot hold: the options bound those they take)
            raise CliError(f"cannot send this request: {e}") from None
        reply = self._send(f"/{schemas.SERVICE}/{name}", data, timeout)
        try:
            return protowire.decode(reply_schema, reply, as_sent)
        except protowire.DecodeError:
            raise CliError(f"airctld at {self.address} sent a reply that is not a {reply_schema.name}",
                           "INTERNAL") from None

    def _send(self, method: str, data: bytes, timeout: float) -> memoryview:
        """The reply's bytes to a request's (signed: the credential is bound to the bytes sent)."""
        from air.aircli.wire import WireError
        from air.protos.credential import CredentialError
        try:
            metadata = self._auth.metadata(method, self.address, data)
            return self._channel.call(method, data, metadata, timeout)
        except CredentialError as e:
            raise CliError(str(e)) from None
        except WireError as e:
            if e.maybe_done:   # (a retry by hand could do it twice)
                what = {"UNAVAILABLE": "went away before it answered",
                        "DEADLINE_EXCEEDED": f"did not answer within {timeout:g} s"}.get(e.code, "broke off its answer")
                raise CliError(f"airctld at {self.address} {what}; the request may have been carried out: look "
                               f"before you repeat it ({_one_line(e.details)})",
                               "UNAVAILABLE" if e.code == "DEADLINE_EXCEEDED" else e.code) from None
            if e.code == "UNAVAILABLE":
                raise CliError(f"cannot reach airctld at {self.address}: is it running? "
                               f"({_one_line(e.details or 'unavailable')})", "UNAVAILABLE") from None
            if e.code == "DEADLINE_EXCEEDED":
                raise CliError(f"airctld at {self.address} did not answer within {timeout:g} s",
                               "UNAVAILABLE") from None
            raise CliError(e.details or e.code, e.code) from None
