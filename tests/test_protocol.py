"""The sans-I/O protocol layer, cross-checked with kafka-python 3.0 (whose message classes are
generated from Apache Kafka's JSON schemas) and with bytes worked out by hand."""

from __future__ import annotations

import random
import struct

import pytest
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from aioproducer.errors import CorruptMessageError, UnsupportedVersionError
from aioproducer.protocol.compression import Codec
from aioproducer.protocol.messages import (
    CLIENT_VERSIONS,
    ApiKey,
    decode_response,
    encode_request,
    pick_version,
)
from aioproducer.protocol.records import BatchWriter, encode_headers, read_batches

BODIES = {
    ApiKey.API_VERSIONS: (ApiVersionsRequest, {"client_software_name": "aioproducer",
                                               "client_software_version": "1.0"}),
    ApiKey.METADATA: (MetadataRequest, {"topics": [{"name": "a"}, {"name": "bb"}],
                                        "allow_auto_topic_creation": False}),
    ApiKey.PRODUCE: (ProduceRequest, {"transactional_id": "tx", "acks": -1, "timeout_ms": 3000,
                                      "topic_data": [{"name": "t", "partition_data": [
                                          {"index": 2, "records": b"\x01\x02\x03"}]}]}),
    ApiKey.INIT_PRODUCER_ID: (InitProducerIdRequest, {"transactional_id": None,
                                                      "transaction_timeout_ms": 60000}),
    ApiKey.FIND_COORDINATOR: (FindCoordinatorRequest, {"key": "group", "key_type": 0,
                                                       "coordinator_keys": ["group"]}),
    ApiKey.CREATE_TOPICS: (CreateTopicsRequest, {"topics": [{"name": "n", "num_partitions": 3,
                                                             "replication_factor": 1}]}),
    ApiKey.ADD_PARTITIONS_TO_TXN: (AddPartitionsToTxnRequest, {
        "v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 7,
        "v3_and_below_producer_epoch": 1,
        "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]}]}),
    ApiKey.ADD_OFFSETS_TO_TXN: (AddOffsetsToTxnRequest, {"transactional_id": "tx",
                                                         "producer_id": 7, "producer_epoch": 1,
                                                         "group_id": "g"}),
    ApiKey.END_TXN: (EndTxnRequest, {"transactional_id": "tx", "producer_id": 7,
                                     "producer_epoch": 1, "committed": True}),
    ApiKey.TXN_OFFSET_COMMIT: (TxnOffsetCommitRequest, {
        "transactional_id": "tx", "group_id": "g", "producer_id": 7, "producer_epoch": 1,
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 42,
                                                 "committed_metadata": None}]}]}),
    ApiKey.OFFSET_FETCH: (OffsetFetchRequest, {
        "group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 3]}],
        "require_stable": True}),
    ApiKey.SASL_HANDSHAKE: (SaslHandshakeRequest, {"mechanism": "PLAIN"}),
    ApiKey.SASL_AUTHENTICATE: (SaslAuthenticateRequest, {"auth_bytes": b"\0u\0p"}),
    ApiKey.FETCH: (FetchRequest, {"max_wait_ms": 500, "min_bytes": 1, "isolation_level": 1,
                                  "topics": [{"topic": "t", "partitions": [
                                      {"partition": 2, "fetch_offset": 1 << 40,
                                       "partition_max_bytes": 1 << 20}]}]}),
    ApiKey.LIST_OFFSETS: (ListOffsetsRequest, {"isolation_level": 1, "topics": [
        {"name": "t", "partitions": [{"partition_index": 1, "timestamp": -2}]}]}),
}
# kafka-python has no schema for KIP-714's two requests nor ApiVersions v5 (KIP-1242):
# Apache Kafka's broker reads them in tests/real_kafka/test_telemetry.py and
# test_rebootstrap.py.
CASES = [(api, version) for api, (low, high) in CLIENT_VERSIONS.items()
         if api not in (ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, ApiKey.PUSH_TELEMETRY)
         for version in range(low, high + 1)
         if (api, version) != (ApiKey.API_VERSIONS, 5)]


@pytest.mark.parametrize("api,version", CASES, ids=[f"{a.name}-v{v}" for a, v in CASES])
def test_requests_decode_and_reencode_identically_in_kafka_python(api, version):
    cls, body = BODIES[api]
    frame = encode_request(api, version, 1234, "client-7", body)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    theirs = cls.decode(frame[4:], version=version, header=True)
    assert theirs.header.correlation_id == 1234 and theirs.header.client_id == "client-7"
    assert theirs.encode(header=True) == frame[4:]  # every byte where their schema says
    decoded = theirs.to_dict(json=False)
    for name, value in body.items():
        if name in decoded:
            assert _subset(decoded[name], value), name


def _subset(theirs, ours) -> bool:
    """Whether what we sent is in what kafka-python decoded (it adds default fields)."""
    if isinstance(ours, dict):
        return all(_subset(theirs.get(k), v) for k, v in ours.items() if k in theirs)
    if isinstance(ours, list):
        return len(theirs) == len(ours) and all(_subset(t, o) for t, o in zip(theirs, ours))
    return theirs == ours


@pytest.mark.parametrize("version", range(3, 12))
def test_produce_response_from_kafka_python(version):
    topic_cls = ProduceResponse.TopicProduceResponse
    partition_cls = topic_cls.PartitionProduceResponse
    response = ProduceResponse(version=version, throttle_time_ms=5, responses=[topic_cls(
        version=version, name="t", partition_responses=[partition_cls(
            version=version, index=3, error_code=6, base_offset=42, log_append_time_ms=-1,
            log_start_offset=0, record_errors=[], error_message="not leader")])])
    response.with_header(correlation_id=99)
    frame = response.encode(header=True)
    assert int.from_bytes(frame[:4], "big") == 99  # the header our framing reads
    body = decode_response(ApiKey.PRODUCE, version, frame)
    [partition] = body["responses"][0]["partition_responses"]
    assert (partition["index"], partition["error_code"], partition["base_offset"]) == (3, 6, 42)
    if version >= 8:
        assert partition["error_message"] == "not leader"


@pytest.mark.parametrize("version", [10, 11])
def test_produce_response_naming_a_new_leader_from_kafka_python(version):
    """KIP-951's tagged fields, read where they are (a partition's CurrentLeader, the
    response's NodeEndpoints); absent, they are not in the decoded dict."""
    topic_cls = ProduceResponse.TopicProduceResponse
    partition_cls = topic_cls.PartitionProduceResponse
    moved = partition_cls(
        version=version, index=0, error_code=6, base_offset=-1, log_append_time_ms=-1,
        log_start_offset=-1, record_errors=[], error_message=None,
        current_leader=partition_cls.LeaderIdAndEpoch(version=version, leader_id=2,
                                                      leader_epoch=7))
    stayed = partition_cls(
        version=version, index=1, error_code=0, base_offset=5, log_append_time_ms=-1,
        log_start_offset=0, record_errors=[], error_message=None)
    response = ProduceResponse(
        version=version, throttle_time_ms=3,
        responses=[topic_cls(version=version, name="t", partition_responses=[moved, stayed])],
        node_endpoints=[ProduceResponse.NodeEndpoint(version=version, node_id=2, host="h2",
                                                     port=9093, rack="r1")])
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.PRODUCE, version, response.encode(header=True))
    first, second = body["responses"][0]["partition_responses"]
    assert first["current_leader"] == {"leader_id": 2, "leader_epoch": 7}
    assert "current_leader" not in second and second["base_offset"] == 5
    assert body["node_endpoints"] == [{"node_id": 2, "host": "h2", "port": 9093, "rack": "r1"}]
    assert body["throttle_time_ms"] == 3

    response.node_endpoints = []
    moved.current_leader = None
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.PRODUCE, version, response.encode(header=True))
    assert "node_endpoints" not in body
    assert "current_leader" not in body["responses"][0]["partition_responses"][0]


def test_unknown_tagged_fields_are_skipped():
    """A tag we do not know (a newer broker's field) is skipped whole, and the fields after
    it are read in place."""
    from aioproducer.protocol.primitives import Field, compile_reader, encode_uvarint

    schema = (Field("a", "int32"), Field("known", "int32", tag=3),
              Field("items", (Field("b", "int16"),)))
    item = b"\x00\x07" + b"\x00"  # b=7, no tags
    tags = (encode_uvarint(2) + encode_uvarint(1) + encode_uvarint(2) + b"\xff\xff"
            + encode_uvarint(3) + encode_uvarint(4) + struct.pack(">i", 42))
    frame = struct.pack(">i", 1) + encode_uvarint(2) + item + tags
    assert compile_reader(schema, 0, flexible=True)(frame, 0) == \
        {"a": 1, "items": [{"b": 7}], "known": 42}
    bad = struct.pack(">i", 1) + encode_uvarint(2) + item + encode_uvarint(1) + \
        encode_uvarint(3) + encode_uvarint(9) + struct.pack(">i", 42)
    with pytest.raises(CorruptMessageError):
        compile_reader(schema, 0, flexible=True)(bad, 0)


@pytest.mark.parametrize("version", range(1, 14))
def test_metadata_response_from_kafka_python(version):
    broker_cls = MetadataResponse.MetadataResponseBroker
    topic_cls = MetadataResponse.MetadataResponseTopic
    partition_cls = topic_cls.MetadataResponsePartition
    partitions = [partition_cls(version=version, error_code=0, partition_index=p,
                                leader_id=111, replica_nodes=[111], isr_nodes=[111],
                                **({"leader_epoch": 0} if version >= 7 else {}),
                                **({"offline_replicas": []} if version >= 5 else {}))
                  for p in range(3)]
    topic = topic_cls(version=version, error_code=0, name="t", is_internal=False,
                      partitions=partitions)
    response = MetadataResponse(
        version=version, controller_id=1, topics=[topic],
        brokers=[broker_cls(version=version, node_id=111, host="h", port=9092, rack=None)],
        **({"throttle_time_ms": 0} if version >= 3 else {}),
        **({"cluster_id": "c"} if version >= 2 else {}),
        **({"error_code": 129} if version >= 13 else {}))  # KIP-1102: REBOOTSTRAP_REQUIRED
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.METADATA, version, response.encode(header=True))
    assert body["brokers"][0]["node_id"] == 111 and body["brokers"][0]["host"] == "h"
    assert [p["leader_id"] for p in body["topics"][0]["partitions"]] == [111] * 3
    assert body.get("error_code", 0) == (129 if version >= 13 else 0)


@pytest.mark.parametrize("version", range(0, 6))
def test_init_producer_id_response_from_kafka_python(version):
    response = InitProducerIdResponse(version=version, throttle_time_ms=0, error_code=0,
                                      producer_id=1234567890123, producer_epoch=7)
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.INIT_PRODUCER_ID, version, response.encode(header=True))
    assert (body["producer_id"], body["producer_epoch"]) == (1234567890123, 7)


@pytest.mark.parametrize("version", range(1, 8))
def test_offset_fetch_response_from_kafka_python(version):
    topic_cls = OffsetFetchResponse.OffsetFetchResponseTopic
    partition_cls = topic_cls.OffsetFetchResponsePartition
    response = OffsetFetchResponse(version=version, throttle_time_ms=0, error_code=0, topics=[
        topic_cls(version=version, name="t", partitions=[
            partition_cls(version=version, partition_index=3, committed_offset=42,
                          committed_leader_epoch=-1, metadata=None, error_code=0),
            partition_cls(version=version, partition_index=0, committed_offset=-1,
                          committed_leader_epoch=-1, metadata="", error_code=0)])])
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.OFFSET_FETCH, version, response.encode(header=True))
    [topic] = body["topics"]
    assert [(p["partition_index"], p["committed_offset"], p["metadata"])
            for p in topic["partitions"]] == [(3, 42, None), (0, -1, "")]


@pytest.mark.parametrize("version", range(0, 5))
def test_find_coordinator_response_from_kafka_python(version):
    coordinator_cls = FindCoordinatorResponse.Coordinator
    if version >= 4:
        fields = {"coordinators": [coordinator_cls(version=version, key="g", node_id=3, host="h",
                                                   port=1, error_code=0, error_message=None)]}
    else:
        fields = {"error_code": 0, "node_id": 3, "host": "h", "port": 1,
                  **({"error_message": None} if version >= 1 else {})}
    response = FindCoordinatorResponse(
        version=version, **({"throttle_time_ms": 0} if version >= 1 else {}), **fields)
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.FIND_COORDINATOR, version, response.encode(header=True))
    found = body["coordinators"][0] if version >= 4 else body
    assert (found["node_id"], found["host"], found["port"]) == (3, "h", 1)


def test_an_unsupported_api_versions_answer_is_read_as_v0():
    """A broker that cannot read our ApiVersions version answers UNSUPPORTED_VERSION in a v0
    body (whatever we asked), listing the versions it speaks: it is read as such."""
    versions = [(0, 0, 7), (3, 0, 8), (18, 0, 2)]
    response = ApiVersionsResponse(version=0, error_code=35, api_keys=[
        ApiVersionsResponse.ApiVersion(version=0, api_key=k, min_version=lo, max_version=hi)
        for k, lo, hi in versions])
    response.with_header(correlation_id=1)
    frame = response.encode(header=True)
    for asked in (1, 2, 3):
        body = decode_response(ApiKey.API_VERSIONS, asked, frame)
        assert body["error_code"] == 35
        assert [(k["api_key"], k["min_version"], k["max_version"])
                for k in body["api_keys"]] == versions


def test_golden_request_bytes():
    # ApiVersions v0: size, api key 18, version 0, correlation id 1, client id "c"; no body.
    assert encode_request(ApiKey.API_VERSIONS, 0, 1, "c", {}) == bytes.fromhex(
        "0000000b" "0012" "0000" "00000001" "0001" "63")
    # ApiVersions v3 (flexible): header v2 ends with an empty tag section; the body has two
    # compact strings (length + 1 as an unsigned varint) and its own empty tag section.
    assert encode_request(ApiKey.API_VERSIONS, 3, 1, "c",
                          {"client_software_name": "a", "client_software_version": "1"}
                          ) == bytes.fromhex("00000011" "0012" "0003" "00000001" "0001" "63" "00"
                                             "0261" "0231" "00")


def test_truncated_and_garbage_frames_raise_corrupt_message():
    response = InitProducerIdResponse(version=0, throttle_time_ms=0, error_code=0,
                                      producer_id=1, producer_epoch=0)
    response.with_header(correlation_id=1)
    frame = response.encode(header=True)
    for cut in range(len(frame)):
        with pytest.raises(CorruptMessageError):
            decode_response(ApiKey.INIT_PRODUCER_ID, 0, frame[:cut])
    rng = random.Random(7)
    for _ in range(200):
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        try:
            decode_response(ApiKey.METADATA, 12, garbage)
        except CorruptMessageError:
            pass  # any other exception type fails the test


def test_version_negotiation():
    assert pick_version(ApiKey.PRODUCE, (0, 10)) == 10
    assert pick_version(ApiKey.PRODUCE, (5, 99)) == CLIENT_VERSIONS[ApiKey.PRODUCE][1]
    with pytest.raises(UnsupportedVersionError, match="PRODUCE"):
        pick_version(ApiKey.PRODUCE, (0, 2))
    with pytest.raises(UnsupportedVersionError, match="does not support"):
        pick_version(ApiKey.END_TXN, None)


# -- record batches -----------------------------------------------------------------------------


def _records(n: int):
    rng = random.Random(n)
    for i in range(n):
        key = None if i % 5 == 0 else rng.randbytes(rng.randrange(0, 40))
        value = None if i % 7 == 0 else rng.randbytes(rng.randrange(0, 3000))
        headers = [("h", b"x"), ("null", None), ("ключ", b"")] if i % 3 == 0 else []
        yield 1_700_000_000_000 + rng.randrange(-5000, 5000), key, value, headers


@pytest.mark.parametrize("codec", list(Codec))
def test_our_batches_read_by_kafka_python(codec):
    records = list(_records(2000))
    writer = BatchWriter(records[0][0], 1 << 30)
    for ts, key, value, headers in records:
        assert writer.try_append(ts, key, value, encode_headers(headers) if headers else None)
    writer.close(codec)
    data = writer.encode(producer_id=42, producer_epoch=3, base_sequence=100, transactional=True)
    batch = MemoryRecords(data).next_batch()
    assert batch.validate_crc() and batch.compression_type == int(codec)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 3, 100)
    assert batch.is_transactional and not batch.is_control_batch
    got = list(batch)
    assert len(got) == len(records)
    for (ts, key, value, headers), r in zip(records, got):
        assert (r.timestamp, r.key, r.value, list(r.headers)) == (ts, key, value, headers)
    # A retry re-encodes the same payload under another epoch/sequence without recompressing.
    again = MemoryRecords(writer.encode(producer_id=42, producer_epoch=4, base_sequence=100))
    assert again.next_batch().producer_epoch == 4


@pytest.mark.parametrize("codec", list(Codec))
def test_kafka_python_batches_read_by_us(codec):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=int(codec), is_transactional=0,
                                        producer_id=9, producer_epoch=1, base_sequence=5,
                                        batch_size=1 << 30)
    # Compressible values: kafka-python writes a batch uncompressed when that is smaller.
    records = [(ts, key, None if value is None else b"abc" * len(value), headers)
               for ts, key, value, headers in _records(500)]
    for offset, (ts, key, value, headers) in enumerate(records):
        builder.append(offset, ts, key, value, headers)
    [batch] = read_batches(bytes(builder.build()))
    assert (batch.producer_id, batch.base_sequence, batch.codec) == (9, 5, codec)
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in batch.records] == \
        [(ts, k, v, h) for ts, k, v, h in records]


def test_batch_limit_and_corruption():
    writer = BatchWriter(0, 200)
    assert writer.try_append(0, None, b"x" * 1000, None)  # the first record always fits
    assert not writer.try_append(0, None, b"y", None)
    writer = BatchWriter(0, 200)
    while writer.try_append(0, b"k", b"v" * 20, None):
        pass
    assert 150 < writer.size <= 200
    writer.close(Codec.NONE)
    data = bytearray(writer.encode())
    assert len(data) == writer.size
    data[-1] ^= 0xFF
    with pytest.raises(CorruptMessageError, match="CRC"):
        read_batches(bytes(data))
    assert read_batches(bytes(data[:-5])) == []  # a trailing partial batch is not an error


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_response_from_kafka_python(version):
    """Each version's fields where Kafka puts them, v12's tagged fields (the current leader)
    skipped, and the records handed on as the bytes they are."""
    partition_cls = FetchResponse.FetchableTopicResponse.PartitionData
    extra = {"current_leader": partition_cls.LeaderIdAndEpoch(
        version=version, leader_id=3, leader_epoch=9)} if version >= 12 else {}
    aborted = [partition_cls.AbortedTransaction(version=version, producer_id=77,
                                                first_offset=40)]
    response = FetchResponse(
        version=version, throttle_time_ms=0, error_code=0, session_id=0,
        responses=[FetchResponse.FetchableTopicResponse(
            version=version, topic="t", partitions=[partition_cls(
                version=version, partition_index=2, error_code=0, high_watermark=50,
                last_stable_offset=45, log_start_offset=0, aborted_transactions=aborted,
                preferred_read_replica=-1, records=b"\x00batches", **extra)])])
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.FETCH, version, response.encode(header=True))
    [partition] = body["responses"][0]["partitions"]
    assert (partition["partition_index"], partition["high_watermark"],
            partition["last_stable_offset"], partition["records"]) == (2, 50, 45, b"\x00batches")
    assert partition["aborted_transactions"] == [{"producer_id": 77, "first_offset": 40}]


@pytest.mark.parametrize("version", range(1, 8))
def test_list_offsets_response_from_kafka_python(version):
    topic_cls = ListOffsetsResponse.ListOffsetsTopicResponse
    partition_cls = topic_cls.ListOffsetsPartitionResponse
    response = ListOffsetsResponse(version=version, throttle_time_ms=0, topics=[topic_cls(
        version=version, name="t", partitions=[partition_cls(
            version=version, partition_index=1, error_code=0, timestamp=-1, offset=1 << 40,
            leader_epoch=0)])])
    response.with_header(correlation_id=1)
    body = decode_response(ApiKey.LIST_OFFSETS, version, response.encode(header=True))
    [partition] = body["topics"][0]["partitions"]
    assert (partition["partition_index"], partition["offset"]) == (1, 1 << 40)


def test_api_versions_v3_finalized_features_are_read():
    """KIP-584's tagged fields of ApiVersions v3+: the finalized features with their epoch
    (transaction.version decides Transactions V2); without them, none."""
    from aioproducer.protocol.primitives import encode_uvarint

    def compact(text: bytes) -> bytes:
        return encode_uvarint(len(text) + 1) + text

    api = struct.pack(">hhh", 22, 0, 6) + b"\x00"
    feature = compact(b"transaction.version") + struct.pack(">hh", 2, 0) + b"\x00"
    features = encode_uvarint(2) + feature
    tags = (encode_uvarint(2) + encode_uvarint(1) + encode_uvarint(8) + struct.pack(">q", 77)
            + encode_uvarint(2) + encode_uvarint(len(features)) + features)
    head = struct.pack(">ih", 5, 0) + encode_uvarint(2) + api + struct.pack(">i", 0)
    body = decode_response(ApiKey.API_VERSIONS, 3, head + tags)
    assert body["finalized_features_epoch"] == 77
    assert body["finalized_features"] == [
        {"name": "transaction.version", "max_version_level": 2, "min_version_level": 0}]
    assert "finalized_features" not in decode_response(ApiKey.API_VERSIONS, 3, head + b"\x00")


def test_end_txn_v5_carries_the_next_producer_id_and_epoch():
    """Transactions V2: EndTxn v5's answer names the producer id and epoch for the next
    transaction; v4 has neither."""
    v5 = struct.pack(">i", 9) + b"\x00" + struct.pack(">ihqh", 0, 0, 4242, 8) + b"\x00"
    assert decode_response(ApiKey.END_TXN, 5, v5) == {
        "throttle_time_ms": 0, "error_code": 0, "producer_id": 4242, "producer_epoch": 8}
    v4 = struct.pack(">i", 9) + b"\x00" + struct.pack(">ih", 0, 0) + b"\x00"
    assert decode_response(ApiKey.END_TXN, 4, v4) == {"throttle_time_ms": 0, "error_code": 0}

