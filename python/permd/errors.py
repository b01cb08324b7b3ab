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


_BY_CODE = {-1: InvalidArgument, -2: OutOfRange, -4: InvalidArgument, -5: ConnectionFailed, -7: NotFound,
            -8: Conflict, -9: Unauthenticated, -10: Overloaded, -11: InvalidArgument, -13: ConnectionFailed,
            -14: Timeout}


def raise_for(code, what, message):
    raise _BY_CODE.get(code, PermdError)(code, f"{what}: {message}")
