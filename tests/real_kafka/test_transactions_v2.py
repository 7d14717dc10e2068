"""Transactions on Apache Kafka 4.4, with the finalized feature transaction.version at 2
(Transactions V2, KIP-890 part 2) and at 0 (the V1 protocol): commit, abort, fencing, KIP-447
offsets with librdkafka's group metadata, a transaction cut by a broker kill, the KIP-1050
error classes the broker can provoke, and KIP-896's request versions. Every outcome is read
back with confluent-kafka's consumer at isolation.level=read_committed."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import uuid
from typing import Any, Iterator

import pytest
from kafka.protocol.admin import DescribeTransactionsRequest

from aioproducer import Producer
from aioproducer.errors import (
    ErrorClass,
    IllegalGenerationError,
    InvalidTransactionTimeoutError,
    KafkaError,
    ProducerFencedError,
    TransactionFailedError,
    error_class,
)
from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.framing import Framing
from aioproducer.protocol.messages import TXN_V2_FROM, ApiKey, pick_version
from aioproducer.testing import ApacheKafka, ApacheKafkaUnavailable
from aioproducer.testing.pytest_plugin import REQUIRE_ENV
from tests.support.producer_state import (CHECK_INTERVAL, active_producers,
                                          producer_ids_expiring_after, wait_forgotten)
from tests.support.raw import call
from tests.support.readback import consume_all
from tests.support.transactions import COMMITTED_VALUES, commit_abort_commit

# A broker-side cap below our default transaction_timeout_ms, to provoke
# INVALID_TRANSACTION_TIMEOUT (invalid configuration).
_MAX_TIMEOUT_MS = 300_000


@pytest.fixture(scope="module", params=[2, 0], ids=["txn-v2", "txn-v1"])
def kafka(request: pytest.FixtureRequest) -> Iterator[ApacheKafka]:
    """One Kafka 4.4 node formatted with transaction.version=2 or =0 (skipped without Java
    or Maven, failed under AIOPRODUCER_REQUIRE_KAFKA=1, as the plugin's apache_kafka)."""
    cluster = ApacheKafka(transaction_version=request.param, broker_config={
        "transaction.max.timeout.ms": _MAX_TIMEOUT_MS,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500, **CHECK_INTERVAL})
    try:
        cluster.start()
    except ApacheKafkaUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"Apache Kafka is required but cannot run: {exc}", pytrace=False)
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    cluster.transaction_version = request.param  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        cluster.stop()


def _v2(kafka: ApacheKafka) -> bool:
    return kafka.transaction_version >= 2  # type: ignore[attr-defined,no-any-return]


def _topic(kafka: ApacheKafka, partitions: int = 1) -> str:
    name = f"tx-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions)
    return name


def _tid() -> str:
    return f"tid-{uuid.uuid4().hex[:8]}"


def _committed(kafka: ApacheKafka, topic: str, expected: int) -> list[bytes]:
    return [r.value for r in consume_all(kafka.bootstrap, topic, expected, timeout=20,
                                         isolation_level="read_committed")]


async def test_commits_and_aborts_are_what_read_committed_sees(kafka, requests_sent):
    """Three committed transactions and one aborted, over two partitions: a read_committed
    consumer sees the committed records only. V2 bumps the epoch at every transaction's end
    (the EndTxn answer carries it) and sends no AddPartitionsToTxn; V1 keeps the epoch."""
    topic = _topic(kafka, 2)
    async with Producer(kafka.bootstrap, transactional_id=_tid(), linger_ms=5) as producer:
        assert producer.metrics().finalized_features.get("transaction.version", 0) == \
            kafka.transaction_version
        epochs = [producer.metrics().producer_epoch]
        started = len(requests_sent)
        epochs += await commit_abort_commit(producer, topic,
                                            lambda: producer.metrics().producer_epoch)
        assert producer.metrics().transaction_version == (2 if _v2(kafka) else 1)
    sent = _kinds(requests_sent[started:])
    if _v2(kafka):
        assert epochs == [epochs[0] + i for i in range(5)], epochs
        assert ApiKey.ADD_PARTITIONS_TO_TXN not in sent
        assert ApiKey.INIT_PRODUCER_ID not in sent  # none after the abort either
    else:
        assert len(set(epochs)) == 1, epochs
        assert sent.get(ApiKey.ADD_PARTITIONS_TO_TXN, 0) >= 3
    got = _committed(kafka, topic, 6)
    assert sorted(got) == COMMITTED_VALUES


async def test_a_transactional_producer_idle_past_producer_id_expiration(kafka):
    """Between two transactions the leader drops the producer's state (idle past
    producer.id.expiration.ms; a transaction still open there is never dropped). V1 goes
    on under the same epoch, numbered on mid-sequence, which Kafka takes as it is (no state
    to check it against); V2 starts each transaction at sequence 0 under a new epoch (what
    Kafka 4.4 demands of a V2 producer it keeps no state for). Both transactions commit,
    read_committed sees each record once, in order."""
    topic = _topic(kafka)
    values = [b"%04d" % i + b"." * 60 for i in range(600)]
    async with Producer(kafka.bootstrap, transactional_id=_tid(), batch_size=1024,
                        linger_ms=0, max_in_flight_requests_per_connection=5) as producer:
        async with producer.transaction():
            await asyncio.gather(*[await producer.enqueue(topic, v, partition=0)
                                   for v in values[:300]])
        [before] = active_producers(kafka.bootstrap, topic)
        with producer_ids_expiring_after(kafka.bootstrap, 1000):
            await asyncio.to_thread(wait_forgotten, kafka.bootstrap, topic, before.producer_id)
        async with producer.transaction():
            await asyncio.gather(*[await producer.enqueue(topic, v, partition=0)
                                   for v in values[300:]])
        [after] = active_producers(kafka.bootstrap, topic)
        assert producer.metrics().records_failed == 0
    assert after.producer_id == before.producer_id
    if not _v2(kafka):
        assert (after.epoch, after.last_sequence) == (before.epoch, 599)
    assert _committed(kafka, topic, 600) == values


async def test_a_second_producer_fences_the_first(kafka):
    """Fencing is application-recoverable: the old producer's transaction never commits,
    every call after says ProducerFencedError, and the new one's transactions commit."""
    topic, tid = _topic(kafka), _tid()
    old = Producer(kafka.bootstrap, transactional_id=tid, linger_ms=0)
    await old.start()
    try:
        old.begin_transaction()
        await old.send(topic, b"zombie")
        async with Producer(kafka.bootstrap, transactional_id=tid) as new:
            async with new.transaction():
                await new.send(topic, b"new")
            with pytest.raises(KafkaError) as caught:
                await old.send(topic, b"zombie-2")
                await old.commit_transaction()
            if not isinstance(caught.value, ProducerFencedError):
                # (V1 answers the records of an old epoch INVALID_PRODUCER_EPOCH: abortable;
                # the abort then learns it was fenced)
                assert error_class(caught.value) is ErrorClass.ABORTABLE, caught.value
                with pytest.raises(ProducerFencedError) as caught:
                    await old.abort_transaction()
            assert error_class(caught.value) is ErrorClass.APPLICATION_RECOVERABLE
            with pytest.raises(ProducerFencedError):
                old.begin_transaction()
            async with new.transaction():
                await new.send(topic, b"new-2")
    finally:
        await old.close()
    assert _committed(kafka, topic, 2) == [b"new", b"new-2"]


def _joined_consumer(kafka: ApacheKafka, topic: str, group: str) -> Any:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment(), "the consumer never joined its group"
    return consumer


async def test_kip447_offsets_with_librdkafkas_group_metadata(kafka, requests_sent):
    """Consume-transform-produce: confluent-kafka's consumer_group_metadata() (its member id
    and generation) goes with the offsets; the group's committed offset is the transaction's
    once it commits (V2: TxnOffsetCommit v5, no AddOffsetsToTxn). Metadata of a generation
    the group never had is refused (ILLEGAL_GENERATION, a zombie's): abortable, and the
    aborted offsets are not committed."""
    from confluent_kafka import TopicPartition

    source, sink, group = _topic(kafka), _topic(kafka), f"g-{uuid.uuid4().hex[:8]}"
    consumer = await asyncio.to_thread(_joined_consumer, kafka, source, group)
    try:
        metadata = consumer.consumer_group_metadata()
        async with Producer(kafka.bootstrap, transactional_id=_tid()) as producer:
            async with producer.transaction():
                await producer.send(sink, b"derived")
                await producer.send_offsets_to_transaction({(source, 0): 5}, metadata)
            generation = int.from_bytes(metadata[7:11], sys.byteorder, signed=True)
            stale = metadata[:7] + (generation + 7).to_bytes(4, sys.byteorder) + metadata[11:]
            producer.begin_transaction()
            await producer.send(sink, b"zombie")
            with pytest.raises(IllegalGenerationError) as caught:
                await producer.send_offsets_to_transaction({(source, 0): 9}, stale)
            assert error_class(caught.value) is ErrorClass.ABORTABLE
            with pytest.raises(TransactionFailedError):
                await producer.commit_transaction()
            await producer.abort_transaction()
        [committed] = await asyncio.to_thread(
            consumer.committed, [TopicPartition(source, 0)], 10)
    finally:
        consumer.close()
    assert committed.offset == 5
    assert (ApiKey.ADD_OFFSETS_TO_TXN in _kinds(requests_sent)) is not _v2(kafka)
    assert _committed(kafka, sink, 1) == [b"derived"]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_a_transaction_cut_by_a_broker_kill_ends_once_it_is_back(kafka, commit):
    """The only broker is killed (SIGKILL) with a transaction open and started again a
    second later: commit_transaction() (or abort_transaction()) reconnects, finds the
    coordinator again and finishes within max_block_ms; the next transaction commits. A
    read_committed consumer sees the committed records once each, the aborted ones never."""
    topic = _topic(kafka)
    async with Producer(kafka.bootstrap, transactional_id=_tid(), linger_ms=0,
                        max_block_ms=60_000) as producer:
        producer.begin_transaction()
        for i in range(10):
            await producer.send(topic, b"cut-%d" % i)
        kafka.kill_node(0)
        restart = threading.Timer(1.0, kafka.start_node, args=(0,), kwargs={"wait": False})
        restart.start()
        try:
            started = time.monotonic()
            await (producer.commit_transaction() if commit else producer.abort_transaction())
            assert time.monotonic() - started < 60
        finally:
            restart.join()
        async with producer.transaction():
            await producer.send(topic, b"after")
    expected = [b"cut-%d" % i for i in range(10)] if commit else []
    assert _committed(kafka, topic, len(expected) + 1) == expected + [b"after"]


async def test_start_waits_out_a_broker_that_dies_before_init_producer_id(kafka, monkeypatch):
    """start() of a transactional producer whose broker is killed after the first metadata
    (as InitProducerId is asked) and started again: init_transactions() retries through the
    lost connection and start() returns within max_block_ms."""
    topic = _topic(kafka)
    producer = Producer(kafka.bootstrap, transactional_id=_tid(), max_block_ms=60_000)
    original = Producer.init_transactions

    async def killed_first(self: Producer) -> None:
        kafka.kill_node(0)
        threading.Timer(1.0, kafka.start_node, args=(0,), kwargs={"wait": False}).start()
        await original(self)

    monkeypatch.setattr(Producer, "init_transactions", killed_first)
    await producer.start()
    monkeypatch.undo()
    try:
        async with producer.transaction():
            await producer.send(topic, b"started")
    finally:
        await producer.close()
    assert _committed(kafka, topic, 1) == [b"started"]


async def test_a_transaction_timed_out_by_the_coordinator(kafka):
    """transaction_timeout_ms passes with the transaction open: the coordinator aborts it.
    The next record fails it (KIP-1050: a timeout inside a transaction is abortable). V2
    bumped the epoch with the abort, so ours is one behind without being fenced: the abort
    works and the next transaction commits. V1 fences the producer for it (as the Java
    client is): the abort says so, application-recoverable, and a new producer goes on."""
    topic, tid = _topic(kafka), _tid()
    async with Producer(kafka.bootstrap, transactional_id=tid, linger_ms=0,
                        transaction_timeout_ms=1000) as producer:
        producer.begin_transaction()
        await producer.send(topic, b"too-slow")
        await asyncio.to_thread(_wait_aborted_by_the_coordinator, kafka, tid)
        with pytest.raises(KafkaError) as caught:
            await producer.send(topic, b"late")
        assert error_class(caught.value) is ErrorClass.ABORTABLE, repr(caught.value)
        with pytest.raises(TransactionFailedError):
            await producer.commit_transaction()
        if _v2(kafka):
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send(topic, b"in-time")
        else:
            with pytest.raises(ProducerFencedError) as fenced:
                await producer.abort_transaction()
            assert error_class(fenced.value) is ErrorClass.APPLICATION_RECOVERABLE
    if not _v2(kafka):
        async with Producer(kafka.bootstrap, transactional_id=tid) as again:
            async with again.transaction():
                await again.send(topic, b"in-time")
    assert _committed(kafka, topic, 1) == [b"in-time"]


def _wait_aborted_by_the_coordinator(kafka: ApacheKafka, tid: str) -> None:
    """Until the coordinator has aborted the timed-out transaction and written its markers
    (DescribeTransactions says CompleteAbort). A fixed 4 s was not sure to cover its check
    every 500 ms on a starved JVM: a record sent before the markers is taken."""
    deadline = time.monotonic() + 60
    while True:
        [state] = call(kafka.bootstrap, DescribeTransactionsRequest(transactional_ids=[tid]),
                       0).transaction_states
        if state.transaction_state == "CompleteAbort" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert state.transaction_state == "CompleteAbort", state


async def test_a_transaction_timeout_above_the_brokers_limit_is_invalid_configuration(kafka):
    producer = Producer(kafka.bootstrap, transactional_id=_tid(),
                        transaction_timeout_ms=_MAX_TIMEOUT_MS + 1000)
    with pytest.raises(InvalidTransactionTimeoutError) as caught:
        await producer.start()
    assert error_class(caught.value) is ErrorClass.INVALID_CONFIGURATION
    await producer.close()


async def test_every_request_is_negotiated_and_at_or_above_kafka_4s_minimum(
        kafka, requests_sent):
    """KIP-896: Kafka 4 no longer speaks the oldest versions. Every request of a producer's
    life (metadata, idempotent and transactional produce, offsets, commit, abort) goes at
    the version negotiated from this broker's ApiVersions, so at or above the minimum it
    advertises; only a V1 transaction keeps below the V2 versions."""
    topic = _topic(kafka)
    async with Producer(kafka.bootstrap) as idempotent:
        await idempotent.send(topic, b"idempotent")
    idempotent_requests = len(requests_sent)
    async with Producer(kafka.bootstrap, transactional_id=_tid()) as producer:
        async with producer.transaction():
            await producer.send(topic, b"committed")
            await producer.send_offsets_to_transaction({(topic, 0): 1}, "kip896")
        producer.begin_transaction()
        await producer.send(topic, b"aborted")
        await producer.abort_transaction()
    assert {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.INIT_PRODUCER_ID,
            ApiKey.FIND_COORDINATOR, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT} <= \
        _kinds(requests_sent).keys()
    for i, (api_key, version, ranges) in enumerate(requests_sent):
        if ranges is None:  # ApiVersions, before any range is known
            assert api_key is ApiKey.API_VERSIONS
            continue
        low, high = ranges[api_key]
        assert low <= version <= high, (api_key.name, version, ranges[api_key])
        negotiated = pick_version(api_key, ranges[api_key])
        transactional = i >= idempotent_requests
        if transactional and api_key in TXN_V2_FROM and not _v2(kafka):
            assert version == min(negotiated, TXN_V2_FROM[api_key] - 1), (api_key.name, version)
        else:
            assert version == negotiated, (api_key.name, version, negotiated)


@pytest.fixture
def requests_sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[ApiKey, int, Any]]:
    """Every request our connections write from now on: (api key, version as written, the
    ranges its broker advertised in ApiVersions, None for ApiVersions itself)."""
    sent: list[tuple[ApiKey, int, Any]] = []
    write = Framing.send_request

    def spy(self: Framing, api_key: ApiKey, version: int, *args: Any, **kwargs: Any) -> Any:
        sent.append((api_key, version, getattr(self, "ranges", None)))
        return write(self, api_key, version, *args, **kwargs)

    negotiate = BrokerConnection._negotiate_versions

    async def negotiated(self: BrokerConnection, expected_cluster_id: str | None) -> None:
        await negotiate(self, expected_cluster_id)
        self._framing.ranges = self.broker_ranges  # type: ignore[attr-defined]

    monkeypatch.setattr(Framing, "send_request", spy)
    monkeypatch.setattr(BrokerConnection, "_negotiate_versions", negotiated)
    return sent


def _kinds(sent: list[tuple[ApiKey, int, Any]]) -> dict[ApiKey, int]:
    counts: dict[ApiKey, int] = {}
    for api_key, _, _ in sent:
        counts[api_key] = counts.get(api_key, 0) + 1
    return counts
