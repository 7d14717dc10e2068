"""Recovery of sequence state on Apache Kafka 4.4, read back by librdkafka's consumer.

KIP-360 (recovering from UNKNOWN_PRODUCER_ID by bumping the epoch) cannot be provoked on Kafka
4.4: no broker class refers to that error any more. A leader that keeps no state for a
producer id (expired after producer.id.expiration.ms, or lost) takes the next batch with
whatever sequence it carries (ProducerAppendInfo.checkSequence: "If there is no current
producer epoch ... accept writes with any sequence number"). So what is proven here is the
case users meet: a producer idle past producer.id.expiration.ms, its state dropped, goes on
mid-sequence, exactly once and in order.

OUT_OF_ORDER_SEQUENCE_NUMBER is provoked for real: a proxy in front of the broker loses one
Produce request with more in flight behind it (answering it itself, the connection kept), so
the broker sees the next ones' sequence numbers jump and refuses them. Answered
NOT_ENOUGH_REPLICAS, the lost batch is retried and the gap closes; answered INVALID_RECORD
(not retriable), its records fail and the gap is for good: KIP-360's recovery (a new session,
sequences from 0) is what carries an idempotent producer on, and a transactional one must
abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from aioproducer import Producer
from aioproducer.errors import (BrokerInvalidRecordError, MessageTooLargeError,
                                NotEnoughReplicasError, OutOfOrderSequenceNumberError,
                                TransactionFailedError)
from aioproducer.hooks import ProducerHooks
from tests.support.producer_state import (active_producers, producer_ids_expiring_after,
                                          wait_forgotten)
from tests.support.proxy import FaultProxy
from tests.support.readback import consume_all

# Small batches, five requests in flight, retries soon.
FLOW = dict(acks="all", enable_idempotence=True, max_in_flight_requests_per_connection=5,
            batch_size=1024, linger_ms=0, retry_backoff_ms=20, retry_backoff_max_ms=200,
            delivery_timeout_ms=30_000, request_timeout_ms=10_000)


class Retries(ProducerHooks):
    """The errors batches were retried after, or failed with."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def on_retry(self, topic: str, partition: int, record_count: int,
                 error: BaseException) -> None:
        self.errors.append(error)

    def on_error(self, topic: str, partition: int, record_count: int,
                 error: BaseException) -> None:
        self.errors.append(error)

    def count(self, cls: type) -> int:
        return sum(isinstance(e, cls) for e in self.errors)


async def _send_all(producer: Producer, topic: str, values: list[bytes],
                    timestamp_ms: int | None = None, paced: bool = False) -> float:
    """Enqueue every value to partition 0 and wait for all; returns the longest any
    record's future took (enqueue to outcome), in seconds. Raises the first failure.
    `paced`: a millisecond's pause every 10 records, so new batches keep the requests
    flowing (five in flight) while answers come back."""
    loop = asyncio.get_running_loop()
    ended: list[float] = []
    futures = []
    for i, value in enumerate(values):
        if paced and i % 10 == 9:
            await asyncio.sleep(0.001)
        started = loop.time()
        future = await producer.enqueue(topic, value, partition=0, timestamp_ms=timestamp_ms)
        future.add_done_callback(lambda _, started=started: ended.append(loop.time() - started))
        futures.append(future)
    await asyncio.gather(*futures)
    await asyncio.sleep(0)  # (each future's callbacks have run)
    return max(ended)


@contextlib.asynccontextmanager
async def _behind_a_proxy(apache_kafka, retries: Retries,
                          transactional_prefix: str | None) -> AsyncIterator[
                              tuple[FaultProxy, Producer]]:
    """A FLOW producer whose every connection to the broker goes through a FaultProxy (and
    in a transaction begun, if `transactional_prefix`)."""
    broker_port = int(apache_kafka.bootstrap.rsplit(":", 1)[1])
    with FaultProxy(broker_port) as proxy:
        proxy.front()
        extra = ({"transactional_id": f"{transactional_prefix}-{uuid.uuid4().hex[:8]}"}
                 if transactional_prefix else {})
        async with Producer(f"127.0.0.1:{proxy.port}", hooks=[retries], **FLOW,
                            **extra) as producer:
            if transactional_prefix:
                producer.begin_transaction()
            yield proxy, producer


@pytest.mark.parametrize("how", ["idle", "old-timestamps"])
async def test_a_producer_whose_state_expired_goes_on_mid_sequence(apache_kafka, make_topic, how):
    """The leader drops the producer's state, and the producer, none the wiser, sends its next
    600 records, five requests in flight, numbered on from where it stopped. Kafka takes them
    under the same producer id and epoch, at the sequence they carry; librdkafka reads 1,200
    records, once each, in order.

    idle: the producer waits until the leader dropped it with producer.id.expiration.ms at
    1 s. old-timestamps: records stamped two days ago (a replay of old events) with the
    default expiration (a day): Kafka measures a producer's idleness from its last batch's
    timestamp, so its state goes at the next check while it is busy."""
    topic = make_topic()
    address = apache_kafka.bootstrap
    values = [b"%05d" % i + b"." * 60 for i in range(1200)]
    stamp = int(time.time() * 1000) - 2 * 86_400_000 if how == "old-timestamps" else None
    async with Producer(address, **FLOW) as producer:
        await _send_all(producer, topic, values[:600], stamp)
        [before] = active_producers(address, topic)
        assert before.last_sequence == 599
        if how == "idle":
            with producer_ids_expiring_after(address, 1000):
                await asyncio.to_thread(wait_forgotten, address, topic, before.producer_id)
        else:
            await asyncio.to_thread(wait_forgotten, address, topic, before.producer_id)
        longest = await _send_all(producer, topic, values[600:], stamp)
        after = active_producers(address, topic)
        metrics = producer.metrics()
    # Numbered on, not from 0 (with old timestamps the state may be gone again already).
    assert [(a.producer_id, a.epoch, a.last_sequence) for a in after] == \
        [(before.producer_id, before.epoch, 1199)] * (len(after) if how != "idle" else 1)
    assert metrics.records_failed == 0 and longest < FLOW["delivery_timeout_ms"] / 1000
    got = consume_all(address, topic, expected=1200)
    assert [r.value for r in got] == values
    assert [r.offset for r in got] == list(range(1200))


async def test_a_request_lost_just_after_the_leader_forgot_the_producer_is_not_overtaken(
        apache_kafka, make_topic):
    """The leader dropped the producer's state (idle past producer.id.expiration.ms), and the
    first Produce request after the pause is lost (a proxy answers it NOT_ENOUGH_REPLICAS)
    as the stream resumes. A leader without state takes any sequence: had the next requests
    gone beside the first, they would have been written, and the first, retried, refused as
    out of order and written after them under a new session (what the Java client does
    too). After a pause a partition carries one batch until it is acknowledged: every record
    arrives once, in order, under the same producer id and epoch."""
    topic = make_topic()
    address = apache_kafka.bootstrap
    values = [b"%05d" % i + b"." * 60 for i in range(1200)]
    with FaultProxy(int(address.rsplit(":", 1)[1])) as proxy:
        proxy.front()
        async with Producer(f"127.0.0.1:{proxy.port}", **FLOW) as producer:
            await _send_all(producer, topic, values[:600])
            [before] = active_producers(address, topic)
            # (2 s: longer than the producer's own threshold for a pause, QUIET_S)
            with producer_ids_expiring_after(address, 2000):
                await asyncio.to_thread(wait_forgotten, address, topic, before.producer_id)
            proxy.lose_produce()
            longest = await _send_all(producer, topic, values[600:])
            after = active_producers(address, topic)
            metrics = producer.metrics()
    assert proxy.lost == [(topic, 0)]
    assert metrics.records_failed == 0 and longest < FLOW["delivery_timeout_ms"] / 1000
    got = consume_all(address, topic, expected=1200)
    assert [r.value for r in got] == values
    assert [(a.producer_id, a.epoch, a.last_sequence) for a in after] == \
        [(before.producer_id, before.epoch, 1199)]


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
async def test_a_lost_produce_request_is_an_out_of_order_gap_retried_in_order(
        apache_kafka, make_topic, transactional):
    """One Produce request of a 2,000-record stream, with others in flight behind it, never
    reaches the broker (a proxy answers it NOT_ENOUGH_REPLICAS itself, the connection kept):
    the broker answers the requests behind it OUT_OF_ORDER_SEQUENCE_NUMBER, as their
    sequence numbers jump. The producer sends the lost batch again, then the refused ones,
    in order: every future succeeds well within delivery_timeout_ms, under the same
    producer id and epoch, and read_committed librdkafka reads each record once, in order
    (the transaction commits: the gap is no error of it)."""
    topic = make_topic()
    values = [b"%05d" % i + b"." * 60 for i in range(2000)]
    retries = Retries()
    async with _behind_a_proxy(apache_kafka, retries, "lost" if transactional else None) as (
            proxy, producer):
        started = time.monotonic()
        longest = await _send_all(producer, topic, values[:1])  # (then five in flight)
        proxy.lose_produce(after=3)
        longest = max(longest, await _send_all(producer, topic, values[1:], paced=True))
        if transactional:
            await producer.commit_transaction()
        states = active_producers(apache_kafka.bootstrap, topic)
        metrics = producer.metrics()
    elapsed = time.monotonic() - started
    assert proxy.lost == [(topic, 0)]
    assert retries.count(NotEnoughReplicasError) == 1
    assert retries.count(OutOfOrderSequenceNumberError) >= 1, retries.errors
    assert metrics.records_failed == 0
    assert longest < FLOW["delivery_timeout_ms"] / 1000 and elapsed < 20
    if not transactional:
        [state] = states
        assert (state.epoch, state.last_sequence) == (0, 1999)  # no new epoch was needed
    got = consume_all(apache_kafka.bootstrap, topic, expected=2000,
                      isolation_level="read_committed")
    assert [r.value for r in got] == values


_INVALID_RECORD = 87  # not retriable: the batch fails, its sequence numbers are never written


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
async def test_a_batch_refused_for_good_leaves_a_real_gap_closed_by_a_new_session(
        apache_kafka, make_topic, transactional):
    """One Produce request of a 2,000-record stream is lost and answered INVALID_RECORD: its
    batch's records fail with that error, and the broker refuses the requests behind it
    OUT_OF_ORDER_SEQUENCE_NUMBER, a gap no retry can fill.

    Idempotent (KIP-360): the producer starts a new session and numbers the rest from 0;
    every other record arrives once, in order. (It asks InitProducerId with its producer id
    and epoch; Kafka answers an idempotent producer with a new producer id at epoch 0.)
    Transactional: the transaction can only be aborted (enqueue and commit_transaction
    raise TransactionFailedError); the abort starts a new epoch and the next transaction
    commits; read_committed sees only it."""
    topic = make_topic()
    values = [b"%05d" % i + b"." * 60 for i in range(2000)]
    retries = Retries()
    async with _behind_a_proxy(apache_kafka, retries, "gap" if transactional else None) as (
            proxy, producer):
        await producer.send(topic, values[0], partition=0)
        before = producer.metrics()
        proxy.lose_produce(after=3, error_code=_INVALID_RECORD)
        futures = []
        for i, value in enumerate(values[1:]):
            if i % 10 == 9:
                await asyncio.sleep(0.001)  # (paced, as _send_all's)
            try:
                futures.append(await producer.enqueue(topic, value, partition=0))
            except TransactionFailedError:
                assert transactional  # the transaction failed: nothing more goes in it
                break
        outcomes = [None] + await asyncio.wait_for(
            asyncio.gather(*futures, return_exceptions=True), 30)
        if transactional:
            with pytest.raises(TransactionFailedError):
                await producer.commit_transaction()
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send(topic, b"next", partition=0)
        else:
            states = active_producers(apache_kafka.bootstrap, topic)
            now = producer.metrics()
    assert proxy.lost == [(topic, 0)]
    failed = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
    assert retries.count(OutOfOrderSequenceNumberError) >= 1, retries.errors
    got = consume_all(apache_kafka.bootstrap, topic,
                      expected=1 if transactional else 2000 - len(failed),
                      isolation_level="read_committed")
    if transactional:
        assert [r.value for r in got] == [b"next"]
        return
    refused = [i for i in failed if isinstance(outcomes[i], BrokerInvalidRecordError)]
    assert refused == failed and 0 < len(failed) < 50  # that batch's records, and only them
    assert failed == list(range(failed[0], failed[-1] + 1))
    assert [r.value for r in got] == [v for i, v in enumerate(values) if i not in failed]
    # A new session, numbered from 0; the broker keeps the old one's state until it expires.
    assert now.producer_id != before.producer_id and now.producer_epoch == 0
    assert sorted((s.producer_id, s.epoch) for s in states) == \
        [(before.producer_id, 0), (now.producer_id, 0)]


async def test_a_record_over_the_topics_limit_fails_without_a_sequence_warning(
        apache_kafka, make_topic, caplog):
    """A record over the topic's max.message.bytes, alone in its batch: Kafka refuses it
    (MESSAGE_TOO_LARGE) before appending anything, so the new session that skips its
    sequence numbers is said at DEBUG; it logged a WARNING that the producer "lost its
    sequence state". The records around it land once, in order."""
    topic = make_topic(max_message_bytes=2000)
    caplog.set_level(logging.DEBUG, logger="aioproducer")
    async with Producer(apache_kafka.bootstrap, linger_ms=0) as producer:
        await producer.send(topic, b"before")
        with pytest.raises(MessageTooLargeError):
            await asyncio.wait_for(producer.send(topic, b"x" * 4000), 30)
        await asyncio.wait_for(producer.send(topic, b"after"), 30)
    assert [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "sequence" in r.getMessage()] == []
    assert [r.levelno for r in caplog.records if "refused unwritten" in r.getMessage()] == \
        [logging.DEBUG]
    got = consume_all(apache_kafka.bootstrap, topic, expected=2)
    assert [r.value for r in got] == [b"before", b"after"]


async def test_kafka_answers_an_idempotent_epoch_bump_with_a_new_producer_id(apache_kafka):
    """KIP-360's InitProducerId carrying the current producer id and epoch, without a
    transactional id: Kafka 4.4's coordinator hands out a new producer id at epoch 0 (it
    bumps epochs for transactional ids only), which is why the recovery above changes the
    producer id. (The Java client bumps an idempotent producer's epoch itself.)"""
    from aioproducer.client.connection import BrokerConnection
    from aioproducer.protocol.messages import ApiKey

    host, port = apache_kafka.bootstrap.rsplit(":", 1)
    conn = await BrokerConnection.connect(-1, host, int(port), client_id="bump",
                                          request_timeout=10, connect_timeout=10)
    try:
        ask = {"transactional_id": None, "transaction_timeout_ms": 60000}
        first = await conn.request(ApiKey.INIT_PRODUCER_ID,
                                   {**ask, "producer_id": -1, "producer_epoch": -1})
        bump = await conn.request(ApiKey.INIT_PRODUCER_ID, {
            **ask, "producer_id": first["producer_id"], "producer_epoch": first["producer_epoch"]})
    finally:
        conn.close()
    assert first["error_code"] == bump["error_code"] == 0
    assert bump["producer_id"] != first["producer_id"] and bump["producer_epoch"] == 0
