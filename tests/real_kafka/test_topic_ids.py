"""Topics named by id (KIP-516): Produce v13 on Apache Kafka, and a topic deleted and made
again under a running producer, with v13 and with v12 (what a producer that speaks only
names sends). Read back by librdkafka."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from aioproducer import Producer
from aioproducer.errors import ErrorClass, KafkaError, error_class
from aioproducer.protocol import messages
from aioproducer.protocol.framing import Framing
from aioproducer.protocol.messages import ApiKey
from tests.support.readback import consume_all


def _delete(admin: AdminClient, topic: str) -> None:
    """Delete `topic` and wait (up to 30 s) until Metadata no longer names it."""
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} still listed 30 s after its deletion"
        time.sleep(0.05)


def _create(admin: AdminClient, topic: str, partitions: int) -> None:
    """Create `topic`, also while the deletion of one of that name is still under way (Kafka
    then refuses it with TOPIC_ALREADY_EXISTS): tried for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _topic_id(admin: AdminClient, topic: str) -> bytes:
    """The topic's id (its 16 bytes) as librdkafka's DescribeTopics reads it."""
    described = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    high = described.topic_id.get_most_significant_bits() & (2**64 - 1)
    low = described.topic_id.get_least_significant_bits() & (2**64 - 1)
    return (high << 64 | low).to_bytes(16)


async def _send_paced(producer: Producer, topic: str, numbers: range,
                      futures: dict[int, Any]) -> None:
    for i in numbers:
        futures[i] = await producer.enqueue(topic, b"%06d" % i)
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("highest", [13, 12])
async def test_a_topic_recreated_mid_stream_gets_the_records_acknowledged_after(
        apache_kafka, monkeypatch, caplog, highest):
    """Numbered records, one every 5 ms, while the topic is deleted and made again: each
    record is acknowledged (an in-flight v13 request naming the old id is answered
    UNKNOWN_TOPIC_ID and retried once the new id is looked up, as the Java client does; v12's
    by name is written to whatever topic has the name); those the new topic acknowledged are
    read back from it at the offsets given, once each and in order; and the producer says the
    topic was recreated. What the old topic acknowledged (record i at offset i) went with
    it."""
    monkeypatch.setitem(messages.CLIENT_VERSIONS, ApiKey.PRODUCE, (3, highest))
    topic = f"k-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": apache_kafka.bootstrap})
    await asyncio.to_thread(_create, admin, topic, 1)
    futures: dict[int, Any] = {}
    caplog.set_level(logging.WARNING, "aioproducer.client.cluster")
    async with Producer(apache_kafka.bootstrap, linger_ms=0, delivery_timeout_ms=60_000,
                        allow_auto_create_topics=False) as producer:
        await _send_paced(producer, topic, range(100), futures)
        await asyncio.gather(*futures.values())
        cluster = producer._cluster
        assert cluster is not None
        assert cluster.topics[topic].topic_id == await asyncio.to_thread(_topic_id, admin, topic)
        assert [c.version_for(ApiKey.PRODUCE) for c in cluster.open_connections()] == [highest]
        sending = asyncio.create_task(_send_paced(producer, topic, range(100, 600), futures))
        await asyncio.to_thread(_delete, admin, topic)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(_create, admin, topic, 1)
        await sending
        acked = await asyncio.wait_for(asyncio.gather(*futures.values()), 60)
        assert cluster.topics[topic].topic_id == await asyncio.to_thread(_topic_id, admin, topic)
    assert len(acked) == 600  # every record acknowledged, none failed
    by_old = [i for i, metadata in enumerate(acked) if metadata.offset == i]
    by_new = [(i, metadata.offset) for i, metadata in enumerate(acked) if metadata.offset != i]
    assert by_old == list(range(len(by_old))) and len(by_old) >= 100 and by_new
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, len(by_new), 30,
                                  partitions=1)
    assert [(int(r.value), r.offset) for r in got] == by_new
    assert by_new == [(i, i - by_new[0][0]) for i, _ in by_new]  # in order, from offset 0
    assert any("was deleted and recreated" in r.getMessage() for r in caplog.records)



async def test_a_v2_transaction_whose_topic_is_recreated_aborts_and_the_next_commits(
        apache_kafka):
    """A Transactions V2 producer (Kafka 4.4's default) whose topic is deleted and made again
    mid-transaction: its next record for the new topic is refused (a V2 producer's first batch
    on a partition must have sequence 0: OUT_OF_ORDER_SEQUENCE_NUMBER), an abortable error
    whose message says the topic was made again;
    after the abort the next transaction commits there, and a read_committed consumer sees
    only that one: the broken transaction left nothing half-written in the new topic."""
    topic = f"k-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": apache_kafka.bootstrap})
    await asyncio.to_thread(_create, admin, topic, 1)
    async with Producer(apache_kafka.bootstrap, transactional_id=f"t-{topic}", linger_ms=0,
                        allow_auto_create_topics=False) as producer:
        producer.begin_transaction()
        for i in range(5):
            await producer.send(topic, b"old-%d" % i)
        assert producer.metrics().transaction_version == 2
        await asyncio.to_thread(_delete, admin, topic)
        await asyncio.to_thread(_create, admin, topic, 1)
        with pytest.raises(KafkaError) as refused:
            await asyncio.wait_for(producer.send(topic, b"new-0"), 60)
        assert error_class(refused.value) is ErrorClass.ABORTABLE, refused.value
        assert "the topic was deleted and made again" in str(refused.value)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"next")
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, 1, 30,
                                  "read_committed", 1)
    assert [r.value for r in got] == [b"next"]


@pytest.mark.parametrize("metadata", [(1, 13), (1, 9)], ids=["with-ids", "metadata-v9"])
async def test_produce_names_topics_by_id_only_when_metadata_gave_their_ids(
        apache_kafka, monkeypatch, metadata):
    """Produce goes at v13 when every topic of the request has its id from Metadata (v10+),
    at v12 when Metadata was read at a version without ids; either way every record is read
    back once, in order, from both topics."""
    monkeypatch.setitem(messages.CLIENT_VERSIONS, ApiKey.METADATA, metadata)
    written: list[int] = []
    send_request = Framing.send_request

    def spy(self: Framing, api_key: ApiKey, version: int, *args: Any, **kwargs: Any) -> Any:
        if api_key == ApiKey.PRODUCE:
            written.append(version)
        return send_request(self, api_key, version, *args, **kwargs)

    monkeypatch.setattr(Framing, "send_request", spy)
    topics = [f"k-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    for topic in topics:
        apache_kafka.create_topic(topic, 2)
    async with Producer(apache_kafka.bootstrap, linger_ms=20) as producer:
        futures = [await producer.enqueue(topics[i % 2], b"%04d" % i, partition=i // 2 % 2)
                   for i in range(400)]
        await asyncio.gather(*futures)
    assert written and set(written) == {13 if metadata[1] >= 10 else 12}
    for t, topic in enumerate(topics):
        got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, 200, 30,
                                      partitions=2)
        for p in range(2):
            assert [r.value for r in got if r.partition == p] == \
                [b"%04d" % i for i in range(400) if i % 2 == t and i // 2 % 2 == p]
