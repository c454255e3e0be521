"""Length-prefixed JSON messages over a stream socket.

A message is a 4-byte big-endian length ``n`` (at most :data:`MAX_MESSAGE`) followed by ``n``
bytes of UTF-8 JSON holding an object. Anything else (oversized, truncated, not JSON, not an
object) raises :class:`ProtocolError`; the peer is then dropped, never trusted.
"""

import json
import struct

__all__ = ["ProtocolError", "send_message", "recv_message", "MAX_MESSAGE"]

MAX_MESSAGE = 64 << 20


class ProtocolError(Exception):
    """A malformed or unexpected message."""


def send_message(sock, obj):
    data = json.dumps(obj).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock, n):
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ProtocolError(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_message(sock):
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_MESSAGE:
        raise ProtocolError(f"message length {n} exceeds {MAX_MESSAGE}")
    try:
        obj = json.loads(_recv_exact(sock, n).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a JSON object")
    return obj
