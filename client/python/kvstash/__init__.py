"""kvstash: the Python client of kvstashd, the KV-cache daemon (docs/python.md).

Pure Python on msgpack (Debian python3-msgpack) and the standard library:

    import kvstash
    with kvstash.Client("unix:/run/kvstash/kvstashd.sock") as c:
        c.put(b"k", b"v")
        assert c.get(b"k") == b"v"

Client speaks every method of protocol/SPEC.md; Error (with code, name, message) is the
one exception type, ConnectionLost its subclass for a connection that is over.
"""

from .buffers import Buffer
from .client import Client
from .errors import (BUSY, CHECKSUM_MISMATCH, EXISTS, FORBIDDEN, INTERNAL, INVALID_ARGUMENT,
                     METHOD_NOT_FOUND, NO_SPACE, NOT_FOUND, OK, PROTOCOL_ERROR, QUOTA_EXCEEDED,
                     TIMEOUT, TOO_LARGE, UNAUTHORIZED, UNAVAILABLE, UNSUPPORTED, ConnectionLost,
                     Error, code_name)

__version__ = "0.1.0"

__all__ = [
    "Client", "Buffer", "Error", "ConnectionLost", "code_name", "OK", "NOT_FOUND", "EXISTS",
    "BUSY", "NO_SPACE", "TOO_LARGE", "INVALID_ARGUMENT", "METHOD_NOT_FOUND", "PROTOCOL_ERROR",
    "UNAUTHORIZED", "FORBIDDEN", "QUOTA_EXCEEDED", "CHECKSUM_MISMATCH", "TIMEOUT", "UNAVAILABLE",
    "UNSUPPORTED", "INTERNAL",
]
