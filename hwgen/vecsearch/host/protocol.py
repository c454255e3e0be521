"""Length-prefixed messages over a stream socket: JSON objects, binary arrays, packed searches.

A message is a 4-byte big-endian length ``n`` (at most :data:`MAX_MESSAGE`) followed by ``n``
bytes of body, which holds an object (a mapping of field names to values) in one of three forms:

* **JSON**: UTF-8 JSON text of the object (control messages, errors, and clients that send
  nested integer lists);
* **binary**: :data:`BINARY_MAGIC` then the object in the safetensors format (a documented,
  code-free layout: an 8-byte little-endian header length, a JSON header naming each array's
  dtype, shape and byte range, then the raw little-endian array bytes), parsed by the
  `safetensors` library. Every numpy array of the object is one tensor; every other field is
  JSON text in the header's ``__metadata__``. A search of one 576-dimension int8 query is about
  0.7 KB instead of about 2.5 KB of JSON, and neither side converts integers to text and back;
* **packed search**: a search request or its result as fixed little-endian records, no
  header to parse (:data:`SEARCH_MAGIC` / :data:`RESULT_MAGIC`, laid out below). The
  coordinator's searches and the node's answers to them travel this way: a search follows a
  75 ms LM step or a multi-millisecond node search, and code that runs after such a wait runs
  about ten times slower than when warm (measured on the 2-core machine after a 10 ms pause:
  the safetensors decoding of a one-query result 234 us against 26 us warm, ``json.loads`` of
  its header alone 105 us, a ``struct`` record 24 us), so the fewer steps a search takes the
  less the transport costs.

  A search request is ``SEARCH_MAGIC``, then ``<IIII4s``: ``q``, ``dim``, ``nprobe``, ``k``
  and the two arrays' types as numpy writes them without the byte order (``i1`` ... ``i8``,
  ``u1`` ... ``u8``; queries, then probes), then the queries ``(q, dim)`` and the probes
  ``(q, nprobe)``, little-endian. A result is ``RESULT_MAGIC``,
  then ``<IIQQ``: ``q``, ``k``, ``search_us``, ``handled_us``, then the distances and the ids,
  each ``(q, k)`` int64. Both decode to the same objects as the other forms (a request as a
  :class:`PackedSearch`, so that the node answers it packed).

:func:`encode_search` writes a packed request; :func:`encode_message` writes a
:class:`PackedResult` packed, an object holding an array in the binary form, anything else as
JSON; :func:`decode_message` reads all three. Anything else raises :class:`ProtocolError`, whose
``kind`` says what was wrong and whose ``fatal`` says whether the stream can still be read:

``too_large`` (fatal)
    the length prefix exceeds the limit: the body is not read, so the stream cannot be
    resynchronised;
``framing`` (fatal)
    the peer closed the connection in the middle of a message;
``timeout`` (fatal)
    a message started but did not complete within the time allowed;
``json`` (not fatal)
    the body was read in full but is not a UTF-8 JSON object (invalid UTF-8, invalid JSON,
    nesting too deep for the parser, an integer literal too long to convert, or a value that
    is not an object). The next message can be read.
``binary`` (not fatal)
    the body starts with :data:`BINARY_MAGIC` but is not a valid safetensors object (header
    or array bytes inconsistent, metadata not JSON, a field both an array and metadata), or
    with :data:`SEARCH_MAGIC` or :data:`RESULT_MAGIC` but its length or a type does not match
    its record. The next message can be read.

Higher layers (:mod:`hwgen.vecsearch.host.node_server`) add kinds of their own for valid
messages that are bad requests. :func:`error_reply` is the form every error answer takes on the
wire: ``{"error": "<text>", "kind": "<kind>"}``.
"""

import json
import socket
import struct
import sys
import time

import numpy as np

__all__ = ["ProtocolError", "send_message", "recv_message", "recv_exact", "encode_message",
           "decode_message", "error_reply", "encode_search", "encode_result", "PackedSearch",
           "PackedResult",
           "MAX_MESSAGE", "HEADER", "BINARY_MAGIC", "SEARCH_MAGIC", "RESULT_MAGIC"]

MAX_MESSAGE = 64 << 20
HEADER = 4                   #: bytes of the length prefix
BINARY_MAGIC = b"HWST"       #: first bytes of a binary body (never the start of JSON text)
SEARCH_MAGIC = b"HWSQ"       #: first bytes of a packed search request
RESULT_MAGIC = b"HWSR"       #: first bytes of a packed search result
_SEARCH = struct.Struct("<IIII4s")
_RESULT = struct.Struct("<IIQQ")
_INT_TYPES = frozenset(k + n for k in ("i", "u") for n in "1248")
_MAX_ERROR_TEXT = 300        #: error texts on the wire are cut to this many characters


class ProtocolError(Exception):
    """A malformed or unexpected message.

    ``kind`` names the problem (see the module docstring); ``fatal`` is true when the byte
    stream can no longer be trusted to be at a message boundary, so the connection must close.
    """

    def __init__(self, message, kind="bad_request", fatal=False):
        super().__init__(message)
        self.kind = kind
        self.fatal = fatal


def error_reply(message, kind):
    """The wire form of an error answer."""
    text = str(message)
    if len(text) > _MAX_ERROR_TEXT:
        text = text[:_MAX_ERROR_TEXT] + "..."
    return {"error": text, "kind": kind}


def _encode_binary(obj):
    """The binary body of ``obj``: its arrays as safetensors tensors, the rest as metadata."""
    from safetensors.numpy import save
    arrays = {k: np.ascontiguousarray(v) for k, v in obj.items() if isinstance(v, np.ndarray)}
    meta = {k: json.dumps(v, separators=(",", ":")) for k, v in obj.items()
            if not isinstance(v, np.ndarray)}
    return BINARY_MAGIC + save(arrays, metadata=meta or None)


def _decode_binary(body):
    """The object of a binary body (see the module docstring); a ``binary`` ProtocolError
    otherwise."""
    from safetensors import SafetensorError
    from safetensors.numpy import load
    raw = bytes(body[len(BINARY_MAGIC):])
    try:
        arrays = load(raw)
        (n,) = struct.unpack("<Q", raw[:8])
        meta = json.loads(raw[8:8 + n]).get("__metadata__") or {}
        fields = {k: json.loads(v) for k, v in meta.items()}
    except (SafetensorError, ValueError, TypeError, struct.error, RecursionError) as e:
        raise ProtocolError(f"not a valid binary message: {e}", "binary") from None
    if set(fields) & set(arrays):
        raise ProtocolError("a field is both an array and metadata", "binary")
    return {**fields, **arrays}


def encode_message(obj, max_size=MAX_MESSAGE):
    """The bytes of one message (length prefix included): packed for a
    :class:`PackedResult`, binary when ``obj`` holds a numpy array, JSON otherwise."""
    if isinstance(obj, PackedResult):
        data = _result_body(obj["distances"], obj["ids"], obj["search_us"],
                            obj.get("handled_us", 0))
    elif any(isinstance(v, np.ndarray) for v in obj.values()):
        data = _encode_binary(obj)
    else:
        data = json.dumps(obj, separators=(",", ":")).encode()
    return _framed(data, max_size)


def _framed(data, max_size=MAX_MESSAGE):
    """``data`` behind its length prefix; a ``too_large`` ProtocolError beyond ``max_size``."""
    if len(data) > max_size:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {max_size}", "too_large")
    return struct.pack(">I", len(data)) + data


def send_message(sock, obj):
    """Send ``obj`` as one length-prefixed message (:func:`encode_message`) on ``sock``."""
    sock.sendall(encode_message(obj))


def recv_exact(sock, n, deadline=None, got_before=0):
    """``n`` bytes from ``sock``; with ``deadline`` (a :func:`time.monotonic` value), raise a
    fatal ``timeout`` ProtocolError once it passes. A close before ``n`` bytes is a fatal
    ``framing`` error (``got_before`` bytes of the message were read by the caller already)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"message incomplete after the timeout ({got_before + got}"
                                    f" bytes received)", "timeout", fatal=True)
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except socket.timeout:
            if deadline is None:
                raise
            continue                              # the deadline check above raises
        if not chunk:
            raise ProtocolError(f"connection closed after {got_before + got} of "
                                f"{got_before + n} bytes", "framing", fatal=True)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def parse_header(header, max_size=MAX_MESSAGE):
    """The body length announced by a 4-byte header (fatal ``too_large`` beyond ``max_size``)."""
    (n,) = struct.unpack(">I", header)
    if n > max_size:
        raise ProtocolError(f"message length {n} exceeds {max_size}", "too_large", fatal=True)
    return n


class PackedSearch(dict):
    """A search request that arrived packed (:func:`encode_search`): answered packed."""


class PackedResult(dict):
    """A search result to send packed (``distances``, ``ids``, ``search_us``, ``handled_us``):
    :func:`encode_message` writes it with :func:`encode_result`."""


def encode_search(queries, probes, k):
    """The bytes of a packed search request (length prefix included) for integer arrays
    ``queries`` (q, dim) and ``probes`` (q, nprobe)."""
    queries, probes = _little(queries), _little(probes)
    types = (queries.dtype.str[1:] + probes.dtype.str[1:]).encode()
    return _framed(b"".join((SEARCH_MAGIC, _SEARCH.pack(*queries.shape, probes.shape[1], k,
                                                        types),
                             queries.tobytes(), probes.tobytes())))


def _little(a):
    """``a`` as a little-endian array (itself when it is one already, as almost always: the
    cheap test first, since every step of a search's path counts)."""
    order = a.dtype.byteorder
    if order == "|" or order == "<" or (order == "=" and sys.byteorder == "little"):
        return a
    return a.astype(a.dtype.newbyteorder("<"))


def encode_result(distances, ids, search_us, handled_us=0):
    """The bytes of a packed search result (length prefix included): int64 (q, k)
    ``distances`` and ``ids`` and the node's times in microseconds."""
    return _framed(_result_body(distances, ids, search_us, handled_us))


def _result_body(distances, ids, search_us, handled_us):
    q, k = distances.shape
    return b"".join((RESULT_MAGIC, _RESULT.pack(q, k, search_us, handled_us),
                     distances.astype("<i8", copy=False).tobytes(),
                     ids.astype("<i8", copy=False).tobytes()))


def _decode_search(body):
    try:
        q, dim, nprobe, k, types = _SEARCH.unpack_from(body, 4)
    except struct.error:
        raise ProtocolError("packed search shorter than its header", "binary") from None
    types = types.decode("latin-1")
    if types[:2] not in _INT_TYPES or types[2:] not in _INT_TYPES:
        raise ProtocolError(f"packed search types {types!r} are not integer types", "binary")
    qt, pt = np.dtype("<" + types[:2]), np.dtype("<" + types[2:])
    start = 4 + _SEARCH.size
    mid = start + q * dim * qt.itemsize
    if len(body) != mid + q * nprobe * pt.itemsize:
        raise ProtocolError(f"packed search of {len(body)} bytes does not hold {q} queries of "
                            f"{dim} and {q} x {nprobe} probes", "binary")
    return PackedSearch(op="search", k=k,
                        queries=np.frombuffer(body, qt, q * dim, start).reshape(q, dim),
                        probes=np.frombuffer(body, pt, q * nprobe, mid).reshape(q, nprobe))


def _decode_result(body):
    try:
        q, k, search_us, handled_us = _RESULT.unpack_from(body, 4)
    except struct.error:
        raise ProtocolError("packed result shorter than its header", "binary") from None
    start = 4 + _RESULT.size
    if len(body) != start + 16 * q * k:
        raise ProtocolError(f"packed result of {len(body)} bytes does not hold {q} x {k} "
                            f"results", "binary")
    both = np.frombuffer(body, "<i8", 2 * q * k, start).reshape(2, q, k)
    return {"distances": both[0], "ids": both[1], "search_us": search_us,
            "handled_us": handled_us}


def decode_message(body):
    """The object in a message body (JSON, binary or packed); a non-fatal ``json`` or
    ``binary`` ProtocolError otherwise."""
    magic = body[:4]
    if magic == SEARCH_MAGIC:
        return _decode_search(body)
    if magic == RESULT_MAGIC:
        return _decode_result(body)
    if magic == BINARY_MAGIC:
        return _decode_binary(body)
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProtocolError(f"not UTF-8: {e}", "json") from None
    except json.JSONDecodeError as e:
        raise ProtocolError(f"not JSON: {e}", "json") from None
    except RecursionError:
        raise ProtocolError("JSON nested too deeply", "json") from None
    except ValueError as e:           # e.g. an integer literal beyond Python's digit limit
        raise ProtocolError(f"not acceptable JSON: {e}", "json") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a message must be a JSON object", "json")
    return obj


def recv_message(sock, deadline=None, max_size=MAX_MESSAGE):
    """One message; the socket's own timeout applies unless ``deadline`` is given."""
    n = parse_header(recv_exact(sock, HEADER, deadline), max_size)
    return decode_message(recv_exact(sock, n, deadline, got_before=HEADER))
