"""Transactions and idempotent recovery on Apache Kafka, read back by code we did not write:
librdkafka's read_committed consumer, a real consumer group (kafka-python's) for KIP-447."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from aioproducer import Producer
from aioproducer.errors import InvalidProducerEpochError, ProducerFencedError
from tests.support.proxy import FaultProxy
from tests.support.readback import consume_all


def _tid() -> str:
    return f"txn-{uuid.uuid4().hex[:10]}"


async def test_read_committed_consumers_see_only_committed_records(apache_kafka, make_topic):
    """Skipped on Tansu (its Fetch lists no aborted transactions); on Kafka it must hold."""
    topic = make_topic(partitions=2)
    async with Producer(apache_kafka.bootstrap, transactional_id=_tid()) as producer:
        async with producer.transaction():
            await producer.send(topic, b"committed-1", partition=0)
            await producer.send(topic, b"committed-1b", partition=1)
        producer.begin_transaction()
        await producer.send(topic, b"aborted", partition=0)
        await producer.send(topic, b"aborted-b", partition=1)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"committed-2", partition=0)
    committed = consume_all(apache_kafka.bootstrap, topic, expected=3,
                            isolation_level="read_committed")
    assert sorted(r.value for r in committed) == [b"committed-1", b"committed-1b", b"committed-2"]
    everything = consume_all(apache_kafka.bootstrap, topic, expected=5)
    assert sorted(r.value for r in everything) == sorted(
        [b"committed-1", b"committed-1b", b"aborted", b"aborted-b", b"committed-2"])


async def test_a_second_producer_fences_the_first_and_aborts_its_transaction(apache_kafka,
                                                                          make_topic):
    topic = make_topic()
    tid = _tid()
    first = Producer(apache_kafka.bootstrap, transactional_id=tid)
    await first.start()
    try:
        first.begin_transaction()
        await first.send(topic, b"zombie")
        async with Producer(apache_kafka.bootstrap, transactional_id=tid) as second:
            with pytest.raises((ProducerFencedError, InvalidProducerEpochError)):
                await first.send(topic, b"zombie-2")
            with pytest.raises(ProducerFencedError):
                await first.abort_transaction()
            async with second.transaction():
                await second.send(topic, b"successor")
    finally:
        await first.close()
    got = consume_all(apache_kafka.bootstrap, topic, expected=1, isolation_level="read_committed")
    assert [r.value for r in got] == [b"successor"]


def _join(bootstrap: str, group: str, topic: str):
    """A kafka-python consumer that joined `group` and owns `topic`'s partition."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(200)
    assert consumer.assignment(), "the consumer did not join its group"
    return consumer


async def test_send_offsets_to_transaction_with_a_real_groups_metadata(apache_kafka, make_topic):
    """KIP-447: offsets committed in the transaction with the group's generation and member
    id are read back by librdkafka as the group's committed offsets; with a stale generation
    the coordinator refuses them, so the fields reached it."""
    source, sink = make_topic(), make_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = await asyncio.to_thread(_join, apache_kafka.bootstrap, group, source)
    try:
        metadata = consumer.group_metadata()
        assert metadata.generation_id >= 1 and metadata.member_id
        async with Producer(apache_kafka.bootstrap, transactional_id=_tid()) as producer:
            async with producer.transaction():
                await producer.send(sink, b"derived")
                await producer.send_offsets_to_transaction({(source, 0): 42}, metadata)
            stale = {"group_id": group, "generation_id": metadata.generation_id + 5,
                     "member_id": metadata.member_id}
            producer.begin_transaction()
            await producer.send(sink, b"doomed")
            with pytest.raises(Exception, match="(?i)generation"):
                await producer.send_offsets_to_transaction({(source, 0): 99}, stale)
            await producer.abort_transaction()
    finally:
        consumer.close(autocommit=False)
    reader = Consumer({"bootstrap.servers": apache_kafka.bootstrap, "group.id": group})
    try:
        [committed] = reader.committed([TopicPartition(source, 0)], timeout=10)
    finally:
        reader.close()
    assert committed.offset == 42
    got = consume_all(apache_kafka.bootstrap, sink, expected=1, isolation_level="read_committed")
    assert [r.value for r in got] == [b"derived"]


async def test_aiokafka_and_kafka_python_offsets_commit_with_their_metadata(apache_kafka,
                                                                           make_topic):
    """Their consumers' users write {TopicPartition: OffsetAndMetadata(offset, metadata)}
    (kafka-python's with a leader epoch too): the offsets, and the metadata and leader epoch
    given with them, are what the group has committed, read back by kafka-python's admin
    client. They were refused ("offsets must map ... to an offset (int >= 0)")."""
    from collections import namedtuple

    from kafka import KafkaAdminClient
    from kafka.structs import OffsetAndMetadata as KafkaPythonOffset
    from kafka.structs import TopicPartition as KafkaPythonPartition

    AiokafkaOffset = namedtuple("OffsetAndMetadata", "offset metadata")  # aiokafka's shape
    source, sink = make_topic(3), make_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with Producer(apache_kafka.bootstrap, transactional_id=_tid()) as producer, \
            producer.transaction():
        await producer.send(sink, b"derived")
        await producer.send_offsets_to_transaction({
            KafkaPythonPartition(source, 0): KafkaPythonOffset(42, "from kafka-python", 0),
            KafkaPythonPartition(source, 1): AiokafkaOffset(7, "from aiokafka"),
            (source, 2): 3}, group)
    # (Not librdkafka's committed(): confluent-kafka reads the metadata it copies as a C
    # string, which that copy does not end: CI read "from kafka-python\x10".)
    admin = KafkaAdminClient(bootstrap_servers=apache_kafka.bootstrap)
    try:
        committed = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    assert sorted((tp.partition, c.offset, c.metadata, c.leader_epoch)
                  for tp, c in committed.items() if tp.topic == source) == [
        (0, 42, "from kafka-python", 0), (1, 7, "from aiokafka", -1), (2, 3, "", -1)]


async def test_an_idempotent_producer_goes_on_after_its_records_are_deleted(apache_kafka,
                                                                         make_topic):
    """DeleteRecords removes every record, but not the broker's state for the producer id on
    the partition (Kafka keeps producers when the log start offset moves; brokers before
    KIP-360 dropped them and answered UNKNOWN_PRODUCER_ID): DescribeProducers still shows
    the last sequence, and the producer goes on from it, nothing lost or doubled."""
    from tests.support.producer_state import active_producers

    topic = make_topic()
    async with Producer(apache_kafka.bootstrap, linger_ms=0) as producer:
        for i in range(5):
            await producer.send(topic, b"before-%d" % i)
        apache_kafka.delete_records(topic, 0, -1)  # -1: up to the high watermark
        [kept] = active_producers(apache_kafka.bootstrap, topic)
        for i in range(5):
            await producer.send(topic, b"after-%d" % i)
        [state] = active_producers(apache_kafka.bootstrap, topic)
        assert producer.metrics().records_failed == 0
    assert kept.last_sequence == 4 and (state.producer_id, state.last_sequence) == (
        kept.producer_id, 9)
    got = consume_all(apache_kafka.bootstrap, topic, expected=5)
    assert [r.value for r in got] == [b"after-%d" % i for i in range(5)]
    assert [r.offset for r in got] == list(range(5, 10))


async def _in_a_transaction(bootstrap: str) -> Producer:
    """A transactional producer started, its transaction begun: the loop-end tests leave it
    unclosed."""
    producer = Producer(bootstrap, transactional_id=_tid())
    await producer.start()
    producer.begin_transaction()
    return producer


async def _commit_begun(producer: Producer) -> None:
    """commit_transaction() in a task of its own, begun: it waits for the records' acks."""
    asyncio.ensure_future(producer.commit_transaction())
    await asyncio.sleep(0)
    assert producer.metrics().transaction_state == "committing"


async def _committed_after(bootstrap: str, topic: str) -> None:
    """A later producer's transaction, committed: read_committed consumers read it at once
    unless a transaction left open before it holds them back."""
    async with Producer(bootstrap, transactional_id=_tid()) as producer, producer.transaction():
        await producer.send(topic, b"committed after")


def _check_aborted_at_the_loop_s_end(caplog: pytest.LogCaptureFixture, bootstrap: str,
                                     topic: str) -> None:
    """The loop's end reported the commit under way aborted, and a later transaction's
    record is read at once by a read_committed consumer (and none of the aborted one's)."""
    said = [r.getMessage() for r in caplog.records if "unclosed" in r.getMessage()]
    assert len(said) == 1 and "its transaction's commit, under way, could not complete (" \
        in said[0] and "): the transaction was aborted" in said[0], said
    asyncio.run(_committed_after(bootstrap, topic))
    got = consume_all(bootstrap, topic, expected=1, timeout=15,
                      isolation_level="read_committed")
    assert [r.value for r in got] == [b"committed after"]


def test_a_commit_under_way_as_asyncio_run_ends_is_completed(apache_kafka, make_topic,
                                                              caplog):
    """A script whose main() returns as its commit is under way (commit_transaction() in a
    task of its own, its records not acknowledged yet), no close(): asyncio.run() cancels
    the commit with the rest. Its records were sent, the report said so, but no EndTxn
    followed: the transaction stayed open until the coordinator's timeout (60 s), and a
    read_committed consumer (librdkafka's) found nothing in 15 s. The loop's end now
    finishes the commit, and the report says it did."""
    topic = make_topic()
    kept: list[Producer] = []  # (open as the loop ends)

    async def main() -> None:
        producer = await _in_a_transaction(apache_kafka.bootstrap)
        for i in range(3):
            await producer.enqueue(topic, b"%d" % i)
        await _commit_begun(producer)
        kept.append(producer)

    asyncio.run(main())
    got = consume_all(apache_kafka.bootstrap, topic, expected=3, timeout=15,
                      isolation_level="read_committed")
    assert [r.value for r in got] == [b"0", b"1", b"2"]
    assert kept[0].metrics().state == "closed"
    said = [r.getMessage() for r in caplog.records if "unclosed" in r.getMessage()]
    assert len(said) == 1 and "its transaction's commit, under way, completed" in said[0], \
        said


def test_a_producer_collected_unclosed_mid_commit_completes_the_commit(apache_kafka,
                                                                       make_topic, caplog):
    """A commit_transaction() given up by its caller (cancelled, as by a timeout: the commit
    goes on in its task), then the producer dropped unclosed and collected: the producer's
    end cancelled the commit's task as soon as its records were sent, before its EndTxn,
    and the transaction stayed open until the coordinator's timeout. Now it completes."""
    topic = make_topic()

    async def main() -> None:
        producer = await _in_a_transaction(apache_kafka.bootstrap)
        for i in range(3):
            await producer.enqueue(topic, b"%d" % i)
        commit = asyncio.ensure_future(producer.commit_transaction())
        await asyncio.sleep(0)  # (the commit began: it waits for the records' acks)
        assert producer.metrics().transaction_state == "committing"
        commit.cancel()  # (as a timeout does)
        await asyncio.wait({commit})
        del producer, commit
        gc.collect()
        for _ in range(300):  # at most 15 s: until its end is reported
            if any("was collected" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)

    asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "was collected" in r.getMessage()]
    assert len(said) == 1 and "its transaction's commit, under way, completed" in said[0], \
        said
    got = consume_all(apache_kafka.bootstrap, topic, expected=3, timeout=15,
                      isolation_level="read_committed")
    assert [r.value for r in got] == [b"0", b"1", b"2"]


def test_a_commit_under_way_whose_record_fails_as_asyncio_run_ends_is_aborted(
        apache_kafka, make_topic, caplog):
    """The loop's end finishing a commit under way, a record of it refused by the broker (a
    topic's max.message.bytes): the commit cannot be, so the transaction is aborted at
    once, not left open, and the report says why: a read_committed consumer reads a later
    producer's committed record at once, and not the abandoned one."""
    small = make_topic(max_message_bytes=1000)
    topic = make_topic()

    async def main() -> None:
        producer = await _in_a_transaction(apache_kafka.bootstrap)
        await producer.enqueue(topic, b"never committed")
        await producer.enqueue(small, b"x" * 5000)
        await _commit_begun(producer)

    asyncio.run(main())
    _check_aborted_at_the_loop_s_end(caplog, apache_kafka.bootstrap, topic)


def test_a_commit_refused_for_good_as_asyncio_run_ends_is_aborted(apache_kafka, make_topic,
                                                                   caplog):
    """The loop's end finishing a commit under way, its EndTxn(commit) refused for good
    (TRANSACTION_ABORTABLE, answered by a proxy in front of Kafka: the coordinator never
    sees it): the transaction is aborted at once, not left to the coordinator's timeout. A
    read_committed consumer reads a later producer's committed record at once, and none of
    the refused commit's records; the loop's end raised the refused commit and left the
    transaction open (60 s), and the read found nothing in 15 s."""
    topic = make_topic()

    async def main(bootstrap: str) -> None:
        producer = await _in_a_transaction(bootstrap)
        for i in range(3):
            await producer.enqueue(topic, b"%d" % i)
        await _commit_begun(producer)

    with FaultProxy(int(apache_kafka.bootstrap.rsplit(":", 1)[1])) as proxy:
        proxy.front()  # (every connection through it, the coordinator's too)
        proxy.refuse_commits(120)  # TRANSACTION_ABORTABLE
        asyncio.run(main(f"127.0.0.1:{proxy.port}"))
        assert proxy.commits_refused == 1
    _check_aborted_at_the_loop_s_end(caplog, apache_kafka.bootstrap, topic)


def test_a_transaction_left_open_as_asyncio_run_ends_is_aborted_at_once(apache_kafka,
                                                                       make_topic):
    """A script whose main() returns with a transaction open (no commit, no close()): the
    transaction is aborted as the loop ends, so a read_committed consumer (librdkafka's)
    reads a later producer's committed record at once, and not the abandoned one. Before, the
    transaction stayed open until the coordinator timed it out (transaction_timeout_ms, 60 s):
    the read found nothing in 15 s."""
    topic = make_topic()
    kept: list[Producer] = []  # (open as the loop ends)

    async def left_open() -> None:
        producer = await _in_a_transaction(apache_kafka.bootstrap)
        await producer.send(topic, b"left open")
        kept.append(producer)

    asyncio.run(left_open())
    asyncio.run(_committed_after(apache_kafka.bootstrap, topic))
    got = consume_all(apache_kafka.bootstrap, topic, expected=1, timeout=15,
                      isolation_level="read_committed")
    assert [r.value for r in got] == [b"committed after"]
    assert kept[0].metrics().state == "closed"
    assert sorted(r.value for r in consume_all(apache_kafka.bootstrap, topic, expected=2)) == \
        [b"committed after", b"left open"]
