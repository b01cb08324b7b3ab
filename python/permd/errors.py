"""Exceptions of the permd package: one class per PERMD_E* code, each also a familiar builtin."""


class PermdError(Exception):
    """A failure reported by libpermd or the daemon; .code is the PERMD_E* number."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class NotFound(PermdError, KeyError):
    def __str__(self):  # KeyError would quote the message
        return self.args[0]


class Conflict(PermdError, ValueError):
    pass


class InvalidArgument(PermdError, ValueError):
    pass


class OutOfRange(PermdError, IndexError):
    pass


ERANGE = -2  # PERMD_ERANGE: OutOfRange's code


class Unauthenticated(PermdError, PermissionError):
    pass


class Overloaded(PermdError):
    pass


class ConnectionFailed(PermdError, ConnectionError):
    pass


class Timeout(PermdError, TimeoutError):
    pass


class OutOfMemory(PermdError, MemoryError):
    pass


class ProtocolError(PermdError, ConnectionError):
    """The peer sent what is not permd's protocol (not a permd, or a damaged stream)."""


class Unsupported(PermdError, NotImplementedError):
    """The server does not know the request (an older permd)."""


class ServerError(PermdError, RuntimeError):
    """A failure inside the server (INTERNAL)."""


class Unavailable(PermdError, RuntimeError):
    """No GPU or NCCL where the request needs one, or a delivery group that lost a member."""


class NoProcessGroup(RuntimeError, ValueError):
    """No world given and no torch.distributed process group to take it from. torch's DistributedSampler
    raises a RuntimeError there (torch 1.x; a ValueError in torch 2.x): this is both, so that `except
    RuntimeError:` fallbacks written for torch and `except ValueError:` written for permd both catch it."""


_BY_CODE = {-1: InvalidArgument, -2: OutOfRange, -3: OutOfMemory, -4: InvalidArgument, -5: ConnectionFailed,
            -6: ProtocolError, -7: NotFound, -8: Conflict, -9: Unauthenticated, -10: Overloaded, -11: InvalidArgument,
            -12: Unsupported, -13: ConnectionFailed, -14: Timeout, -15: ServerError, -16: Unavailable}


def raise_for(code, what, message):
    raise _BY_CODE.get(code, PermdError)(code, f"{what}: {message}")
