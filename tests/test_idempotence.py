"""Recovering lost sequence state: the KIP-360 epoch bump and the fallback to a new id."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from aioproducer import Producer, _speedups
from aioproducer.errors import (
    ClusterAuthorizationFailedError,
    DeliveryTimeoutError,
    MessageTooLargeError,
)
from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.messages import ApiKey
from tests.support.proxy import refuse_producer_ids
from tests.support.readback import assert_contiguous_sequences, consume_all, fetch_raw_batches


async def test_epoch_bump_at_the_request_level(broker):
    host, port = broker.bootstrap.rsplit(":", 1)
    conn = await BrokerConnection.connect(-1, host, int(port), client_id="t",
                                          request_timeout=10, connect_timeout=10)
    try:
        assert conn.version_for(ApiKey.INIT_PRODUCER_ID) >= 3
        first = await conn.request(ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": None, "transaction_timeout_ms": 60000,
            "producer_id": -1, "producer_epoch": -1})
        assert first["error_code"] == 0
        bump = await conn.request(ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": None, "transaction_timeout_ms": 60000,
            "producer_id": first["producer_id"], "producer_epoch": first["producer_epoch"]})
    finally:
        conn.close()
    if broker.is_embedded:
        # Tansu refuses KIP-360 bumps (UNKNOWN_SERVER_ERROR): the producer must fall back to
        # a new producer id there, which the next test shows.
        assert bump["error_code"] == -1
    else:
        # Apache Kafka bumps epochs for transactional ids only: an idempotent producer gets
        # a new producer id at epoch 0 (tests/real_kafka/test_recovery.py).
        assert bump["error_code"] == 0
        assert bump["producer_id"] != first["producer_id"] and bump["producer_epoch"] == 0


async def test_broker_forgetting_our_producer_id_loses_and_duplicates_nothing(broker, topic):
    """The broker stops knowing our producer id mid-stream (as after its state expired):
    the producer bumps its epoch, or takes a new id where the broker refuses, renumbers what
    is pending, and every record arrives once, in order."""
    async with Producer(broker.bootstrap, batch_size=2048, linger_ms=1) as producer:
        first = [await producer.enqueue(topic, b"%05d" % i) for i in range(2000)]
        await producer.flush()
        before = producer.metrics()
        original_id = before.producer_id
        # What the broker would see if it had forgotten us: an id it does not know. (The
        # one fault no proxy can make: our own numbering, started afresh under that id.)
        producer._txn.sequencer.start(original_id + 1_000_000, before.producer_epoch)
        second = [await producer.enqueue(topic, b"%05d" % i) for i in range(2000, 4000)]
        await producer.flush()
    assert all(h.exception() is None for h in first + second)
    values = [r.value for r in consume_all(broker.bootstrap, topic, expected=4000)]
    assert values == [b"%05d" % i for i in range(4000)]
    sessions: dict[tuple[int, int], list] = {}
    for batch in fetch_raw_batches(broker.bootstrap, topic, 0):
        sessions.setdefault((batch.producer_id, batch.producer_epoch), []).append(batch)
    assert (original_id, 0) in sessions and len(sessions) == 2
    for batches in sessions.values():  # each session's sequences start at 0, without gaps
        assert_contiguous_sequences(batches)
    assert original_id + 1_000_000 not in {pid for pid, _ in sessions}  # recovered, not reused


async def test_a_numbered_batch_that_expires_awaiting_its_retry_leaves_no_gap(proxied_broker,
                                                                           caplog):
    """A batch is numbered and sent, never reaches the broker, and fails at
    delivery_timeout_ms while waiting for its retry (the broker was unreachable). The records
    after it, sent once the broker is back, arrive once and in order: its sequence numbers
    are not left as a gap that makes the broker refuse every later batch of the partition."""
    cluster = proxied_broker
    cluster.create_topic("gap", 1)
    async with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=1000,
                        delivery_timeout_ms=1500, retry_backoff_ms=100,
                        retry_backoff_max_ms=200, reconnect_backoff_max_ms=100) as producer:
        await producer.send("gap", b"before")
        cluster.proxy.refuse(True, cut=False)  # the broker is unreachable from now on ...
        cluster.proxy.cut_after(8, "up")  # ... and the next request is cut before it arrives
        with pytest.raises(DeliveryTimeoutError, match="gap-0"):
            await asyncio.wait_for(producer.send("gap", b"lost"), 10)
        cluster.proxy.refuse(False)
        for i in range(3):
            await asyncio.wait_for(producer.send("gap", b"after-%d" % i), 10)
    values = [r.value for r in consume_all(cluster.broker.bootstrap, "gap", expected=4)]
    assert values == [b"before", b"after-0", b"after-1", b"after-2"]
    sessions: dict[tuple[int, int], list] = {}
    for batch in fetch_raw_batches(cluster.broker.bootstrap, "gap", 0):
        sessions.setdefault((batch.producer_id, batch.producer_epoch), []).append(batch)
    for batches in sessions.values():  # the records after the gap were numbered afresh
        assert_contiguous_sequences(batches)
    # (Whether the broker wrote it is unknown: said, unlike a batch refused unwritten.)
    assert [r.levelno for r in caplog.records if "lost its sequence state" in r.getMessage()
            and "gap-0" in r.getMessage()] == [logging.WARNING]


async def test_a_record_refused_unwritten_starts_a_new_session_without_a_warning(
        proxied_broker, caplog):
    """On Apache Kafka a record over the broker's message.max.bytes, alone in its batch,
    failed with MessageTooLargeError and the producer also warned that it "lost its sequence
    state ... (KIP-360)". The broker checks a batch's size (and timestamps, records and
    permission) before it appends anything: nothing was lost but the batch's sequence
    numbers, and the new session that skips them is routine. It is said at DEBUG (the Java
    client bumps its epoch without a word); the next record goes through at once."""
    cluster = proxied_broker
    cluster.create_topic("refused", 1)
    cluster.proxy.message_max_bytes(3000)
    caplog.set_level(logging.DEBUG, logger="aioproducer")
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        await producer.send("refused", b"before")
        with pytest.raises(MessageTooLargeError):
            await asyncio.wait_for(producer.send("refused", b"x" * 4000), 10)
        await asyncio.wait_for(producer.send("refused", b"after"), 10)
    # (Still said at WARNING: the record's failure, by the delivery-failure log that
    # on_delivery_error replaces, and on Tansu only its refusal of the KIP-360 epoch bump.)
    warned = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "sequence" in r.getMessage()]
    assert warned == []
    said = [r for r in caplog.records if "refused unwritten" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG]
    assert "MESSAGE_TOO_LARGE" in said[0].getMessage() or "too large" in said[0].getMessage()
    values = [r.value for r in consume_all(cluster.broker.bootstrap, "refused", expected=2)]
    assert values == [b"before", b"after"]


async def test_a_principal_refused_idempotent_writes_is_told_what_to_grant(proxied_broker):
    """A broker with ACLs answers InitProducerId with CLUSTER_AUTHORIZATION_FAILED when the
    principal has neither Write on a topic nor IdempotentWrite on the cluster. Each record
    fails with an error that says what to grant; once it is granted (here: the proxy stops
    refusing), the same producer goes on without a restart. (The Java client instead makes
    the producer unusable until it is closed.)"""
    cluster = proxied_broker
    cluster.create_topic("acl", 1)
    cluster.proxy.rewrite_responses(InitProducerIdResponse, refuse_producer_ids(31))
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for _ in range(2):
            with pytest.raises(ClusterAuthorizationFailedError,
                               match="IdempotentWrite on the cluster") as refused:
                await asyncio.wait_for(producer.send("acl", b"refused"), 10)
            assert "enable_idempotence" in str(refused.value)
        cluster.proxy.rewrite_responses(InitProducerIdResponse, None)  # granted
        cluster.proxy.cut_all()  # (a rewrite applies to the connections made after it)
        await asyncio.wait_for(producer.send("acl", b"granted"), 10)
    assert [r.value for r in consume_all(cluster.broker.bootstrap, "acl", expected=1)] == \
        [b"granted"]


async def test_a_gap_left_behind_an_acknowledged_batch_is_closed_at_its_ack(proxied_broker):
    """A batch's answer is lost (the broker wrote it; we see NOT_LEADER_OR_FOLLOWER), and the
    next, too large for the broker, fails unwritten while the first waits for its retry.
    When the retry is acknowledged nothing is pending to show the gap the second left: as
    the Java client does at that ack (maybeResolveSequences), the producer starts afresh, so
    the next batch is accepted the first time instead of refused as out of order."""
    cluster = proxied_broker
    cluster.create_topic("gap-at-ack", 1)
    answers: list[int] = []
    lose_next: list[bool] = []

    def lose_one(response):
        answers.extend(p.error_code for t in response.responses for p in t.partition_responses)
        if not lose_next:
            return None
        lose_next.clear()
        for topic in response.responses:
            for partition in topic.partition_responses:
                partition.error_code, partition.base_offset = 6, -1
        return response
    cluster.proxy.rewrite_responses(ProduceResponse, lose_one)
    cluster.proxy.message_max_bytes(3000)
    async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=200) as producer:
        await producer.send("gap-at-ack", b"before")  # (the producer id is known from here)
        lose_next.append(True)
        lost = await producer.enqueue("gap-at-ack", b"answer lost")  # written at once ...
        too_large = await producer.enqueue("gap-at-ack", b"x" * 4000)  # ... this behind it
        with pytest.raises(MessageTooLargeError):
            await asyncio.wait_for(too_large, 10)
        await asyncio.wait_for(lost, 10)
        answers.clear()
        await asyncio.wait_for(producer.send("gap-at-ack", b"next"), 10)
    assert 45 not in answers, f"the next batch was refused as out of order: {answers}"
    values = [r.value for r in consume_all(cluster.broker.bootstrap, "gap-at-ack", expected=3)]
    assert values == [b"before", b"answer lost", b"next"]


async def test_before_the_producer_id_no_round_looks_for_batches_and_its_answer_sends_them(
        proxied_broker):
    """Every batch waits for the producer id; here InitProducerId is answered
    COORDINATOR_LOAD_IN_PROGRESS (as by a fresh Kafka cluster) until the test lets it through.
    Meanwhile no round looks for sendable batches (at 10,000 partitions a round that flush()
    woke walked every partition's queue and took nothing), and the answer, not a timer,
    sends them: every record arrives, once, in order."""
    cluster = proxied_broker
    partitions, per_partition = 200, 5
    cluster.create_topic("held", partitions)
    refusals: list[int] = []
    held = [True]

    def refuse_while_held(response):
        if not held:
            return None
        refusals.append(response.error_code)
        return refuse_producer_ids(14)(response)
    cluster.proxy.rewrite_responses(InitProducerIdResponse, refuse_while_held)
    async with Producer(cluster.bootstrap, linger_ms=5, retry_backoff_ms=20,
                        retry_backoff_max_ms=50) as producer:
        await producer.partitions_for("held")
        looked: list[str] = []  # the accumulator's passes over the queues, as the sender asks
        accumulator = producer._accumulator
        ready, drain = accumulator.ready, accumulator._drain
        accumulator.ready = lambda *args: (looked.append("ready"), ready(*args))[1]
        accumulator._drain = lambda *args: (looked.append("drain"), drain(*args))[1]
        futures = [await producer.enqueue("held", b"%d" % i, key=b"%d" % (i % partitions))
                   for i in range(partitions * per_partition)]
        flushing = asyncio.ensure_future(producer.flush())
        try:
            for _ in range(200):  # (10 s at most) three refusals: the batches waited them out
                if len(refusals) >= 3:
                    break
                await asyncio.sleep(0.05)
            assert len(refusals) >= 3, "InitProducerId was not asked again"
            assert looked == [] and not flushing.done()
        finally:
            held.clear()  # (else close() would wait for the producer id)
        await asyncio.wait_for(flushing, 10)
        assert "drain" in looked
        for future in futures:
            await future
    records = consume_all(cluster.broker.bootstrap, "held", expected=partitions * per_partition)
    by_key: dict[bytes, list[int]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(int(record.value))
    assert len(records) == partitions * per_partition
    assert by_key == {b"%d" % k: [k + partitions * n for n in range(per_partition)]
                      for k in range(partitions)}


@pytest.mark.skipif(_speedups.IMPLEMENTATION != "c", reason="the compiled decision")
async def test_a_lone_batch_on_an_idle_producer_goes_as_the_compiled_drain_decides(
        proxied_broker):
    """At linger_ms=0 a send on an idle producer writes its batch in the call that opened it
    (Sender._send_now). Whether an idempotent producer's batch may go is decided there as
    the compiled drain decides (a producer id, nothing of its partition in flight), not by a
    may_send call per send (~1,700 of ~170,000 instructions a send, counted by callgrind)."""
    cluster = proxied_broker
    cluster.create_topic("lone", 3)
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        await producer.send("lone", b"first", partition=0)  # (the producer id is known now)
        asked: list[int] = []
        lone: list[bool] = []
        txn, accumulator = producer._txn, producer._accumulator
        may_send, drain_lone = txn.may_send, accumulator.drain_lone
        txn.may_send = lambda batch: asked.append(batch.partition) or may_send(batch)
        accumulator.drain_lone = lambda batch: lone.append(drain_lone(batch)) or lone[-1]
        for i in range(20):
            await asyncio.wait_for(producer.send("lone", b"%d" % i, partition=i % 3), 10)
    assert lone == [True] * 20 and asked == []
    values = [(r.partition, r.value) for r in consume_all(cluster.broker.bootstrap, "lone",
                                                           expected=21)]
    assert sorted(values, key=lambda v: v[0]) == [(0, b"first")] + [
        (p, b"%d" % i) for p in range(3) for i in range(p, 20, 3)]
