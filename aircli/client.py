"""The tools' connection to airctld, and the one-line error every failure becomes."""
from __future__ import annotations

import sys
from typing import Callable

import click


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
    """A Controller stub bound to the configured address, with errors mapped to CliError."""

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

    def call(self, method: str, request, timeout: float = 30.0):
        from air.protos.credential import CredentialError
        grpc = self._grpc
        try:
            return getattr(self._stub, method)(request, timeout=timeout)
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
