"""The requests and responses the producer speaks, each version we support.

Fields follow Apache Kafka's JSON message definitions (clients/src/main/resources/common/
message/), names in snake case. Request header v1 (v2 when flexible); response header v0 (v1
when flexible, except ApiVersions, whose response header is always v0 so that any client
can read it).
"""

from __future__ import annotations

import enum
import struct
from functools import lru_cache
from typing import Any, Mapping, TypeAlias

from .._speedups import decode_produce, encode_produce
from ..errors import BrokerUnsupportedVersionError, UnsupportedVersionError
from .primitives import Field as F
from .primitives import compile_reader, compile_writer, skip_tags


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1  # the read path of the CLI's consume (aioproducer/tools/reader.py)
    LIST_OFFSETS = 2
    METADATA = 3
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    SASL_AUTHENTICATE = 36
    OFFSET_FETCH = 9  # a group's committed offsets (the Spark sink's committed batch ids)
    GET_TELEMETRY_SUBSCRIPTIONS = 71  # KIP-714: what metrics the broker wants, how often
    PUSH_TELEMETRY = 72


# (lowest, highest) version we implement, and the first flexible version (99: none).
CLIENT_VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 13),  # 13: topics named by id (KIP-516), when Metadata gave them
    ApiKey.METADATA: (1, 13),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 5),
    ApiKey.CREATE_TOPICS: (0, 7),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),  # 4+ batch several transactions (and crash Tansu)
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 5),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.FETCH: (4, 12),  # 4: RecordBatch v2 and isolation; 13+ name topics by id only
    ApiKey.LIST_OFFSETS: (1, 7),  # 1: one offset per partition
    ApiKey.OFFSET_FETCH: (1, 7),  # 8+ ask for several groups at once
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (0, 0),
    ApiKey.PUSH_TELEMETRY: (0, 0),
}
# Transactions V2 (KIP-890 part 2): from these versions a broker takes the request as part of
# a V2 transaction (Produce adds its partitions implicitly, TxnOffsetCommit its group, EndTxn
# bumps the epoch and answers the next one). A producer sends them only in a transaction it
# decided to run as V2 (the finalized feature transaction.version >= 2); otherwise below.
TXN_V2_FROM: dict[ApiKey, int] = {
    ApiKey.PRODUCE: 12, ApiKey.TXN_OFFSET_COMMIT: 5, ApiKey.END_TXN: 5,
}
# From this version a Produce request names each topic by its id (KIP-516, as Metadata v10+
# gives it), not its name, and its response answers by id; a broker that no longer has the
# id (the topic was deleted) answers UNKNOWN_TOPIC_ID.
PRODUCE_TOPIC_IDS_FROM = 13
FLEXIBLE_FROM: dict[ApiKey, int] = {
    ApiKey.PRODUCE: 9, ApiKey.METADATA: 9, ApiKey.FIND_COORDINATOR: 3,
    ApiKey.SASL_HANDSHAKE: 99, ApiKey.API_VERSIONS: 3, ApiKey.CREATE_TOPICS: 5,
    ApiKey.INIT_PRODUCER_ID: 2, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.ADD_OFFSETS_TO_TXN: 3,
    ApiKey.END_TXN: 3, ApiKey.TXN_OFFSET_COMMIT: 3, ApiKey.SASL_AUTHENTICATE: 2,
    ApiKey.FETCH: 12, ApiKey.LIST_OFFSETS: 6, ApiKey.OFFSET_FETCH: 6,
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: 0, ApiKey.PUSH_TELEMETRY: 0,
}

_REQUESTS: dict[ApiKey, tuple[F, ...]] = {
    ApiKey.API_VERSIONS: (
        F("client_software_name", "string", (3, 99)),
        F("client_software_version", "string", (3, 99)),
        # KIP-1242: the cluster and node the client means to reach (null and -1: unknown).
        F("cluster_id", "string", (5, 99), nullable_from=5),
        F("node_id", "int32", (5, 99), default=-1),
    ),
    ApiKey.METADATA: (
        F("topics", (
            F("topic_id", "uuid", (10, 99)),
            F("name", "string", nullable_from=10),
        ), nullable_from=1),
        F("allow_auto_topic_creation", "bool", (4, 99), default=True),
        F("include_cluster_authorized_operations", "bool", (8, 10)),
        F("include_topic_authorized_operations", "bool", (8, 99)),
    ),
    ApiKey.PRODUCE: (
        F("transactional_id", "string", (3, 99), nullable_from=3),
        F("acks", "int16"),
        F("timeout_ms", "int32"),
        F("topic_data", (
            F("name", "string", (0, 12)),
            F("topic_id", "uuid", (13, 99)),
            F("partition_data", (
                F("index", "int32"),
                F("records", "records", nullable_from=0),
            )),
        )),
    ),
    ApiKey.INIT_PRODUCER_ID: (
        F("transactional_id", "string", nullable_from=0),
        F("transaction_timeout_ms", "int32"),
        F("producer_id", "int64", (3, 99), default=-1),
        F("producer_epoch", "int16", (3, 99), default=-1),
    ),
    ApiKey.FIND_COORDINATOR: (
        F("key", "string", (0, 3)),
        F("key_type", "int8", (1, 99)),
        F("coordinator_keys", "[string]", (4, 99)),
    ),
    ApiKey.CREATE_TOPICS: (
        F("topics", (
            F("name", "string"),
            F("num_partitions", "int32", default=-1),
            F("replication_factor", "int16", default=-1),
            F("assignments", (F("partition_index", "int32"), F("broker_ids", "[int32]"))),
            F("configs", (F("name", "string"), F("value", "string", nullable_from=0))),
        )),
        F("timeout_ms", "int32", default=60000),
        F("validate_only", "bool", (1, 99)),
    ),
    ApiKey.ADD_PARTITIONS_TO_TXN: (
        F("v3_and_below_transactional_id", "string", (0, 3)),
        F("v3_and_below_producer_id", "int64", (0, 3)),
        F("v3_and_below_producer_epoch", "int16", (0, 3)),
        F("v3_and_below_topics", (F("name", "string"), F("partitions", "[int32]")), (0, 3)),
    ),
    ApiKey.ADD_OFFSETS_TO_TXN: (
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("group_id", "string"),
    ),
    ApiKey.END_TXN: (
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("committed", "bool"),
    ),
    ApiKey.TXN_OFFSET_COMMIT: (
        F("transactional_id", "string"),
        F("group_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("generation_id", "int32", (3, 99), default=-1),
        F("member_id", "string", (3, 99)),
        F("group_instance_id", "string", (3, 99), nullable_from=3),
        F("topics", (
            F("name", "string"),
            F("partitions", (
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("committed_leader_epoch", "int32", (2, 99), default=-1),
                F("committed_metadata", "string", nullable_from=0),
            )),
        )),
    ),
    ApiKey.SASL_HANDSHAKE: (F("mechanism", "string"),),
    ApiKey.SASL_AUTHENTICATE: (F("auth_bytes", "bytes"),),
    ApiKey.FETCH: (
        F("replica_id", "int32", default=-1),
        F("max_wait_ms", "int32"),
        F("min_bytes", "int32"),
        F("max_bytes", "int32", (3, 99), default=0x7FFFFFFF),
        F("isolation_level", "int8", (4, 99)),
        F("session_id", "int32", (7, 99)),
        F("session_epoch", "int32", (7, 99), default=-1),
        F("topics", (
            F("topic", "string"),
            F("partitions", (
                F("partition", "int32"),
                F("current_leader_epoch", "int32", (9, 99), default=-1),
                F("fetch_offset", "int64"),
                F("last_fetched_epoch", "int32", (12, 99), default=-1),
                F("log_start_offset", "int64", (5, 99), default=-1),
                F("partition_max_bytes", "int32"),
            )),
        )),
        F("forgotten_topics_data", (F("topic", "string"), F("partitions", "[int32]")),
          (7, 99)),
        F("rack_id", "string", (11, 99)),
    ),
    ApiKey.LIST_OFFSETS: (
        F("replica_id", "int32", default=-1),
        F("isolation_level", "int8", (2, 99)),
        F("topics", (
            F("name", "string"),
            F("partitions", (
                F("partition_index", "int32"),
                F("current_leader_epoch", "int32", (4, 99), default=-1),
                F("timestamp", "int64"),
            )),
        )),
    ),
    ApiKey.OFFSET_FETCH: (
        F("group_id", "string"),
        F("topics", (F("name", "string"), F("partition_indexes", "[int32]")), nullable_from=2),
        F("require_stable", "bool", (7, 99)),
    ),
    # The zero UUID first: the broker assigns this client instance its id.
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (F("client_instance_id", "uuid"),),
    ApiKey.PUSH_TELEMETRY: (
        F("client_instance_id", "uuid"),
        F("subscription_id", "int32"),
        F("terminating", "bool"),
        F("compression_type", "int8"),
        F("metrics", "bytes"),  # OTLP MetricsData (protocol/otlp.py), compressed as said
    ),
}

# Bounds on what a Metadata response may claim, far above any real cluster (the largest run
# a few thousand brokers, and Kafka advises against more than a few hundred thousand
# partitions in all), so that a broken or hostile broker cannot make the client build
# millions of objects: a response over them is a CorruptMessageError. A replication factor
# is an int16 in Kafka's CreateTopics.
_MAX_BROKERS = 10_000
_MAX_TOPICS = 200_000  # in one response: the producer asks only for the topics it uses
_MAX_PARTITIONS = 200_000  # of one topic
_MAX_REPLICAS = 32_767

_RESPONSES: dict[ApiKey, tuple[F, ...]] = {
    ApiKey.API_VERSIONS: (
        F("error_code", "int16"),
        F("api_keys", (F("api_key", "int16"), F("min_version", "int16"), F("max_version", "int16"))),
        F("throttle_time_ms", "int32", (1, 99)),
        # KIP-584: what each feature's level is, cluster-wide (transaction.version decides
        # Transactions V2); the epoch orders answers from different brokers.
        F("finalized_features_epoch", "int64", (3, 99), tag=1),
        F("finalized_features", (
            F("name", "string"), F("max_version_level", "int16"),
            F("min_version_level", "int16"),
        ), (3, 99), tag=2),
    ),
    ApiKey.METADATA: (
        F("throttle_time_ms", "int32", (3, 99)),
        F("brokers", (
            F("node_id", "int32"), F("host", "string"), F("port", "int32"),
            F("rack", "string", (1, 99), nullable_from=1),
        ), max_items=_MAX_BROKERS),
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
                F("replica_nodes", "[int32]", max_items=_MAX_REPLICAS),
                F("isr_nodes", "[int32]", max_items=_MAX_REPLICAS),
                F("offline_replicas", "[int32]", (5, 99), max_items=_MAX_REPLICAS),
            ), max_items=_MAX_PARTITIONS),
            F("topic_authorized_operations", "int32", (8, 99)),
        ), max_items=_MAX_TOPICS),
        F("cluster_authorized_operations", "int32", (8, 10)),
        F("error_code", "int16", (13, 99)),  # KIP-1102: REBOOTSTRAP_REQUIRED
    ),
    ApiKey.PRODUCE: (
        F("responses", (
            F("name", "string", (0, 12)),
            F("topic_id", "uuid", (13, 99)),
            F("partition_responses", (
                F("index", "int32"),
                F("error_code", "int16"),
                F("base_offset", "int64"),
                F("log_append_time_ms", "int64", (2, 99)),
                F("log_start_offset", "int64", (5, 99)),
                F("record_errors", (
                    F("batch_index", "int32"),
                    F("batch_index_error_message", "string", nullable_from=0),
                ), (8, 99)),
                F("error_message", "string", (8, 99), nullable_from=0),
                # KIP-951: with NOT_LEADER_OR_FOLLOWER, the leader to use instead.
                F("current_leader", (F("leader_id", "int32"), F("leader_epoch", "int32")),
                  (10, 99), tag=0, array=False),
            )),
        )),
        F("throttle_time_ms", "int32", (1, 99)),
        F("node_endpoints", (  # KIP-951: where the leaders named above are
            F("node_id", "int32"), F("host", "string"), F("port", "int32"),
            F("rack", "string", nullable_from=0),
        ), (10, 99), tag=0),
    ),
    ApiKey.INIT_PRODUCER_ID: (
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
    ),
    ApiKey.FIND_COORDINATOR: (
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
    ),
    ApiKey.CREATE_TOPICS: (
        F("throttle_time_ms", "int32", (2, 99)),
        F("topics", (
            F("name", "string"),
            F("topic_id", "uuid", (7, 99)),
            F("error_code", "int16"),
            F("error_message", "string", (1, 99), nullable_from=0),
            F("num_partitions", "int32", (5, 99)),
            F("replication_factor", "int16", (5, 99)),
            F("configs", (
                F("name", "string"), F("value", "string", nullable_from=0),
                F("read_only", "bool"), F("config_source", "int8"), F("is_sensitive", "bool"),
            ), (5, 99), nullable_from=5),
        )),
    ),
    ApiKey.ADD_PARTITIONS_TO_TXN: (
        F("throttle_time_ms", "int32"),
        F("results_by_topic_v3_and_below", (
            F("name", "string"),
            F("results_by_partition", (F("partition_index", "int32"),
                                       F("partition_error_code", "int16"))),
        ), (0, 3)),
    ),
    ApiKey.ADD_OFFSETS_TO_TXN: (F("throttle_time_ms", "int32"), F("error_code", "int16")),
    ApiKey.END_TXN: (
        F("throttle_time_ms", "int32"), F("error_code", "int16"),
        # V2: the producer id and epoch of the next transaction (the epoch bumped, or a new
        # id with epoch 0 once the epoch ran out).
        F("producer_id", "int64", (5, 99)), F("producer_epoch", "int16", (5, 99)),
    ),
    ApiKey.TXN_OFFSET_COMMIT: (
        F("throttle_time_ms", "int32"),
        F("topics", (
            F("name", "string"),
            F("partitions", (F("partition_index", "int32"), F("error_code", "int16"))),
        )),
    ),
    ApiKey.SASL_HANDSHAKE: (F("error_code", "int16"), F("mechanisms", "[string]")),
    ApiKey.SASL_AUTHENTICATE: (
        F("error_code", "int16"),
        F("error_message", "string", nullable_from=0),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", (1, 99)),
    ),
    ApiKey.FETCH: (
        F("throttle_time_ms", "int32", (1, 99)),
        F("error_code", "int16", (7, 99)),
        F("session_id", "int32", (7, 99)),
        F("responses", (
            F("topic", "string"),
            F("partitions", (
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("high_watermark", "int64"),
                F("last_stable_offset", "int64", (4, 99)),
                F("log_start_offset", "int64", (5, 99)),
                F("aborted_transactions", (F("producer_id", "int64"),
                                           F("first_offset", "int64")),
                  (4, 99), nullable_from=4),
                F("preferred_read_replica", "int32", (11, 99)),
                F("records", "records", nullable_from=0),
            )),
        )),
    ),
    ApiKey.LIST_OFFSETS: (
        F("throttle_time_ms", "int32", (2, 99)),
        F("topics", (
            F("name", "string"),
            F("partitions", (
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("timestamp", "int64"),
                F("offset", "int64"),
                F("leader_epoch", "int32", (4, 99)),
            )),
        )),
    ),
    ApiKey.OFFSET_FETCH: (
        F("throttle_time_ms", "int32", (3, 99)),
        F("topics", (
            F("name", "string"),
            F("partitions", (
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("committed_leader_epoch", "int32", (5, 99), default=-1),
                F("metadata", "string", nullable_from=0),
                F("error_code", "int16"),
            )),
        )),
        F("error_code", "int16", (2, 99)),
    ),
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("client_instance_id", "uuid"),
        F("subscription_id", "int32"),
        F("accepted_compression_types", "[int8]", max_items=256),
        F("push_interval_ms", "int32"),
        F("telemetry_max_bytes", "int32"),
        F("delta_temporality", "bool"),
        # Prefixes of metric names: [] none, [""] or ["*"] all.
        F("requested_metrics", "[string]", max_items=10_000),
    ),
    ApiKey.PUSH_TELEMETRY: (F("throttle_time_ms", "int32"), F("error_code", "int16")),
}

_HEADER = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
# A request as it is written: one bytes, or its parts in order (see encode_request).
Frame: TypeAlias = "bytes | list[bytes | memoryview]"
_INT16 = struct.Struct(">h")
# Parts of a request this large are written where they lie, not copied into it (_c.c's
# REFERENCE_FROM).
_REFERENCE_FROM = 16384
_CORRELATION = struct.Struct(">i")


def pick_version(api_key: ApiKey, broker_range: tuple[int, int] | None) -> int:
    """The highest version of `api_key` both we and the broker speak."""
    ours = CLIENT_VERSIONS[api_key]
    if broker_range is None:
        raise UnsupportedVersionError(
            f"the broker does not support {api_key.name} (we speak versions {ours[0]}-{ours[1]})")
    low, high = max(ours[0], broker_range[0]), min(ours[1], broker_range[1])
    if low > high:
        raise UnsupportedVersionError(
            f"no common version of {api_key.name}: we speak {ours[0]}-{ours[1]}, the broker "
            f"{broker_range[0]}-{broker_range[1]}")
    return high


def _flexible(api_key: ApiKey, version: int) -> bool:
    return version >= FLEXIBLE_FROM[api_key]


@lru_cache(maxsize=None)
def _request_writer(api_key: ApiKey, version: int):  # type: ignore[no-untyped-def]
    return compile_writer(_REQUESTS[api_key], version, _flexible(api_key, version))


@lru_cache(maxsize=None)
def _response_reader(api_key: ApiKey, version: int):  # type: ignore[no-untyped-def]
    return compile_reader(_RESPONSES[api_key], version, _flexible(api_key, version))


def encode_request(api_key: ApiKey, version: int, correlation_id: int, client_id: str | None,
                   body: Mapping[str, Any]) -> Frame:
    """A whole request frame, size prefix included: bytes, or the list of its parts to write
    in order (a Produce request whose large batches are not copied into it)."""
    if api_key == ApiKey.PRODUCE:  # in C for what the sender writes, when compiled
        frame = encode_produce(version, correlation_id, client_id, body)
        if frame is not None:
            return frame
    return _encode_request(api_key, version, correlation_id, client_id, body)


def _encode_request(api_key: ApiKey, version: int, correlation_id: int, client_id: str | None,
                    body: Mapping[str, Any]) -> Frame:
    """encode_request() by the generated codec: every request, every case."""
    parts: list[bytes] = [b""]
    if client_id is None:
        parts.append(_INT16.pack(-1))
    else:
        client = client_id.encode()
        parts.append(_INT16.pack(len(client)))
        parts.append(client)
    if _flexible(api_key, version):
        parts.append(b"\x00")  # request header v2: no tagged fields
    _request_writer(api_key, version)(parts, body)
    size = sum(map(len, parts)) + 8
    parts[0] = _HEADER.pack(size, api_key, version, correlation_id)
    if size < _REFERENCE_FROM:
        return b"".join(parts)
    return _by_reference(parts)


def _by_reference(parts: list[Any]) -> Frame:
    """The frame as its parts, as the C encoder writes it: each part of _REFERENCE_FROM bytes
    or more (a large batch's records) where it lies, the runs between them joined."""
    frame: list[bytes | memoryview] = []
    start = 0
    for index, part in enumerate(parts):
        if len(part) >= _REFERENCE_FROM:
            if index > start:
                frame.append(b"".join(parts[start:index]))
            # (transports write bytes, bytearrays and memoryviews)
            frame.append(part if type(part) is bytes or type(part) is memoryview
                         else memoryview(part))
            start = index + 1
    if not frame:
        return b"".join(parts)
    if start < len(parts):
        frame.append(b"".join(parts[start:]))
    return frame


def decode_response(api_key: ApiKey, version: int, frame: bytes | memoryview) -> dict[str, Any]:
    """The body of a response frame (the bytes after the size prefix)."""
    if api_key == ApiKey.PRODUCE:  # in C for a healthy broker's answer, when compiled
        body = decode_produce(version, frame)
        if body is not None:
            return body
    return _decode_response(api_key, version, frame)


def _decode_response(api_key: ApiKey, version: int, frame: bytes | memoryview) -> dict[str, Any]:
    """decode_response() by the generated codec: every response, every case."""
    position = 4  # after the correlation id
    if api_key == ApiKey.API_VERSIONS:
        # A broker that does not speak the version we asked for answers in a v0 body (with
        # its own range in it), as Apache Kafka's ApiVersionsResponse.parse expects.
        if version and len(frame) >= 6 and \
                _INT16.unpack_from(frame, position)[0] == BrokerUnsupportedVersionError.error_code:
            version = 0
    elif _flexible(api_key, version):
        position = skip_tags(frame, position)  # response header v1
    return _response_reader(api_key, version)(frame, position)  # type: ignore[no-any-return]
