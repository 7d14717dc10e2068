"""HostileBroker: a fake broker that answers ApiVersions honestly and Metadata with whatever
body it is given (huge, or claiming more than any cluster has), for tests and benchmarks of
what a broken or hostile broker can do to the client.

It runs in threads of its own (a socket server), so it keeps answering while the client's
loop is busy, and works from sync code as well. Responses are encoded with the client's own
schemas (the generated writers of protocol/primitives.py): the point is their size and
shape, not a second reading of the protocol.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
from typing import Any

from aioproducer.protocol.messages import _RESPONSES, ApiKey
from aioproducer.protocol.primitives import compile_writer

METADATA_VERSION = 12  # the only one advertised: flexible, with topic ids


def _body(api_key: ApiKey, version: int, flexible: bool, value: dict[str, Any]) -> bytes:
    parts: list[bytes] = []
    compile_writer(_RESPONSES[api_key], version, flexible)(parts, value)
    return b"".join(parts)


def metadata_body(topics: int, partitions: int, replicas: int, port: int = 1) -> bytes:
    """A Metadata v12 response body: `topics` topics of `partitions` partitions (all called
    0), each with `replicas` replicas (all in the ISR) led by broker 1."""
    nodes = list(range(1, replicas + 1))
    # One partition, repeated (index 0 throughout): quick to build, as large to decode.
    partition_list = [{"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 0,
                       "replica_nodes": nodes, "isr_nodes": nodes,
                       "offline_replicas": []}] * partitions
    return _body(ApiKey.METADATA, METADATA_VERSION, True, {
        "throttle_time_ms": 0, "cluster_id": "hostile", "controller_id": 1,
        "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": port, "rack": None}],
        "topics": [{"error_code": 0, "name": f"t{t}", "topic_id": (t + 1).to_bytes(16),
                    "is_internal": False, "partitions": partition_list,
                    "topic_authorized_operations": 0} for t in range(topics)],
    })


def metadata_body_of_size(size: int, topics: int, replicas: int) -> bytes:
    """metadata_body() with as many partitions per topic as make about `size` bytes."""
    one = len(metadata_body(1, 1, replicas)) - len(metadata_body(1, 0, replicas))
    return metadata_body(topics, max(1, size // (one * topics)), replicas)


class HostileBroker:
    """`with HostileBroker(metadata) as broker:` listens on 127.0.0.1:`broker.port`; every
    Metadata request gets `metadata` (a response body) as its answer."""

    def __init__(self, metadata: bytes) -> None:
        self.metadata = metadata
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler,
                                                       bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        self._server.server_bind()
        self._server.server_activate()
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "HostileBroker":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _serve(self, sock: socket.socket) -> None:
        stream = sock.makefile("rb")
        try:
            while True:
                head = stream.read(4)
                if len(head) < 4:
                    return
                frame = stream.read(struct.unpack(">i", head)[0])
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
                if api_key == ApiKey.API_VERSIONS:
                    body = _body(ApiKey.API_VERSIONS, version, version >= 3, {
                        "error_code": 0, "throttle_time_ms": 0, "api_keys": [
                            {"api_key": ApiKey.API_VERSIONS, "min_version": 0,
                             "max_version": 3},
                            {"api_key": ApiKey.METADATA, "min_version": METADATA_VERSION,
                             "max_version": METADATA_VERSION}]})
                    header = struct.pack(">i", correlation_id)  # ApiVersions: header v0
                elif api_key == ApiKey.METADATA:
                    body = self.metadata
                    header = struct.pack(">i", correlation_id) + b"\x00"  # header v1
                else:
                    return  # anything else: hang up
                sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        except OSError:
            return
        finally:
            stream.close()
