"""One request at a time on a plain socket, encoded and decoded by kafka-python's protocol
classes (generated from Apache Kafka's JSON schemas, tagged fields included): a reading of the
wire that is neither ours nor librdkafka's."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka.record import MemoryRecordsBuilder


def call(address: str, request: Any, version: int, timeout: float = 10) -> Any:
    """Send `request` at `version` to `address` ("host:port") and return kafka-python's
    decoded response."""
    host, port = address.rsplit(":", 1)
    request.with_header(correlation_id=1, client_id="raw")
    frame = request.encode(version=version, header=True, framed=True)
    response_class = _response_class(type(request))
    with socket.create_connection((host, int(port)), timeout) as sock:
        sock.sendall(frame)
        (size,) = struct.unpack(">i", _read(sock, 4))
        data = _read(sock, size)
    return response_class.decode(data, version=version, header=True)


def _response_class(request_class: Any) -> Any:
    import importlib
    module = importlib.import_module(request_class.__module__)
    return getattr(module, request_class.__name__.replace("Request", "Response"))


def _read(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def record_batch(*values: bytes) -> bytes:
    """A RecordBatch v2 of these values, built by kafka-python."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for value in values:
        builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())
