"""kvstash.errors: the wire status codes (protocol/SPEC.md, section 4) and the exceptions.

One exception type, Error, carries a wire code, its name and a message. ConnectionLost, a
subclass of both Error and the built-in ConnectionError, means the connection is gone (the
daemon closed it, died, or stopped answering): the Client that raised it is unusable and
raises it again on every later call. This module knows nothing of sockets or msgpack.
"""

OK = 0
NOT_FOUND = 1
EXISTS = 2
BUSY = 3
NO_SPACE = 4
TOO_LARGE = 5
INVALID_ARGUMENT = 6
METHOD_NOT_FOUND = 7
PROTOCOL_ERROR = 8
UNAUTHORIZED = 9
FORBIDDEN = 10
QUOTA_EXCEEDED = 11
CHECKSUM_MISMATCH = 12
TIMEOUT = 13
UNAVAILABLE = 14
UNSUPPORTED = 15
INTERNAL = 16

NAMES = {
    OK: "OK", NOT_FOUND: "NOT_FOUND", EXISTS: "EXISTS", BUSY: "BUSY", NO_SPACE: "NO_SPACE",
    TOO_LARGE: "TOO_LARGE", INVALID_ARGUMENT: "INVALID_ARGUMENT",
    METHOD_NOT_FOUND: "METHOD_NOT_FOUND", PROTOCOL_ERROR: "PROTOCOL_ERROR",
    UNAUTHORIZED: "UNAUTHORIZED", FORBIDDEN: "FORBIDDEN", QUOTA_EXCEEDED: "QUOTA_EXCEEDED",
    CHECKSUM_MISMATCH: "CHECKSUM_MISMATCH", TIMEOUT: "TIMEOUT", UNAVAILABLE: "UNAVAILABLE",
    UNSUPPORTED: "UNSUPPORTED", INTERNAL: "INTERNAL",
}


def code_name(code):
    """The wire name of a code ("NOT_FOUND"), or "CODE_<n>" for one this version does not know.
    A negative code (batch_get_into's -1) is named as its magnitude."""
    return NAMES.get(abs(code), f"CODE_{abs(code)}")


class Error(Exception):
    """A kvstash failure: code (int, the wire code), name (str, "NOT_FOUND") and message
    (str: the daemon's text, or the client's reason; for people, not for matching)."""

    def __init__(self, code, name=None, message=""):
        self.code = code
        self.name = name or code_name(code)
        self.message = message
        super().__init__(f"{self.name} ({code}): {message}" if message else
                         f"{self.name} ({code})")

    def __reduce__(self):
        return type(self), (self.code, self.name, self.message)


class ConnectionLost(Error, ConnectionError):
    """The connection is over; the Client is unusable (close it and make another).

    code is the daemon's, when it said why before closing (its error notification:
    PROTOCOL_ERROR, UNAVAILABLE for max_connections, TIMEOUT for idle_timeout,
    UNAUTHORIZED, ...); otherwise TIMEOUT (13) when the socket made no progress for the
    client's timeout, or UNAVAILABLE (14) when the connection failed (refused, reset,
    closed); errno then holds the system's errno when there was one."""

    def __init__(self, code, name=None, message="", errno=None):
        Error.__init__(self, code, name, message)
        self.errno = errno


def from_wire(triple):
    """An Error from the wire's [code, name, message] (shape checked, never trusted)."""
    try:
        code, name, message = triple
        code = int(code)
        name = str(name)
        message = message if isinstance(message, str) else repr(message)
    except (TypeError, ValueError):
        return Error(PROTOCOL_ERROR, None, f"malformed error from kvstashd: {triple!r}")
    return Error(code, name, message)
