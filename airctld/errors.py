"""Request errors, each with its own gRPC status; the service maps them, the messages reach users."""
import grpc


class RequestError(Exception):
    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidRequest(RequestError):
    """Bad input, or a request that could never be satisfied."""


class NotFound(RequestError):
    code = grpc.StatusCode.NOT_FOUND


class Denied(RequestError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Conflict(RequestError):
    """The request is valid, but not in the object's current state."""
    code = grpc.StatusCode.FAILED_PRECONDITION


class Overtaken(RequestError):
    """A message that a newer one of the same sender has overtaken: it says nothing now."""
    code = grpc.StatusCode.ABORTED


class StoreFailed(RequestError):
    """The store could not write (disk full, I/O error): the change was rolled back whole."""
    code = grpc.StatusCode.INTERNAL
