"""Requests on a plain socket, encoded and decoded by kafka-python's protocol classes
(generated from Apache Kafka's JSON schemas, tagged fields included): a reading of the wire
that is neither ours nor librdkafka's."""

from __future__ import annotations

import importlib
import socket
import struct
from typing import Any

from kafka.record import MemoryRecordsBuilder


class RawConnection:
    """One connection, one request at a time."""

    def __init__(self, address: str, timeout: float = 10) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout)
        self._correlation_id = 0

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, request: Any, version: int) -> Any:
        """Send `request` at `version`; return kafka-python's decoding of the response."""
        self._correlation_id += 1
        request.with_header(correlation_id=self._correlation_id, client_id="raw")
        self.sock.sendall(request.encode(version=version, header=True, framed=True))
        module = importlib.import_module(type(request).__module__)
        response_class = getattr(module, type(request).__name__.replace("Request", "Response"))
        return response_class.decode(self.frame(), version=version, header=True)

    def frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._read(4))
        return self._read(size)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def _read(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)


def call(address: str, request: Any, version: int) -> Any:
    """One request on a connection of its own."""
    with RawConnection(address) as connection:
        return connection.request(request, version)


def record_batch(*values: bytes) -> bytes:
    """A RecordBatch v2 of these values, built by kafka-python."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for value in values:
        builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())
