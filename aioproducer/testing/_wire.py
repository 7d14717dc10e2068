"""The broker's side of the wire, for SimulatedCluster: request decoders and response encoders.

The client's codecs (protocol/messages.py) go the other way and know no tagged fields. These
schemas are written apart from them, from Apache Kafka's JSON message definitions, so that a
test of the client against the cluster checks two readings of the protocol against each
other, not one against itself. They are read by a small interpreter: speed does not matter
here, since record batches pass through as opaque bytes.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from ..protocol.primitives import Reader, encode_uvarint

PRODUCE, METADATA, FIND_COORDINATOR = 0, 3, 10
SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 17, 18, 36

# The first flexible (KIP-482) version of each message the cluster reads or writes.
FLEXIBLE_FROM = {PRODUCE: 9, METADATA: 9, FIND_COORDINATOR: 3, API_VERSIONS: 3,
                 SASL_HANDSHAKE: 99, SASL_AUTHENTICATE: 2}
# The versions the cluster can rewrite; ApiVersions answers advertise no more than these.
HIGHEST = {PRODUCE: 11, METADATA: 13, FIND_COORDINATOR: 6, API_VERSIONS: 3,
           SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 2}
# Versions the cluster speaks above what the real broker behind it may: a request in one is
# forwarded in the version below (the same body), and the answer given the fields it adds.
ABOVE_UPSTREAM = {METADATA: 13}

_INTS = {"int8": struct.Struct(">b"), "int16": struct.Struct(">h"),
         "int32": struct.Struct(">i"), "int64": struct.Struct(">q")}


@dataclass(frozen=True)
class Field:
    """As in Kafka's JSON: `kind` is a primitive, "[primitive]", or a tuple of Fields (an
    array of structs, or one struct when `single`); `tag` makes it a tagged field, written
    only when it holds a value."""

    name: str
    kind: str | tuple["Field", ...]
    versions: tuple[int, int] = (0, 99)
    nullable_from: int = 99
    tag: int | None = None
    single: bool = False


F = Field
_NODE = (F("node_id", "int32"), F("host", "string"), F("port", "int32"),
         F("rack", "string", (1, 99), nullable_from=1))

PRODUCE_REQUEST = (
    F("transactional_id", "string", (3, 99), nullable_from=3),
    F("acks", "int16"),
    F("timeout_ms", "int32"),
    F("topic_data", (
        F("name", "string"),
        F("partition_data", (F("index", "int32"), F("records", "bytes", nullable_from=0))),
    )),
)
PRODUCE_RESPONSE = (
    F("responses", (
        F("name", "string"),
        F("partition_responses", (
            F("index", "int32"),
            F("error_code", "int16"),
            F("base_offset", "int64"),
            F("log_append_time_ms", "int64", (2, 99)),
            F("log_start_offset", "int64", (5, 99)),
            F("record_errors", (F("batch_index", "int32"),
                                F("batch_index_error_message", "string", nullable_from=8)),
              (8, 99)),
            F("error_message", "string", (8, 99), nullable_from=8),
            F("current_leader", (F("leader_id", "int32"), F("leader_epoch", "int32")),
              (10, 99), tag=0, single=True),
        )),
    )),
    F("throttle_time_ms", "int32", (1, 99)),
    F("node_endpoints", (F("node_id", "int32"), F("host", "string"), F("port", "int32"),
                         F("rack", "string", nullable_from=0)), (10, 99), tag=0),
)
METADATA_RESPONSE = (
    F("throttle_time_ms", "int32", (3, 99)),
    F("brokers", _NODE),
    F("cluster_id", "string", (2, 99), nullable_from=2),
    F("controller_id", "int32", (1, 99)),
    F("topics", (
        F("error_code", "int16"),
        F("name", "string", nullable_from=12),
        F("topic_id", "uuid", (10, 99)),
        F("is_internal", "bool", (1, 99)),
        F("partitions", (
            F("error_code", "int16"),
            F("partition_index", "int32"),
            F("leader_id", "int32"),
            F("leader_epoch", "int32", (7, 99)),
            F("replica_nodes", "[int32]"),
            F("isr_nodes", "[int32]"),
            F("offline_replicas", "[int32]", (5, 99)),
        )),
        F("topic_authorized_operations", "int32", (8, 99)),
    )),
    F("cluster_authorized_operations", "int32", (8, 10)),
    F("error_code", "int16", (13, 99)),  # KIP-1102: the top-level error (REBOOTSTRAP_REQUIRED)
)
FIND_COORDINATOR_RESPONSE = (
    F("throttle_time_ms", "int32", (1, 99)),
    F("error_code", "int16", (0, 3)),
    F("error_message", "string", (1, 3), nullable_from=1),
    F("node_id", "int32", (0, 3)),
    F("host", "string", (0, 3)),
    F("port", "int32", (0, 3)),
    F("coordinators", (
        F("key", "string"), F("node_id", "int32"), F("host", "string"), F("port", "int32"),
        F("error_code", "int16"), F("error_message", "string", nullable_from=0),
    ), (4, 99)),
)
API_VERSIONS_RESPONSE = (
    F("error_code", "int16"),
    F("api_keys", (F("api_key", "int16"), F("min_version", "int16"),
                   F("max_version", "int16"))),
    F("throttle_time_ms", "int32", (1, 99)),
)
SASL_HANDSHAKE_REQUEST = (F("mechanism", "string"),)
SASL_HANDSHAKE_RESPONSE = (F("error_code", "int16"), F("mechanisms", "[string]"))
SASL_AUTHENTICATE_REQUEST = (F("auth_bytes", "bytes"),)
SASL_AUTHENTICATE_RESPONSE = (
    F("error_code", "int16"),
    F("error_message", "string", nullable_from=0),
    F("auth_bytes", "bytes"),
    F("session_lifetime_ms", "int64", (1, 99)),
)


def flexible(api_key: int, version: int) -> bool:
    return version >= FLEXIBLE_FROM.get(api_key, 99)


# -- decoding ------------------------------------------------------------------------------

def decode(fields: tuple[Field, ...], data: bytes | memoryview, version: int,
           is_flexible: bool, position: int = 0) -> dict[str, Any]:
    """A message body as a dict of the fields valid in `version` (a Kafka error type on bad
    input: CorruptMessageError)."""
    reader = Reader(data, position)
    return _read_struct(reader, fields, version, is_flexible)


def _read_struct(reader: Reader, fields: tuple[Field, ...], version: int,
                 is_flexible: bool) -> dict[str, Any]:
    present = [f for f in fields if f.versions[0] <= version <= f.versions[1]]
    out: dict[str, Any] = {}
    for f in present:
        if f.tag is None:
            out[f.name] = _read_value(reader, f, version, is_flexible)
    if is_flexible:
        tagged = {f.tag: f for f in present if f.tag is not None}
        for _ in range(reader.uvarint()):
            tag, size = reader.uvarint(), reader.uvarint()
            if tag in tagged:
                end = reader.position + size
                out[tagged[tag].name] = _read_value(reader, tagged[tag], version, True)
                reader.position = end
            else:
                reader.raw(size)
    return out


def _read_length(reader: Reader, is_flexible: bool, wide: bool) -> int:
    if is_flexible:
        return reader.uvarint() - 1
    kind = "int32" if wide else "int16"
    return int(_INTS[kind].unpack(reader.raw(_INTS[kind].size))[0])


def _read_value(reader: Reader, f: Field, version: int, is_flexible: bool) -> Any:
    kind = f.kind
    if isinstance(kind, tuple):
        if f.single:
            return _read_struct(reader, kind, version, is_flexible)
        count = _read_length(reader, is_flexible, wide=True)
        return None if count < 0 else \
            [_read_struct(reader, kind, version, is_flexible) for _ in range(count)]
    if kind.startswith("["):
        count = _read_length(reader, is_flexible, wide=True)
        element = Field(f.name, kind[1:-1])
        return None if count < 0 else \
            [_read_value(reader, element, version, is_flexible) for _ in range(count)]
    if kind in ("string", "bytes"):
        length = _read_length(reader, is_flexible, wide=kind == "bytes")
        if length < 0:
            return None
        raw = reader.raw(length)
        return raw.decode() if kind == "string" else raw
    if kind == "bool":
        return reader.raw(1) != b"\x00"
    if kind == "uuid":
        return uuid.UUID(bytes=reader.raw(16))
    return _INTS[kind].unpack(reader.raw(_INTS[kind].size))[0]


# -- encoding ------------------------------------------------------------------------------

def encode(fields: tuple[Field, ...], value: dict[str, Any], version: int,
           is_flexible: bool) -> bytes:
    out = bytearray()
    _write_struct(out, fields, value, version, is_flexible)
    return bytes(out)


def _write_struct(out: bytearray, fields: tuple[Field, ...], value: dict[str, Any],
                  version: int, is_flexible: bool) -> None:
    tagged: list[tuple[int, bytes]] = []
    for f in fields:
        if not f.versions[0] <= version <= f.versions[1]:
            continue
        item = value.get(f.name)
        if f.tag is not None:
            if is_flexible and item is not None:
                tagged_value = bytearray()
                _write_value(tagged_value, f, item, version, is_flexible)
                tagged.append((f.tag, bytes(tagged_value)))
            continue
        _write_value(out, f, item, version, is_flexible)
    if is_flexible:
        out += encode_uvarint(len(tagged))
        for tag, chunk in sorted(tagged):
            out += encode_uvarint(tag) + encode_uvarint(len(chunk)) + chunk


def _write_length(out: bytearray, length: int | None, is_flexible: bool, wide: bool) -> None:
    if is_flexible:
        out += encode_uvarint(0 if length is None else length + 1)
    else:
        out += _INTS["int32" if wide else "int16"].pack(-1 if length is None else length)


def _write_value(out: bytearray, f: Field, item: Any, version: int, is_flexible: bool) -> None:
    kind = f.kind
    nullable = version >= f.nullable_from
    if isinstance(kind, tuple) or kind.startswith("[") or kind in ("string", "bytes"):
        if item is None and not nullable:
            item = {} if f.single else ("" if kind == "string" else b"" if kind == "bytes"
                                        else [])
    if isinstance(kind, tuple):
        if f.single:
            _write_struct(out, kind, item, version, is_flexible)
            return
        _write_length(out, None if item is None else len(item), is_flexible, wide=True)
        for element in item or ():
            _write_struct(out, kind, element, version, is_flexible)
    elif kind.startswith("["):
        _write_length(out, None if item is None else len(item), is_flexible, wide=True)
        element_field = Field(f.name, kind[1:-1])
        for element in item or ():
            _write_value(out, element_field, element, version, is_flexible)
    elif kind in ("string", "bytes"):
        raw = item.encode() if isinstance(item, str) else item
        _write_length(out, None if raw is None else len(raw), is_flexible,
                      wide=kind == "bytes")
        out += raw or b""
    elif kind == "bool":
        out += b"\x01" if item else b"\x00"
    elif kind == "uuid":
        out += (item or uuid.UUID(int=0)).bytes
    else:
        out += _INTS[kind].pack(item or 0)


# -- headers -------------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the body starts in the frame

    @property
    def is_flexible(self) -> bool:
        return flexible(self.api_key, self.api_version)


_HEADER = struct.Struct(">hhih")


def read_request_header(frame: bytes) -> RequestHeader:
    """Request header v1, or v2 (flexible versions: tagged fields after the client id, which
    stays a non-compact string)."""
    api_key, api_version, correlation_id, length = _HEADER.unpack_from(frame)
    position = _HEADER.size
    client_id = None
    if length >= 0:
        client_id = frame[position:position + length].decode(errors="replace")
        position += length
    header = RequestHeader(api_key, api_version, correlation_id, client_id, position)
    if header.is_flexible:
        reader = Reader(frame, position)
        reader.skip_tags()
        header = RequestHeader(api_key, api_version, correlation_id, client_id,
                               reader.position)
    return header


def response_body_offset(api_key: int, version: int, frame: bytes) -> int:
    """Where a response's body starts: after the correlation id, and after the header's
    tagged fields in flexible versions (but never for ApiVersions, whose header is v0)."""
    if api_key == API_VERSIONS or not flexible(api_key, version):
        return 4
    reader = Reader(frame, 4)
    reader.skip_tags()
    return reader.position


def response_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">i", correlation_id)
    if api_key != API_VERSIONS and flexible(api_key, version):
        header += b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body
