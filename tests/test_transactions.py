"""Transactions: markers on the wire, fencing, the state machine, offsets in a transaction.

Tansu shows aborted records to read_committed consumers (its Fetch never lists aborted
transactions), so commits and aborts are checked on the raw record batches, decoded by
kafka-python: data batches flagged transactional, then a COMMIT or ABORT control batch. A
read_committed consumer's view is checked on Apache Kafka (tests/real_kafka/test_transactions.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import traceback
import uuid

import pytest
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    TxnOffsetCommitResponse,
)

from aioproducer import Producer
from aioproducer.errors import (
    DeliveryTimeoutError,
    IllegalGenerationError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    KafkaConnectionError,
    KafkaError,
    ProducerClosedError,
    ProducerFencedError,
    TransactionalIdAuthorizationFailedError,
    TransactionAbortedError,
    TransactionFailedError,
    TransactionStateError,
)
from tests.support.cancel import producer_tasks
from tests.support.proxy import refuse_producer_ids
from tests.support.readback import (
    assert_contiguous_sequences,
    consume_all,
    fetch_raw_batches,
)


def _tid() -> str:
    return f"txn-{uuid.uuid4().hex[:8]}"


def _markers(bootstrap: str, topic: str, partition: int) -> list[str]:
    """The partition's batches as a list: 'data' for a transactional data batch, else the
    control type ('COMMIT'/'ABORT')."""
    out = []
    for batch in fetch_raw_batches(bootstrap, topic, partition):
        assert batch.is_transactional, "a batch of a transactional producer was not flagged"
        out.append(batch.control_type if batch.is_control else "data")
    return out


async def test_commit_writes_commit_markers_on_every_partition(broker, topic_factory):
    topic = topic_factory(2)
    async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
        async with producer.transaction():
            for i in range(100):
                await producer.enqueue(topic, b"%d" % i, partition=i % 2)
        async with producer.transaction():
            await producer.send(topic, b"second", partition=0)
    for partition in (0, 1):
        markers = _markers(broker.bootstrap, topic, partition)
        assert markers[-1] == "COMMIT" and "ABORT" not in markers
    assert _markers(broker.bootstrap, topic, 0).count("COMMIT") == 2
    got = consume_all(broker.bootstrap, topic, expected=101, isolation_level="read_committed")
    assert sorted(r.value for r in got) == sorted([b"%d" % i for i in range(100)] + [b"second"])


async def test_abort_writes_abort_markers_and_the_producer_goes_on(broker, topic_factory):
    topic = topic_factory(1)
    async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
        producer.begin_transaction()
        sent = [await producer.enqueue(topic, b"aborted-%d" % i) for i in range(10)]
        await producer.flush()
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"kept")
    assert all(h.result().offset >= 0 for h in sent)  # written, then marked aborted
    assert _markers(broker.bootstrap, topic, 0) == ["data", "ABORT", "data", "COMMIT"]


async def test_a_second_start_waits_for_init_transactions(broker, topic):
    """A task that starts the producer while another task's start() is registering the
    transactional id returns when the producer can begin a transaction, not before."""
    producer = Producer(broker.bootstrap, transactional_id=_tid())
    first = asyncio.create_task(producer.start())
    deadline = asyncio.get_running_loop().time() + 10
    # Until the first start() is in init_transactions(): loop turns, not sleeps, so as not to
    # miss that moment; bounded by time too, for a loaded machine's slow metadata.
    for _ in range(10_000_000):
        await asyncio.sleep(0)
        if producer.metrics().transaction_state == "initializing" or \
                asyncio.get_running_loop().time() > deadline:
            break
    assert producer.metrics().transaction_state == "initializing"
    await asyncio.wait_for(producer.start(), 10)
    try:
        async with producer.transaction():
            await producer.send(topic, b"v")
        await first
    finally:
        await producer.close()
    assert _markers(broker.bootstrap, topic, 0) == ["data", "COMMIT"]


async def test_start_refused_a_transactional_id_can_be_retried_once_granted(proxied_broker):
    """start() of a transactional producer whose principal may not use its transactional id
    raises TransactionalIdAuthorizationFailedError; once the ACL is granted, the same
    producer starts and commits."""
    cluster = proxied_broker
    cluster.create_topic("granted-later", 1)
    cluster.proxy.rewrite_responses(InitProducerIdResponse, refuse_producer_ids(53))
    producer = Producer(cluster.bootstrap, transactional_id=_tid())
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        await asyncio.wait_for(producer.start(), 10)
    cluster.proxy.rewrite_responses(InitProducerIdResponse, None)  # granted
    await asyncio.wait_for(producer.start(), 10)
    try:
        async with producer.transaction():
            await asyncio.wait_for(producer.send("granted-later", b"v"), 10)
    finally:
        await asyncio.wait_for(producer.close(), 10)
    assert cluster.proxy.rewritten == 1
    assert _markers(cluster.broker.bootstrap, "granted-later", 0) == ["data", "COMMIT"]


async def test_a_cancelled_commit_goes_on_and_a_second_call_waits_for_it(proxied_broker):
    """commit_transaction() under a timeout that fires (the broker is slow): the commit is not
    left half done, wedging the producer; it goes on, and calling it again waits for it."""
    cluster = proxied_broker
    cluster.create_topic("slow-commit", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        request_timeout_ms=10_000) as producer:
        producer.begin_transaction()
        await producer.send("slow-commit", b"a")
        cluster.proxy.stall(True)
        await producer.enqueue("slow-commit", b"b")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(producer.commit_transaction(), 0.5)
        cluster.proxy.stall(False)
        await asyncio.wait_for(producer.commit_transaction(), 10)
        async with producer.transaction():  # and the producer goes on
            await producer.send("slow-commit", b"c")
    assert _markers(cluster.broker.bootstrap, "slow-commit", 0) == \
        ["data", "data", "COMMIT", "data", "COMMIT"]


async def test_a_transaction_block_cut_short_in_its_commit_says_the_commit_goes_on(
        proxied_broker):
    """The block's body done, a timeout fires while its commit waits (the broker slow): the
    commit goes on, and the TimeoutError's chain says so (a user who took it for an abort and
    redid the transaction wrote it twice); commit_transaction() again returns once committed."""
    cluster = proxied_broker
    cluster.create_topic("cut-in-commit", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        request_timeout_ms=10_000) as producer:
        with pytest.raises(TimeoutError) as caught:
            async with asyncio.timeout(0.5):
                async with producer.transaction():
                    await producer.send("cut-in-commit", b"a")
                    cluster.proxy.stall(True)
                    await producer.enqueue("cut-in-commit", b"b")
        cluster.proxy.stall(False)
        told = "".join(traceback.format_exception(caught.value))
        assert "the transaction's commit was under way and goes on" in told, told
        await asyncio.wait_for(producer.commit_transaction(), 10)
    assert _markers(cluster.broker.bootstrap, "cut-in-commit", 0) == ["data", "data", "COMMIT"]


async def test_a_cancelled_init_transactions_goes_on_and_a_second_call_waits_for_it(
        proxied_broker, cut):
    """init_transactions() called again (to fence a zombie, say) under a timeout that fires:
    the producer is not left "initializing" for good, refusing every transaction; the call
    goes on, calling it again waits for it (one new epoch, not two), and the producer goes
    on."""
    cluster = proxied_broker
    cluster.create_topic("slow-init", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(),
                        request_timeout_ms=10_000) as producer:
        async with producer.transaction():
            await producer.send("slow-init", b"before")
        cluster.proxy.stall(True)
        async with cut(0.5):
            await producer.init_transactions()
        cluster.proxy.stall(False)
        await asyncio.wait_for(producer.init_transactions(), 10)
        async with producer.transaction():
            await producer.send("slow-init", b"after")
    batches = fetch_raw_batches(cluster.broker.bootstrap, "slow-init", 0)
    assert [b.control_type or "data" for b in batches] == ["data", "COMMIT"] * 2
    assert batches[2].producer_epoch == batches[0].producer_epoch + 1


async def test_init_transactions_that_ran_out_of_time_may_be_called_again(proxied_broker):
    """init_transactions() called again while the coordinator keeps answering
    COORDINATOR_LOAD_IN_PROGRESS (retriable) gives up after max_block_ms; as in the Java
    client the producer is not fatal for it: a transaction must wait for an init that
    succeeds, and calling init_transactions() again once the coordinator is back works."""
    cluster = proxied_broker
    cluster.create_topic("init-again", 1)
    loading = [False]
    refuse = refuse_producer_ids(14)
    # (A rewrite applies to the connections made after it is set: set before start.)
    cluster.proxy.rewrite_responses(InitProducerIdResponse,
                                    lambda response: refuse(response) if loading[0] else None)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), max_block_ms=1000,
                        retry_backoff_max_ms=200) as producer:
        loading[0] = True
        with pytest.raises(KafkaError, match="InitProducerId") as ran_out:
            await asyncio.wait_for(producer.init_transactions(), 10)
        assert ran_out.value.retriable
        with pytest.raises(TransactionStateError, match=r"call init_transactions\(\)"):
            producer.begin_transaction()
        loading[0] = False
        await asyncio.wait_for(producer.init_transactions(), 10)
        async with producer.transaction():
            await asyncio.wait_for(producer.send("init-again", b"after"), 10)
    assert _markers(cluster.broker.bootstrap, "init-again", 0) == ["data", "COMMIT"]


async def test_init_transactions_ends_within_max_block_ms_while_reconnects_back_off(
        proxied_broker):
    """init_transactions() while the broker is down and the producer backs off long between
    connection attempts (reconnect_backoff_ms=60 s): it gives up after max_block_ms with a
    KafkaConnectionError, as promised, not at the end of a backoff a minute away."""
    cluster = proxied_broker
    async with Producer(cluster.bootstrap, transactional_id=_tid(), max_block_ms=1000,
                        reconnect_backoff_ms=60_000, reconnect_backoff_max_ms=60_000,
                        retry_backoff_max_ms=200) as producer:
        cluster.proxy.refuse(True)
        with pytest.raises(KafkaConnectionError):
            await asyncio.wait_for(producer.init_transactions(), 10)
    cluster.proxy.heal()


async def _open_transaction(cluster, topic: str, value: bytes) -> Producer:
    """A started transactional producer (linger 0) with a transaction open and `value`
    acknowledged in it, on a new one-partition `topic`."""
    cluster.create_topic(topic, 1)
    producer = Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        request_timeout_ms=10_000)
    await producer.start()
    producer.begin_transaction()
    await asyncio.wait_for(producer.send(topic, value), 10)
    return producer


async def test_a_commit_asked_once_close_began_says_the_producer_is_closing(proxied_broker):
    """commit_transaction() called after close() began aborting the open transaction (a
    handler racing the shutdown): ProducerClosedError saying why, not "an abort is under
    way" for an abort the caller never asked for; close() then ends, aborted."""
    cluster = proxied_broker
    producer = await _open_transaction(cluster, "late-commit", b"open")
    cluster.proxy.stall(True)  # close()'s abort waits for its EndTxn
    closing = asyncio.create_task(producer.close())
    for _ in range(100):  # until close() is aborting (at most 5 s)
        if producer.metrics().transaction_state == "aborting":
            break
        await asyncio.sleep(0.05)
    assert producer.metrics().transaction_state == "aborting"
    with pytest.raises(ProducerClosedError, match="closing.*commit before close"):
        await producer.commit_transaction()
    cluster.proxy.heal()
    await asyncio.wait_for(closing, 10)
    assert _markers(cluster.broker.bootstrap, "late-commit", 0) == ["data", "ABORT"]


async def test_close_lets_a_commit_under_way_finish(proxied_broker):
    """close() while another task commits (a service shutting down mid-request): the commit
    ends, committed, instead of failing because close() took the connections away."""
    cluster = proxied_broker
    producer = await _open_transaction(cluster, "closing-commit", b"a")
    cluster.proxy.stall(True)
    await producer.enqueue("closing-commit", b"b")
    committing = asyncio.create_task(producer.commit_transaction())
    await asyncio.sleep(0.2)
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0.2)
    with pytest.raises(ProducerClosedError, match="closing"):
        producer.begin_transaction()  # no new transaction once close() began
    cluster.proxy.stall(False)
    await asyncio.wait_for(committing, 10)
    await asyncio.wait_for(closing, 10)
    assert _markers(cluster.broker.bootstrap, "closing-commit", 0) == ["data", "data", "COMMIT"]


async def test_close_aborts_a_transaction_left_open(broker, topic):
    """As the Java client does: a transaction still open at close() is aborted, or
    read_committed consumers would wait for it until the coordinator times it out."""
    producer = Producer(broker.bootstrap, transactional_id=_tid(), linger_ms=10_000)
    await producer.start()
    producer.begin_transaction()
    sent = await producer.enqueue(topic, b"sent")
    await producer.flush()
    unsent = await producer.enqueue(topic, b"unsent")
    await asyncio.wait_for(producer.close(), 10)
    assert sent.result().offset == 0
    with pytest.raises(TransactionAbortedError):
        unsent.result()
    assert _markers(broker.bootstrap, topic, 0) == ["data", "ABORT"]


async def test_a_transaction_block_cancelled_after_close_stays_cancelled(broker, topic):
    """A task inside `async with producer.transaction()` (waiting for its input, say) is
    cancelled after the service closed the producer, which aborted the transaction: the
    task ends cancelled, as asyncio.timeout() and TaskGroup rely on, not with a
    ProducerClosedError from aborting once more on a closed producer."""
    producer = Producer(broker.bootstrap, transactional_id=_tid())
    await producer.start()
    inside = asyncio.Event()

    async def handle() -> None:
        async with producer.transaction():
            await producer.send(topic, b"v")
            inside.set()
            await asyncio.Event().wait()  # until cancelled
    task = asyncio.create_task(handle())
    await asyncio.wait_for(inside.wait(), 10)
    await asyncio.wait_for(producer.close(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert _markers(broker.bootstrap, topic, 0) == ["data", "ABORT"]


async def test_exception_in_transaction_block_aborts_unsent_records(broker, topic):
    async with Producer(broker.bootstrap, transactional_id=_tid(), linger_ms=10_000) as producer:
        with pytest.raises(RuntimeError, match="boom"):
            async with producer.transaction():
                handle = await producer.enqueue(topic, b"never sent")
                raise RuntimeError("boom")
        with pytest.raises(TransactionAbortedError):
            await handle
        async with producer.transaction():
            after = await producer.enqueue(topic, b"after")  # commit sends it despite linger
        assert (await after).offset >= 0
    markers = _markers(broker.bootstrap, topic, 0)
    assert markers == ["data", "COMMIT"]  # the aborted record never reached the broker


async def test_commit_waits_for_records_still_in_flight(broker, topic_factory):
    topic = topic_factory(3)
    async with Producer(broker.bootstrap, transactional_id=_tid(), linger_ms=1000) as producer:
        producer.begin_transaction()
        handles = [await producer.enqueue(topic, b"%d" % i) for i in range(5000)]
        assert not all(h.done() for h in handles)
        await producer.commit_transaction()  # must not commit before the records are written
        assert all(h.result().offset >= 0 for h in handles)
    for partition in range(3):
        markers = _markers(broker.bootstrap, topic, partition)
        if markers:
            assert markers[-1] == "COMMIT" and set(markers[:-1]) == {"data"}


async def test_second_producer_with_same_id_fences_the_first(broker, topic):
    tid = _tid()
    first = Producer(broker.bootstrap, transactional_id=tid)
    await first.start()
    try:
        first.begin_transaction()
        await first.send(topic, b"zombie")
        async with Producer(broker.bootstrap, transactional_id=tid) as second:
            # The zombie's next records fail: Tansu answers them PRODUCER_FENCED (fatal),
            # Apache Kafka INVALID_PRODUCER_EPOCH (abortable, as in the Java client), and its
            # coordinator then answers the abort PRODUCER_FENCED.
            with pytest.raises((ProducerFencedError, InvalidProducerEpochError)):
                await first.send(topic, b"zombie-2")
            with pytest.raises(ProducerFencedError):
                await first.abort_transaction()
            with pytest.raises(ProducerFencedError):  # fatal: it stays fenced
                first.begin_transaction()
            async with second.transaction():
                await second.send(topic, b"successor")
    finally:
        await first.close()
    markers = _markers(broker.bootstrap, topic, 0)
    assert markers[-1] == "COMMIT"
    assert "ABORT" in markers  # the zombie's open transaction was aborted by the coordinator


@pytest.mark.parametrize("call, advice", [
    ("commit_without_begin", "begin_transaction"), ("abort_without_begin", "begin_transaction"),
    ("begin_twice", "commit_transaction"), ("send_outside", "begin_transaction"),
])
async def test_illegal_transitions(broker, topic, call, advice):
    async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
        with pytest.raises(TransactionStateError, match=advice):
            if call == "commit_without_begin":
                await producer.commit_transaction()
            elif call == "abort_without_begin":
                await producer.abort_transaction()
            elif call == "begin_twice":
                producer.begin_transaction()
                producer.begin_transaction()
            else:
                await producer.send(topic, b"outside")


async def test_concurrent_transaction_blocks_are_told_to_take_turns(broker, topic):
    """Request handlers each running `async with producer.transaction()` on the app's one
    transactional producer: the second block's begin said "cannot go from 'in transaction' to
    'in transaction'", as if the handler had begun twice. It says a producer has one
    transaction at a time and how to take turns; the first block commits unharmed."""
    async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
        async def handler(value: bytes) -> None:
            async with producer.transaction():
                await producer.send(topic, value)
                await asyncio.sleep(0.05)

        first, second = await asyncio.gather(handler(b"first"), handler(b"second"),
                                             return_exceptions=True)
    assert first is None
    assert isinstance(second, TransactionStateError)
    assert "one transaction at a time" in str(second) and "asyncio.Lock" in str(second)
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1,
                                         isolation_level="read_committed")] == [b"first"]


async def test_transaction_calls_need_a_transactional_id(broker):
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(TransactionStateError, match="transactional_id"):
            producer.begin_transaction()


def test_transaction_calls_from_another_event_loop_are_refused(broker, topic):
    """As send() is: a commit started from another loop would run there, fail, and leave the
    transaction 'committing' for good, so that no commit or abort could end it."""
    producer = Producer(broker.bootstrap, transactional_id=_tid())
    own = asyncio.new_event_loop()

    async def in_transaction():
        producer.begin_transaction()
        await producer.send(topic, b"committed")

    async def elsewhere(call):
        with pytest.raises(RuntimeError, match="another one"):
            await asyncio.wait_for(call(), 5)

    try:
        own.run_until_complete(producer.start())
        own.run_until_complete(in_transaction())
        for call in (producer.commit_transaction, producer.abort_transaction,
                     lambda: producer.send_offsets_to_transaction({(topic, 0): 1}, "group"),
                     lambda: producer.partitions_for("not-yet-known")):
            asyncio.run(elsewhere(call))
        own.run_until_complete(producer.commit_transaction())
        own.run_until_complete(producer.close())
    finally:
        own.close()
    assert _markers(broker.bootstrap, topic, 0) == ["data", "COMMIT"]


async def test_send_offsets_to_transaction(broker, topic_factory):
    from confluent_kafka import Consumer, TopicPartition

    source, sink = topic_factory(1), topic_factory(1)
    group = f"group-{uuid.uuid4().hex[:8]}"
    async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
        async with producer.transaction():
            await producer.send(sink, b"derived")
            await producer.send_offsets_to_transaction({(source, 0): 42}, group)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        [committed] = await asyncio.to_thread(
            consumer.committed, [TopicPartition(source, 0)], 10)
    finally:
        consumer.close()
    assert committed.offset == 42
    assert _markers(broker.bootstrap, sink, 0) == ["data", "COMMIT"]


async def test_confluent_kafkas_consumer_positions_go_in_as_they_are(broker, topic_factory):
    """confluent-kafka's consume-transform-produce idiom: send_offsets_to_transaction(
    consumer.position(consumer.assignment()), consumer.consumer_group_metadata()). A partition
    the consumer has read nothing from yet is at the logical position OFFSET_INVALID (-1001),
    which librdkafka's producer leaves out; ours refused the whole list ("offsets must map
    ..."), so the partitions that were read could not commit their offsets."""
    from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

    source, sink = topic_factory(2), topic_factory(1)
    group = f"group-{uuid.uuid4().hex[:8]}"
    async with Producer(broker.bootstrap) as plain:
        await plain.send(source, b"input", partition=0)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(source, 0), TopicPartition(source, 1)])
        message = None
        for _ in range(100):  # at most 10 s
            message = await asyncio.to_thread(consumer.poll, 0.1)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.value() == b"input"
        positions = consumer.position(consumer.assignment())
        assert sorted((p.partition, p.offset) for p in positions) == [(0, 1), (1, OFFSET_INVALID)]
        async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
            async with producer.transaction():
                await producer.send(sink, message.value().upper())
                await producer.send_offsets_to_transaction(
                    positions, consumer.consumer_group_metadata())
            async with producer.transaction():  # none read yet: nothing to commit
                await producer.send(sink, b"nothing read")
                await producer.send_offsets_to_transaction(
                    [TopicPartition(source, 1, OFFSET_INVALID)], group)
        committed = await asyncio.to_thread(
            consumer.committed, [TopicPartition(source, 0), TopicPartition(source, 1)], 10)
    finally:
        consumer.close()
    assert [c.offset for c in committed] == [1, OFFSET_INVALID]  # none committed for 1
    assert _markers(broker.bootstrap, sink, 0) == ["data", "COMMIT", "data", "COMMIT"]


async def test_committed_offsets_are_what_committed_transactions_sent(broker, topic_factory):
    """committed_offsets() reads back what send_offsets_to_transaction() committed, as
    librdkafka's consumer does: a committed transaction's offset, not an aborted one's, nor
    that of a transaction left open by a producer that a new one with its id fenced."""
    from confluent_kafka import Consumer, TopicPartition

    source = topic_factory(2)
    group, tid = f"group-{uuid.uuid4().hex[:8]}", _tid()
    partitions = [(source, 0), (source, 1)]
    # max_block_ms: fenced at the end, its close gives up aborting (Tansu drops the connection
    # on a fenced EndTxn, which the producer retries) in 2 s rather than the default 60.
    async with Producer(broker.bootstrap, transactional_id=tid, max_block_ms=2000) as producer:
        assert await producer.committed_offsets(group, partitions) == {(source, 0): -1,
                                                                       (source, 1): -1}
        async with producer.transaction():
            await producer.send_offsets_to_transaction({(source, 0): 7}, group)
        producer.begin_transaction()
        await producer.send_offsets_to_transaction({(source, 0): 9, (source, 1): 3}, group)
        await producer.abort_transaction()
        assert await producer.committed_offsets(group, partitions) == {(source, 0): 7,
                                                                       (source, 1): -1}
        producer.begin_transaction()
        await producer.send_offsets_to_transaction({(source, 0): 11}, group)
        async with Producer(broker.bootstrap, transactional_id=tid) as successor:
            assert await successor.committed_offsets(group, partitions[:1]) == {(source, 0): 7}
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        committed = await asyncio.to_thread(
            consumer.committed, [TopicPartition(source, 0), TopicPartition(source, 1)], 10)
    finally:
        consumer.close()
    assert [c.offset for c in committed] == [7, -1001]  # librdkafka: -1001, none committed


async def test_committed_offsets_need_a_transactional_producer(broker, topic):
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(TransactionStateError, match="transactional_id"):
            await producer.committed_offsets("group", [(topic, 0)])


@pytest.mark.parametrize("offsets", [{("t", "0"): 1}, {("t", 0): "1"}, {"t": 1}, {(None, 0): 1},
                                     {("t", 0): -1}, [object()], 5])
async def test_send_offsets_checks_its_input_first(broker, topic, offsets):
    async with Producer(broker.bootstrap, transactional_id=_tid()) as producer:
        async with producer.transaction():
            with pytest.raises(InvalidRecordError, match="offsets must map"):
                await producer.send_offsets_to_transaction(offsets, "group")
            await producer.send(topic, b"the transaction goes on")
    assert _markers(broker.bootstrap, topic, 0) == ["data", "COMMIT"]


async def test_abort_after_an_abortable_error_then_go_on(proxied_broker):
    """A record of the transaction fails (its request stalls past delivery_timeout_ms): commit
    is refused with a clear error, abort works, and the next transaction commits."""
    cluster = proxied_broker
    cluster.create_topic("abortable", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), request_timeout_ms=400,
                        delivery_timeout_ms=900, linger_ms=0, retry_backoff_ms=20) as producer:
        producer.begin_transaction()
        await producer.send("abortable", b"first")  # the partition is in the transaction
        cluster.proxy.stall(True)
        doomed = await producer.enqueue("abortable", b"doomed")
        with pytest.raises(DeliveryTimeoutError):
            await asyncio.wait_for(doomed, 10)
        cluster.proxy.stall(False)
        with pytest.raises(TransactionStateError, match="abort"):
            await producer.commit_transaction()
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("abortable", b"next")
    markers = _markers(cluster.broker.bootstrap, "abortable", 0)
    assert "ABORT" in markers and markers[-1] == "COMMIT"


async def test_abort_of_a_record_awaiting_its_retry_then_go_on(proxied_broker):
    """abort_transaction() fails a record that was sent (so numbered) but never reached the
    broker and waits for its retry. The next transactions commit: the abort starts a new
    epoch, so the gap that record left in the sequence numbers does not make the broker
    refuse every later batch of the partition."""
    cluster = proxied_broker
    cluster.create_topic("retrying", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        request_timeout_ms=1000, delivery_timeout_ms=3000,
                        retry_backoff_ms=1000, retry_backoff_max_ms=1000) as producer:
        async with producer.transaction():
            await producer.send("retrying", b"t0")
        producer.begin_transaction()
        await producer.send("retrying", b"t1")  # the partition is in the transaction
        cluster.proxy.cut_after(8, "up")  # the next request never reaches the broker
        lost = await producer.enqueue("retrying", b"t1-lost")
        for _ in range(100):
            if cluster.proxy.cuts:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the producer sees the cut; the retry waits >= 0.8 s
        assert cluster.proxy.cuts == 1 and not lost.done()
        await producer.abort_transaction()
        with pytest.raises(TransactionAbortedError):
            await lost
        for n in (2, 3):
            async with producer.transaction():
                await producer.send("retrying", b"t%d" % n)
    markers = _markers(cluster.broker.bootstrap, "retrying", 0)
    assert markers == ["data", "COMMIT", "data", "ABORT", "data", "COMMIT", "data", "COMMIT"]
    got = consume_all(cluster.broker.bootstrap, "retrying", expected=4)
    assert [r.value for r in got] == [b"t0", b"t1", b"t2", b"t3"]  # Tansu shows aborted ones


async def test_batches_split_for_the_brokers_limit_commit_with_their_transaction(proxied_broker):
    """The broker refuses the transaction's 64 KiB batches as too large (its limit is 3,000
    bytes): they are split until they fit, the transaction commits, and every record is
    there once, in order, with the pieces' sequence numbers contiguous."""
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("txn-split", 2)
    values = [b"%05d:" % i + os.urandom(100) for i in range(1000)]
    async with Producer(cluster.bootstrap, transactional_id=_tid(), batch_size=65536,
                        linger_ms=20) as producer:
        async with producer.transaction():
            handles = [await producer.enqueue("txn-split", value, partition=i % 2)
                       for i, value in enumerate(values)]
    assert cluster.proxy.refused_batches >= 2, "the limit never bit: the test proves nothing"
    assert all(handle.exception() is None for handle in handles)
    got = consume_all(cluster.broker.bootstrap, "txn-split", len(values))
    for partition in (0, 1):
        assert [r.value for r in got if r.partition == partition] == values[partition::2]
        batches = fetch_raw_batches(cluster.broker.bootstrap, "txn-split", partition)
        assert [b.control_type for b in batches if b.is_control] == ["COMMIT"]
        assert_contiguous_sequences([b for b in batches if not b.is_control])


async def test_fenced_producer_fails_records_of_partitions_not_yet_added(broker, topic_factory):
    """Fenced while a record waits for its partition to join the transaction (the fence
    shows on AddPartitionsToTxn): the record fails with ProducerFencedError, not with
    DeliveryTimeoutError once delivery_timeout_ms has passed."""
    topic = topic_factory(2)
    tid = _tid()
    zombie = Producer(broker.bootstrap, transactional_id=tid, linger_ms=0,
                      request_timeout_ms=2000, delivery_timeout_ms=5000)
    await zombie.start()
    try:
        zombie.begin_transaction()
        await zombie.send(topic, b"a", partition=0)
        async with Producer(broker.bootstrap, transactional_id=tid):
            with pytest.raises(ProducerFencedError, match="fenced"):
                await asyncio.wait_for(zombie.send(topic, b"b", partition=1), 10)
    finally:
        await zombie.close()


async def test_failed_transaction_fails_records_of_partitions_not_yet_added(proxied_broker):
    """AddPartitionsToTxn fails (no answer within max_block_ms): the transaction can only be
    aborted, and the record waiting for its partition fails with that cause at once, not
    with DeliveryTimeoutError at delivery_timeout_ms. Then abort, and go on."""
    cluster = proxied_broker
    cluster.create_topic("unadded", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        request_timeout_ms=300, max_block_ms=600,
                        delivery_timeout_ms=5000) as producer:
        async with producer.transaction():
            await producer.send("unadded", b"first")  # metadata known before the stall
        producer.begin_transaction()
        cluster.proxy.stall(True)
        waiting = await producer.enqueue("unadded", b"never added")
        with pytest.raises(KafkaError) as failed:
            await asyncio.wait_for(waiting, 10)
        cluster.proxy.stall(False)
        assert not isinstance(failed.value, DeliveryTimeoutError)
        with pytest.raises(TransactionStateError, match="abort") as refused:
            await producer.commit_transaction()
        assert refused.value.__cause__ is failed.value  # the cause the record failed with
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("unadded", b"next")
    got = consume_all(cluster.broker.bootstrap, "unadded", expected=2)
    assert [r.value for r in got] == [b"first", b"next"]


# -- errors Tansu never sends, as Apache Kafka's brokers send them (the proxy rewrites answers)


def _once(change):
    """A rewrite for FaultProxy.rewrite_responses that changes the first response only."""
    changed = []

    def rewrite(response):
        if changed:
            return None
        changed.append(change(response))
        return response
    rewrite.changed = changed
    return rewrite


async def test_records_refused_for_an_old_epoch_make_the_transaction_abortable(proxied_broker):
    """Apache Kafka refuses a batch whose epoch is no longer the coordinator's with
    INVALID_PRODUCER_EPOCH (KIP-588: the transaction timed out). As in the Java client, that
    is abortable, not fatal: the abort works, starts a new epoch, and the producer goes on."""
    cluster = proxied_broker
    cluster.create_topic("old-epoch", 1)

    def old_epoch(response):
        for topic in response.responses:
            for partition in topic.partition_responses:
                partition.error_code, partition.base_offset = 47, -1
    cluster.proxy.rewrite_responses(ProduceResponse, _once(old_epoch))
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0) as producer:
        producer.begin_transaction()
        with pytest.raises(InvalidProducerEpochError):
            await producer.send("old-epoch", b"refused")
        with pytest.raises(TransactionStateError, match="abort") as refused:
            await producer.commit_transaction()
        assert isinstance(refused.value.__cause__, InvalidProducerEpochError)
        assert refused.value.abortable and not refused.value.fatal  # what is left: abort
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("old-epoch", b"next")
    assert cluster.proxy.rewritten == 1
    batches = fetch_raw_batches(cluster.broker.bootstrap, "old-epoch", 0)
    assert [b.control_type if b.is_control else "data" for b in batches] == \
        ["data", "ABORT", "data", "COMMIT"]  # the broker did write the refused batch
    assert batches[2].producer_epoch > batches[0].producer_epoch
    assert [r[2] for r in batches[2].records] == [b"next"]


@pytest.mark.parametrize("code, error", [(53, TransactionalIdAuthorizationFailedError),
                                         (48, InvalidTxnStateError)])
async def test_fatal_answers_of_the_coordinator_close_the_door(proxied_broker, code, error):
    """AddPartitionsToTxn answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED or INVALID_TXN_STATE
    is fatal, as in the Java client: the record fails with that error, and every transaction
    call after it says the producer cannot go on."""
    cluster = proxied_broker
    cluster.create_topic("refused-txn", 1)

    def refuse(response):
        for topic in response.results_by_topic_v3_and_below:
            for partition in topic.results_by_partition:
                partition.partition_error_code = code
    cluster.proxy.rewrite_responses(AddPartitionsToTxnResponse, _once(refuse))
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0) as producer:
        producer.begin_transaction()
        with pytest.raises(error):
            await asyncio.wait_for(producer.send("refused-txn", b"never"), 10)
        for call in (producer.abort_transaction, producer.commit_transaction):
            with pytest.raises(TransactionStateError, match="fatal error.*close it") as refused:
                await call()
            assert refused.value.fatal
        with pytest.raises(TransactionStateError, match="fatal error.*close it"):
            producer.begin_transaction()
    assert cluster.proxy.rewritten == 1


async def test_a_block_that_raises_keeps_its_exception_when_the_abort_fails(proxied_broker):
    """The block of `transaction()` raised, and the abort it makes is then refused (EndTxn
    answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal): the user gets the block's own
    exception, with the abort's failure as a note, not the abort's error in its place; the
    next transaction call says the producer cannot go on."""
    cluster = proxied_broker
    cluster.create_topic("abort-refused", 1)

    def refuse(response):
        response.error_code = 53
    cluster.proxy.rewrite_responses(EndTxnResponse, _once(refuse))
    async with Producer(cluster.bootstrap, transactional_id=_tid()) as producer:
        with pytest.raises(ValueError, match="the block's own error") as raised:
            async with producer.transaction():
                await producer.send("abort-refused", b"aborted")
                raise ValueError("the block's own error")
        assert any("aborting the transaction failed too: TransactionalIdAuthorization" in note
                   for note in raised.value.__notes__)
        with pytest.raises(TransactionStateError, match="fatal error.*close it"):
            producer.begin_transaction()
    assert cluster.proxy.rewritten == 1


async def test_a_retriable_partition_error_retries_the_whole_add(proxied_broker):
    """Apache Kafka answers AddPartitionsToTxn for a topic it does not know yet with
    UNKNOWN_TOPIC_OR_PARTITION for it and OPERATION_NOT_ATTEMPTED for the others: the
    request is sent again (as the Java client does), not taken as the transaction failing."""
    cluster = proxied_broker
    cluster.create_topic("add-again", 2)

    def one_unknown(response):
        partitions = [p for t in response.results_by_topic_v3_and_below
                      for p in t.results_by_partition]
        for partition in partitions:
            partition.partition_error_code = 55 if partition.partition_index == 0 else 3
        return len(partitions)
    rewrite = _once(one_unknown)
    cluster.proxy.rewrite_responses(AddPartitionsToTxnResponse, rewrite)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=20) as producer:
        await producer.partitions_for("add-again")
        async with producer.transaction():
            handles = [await producer.enqueue("add-again", b"%d" % p, partition=p)
                       for p in (0, 1)]
    assert rewrite.changed == [2], "both partitions must be in the refused request"
    assert [(await h).partition for h in handles] == [0, 1]
    for partition in (0, 1):
        assert _markers(cluster.broker.bootstrap, "add-again", partition) == ["data", "COMMIT"]


async def test_closing_at_once_during_a_commit_fails_the_commit_with_the_reason(proxied_broker):
    """close(timeout=0) while a commit waits for its partitions to be added (the coordinator
    answers CONCURRENT_TRANSACTIONS, retried until max_block_ms): the commit fails at once
    with the reason, the producer's close, not with a CancelledError nobody asked for."""
    cluster = proxied_broker
    cluster.create_topic("busy-coordinator", 1)

    def busy(response):
        for topic in response.results_by_topic_v3_and_below:
            for partition in topic.results_by_partition:
                partition.partition_error_code = 51
        return response
    cluster.proxy.rewrite_responses(AddPartitionsToTxnResponse, busy)
    producer = Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0)
    await producer.start()
    producer.begin_transaction()
    handle = await producer.enqueue("busy-coordinator", b"never sent")
    committing = asyncio.create_task(producer.commit_transaction())
    for _ in range(200):  # until the coordinator has said it is busy (at most 10 s)
        if cluster.proxy.rewritten:
            break
        await asyncio.sleep(0.05)
    assert cluster.proxy.rewritten
    await producer.close(timeout=0)  # (awaited as is: wait_for's task gives the commit time)
    assert producer_tasks() == [], "the commit outlived close()"
    with pytest.raises(TransactionStateError, match="cannot commit") as failed:
        await asyncio.wait_for(committing, 10)
    assert isinstance(failed.value.__cause__, ProducerClosedError)
    with pytest.raises(ProducerClosedError):
        await handle


async def test_closing_at_once_while_a_commit_reconnects_fails_it_with_the_reason(
        proxied_broker):
    """close(timeout=0) while the commit's EndTxn waits for a new connection to its
    coordinator (the old one was lost, the new one is not answering yet): the commit fails
    with ProducerClosedError, not with a CancelledError its caller never asked for."""
    cluster = proxied_broker
    cluster.create_topic("reconnecting", 1)
    producer = Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0)
    await producer.start()
    producer.begin_transaction()
    await producer.send("reconnecting", b"sent")
    accepted = cluster.proxy.connections_accepted
    cluster.proxy.stall(True)
    cluster.proxy.cut_all()
    committing = asyncio.create_task(producer.commit_transaction())
    for _ in range(200):  # until a new connection hangs on its ApiVersions (at most 10 s)
        if cluster.proxy.connections_accepted > accepted:
            break
        await asyncio.sleep(0.05)
    assert cluster.proxy.connections_accepted > accepted
    await producer.close(timeout=0)  # (awaited as is: wait_for's task gives the commit time)
    assert producer_tasks() == [], "the commit outlived close()"
    with pytest.raises(ProducerClosedError):
        await asyncio.wait_for(committing, 10)
    cluster.proxy.stall(False)


async def test_failed_send_offsets_make_the_transaction_abortable(proxied_broker):
    """TxnOffsetCommit answered ILLEGAL_GENERATION (the consumer group moved on): the offsets
    are not in the transaction, so it must not commit; the abort works and the producer
    goes on. The same when send_offsets_to_transaction() is cancelled half way."""
    from confluent_kafka import Consumer, TopicPartition

    cluster = proxied_broker
    cluster.create_topic("offsets-src", 1)
    cluster.create_topic("offsets-out", 1)
    group = f"group-{uuid.uuid4().hex[:8]}"

    def illegal_generation(response):
        for topic in response.topics:
            for partition in topic.partitions:
                partition.error_code = 22
    cluster.proxy.rewrite_responses(TxnOffsetCommitResponse, _once(illegal_generation))
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        request_timeout_ms=5000) as producer:
        producer.begin_transaction()
        await producer.send("offsets-out", b"derived-1")
        with pytest.raises(IllegalGenerationError):
            await producer.send_offsets_to_transaction({("offsets-src", 0): 7}, group)
        with pytest.raises(TransactionStateError, match="abort"):
            await producer.commit_transaction()
        await producer.abort_transaction()

        producer.begin_transaction()
        await producer.send("offsets-out", b"derived-2")
        cluster.proxy.stall(True)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                producer.send_offsets_to_transaction({("offsets-src", 0): 8}, group), 0.5)
        cluster.proxy.stall(False)
        with pytest.raises(TransactionStateError, match="cancelled"):
            await producer.commit_transaction()
        await producer.abort_transaction()

        async with producer.transaction():
            await producer.send("offsets-out", b"derived-3")
            await producer.send_offsets_to_transaction({("offsets-src", 0): 9}, group)
    assert cluster.proxy.rewritten == 1
    assert _markers(cluster.broker.bootstrap, "offsets-out", 0) == \
        ["data", "ABORT", "data", "ABORT", "data", "COMMIT"]
    consumer = Consumer({"bootstrap.servers": cluster.broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        [committed] = await asyncio.to_thread(
            consumer.committed, [TopicPartition("offsets-src", 0)], 10)
    finally:
        consumer.close()
    assert committed.offset == 9


async def _ends_in_background(producer: Producer, commit: bool, cluster, cut) -> None:
    """Commit or abort cut short while the broker stalls; the call goes on in the
    background and, once the broker answers, ends (its marker on the wire)."""
    end = producer.commit_transaction if commit else producer.abort_transaction
    cluster.proxy.stall(True)
    async with cut(0.3):
        await end()
    cluster.proxy.stall(False)
    marker = "COMMIT" if commit else "ABORT"
    for _ in range(100):  # at most 10 s
        if marker in _markers(cluster.broker.bootstrap, "ended-once", 0):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {marker} marker")


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_a_second_call_reports_the_outcome_of_one_cut_short(proxied_broker, commit, cut):
    """The README says: call commit_transaction() again to learn the outcome of one cut
    short. Once that commit ended in the background, the second call returns (it used to
    raise "cannot go from 'ready' to 'committing'", and an app that then redid the
    transaction wrote it twice); the same for abort. Until the next transaction begins."""
    cluster = proxied_broker
    producer = await _open_transaction(cluster, "ended-once", b"a")
    try:
        await _ends_in_background(producer, commit, cluster, cut)
        end = producer.commit_transaction if commit else producer.abort_transaction
        await asyncio.wait_for(end(), 10)
        await asyncio.wait_for(end(), 10)  # still the same outcome
        producer.begin_transaction()  # the next transaction: its own commit, not the last
        await producer.send("ended-once", b"b")
        await asyncio.wait_for(producer.commit_transaction(), 10)
    finally:
        await asyncio.wait_for(producer.close(), 10)
    assert _markers(cluster.broker.bootstrap, "ended-once", 0) == \
        ["data", "COMMIT" if commit else "ABORT", "data", "COMMIT"]


async def test_an_abort_cut_short_by_an_outage_may_be_tried_again(proxied_broker):
    """abort_transaction() while the broker is unreachable for longer than max_block_ms
    raises a retriable error and leaves the producer able to abort again once the broker is
    back (it used to make the producer fatal for good: a lost connection is retriable).
    max_block_ms is 3 s: the second abort reconnects, finds the coordinator and ends the
    transaction within it, which 1 s did not always allow a test worker sharing 2 cores."""
    cluster = proxied_broker
    cluster.create_topic("outage-abort", 1)
    async with Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        max_block_ms=3000, request_timeout_ms=1000,
                        retry_backoff_ms=50) as producer:
        producer.begin_transaction()
        await asyncio.wait_for(producer.send("outage-abort", b"a"), 10)
        cluster.proxy.refuse(True)
        with pytest.raises(KafkaError) as caught:
            await asyncio.wait_for(producer.abort_transaction(), 20)
        assert caught.value.retriable, caught.value
        cluster.proxy.heal()
        await asyncio.wait_for(producer.abort_transaction(), 20)
        async with producer.transaction():
            await producer.send("outage-abort", b"b")
    assert _markers(cluster.broker.bootstrap, "outage-abort", 0) == \
        ["data", "ABORT", "data", "COMMIT"]


async def test_a_failed_commit_cut_short_raises_its_error_when_called_again(proxied_broker):
    """A commit cut short by its caller's timeout, then refused by the coordinator
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): calling commit_transaction() again raises that
    error, not a complaint about the state the commit left."""
    cluster = proxied_broker
    refuse = _once(lambda response: setattr(response, "error_code", 53))
    cluster.proxy.rewrite_responses(EndTxnResponse, refuse)
    producer = await _open_transaction(cluster, "refused-commit", b"a")
    try:
        cluster.proxy.stall(True)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(producer.commit_transaction(), 0.5)
        cluster.proxy.stall(False)
        for _ in range(200):  # until the commit ended (at most 10 s)
            if producer.metrics().transaction_state == "fatal error":
                break
            await asyncio.sleep(0.05)
        assert producer.metrics().transaction_state == "fatal error"  # (a second call now cannot join it)
        for _ in range(2):
            with pytest.raises(TransactionalIdAuthorizationFailedError):
                await asyncio.wait_for(producer.commit_transaction(), 10)
    finally:
        await asyncio.wait_for(producer.close(), 10)
    assert refuse.changed


def test_confluent_kafkas_group_metadata_is_read():
    """confluent-kafka's consumer_group_metadata() is librdkafka's serialized form (bytes):
    its group id, generation, member id and group instance id go to TxnOffsetCommit for
    KIP-447's fencing of zombies. (These are the bytes librdkafka 2.x wrote for a member of
    generation 1, with and without group.instance.id; test_transactions_v2 uses a live one.)"""
    from aioproducer._internal.arguments import group_fields

    generation = (1).to_bytes(4, sys.byteorder)
    assert group_fields(b"CGMDv2:" + generation + b"g\x00m-1\x00\x00inst-1\x00") == {
        "group_id": "g", "generation_id": 1, "member_id": "m-1", "group_instance_id": "inst-1"}
    assert group_fields(b"CGMDv2:" + generation + b"g\x00rdkafka-2\x00\x01") == {
        "group_id": "g", "generation_id": 1, "member_id": "rdkafka-2",
        "group_instance_id": None}
    with pytest.raises(InvalidRecordError, match="confluent-kafka"):
        group_fields(b"CGMDv2:\x01")


@pytest.mark.parametrize("call", ["commit", "abort", "send_offsets", "init"])
async def test_a_transactional_call_rides_out_a_broker_restart(proxied_broker, call):
    """The broker goes away with every connection cut and refuses new ones for 2 s (a
    restart that keeps its state, as Kafka's does; Tansu forgets everything on a real
    restart) while a transactional call runs: the call reconnects, finds the coordinator
    again and finishes within max_block_ms, as the Java client's do, and the records land
    as the call said (init: start() of a producer whose broker goes away after the first
    metadata)."""
    cluster = proxied_broker
    cluster.create_topic("restarted", 1)
    producer = Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        max_block_ms=8000, request_timeout_ms=3000, retry_backoff_ms=50)

    def restart() -> None:
        cluster.proxy.refuse(True)
        threading.Timer(2.0, cluster.proxy.heal).start()

    if call == "init":
        original = Producer.init_transactions

        async def broker_restarts_first(self: Producer) -> None:
            restart()
            await original(self)

        Producer.init_transactions = broker_restarts_first
        try:
            await asyncio.wait_for(producer.start(), 20)
        finally:
            Producer.init_transactions = original
        producer.begin_transaction()
        await producer.send("restarted", b"a")
    else:
        await producer.start()
        producer.begin_transaction()
        await asyncio.wait_for(producer.send("restarted", b"a"), 10)
        restart()
    try:
        started = asyncio.get_running_loop().time()
        if call == "send_offsets":
            await asyncio.wait_for(producer.send_offsets_to_transaction(
                {("restarted", 0): 1}, f"group-{uuid.uuid4().hex[:8]}"), 20)
        if call == "abort":
            await asyncio.wait_for(producer.abort_transaction(), 20)
        else:
            await asyncio.wait_for(producer.commit_transaction(), 20)
        assert asyncio.get_running_loop().time() - started < 8 + 1
        async with producer.transaction():  # and the producer goes on
            await producer.send("restarted", b"b")
    finally:
        await asyncio.wait_for(producer.close(), 10)
    assert cluster.proxy.connections_refused or call == "init"
    assert _markers(cluster.broker.bootstrap, "restarted", 0) == \
        ["data", "ABORT" if call == "abort" else "COMMIT", "data", "COMMIT"]


@pytest.mark.parametrize("call", ["commit", "send_offsets"])
async def test_a_transactional_call_ends_by_max_block_ms_on_a_silent_broker(proxied_broker,
                                                                           call):
    """A broker that stops answering without closing its connections (a hung process): the
    call raises by max_block_ms, not after request_timeout_ms (30 s here). A commit keeps
    its state and finishes when called again once the broker answers; the offsets leave
    the transaction abortable (KIP-1050: a timeout inside a transaction)."""
    cluster = proxied_broker
    cluster.create_topic("silent", 1)
    producer = Producer(cluster.bootstrap, transactional_id=_tid(), linger_ms=0,
                        max_block_ms=1500, request_timeout_ms=30_000)
    await producer.start()
    try:
        producer.begin_transaction()
        await asyncio.wait_for(producer.send("silent", b"a"), 10)
        cluster.proxy.stall(True)
        started = asyncio.get_running_loop().time()
        if call == "commit":
            with pytest.raises(KafkaError) as caught:
                await asyncio.wait_for(producer.commit_transaction(), 20)
            assert caught.value.retriable
        else:
            with pytest.raises(TransactionFailedError):
                await asyncio.wait_for(producer.send_offsets_to_transaction(
                    {("silent", 0): 1}, "silent-group"), 20)
        assert asyncio.get_running_loop().time() - started < 1.5 + 1
        cluster.proxy.stall(False)
        if call == "commit":
            await asyncio.wait_for(producer.commit_transaction(), 20)
        else:
            await asyncio.wait_for(producer.abort_transaction(), 20)
    finally:
        cluster.proxy.stall(False)
        await asyncio.wait_for(producer.close(), 10)
    assert _markers(cluster.broker.bootstrap, "silent", 0)[-2:] == \
        ["data", "COMMIT" if call == "commit" else "ABORT"]


def test_a_commit_refused_for_good_as_asyncio_run_ends_is_aborted(proxied_broker, caplog):
    """A script whose main() returns as its commit is under way, no close(): the loop's end
    finishes the commit, and its EndTxn is refused for good (TRANSACTION_ABORTABLE, from a
    proxy that answers commits itself: the broker never sees one). The transaction can only
    be aborted then, and is, at once: the loop's end raised the refused commit and left the
    transaction open on the broker, its records neither committed nor aborted (until the
    coordinator's timeout, which this broker never fires). (Tansu: aborts are read from the
    raw batches' markers.)"""
    cluster = proxied_broker
    topic = f"refused-commit-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1)
    cluster.proxy.refuse_commits(120)  # TRANSACTION_ABORTABLE

    async def main() -> None:
        producer = Producer(cluster.bootstrap, transactional_id=_tid())
        await producer.start()
        producer.begin_transaction()
        for i in range(3):
            await producer.enqueue(topic, b"%d" % i)
        asyncio.ensure_future(producer.commit_transaction())
        await asyncio.sleep(0)  # (the commit began: it waits for the records' acks)
        assert producer.metrics().transaction_state == "committing"

    asyncio.run(main())
    assert cluster.proxy.commits_refused == 1
    assert _markers(cluster.broker.bootstrap, topic, 0) == ["data", "ABORT"]
    said = [r.getMessage() for r in caplog.records if "unclosed" in r.getMessage()]
    assert len(said) == 1 and "its transaction's commit, under way, could not complete (" \
        in said[0] and "): the transaction was aborted" in said[0], said
