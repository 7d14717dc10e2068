"""Lifecycle under stress: cancelled awaits, overload with bounded memory, an unclosed
producer, and an internal failure that must not go unnoticed."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import resource
import subprocess
import sys
import warnings
import weakref
from typing import Any

import pytest
from kafka.protocol.producer import InitProducerIdResponse
from kafka.protocol.producer.transaction import EndTxnResponse

from aioproducer import Producer
from aioproducer._internal.batch import RecordFuture
from aioproducer.client.cluster import Cluster
from aioproducer.errors import (
    BufferExhaustedError,
    EventLoopEndedError,
    KafkaConnectionError,
    ProducerClosedError,
    TransactionAbortedError,
    TransactionalIdAuthorizationFailedError,
)
from tests.support.forking import SENT_BY_THE_PARENT, fork_amid_sends, \
    fork_as_a_connection_is_handed_over, fork_while_connecting
from tests.support.proxy import refuse_producer_ids
from tests.support.readback import consume_all, transaction_outcomes


async def _tasks_left(wait: float = 2.0) -> list[str]:
    """The names of tasks other than this one still running after `wait` seconds at most
    (a cancelled task ends a loop turn or two later)."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        left = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if not left or asyncio.get_running_loop().time() > deadline:
            return left
        await asyncio.sleep(0.01)


async def _works_and_closes_clean(producer: Producer, cluster, topic: str) -> None:
    """A record sent after whatever the test did arrives once, and close() leaves nothing
    running."""
    try:
        metadata = await asyncio.wait_for(producer.send(topic, b"v"), 10)
    finally:
        await asyncio.wait_for(producer.close(), 10)
    assert not await _tasks_left(), "still running after close()"
    got = consume_all(cluster.broker.bootstrap, topic, expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"v")]


async def test_cancelled_sends_leave_the_producer_healthy(broker, topic_factory):
    topic = topic_factory(3)
    rng = random.Random(5)
    async with Producer(broker.bootstrap, linger_ms=20) as producer:
        tasks = [asyncio.create_task(producer.send(topic, b"%d" % i, key=b"%d" % (i % 7)))
                 for i in range(400)]
        await asyncio.sleep(0)
        cancelled = set(rng.sample(range(400), 200))
        for i in cancelled:  # some before their enqueue ran, some while awaiting the ack
            tasks[i].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for i, result in enumerate(results):
            if i not in cancelled:
                assert result.offset >= 0, f"record {i} was harmed by others' cancellation"
        after = await producer.send(topic, b"after")
        assert after.offset >= 0
    got = consume_all(broker.bootstrap, topic, expected=201)
    values = [r.value for r in got]
    assert len(values) == len(set(values)), "a record was written twice"
    kept = {b"%d" % i for i in range(400) if i not in cancelled}
    assert kept <= set(values)  # cancelled ones are either fully in or not at all


async def test_cancelled_wait_for_buffer_memory_loses_nothing(proxied_broker):
    cluster = proxied_broker
    topic = "buffer-wait"
    cluster.create_topic(topic, 1)
    async with Producer(cluster.bootstrap, buffer_memory=64 * 1024, batch_size=16 * 1024,
                        max_block_ms=5000, linger_ms=1) as producer:
        await producer.send(topic, b"warm-up")
        cluster.proxy.stall(True)  # nothing is acknowledged: the buffer fills up
        accepted = []
        blocked = None
        for i in range(1000):
            task = asyncio.create_task(producer.enqueue(topic, b"x" * 1000 + b"%d" % i))
            await asyncio.sleep(0.001)
            if not task.done():
                blocked = task
                break
            accepted.append(task.result())
        assert blocked is not None, "the buffer never filled"
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        cluster.proxy.stall(False)
        await asyncio.wait_for(producer.flush(), 30)
        assert all(h.result().offset >= 0 for h in accepted)
        metrics = producer.metrics()
        assert metrics.buffer_memory_available == producer.config.buffer_memory
        assert metrics.waiting_for_memory == 0


async def _stalled_record(cluster):
    """A started producer and a record of it that the stalled broker cannot acknowledge."""
    cluster.create_topic("closing", 1)
    producer = Producer(cluster.bootstrap, linger_ms=1, request_timeout_ms=10_000)
    await producer.start()
    await producer.send("closing", b"warm-up")
    cluster.proxy.stall(True)
    return producer, await producer.enqueue("closing", b"pending")


async def test_a_second_close_waits_for_the_first(proxied_broker):
    cluster = proxied_broker
    producer, handle = await _stalled_record(cluster)
    first = asyncio.create_task(producer.close(timeout=1.0))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(producer.close())
    await asyncio.wait_for(asyncio.shield(second), 10)
    assert first.done(), "the second close() returned while the first was still closing"
    with pytest.raises(ProducerClosedError, match=r"close\(timeout=1.0\)"):
        handle.result()
    await first
    cluster.proxy.stall(False)


async def test_flush_while_closing_waits_for_the_records(proxied_broker):
    """close() sends what is buffered; a flush() in another task meanwhile still waits for
    those records (code that flushes before committing offsets relies on it)."""
    cluster = proxied_broker
    producer, handle = await _stalled_record(cluster)
    closing = asyncio.create_task(producer.close(timeout=10))
    await asyncio.sleep(0.05)
    with pytest.raises(asyncio.TimeoutError):
        await producer.flush(timeout=0.3)
    cluster.proxy.stall(False)
    await asyncio.wait_for(producer.flush(), 10)
    assert handle.done() and handle.result().offset == 1
    await asyncio.wait_for(closing, 10)


async def _send_waiting_for_metadata(cluster, stalled: bool):
    """A started producer, and a send() of it waiting for a topic that does not exist (its
    metadata request unanswered if `stalled`, else between retries)."""
    producer = Producer(cluster.bootstrap, allow_auto_create_topics=False,
                        max_block_ms=20_000, request_timeout_ms=20_000,
                        retry_backoff_ms=10_000, retry_backoff_max_ms=10_000)
    await producer.start()
    cluster.proxy.stall(stalled)
    waiting = asyncio.create_task(producer.send("not-created", b"v"))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    return producer, waiting


@pytest.mark.parametrize("stalled", [False, True], ids=["between-retries", "mid-request"])
async def test_close_ends_a_wait_for_metadata_with_producer_closed(proxied_broker, stalled):
    """A send waiting for a topic's metadata ends with ProducerClosedError when the producer
    closes: not a CancelledError in a task nobody cancelled, nor after max_block_ms, nor
    at the end of the backoff before it would have asked again."""
    cluster = proxied_broker
    producer, waiting = await _send_waiting_for_metadata(cluster, stalled)
    await asyncio.wait_for(producer.close(timeout=0), 10)
    with pytest.raises(ProducerClosedError, match="closed while"):
        await asyncio.wait_for(waiting, 5)
    cluster.proxy.stall(False)


@pytest.mark.parametrize("verb", ["send", "enqueue"])
async def test_sends_begun_before_close_to_a_topic_not_known_yet_are_sent(broker, topic_factory,
                                                                          verb):
    """Fire-and-forget sends (`create_task(producer.send(...))`, no task kept) to a topic the
    producer has not used yet, then `await close()`: the sends wait for the topic's metadata,
    and close() waits for them to buffer their records, then sends them, as it sends what is
    buffered. (It closed the metadata fetch under them: every record failed with
    ProducerClosedError, none was written.)"""
    count = 1000
    producer = Producer(broker.bootstrap)
    await producer.start()
    topic = topic_factory(3)  # (made before start(), it came with the first metadata)
    call = getattr(producer, verb)
    tasks = [asyncio.create_task(call(topic, b"%d" % i)) for i in range(count)]
    await asyncio.wait_for(producer.close(), 30)
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert [o for o in outcomes if isinstance(o, BaseException)][:1] == []
    got = consume_all(broker.bootstrap, topic, expected=count)
    assert sorted(int(r.value) for r in got) == list(range(count))


async def test_sends_waiting_for_a_new_topic_s_metadata_share_one_wait(broker, topic_factory):
    """1,000 `create_task(producer.send(...))` to a topic not used yet wait for its metadata
    together: one fetch (a task), whose end wakes them all. Each waited through its own
    asyncio.wait (a future, a timer and a callback on the fetch each): 45 us a send for
    100,000 of them. Counted, not timed: the timers the loop holds while they wait. The
    records arrive once, each key's in call order."""
    count, keys = 1000, 7
    producer = Producer(broker.bootstrap)
    await producer.start()
    topic = topic_factory(3)  # (made after start(): its metadata is not known)
    loop = asyncio.get_running_loop()
    timers = len(loop._scheduled)  # type: ignore[attr-defined]
    tasks = [asyncio.create_task(producer.send(topic, b"%d" % i, b"k%d" % (i % keys)))
             for i in range(count)]
    await asyncio.sleep(0)  # (each send's first step: it waits for the metadata)
    waits = [t for t in asyncio.all_tasks() if t.get_name().startswith(
        f"aioproducer-metadata-wait-{topic}")]
    added = len(loop._scheduled) - timers  # type: ignore[attr-defined]
    assert len(waits) == 1 and added < 10, (len(waits), added)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    await asyncio.wait_for(producer.close(), 30)
    got = consume_all(broker.bootstrap, topic, expected=count)
    assert sorted(int(r.value) for r in got) == list(range(count))
    for key in range(keys):
        of_key = [int(r.value) for r in sorted(got, key=lambda r: (r.partition, r.offset))
                  if r.key == b"k%d" % key]
        assert of_key == list(range(key, count, keys))


async def _start_stalled(cluster) -> tuple[Producer, asyncio.Task[None]]:
    """A producer whose start() waits for its first metadata (the broker is stalled)."""
    cluster.proxy.stall(True)
    producer = Producer(cluster.bootstrap, request_timeout_ms=20_000)
    starting = asyncio.create_task(producer.start())
    await asyncio.sleep(0.3)
    assert not starting.done()
    return producer, starting


async def test_close_while_starting(proxied_broker):
    cluster = proxied_broker
    producer, starting = await _start_stalled(cluster)
    await asyncio.wait_for(producer.close(), 10)
    with pytest.raises(ProducerClosedError, match="closed while it started"):
        await asyncio.wait_for(starting, 5)
    with pytest.raises(ProducerClosedError, match="closed"):
        await producer.start()
    cluster.proxy.stall(False)


async def test_a_start_cancelled_as_close_is_called_ends_cancelled(proxied_broker):
    """A service told to stop while its producer starts: close() is called and the task
    running start() cancelled in the same moment. The task ends cancelled, as
    asyncio.timeout() and TaskGroup rely on, not with a ProducerClosedError it never asked
    for; the producer ends closed."""
    cluster = proxied_broker
    producer, starting = await _start_stalled(cluster)
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0)  # close() began
    starting.cancel()
    await asyncio.wait_for(closing, 10)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(starting, 5)
    with pytest.raises(ProducerClosedError, match="closed; create a new one"):
        await producer.start()
    cluster.proxy.stall(False)


async def test_a_failed_start_can_be_retried(proxied_broker, caplog):
    """A service whose broker is down when it starts: start() fails once, with the
    exception alone (no warning logged besides), and the same producer starts when the
    broker is back. A start cancelled by its caller's timeout can be retried too."""
    cluster = proxied_broker
    cluster.create_topic("second-start", 1)
    producer = Producer(cluster.bootstrap, request_timeout_ms=2000)
    cluster.proxy.refuse(True)
    with caplog.at_level("WARNING", logger="aioproducer"):
        with pytest.raises(KafkaConnectionError, match=cluster.bootstrap):
            await asyncio.wait_for(producer.start(), 10)
    assert not caplog.records, "the failure was reported twice"
    assert not await _tasks_left(), "a failed start() left tasks running"
    cluster.proxy.heal()
    cluster.proxy.stall(True)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(producer.start(), 0.5)
    cluster.proxy.heal()
    await asyncio.wait_for(producer.start(), 10)
    await _works_and_closes_clean(producer, cluster, "second-start")
    with pytest.raises(ProducerClosedError, match="closed; create a new one"):
        await producer.start()


async def test_a_finally_that_flushes_after_a_failed_start_leaves_its_error_seen(
        proxied_broker):
    """`try: await producer.start() ... finally: await producer.flush(); await
    producer.close()`, with the broker down: flush() raised ProducerClosedError ("not
    started"), which is what the caller saw, start()'s KafkaConnectionError only its
    context. A producer not started holds nothing to flush: flush() returns, and the
    caller sees why the start failed."""
    cluster = proxied_broker
    producer = Producer(cluster.bootstrap, request_timeout_ms=2000)
    cluster.proxy.refuse(True)
    with pytest.raises(KafkaConnectionError, match=cluster.bootstrap):
        try:
            await asyncio.wait_for(producer.start(), 10)
        finally:
            await producer.flush()
            await producer.close()
    assert producer.metrics().state == "closed"


@pytest.mark.parametrize("first", ["cancelled", "refused"])
async def test_a_start_cancelled_as_it_tears_down_can_be_retried(proxied_broker, first):
    """A transactional start() that was cancelled (its timeout fired, say) or failed (its
    transactional id refused) is cancelled (again) while it tears down what it started (the
    service is told to stop meanwhile): it ends cancelled, as asked, and the teardown is not
    cut short, leaving the producer closed for good; it ends new, and starts later."""
    cluster = proxied_broker
    cluster.create_topic("cancelled-twice", 1)
    code = 14 if first == "cancelled" else 53  # the coordinator is loading; refused
    cluster.proxy.rewrite_responses(InitProducerIdResponse, refuse_producer_ids(code))
    producer = Producer(cluster.bootstrap, transactional_id="cancelled-twice",
                        retry_backoff_max_ms=200)
    starting = asyncio.create_task(producer.start())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    for _ in range(1_000_000):  # until it was asked (cancelled) or refused (at most 10 s)
        if cluster.proxy.rewritten and first == "cancelled" or producer._closing is not None \
                or loop.time() > deadline:
            break
        await asyncio.sleep(0)
    if first == "cancelled":
        assert cluster.proxy.rewritten
        starting.cancel()
        await asyncio.sleep(0)  # the start begins to tear down
    assert producer._closing is not None and not starting.done()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(starting, 10)
    assert not await _tasks_left(), "a cancelled start() left tasks running"
    cluster.proxy.rewrite_responses(InitProducerIdResponse, None)
    await asyncio.wait_for(producer.start(), 10)
    try:
        async with producer.transaction():
            metadata = await asyncio.wait_for(producer.send("cancelled-twice", b"v"), 10)
    finally:
        await asyncio.wait_for(producer.close(), 10)
    got = consume_all(cluster.broker.bootstrap, "cancelled-twice", expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"v")]


async def test_close_as_a_failed_start_tears_down_leaves_the_producer_closed(proxied_broker):
    """close() called while a transactional start() that failed closes what it started (a
    service told to stop as its start fails): the producer ends closed, as close() said,
    not new, for a retrying start() to bring back to life with nobody left to close it."""
    cluster = proxied_broker
    cluster.proxy.rewrite_responses(InitProducerIdResponse, refuse_producer_ids(53))
    producer = Producer(cluster.bootstrap, transactional_id="refused")
    starting = asyncio.create_task(producer.start())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    for _ in range(1_000_000):  # until the refused start tears down (at most 10 s)
        if producer._closing is not None or loop.time() > deadline:
            break
        await asyncio.sleep(0)
    assert producer._closing is not None and not starting.done()
    await asyncio.wait_for(producer.close(), 10)
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        await asyncio.wait_for(starting, 10)
    cluster.proxy.rewrite_responses(InitProducerIdResponse, None)  # granted: still closed
    with pytest.raises(ProducerClosedError, match="closed; create a new one"):
        await producer.start()
    assert not await _tasks_left(), "still running after close()"


async def test_close_as_the_first_metadata_arrives_wins_over_start(broker, topic, monkeypatch):
    """close() called in the moment start()'s metadata arrives: start() raises, and the
    producer stays closed (no sender task left running on a closed cluster)."""
    producer = Producer(broker.bootstrap)
    fetch = Cluster._fetch_metadata

    async def fetch_then_close(cluster):
        await fetch(cluster)
        asyncio.get_running_loop().create_task(producer.close())
        await asyncio.sleep(0)  # the close runs now, before start() goes on
    monkeypatch.setattr(Cluster, "_fetch_metadata", fetch_then_close)
    with pytest.raises(ProducerClosedError, match="closed while it started"):
        await asyncio.wait_for(producer.start(), 10)
    await asyncio.wait_for(producer.close(), 10)
    assert not await _tasks_left(), "still running after close()"
    with pytest.raises(ProducerClosedError, match="closed"):
        await producer.send(topic, b"v")


async def test_a_caller_cancelled_as_close_ends_its_metadata_wait_is_cancelled(proxied_broker):
    """A send waiting for metadata, cancelled (say by its timeout) in the moment close()
    stops the fetch: it ends cancelled, as asked, not with ProducerClosedError."""
    cluster = proxied_broker
    producer, waiting = await _send_waiting_for_metadata(cluster, stalled=True)
    producer._cluster._refresh.add_done_callback(lambda _: waiting.cancel())
    await asyncio.wait_for(producer.close(timeout=0), 10)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 5)
    cluster.proxy.stall(False)


async def test_concurrent_starts_share_one_start(broker, topic):
    """Two tasks starting the same producer (each on first use) get one producer: no second
    sender task and connections left running after close()."""
    producer = Producer(broker.bootstrap)
    await asyncio.gather(producer.start(), producer.start())
    await producer.send(topic, b"v")
    await producer.close()
    assert not await _tasks_left(), "still running after close()"


async def test_a_start_waiting_for_one_whose_caller_gave_up_starts_the_producer(proxied_broker):
    """Two tasks start the producer at once (each on first use) and the first one's caller
    gives up (its timeout): the second, which nobody cancelled, starts the producer, rather
    than failing with a ProducerClosedError for a producer nobody closed."""
    cluster = proxied_broker
    cluster.create_topic("second-starter", 1)
    cluster.proxy.stall(True)
    producer = Producer(cluster.bootstrap, request_timeout_ms=20_000)
    first = asyncio.create_task(producer.start())
    await asyncio.sleep(0.2)
    second = asyncio.create_task(producer.start())
    await asyncio.sleep(0.2)
    assert not first.done() and not second.done()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(first, 10)
    cluster.proxy.heal()
    await asyncio.wait_for(second, 10)
    await _works_and_closes_clean(producer, cluster, "second-starter")


async def test_close_stops_an_idempotent_producer_waiting_for_its_producer_id(proxied_broker):
    """A broker that cannot hand out producer ids yet answers InitProducerId with
    COORDINATOR_LOAD_IN_PROGRESS (KIP-730), and the producer asks again, with backoff, for as
    long as it is open. close() ends that too: nothing keeps running or logging after it."""
    cluster = proxied_broker
    cluster.create_topic("no-ids-yet", 1)
    cluster.proxy.rewrite_responses(InitProducerIdResponse, refuse_producer_ids(14))
    producer = Producer(cluster.bootstrap, retry_backoff_max_ms=200)
    await producer.start()
    handle = await producer.enqueue("no-ids-yet", b"never sent")
    for _ in range(200):  # until it has asked twice (at most 10 s)
        if cluster.proxy.rewritten >= 2:
            break
        await asyncio.sleep(0.05)
    assert cluster.proxy.rewritten >= 2
    await asyncio.wait_for(producer.close(timeout=0.2), 10)
    with pytest.raises(ProducerClosedError):
        await handle
    assert not await _tasks_left(), "still running after close()"


@pytest.mark.parametrize("end_txn", ["unanswered", "busy", "unreachable"])
async def test_close_at_once_during_a_commit_leaves_nothing_running(proxied_broker, end_txn):
    """A commit whose caller gave up (its timeout) goes on, its EndTxn unanswered, or
    answered CONCURRENT_TRANSACTIONS and waiting retry_backoff_ms to ask again, or waiting
    reconnect_backoff_ms to reach a broker again; close(timeout=0) then ends it: nothing of
    the producer runs on after close() (the commit used to wait out its backoff, then find
    the producer closed)."""
    cluster = proxied_broker
    cluster.create_topic("end-txn-closed", 1)
    if end_txn == "busy":
        cluster.proxy.rewrite_responses(EndTxnResponse, _answer_busy)
    backoff = {"reconnect_backoff_ms": 5000, "reconnect_backoff_max_ms": 5000} \
        if end_txn == "unreachable" else {"retry_backoff_ms": 5000, "retry_backoff_max_ms": 5000}
    producer = Producer(cluster.bootstrap, transactional_id="end-txn-closed", linger_ms=0,
                        **backoff)
    await producer.start()
    producer.begin_transaction()
    await producer.send("end-txn-closed", b"sent")
    cluster.proxy.stall(end_txn == "unanswered")
    cluster.proxy.refuse(end_txn == "unreachable")
    committing = asyncio.create_task(producer.commit_transaction())
    for _ in range(200):  # until EndTxn is on its way, answered, or refused (at most 10 s)
        if end_txn == "unanswered" or cluster.proxy.rewritten or cluster.proxy.connections_refused:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert end_txn == "unanswered" or cluster.proxy.rewritten or cluster.proxy.connections_refused
    assert not committing.done()
    committing.cancel()  # its caller gives up: the commit goes on
    with pytest.raises(asyncio.CancelledError):
        await committing
    await asyncio.wait_for(producer.close(timeout=0), 10)
    assert not await _tasks_left(), "still running after close()"
    with pytest.raises(ProducerClosedError):
        await producer.commit_transaction()
    cluster.proxy.heal()


def _answer_busy(response):
    response.error_code = 51  # CONCURRENT_TRANSACTIONS
    return response


async def test_cancelled_close_still_closes(proxied_broker):
    cluster = proxied_broker
    producer, handle = await _stalled_record(cluster)
    closing = asyncio.create_task(producer.close(timeout=0.5))
    await asyncio.sleep(0.05)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.wait_for(producer.close(), 10)  # waits for the close already under way
    assert isinstance(handle.exception(), ProducerClosedError)
    with pytest.raises(ProducerClosedError, match="closed"):
        await producer.send("closing", b"after")
    cluster.proxy.stall(False)


async def test_close_fails_a_send_waiting_for_buffer_memory(proxied_broker):
    """close() frees the memory of the records it fails; a send() waiting for memory must
    not take it and then wait for a sender that has stopped."""
    cluster = proxied_broker
    cluster.create_topic("closing-full", 1)
    producer = Producer(cluster.bootstrap, linger_ms=0, batch_size=1024, buffer_memory=4096,
                        max_block_ms=30_000, request_timeout_ms=10_000)
    await producer.start()
    await producer.send("closing-full", b"warm-up")
    cluster.proxy.stall(True)
    buffered = [await producer.enqueue("closing-full", b"x" * 900) for _ in range(4)]
    blocked = asyncio.create_task(producer.send("closing-full", b"y" * 900))
    await asyncio.sleep(0.2)
    assert not blocked.done(), "the buffer was not full"
    await asyncio.wait_for(producer.close(timeout=0), 10)
    with pytest.raises(ProducerClosedError, match="closing"):
        await asyncio.wait_for(blocked, 5)
    assert all(isinstance(h.exception(), ProducerClosedError) for h in buffered)
    metrics = producer.metrics()
    assert metrics.buffer_memory_available == producer.config.buffer_memory
    assert metrics.records_pending == 0
    cluster.proxy.stall(False)


async def test_a_batch_the_failing_sender_held_is_failed_too(broker, topic):
    """The sender takes a batch off its queue, then compresses it: if that raises, the batch
    is neither queued nor in flight, and must still fail rather than hang."""
    async with Producer(broker.bootstrap, linger_ms=0, compression_type="gzip") as producer:
        producer._accumulator._compression_level = 42  # zlib refuses it (config would too)
        with pytest.raises(ValueError):
            await asyncio.wait_for(producer.send(topic, b"v"), 5)
        assert producer.metrics().buffer_memory_available == producer.config.buffer_memory
        with pytest.raises(ProducerClosedError, match="internal failure"):
            await producer.send(topic, b"later")


async def test_buffer_exhausted_after_max_block(proxied_broker):
    cluster = proxied_broker
    cluster.create_topic("full", 1)
    async with Producer(cluster.bootstrap, buffer_memory=32 * 1024, batch_size=16 * 1024,
                        max_block_ms=300, request_timeout_ms=2000) as producer:
        await producer.send("full", b"warm-up")
        cluster.proxy.stall(True)
        with pytest.raises(BufferExhaustedError, match="max_block_ms"):
            for _ in range(100):
                await producer.enqueue("full", b"x" * 4000)
        cluster.proxy.stall(False)


async def test_memory_stays_bounded_far_beyond_buffer_memory(fresh_broker):
    """200 MB through a 4 MB buffer: the client's memory must not follow the volume."""
    fresh_broker.create_topic("volume", 4)
    value = random.randbytes(1024)
    async with Producer(fresh_broker.bootstrap, buffer_memory=4 << 20, acks=1,
                        enable_idempotence=False) as producer:
        for _ in range(20_000):  # warm up the allocator and the caches
            await producer.enqueue("volume", value)
        await producer.flush()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(200_000):
            await producer.enqueue("volume", value)  # handles are dropped, as in a bulk load
        await producer.flush()
    growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert growth_mb < 60, f"peak RSS grew {growth_mb:.0f} MB for 200 MB produced"


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


async def test_kept_handles_do_not_keep_the_records(fresh_broker):
    """A service may keep every RecordFuture it got; acknowledged records' bytes must go."""
    fresh_broker.create_topic("kept", 4)
    value = random.randbytes(1024)
    async with Producer(fresh_broker.bootstrap, buffer_memory=4 << 20, acks=1,
                        enable_idempotence=False) as producer:
        warm = [await producer.enqueue("kept", value) for _ in range(20_000)]
        await producer.flush()
        del warm
        gc.collect()
        before = _current_rss_mb()
        handles = [await producer.enqueue("kept", value) for _ in range(100_000)]
        await producer.flush()
        gc.collect()
        growth_mb = _current_rss_mb() - before
        assert all(h.result().offset >= 0 for h in handles[::997])
    assert growth_mb < 40, f"100,000 kept handles of 100 MB produced hold {growth_mb:.0f} MB"


def test_a_producer_whose_loop_ended_says_so_and_closes(broker, topic, caplog):
    """One producer kept from one asyncio.run() to the next (or from one pytest test, each
    with its own loop, to the next): the first loop's end reports what it left and leaves it
    unusable. A call from the next loop said to close it on its own loop, which was gone,
    and close() raised the same, failing the test's teardown: calls say the loop ended and
    what to do, and close() closes it. The error was a plain RuntimeError: a worker that
    runs each job with asyncio.run() and makes its producer again when the old one is
    closed catches ProducerClosedError, and this is one now (EventLoopEndedError)."""
    producer = Producer(broker.bootstrap)

    async def first() -> None:
        await producer.start()
        await producer.send(topic, b"first")

    async def next_one() -> None:
        with pytest.raises(ProducerClosedError, match="this producer's event loop has ended "
                                                      ".* Make a producer in the loop that "
                                                      "uses it") as raised:
            await producer.send(topic, b"second")
        assert isinstance(raised.value, EventLoopEndedError)
        assert "asyncio.run() per job, a Celery task's, keeps a BlockingProducer" in \
            str(raised.value)
        assert isinstance(raised.value, RuntimeError)  # (what it was before it had a class)
        await producer.close()
        await producer.close()
        assert producer.metrics().state == "closed"
        with pytest.raises(ProducerClosedError, match="closed"):
            await producer.send(topic, b"third")

    asyncio.run(first())
    # (What the loop's end reported.)
    assert "was open as its event loop ended, with nothing buffered" in caplog.text
    asyncio.run(next_one())
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"first"]


_SESSION_FIXTURE_TESTS = """
import os

import pytest
import pytest_asyncio

from aioproducer import Producer
{mark}

@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def producer():
    async with Producer(os.environ["BOOTSTRAP"]) as producer:
        yield producer


async def test_one(producer):
    assert (await producer.send(os.environ["TOPIC"], b"one")).offset >= 0


async def test_two(producer):
    assert (await producer.send(os.environ["TOPIC"], b"two")).offset >= 0
"""


def test_a_session_fixtures_producer_in_function_loop_tests_says_what_to_change(
        broker, topic, tmp_path):
    """pytest-asyncio runs a session-scoped async fixture on the session's loop and each test
    on a loop of its own (its default): the tests' sends said to use one producer per
    event loop, which the user did. The error now says what to change in pytest, and the
    change it names makes the tests pass."""
    runs = {}
    for mark in ("", 'pytestmark = pytest.mark.asyncio(loop_scope="session")'):
        (tmp_path / "test_users.py").write_text(_SESSION_FIXTURE_TESTS.format(mark=mark))
        runs[mark] = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
             "asyncio_mode=auto", "--rootdir", str(tmp_path), "-c", "/dev/null",
             str(tmp_path / "test_users.py")], capture_output=True, text=True, timeout=120,
            check=False, cwd=tmp_path,
            env={**os.environ, "BOOTSTRAP": broker.bootstrap, "TOPIC": topic})
    as_written, on_the_fixtures_loop = runs.values()
    assert "2 failed" in as_written.stdout, as_written.stdout
    assert ('run the tests on the fixture\'s loop (`pytestmark = '
            'pytest.mark.asyncio(loop_scope="session")`') in as_written.stdout
    assert "2 passed" in on_the_fixtures_loop.stdout, on_the_fixtures_loop.stdout
    assert sorted(r.value for r in consume_all(broker.bootstrap, topic, expected=2)) == \
        [b"one", b"two"]


def _use_in_forked_child(producer: Producer, topic: str, report: Any) -> None:
    """A multiprocessing child's work: send on the producer the parent started, then close."""
    async def child() -> list[str]:
        said = []
        try:
            await asyncio.wait_for(producer.send(topic, b"child"), 10)
            said.append("sent")
        except (ProducerClosedError, RuntimeError) as error:
            said.append(f"{type(error).__name__}: {error}")
        await producer.close()  # (a child's cleanup: it raised as the send did)
        said.append(producer.metrics().state)
        return said

    report.send(asyncio.run(child()))


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
async def test_a_producer_started_before_fork_tells_the_child_to_start_its_own(broker, topic):
    """multiprocessing's fork start method (the default on Linux before 3.14) with a started
    producer: the child's send said the producer belonged to another event loop ("use one
    producer per event loop"), which says nothing of the fork, and close() in the child raised
    the same. Now it is a ProducerClosedError naming os.fork() and what to do; close() marks
    the child's copy closed; the parent's producer goes on."""
    import multiprocessing

    async with Producer(broker.bootstrap) as producer:
        await producer.send(topic, b"parent")
        context = multiprocessing.get_context("fork")
        report, child_end = context.Pipe()
        child = context.Process(target=_use_in_forked_child, args=(producer, topic, child_end))
        child.start()
        try:
            assert await asyncio.to_thread(report.poll, 30), "the child said nothing"
            said = report.recv()
        finally:
            child.join(10)
            if child.exitcode is None:
                child.kill()
                child.join()
        await producer.send(topic, b"parent again")
    error, state = said
    assert error.startswith("ProducerClosedError: this producer was started before os.fork()")
    assert "Create and start a new producer in this process" in error
    assert state == "closed" and child.exitcode == 0
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"parent", b"parent again"]


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_a_child_forked_in_a_coroutine_leaves_the_parents_connections_alone(broker, topic,
                                                                              runner):
    """os.fork() inside a running coroutine: the child carries on in its copy of the
    parent's loop, with copies of the producer's sender task and connections (the same
    sockets). Its send is refused with a ProducerClosedError naming the fork, and nothing
    of its copy writes to or reads from the parent's sockets: the parent's records, those
    buffered at the fork included, arrive once and in order. The child's send was taken
    and written over the parent's socket, and the parent's records after the fork were
    lost (102 of 201 read back), or its sends hung (the child read its responses)."""
    run = asyncio.run if runner == "asyncio" else pytest.importorskip("uvloop").run
    error = run(fork_amid_sends(broker.bootstrap, topic))
    assert error.startswith("ProducerClosedError: this producer was started before os.fork()")
    got = consume_all(broker.bootstrap, topic, expected=len(SENT_BY_THE_PARENT))
    assert [r.value for r in got] == SENT_BY_THE_PARENT


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_a_child_forked_while_a_connection_opens_leaves_it_to_the_parent(proxied_broker,
                                                                         runner):
    """os.fork() in a coroutine while the producer's connection to the broker is being
    opened (its ApiVersions unanswered): the child's copy of that connection was not made
    inert as those already open were, and closing it in the child took the socket out of
    the epoll instance the two processes share; the parent never heard its answer and
    its record waited for request_timeout_ms (TimeoutError here after 20 s). Now the
    parent's record goes out on it, and the child's send is refused naming the fork."""
    run = asyncio.run if runner == "asyncio" else pytest.importorskip("uvloop").run
    topic = f"fork-{random.randrange(10**6)}"
    proxied_broker.create_topic(topic, 1)
    error, exit_code = run(fork_while_connecting(proxied_broker.bootstrap, proxied_broker.proxy,
                                                 topic))
    assert exit_code == 0
    assert error.startswith("ProducerClosedError: this producer was started before os.fork()")
    got = consume_all(proxied_broker.bootstrap, topic, expected=1)
    assert [r.value for r in got] == [b"buffered before the fork"]


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
def test_a_child_forked_as_a_connection_is_handed_over_holds_none_of_it(proxied_broker):
    """os.fork() from the main thread at the moment a BlockingProducer's loop thread hands
    a new connection over from `Cluster._opening` to the cluster's connections: it was in
    neither then, so the fork hook left the child's copy of its socket connected to the
    broker (the child held the parent's connection open while it lived, and could read or
    write it). It enters the connections before it leaves `_opening` now: the child's copy
    names an unconnected socket, as for every other connection, and the parent's record
    goes out on it."""
    topic = f"fork-{random.randrange(10**6)}"
    proxied_broker.create_topic(topic, 1)
    said = fork_as_a_connection_is_handed_over(proxied_broker.bootstrap,
                                               proxied_broker.proxy, topic)
    assert said == "unconnected"
    got = consume_all(proxied_broker.bootstrap, topic, expected=1)
    assert [r.value for r in got] == [b"sent by the parent"]


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_a_producer_left_open_as_its_loop_ends_closes_its_sockets(broker, topic, runner):
    """A script's asyncio.run() that ends with its producer open: its connections stayed
    open, and when the producer was collected after the loop closed, each transport warned
    ("unclosed transport <_SelectorSocketTransport fd=7>", uvloop's "unclosed resource
    <TCPTransport ...>"). The loop's end closes the producer now (and reports it, naming
    the line that made it): no warning is left for its collection."""
    run = asyncio.run if runner == "asyncio" else pytest.importorskip("uvloop").run
    kept: list[Producer] = []
    reported: list[str] = []

    async def script() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        producer = Producer(broker.bootstrap)
        await producer.start()
        await producer.send(topic, b"sent")
        kept.append(producer)

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    run(asyncio.sleep(0))  # (uvloop's first loop keeps two descriptors of its own)
    before = fds()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        run(script())
        after_run = fds()
        kept.clear()
        gc.collect()
    said = [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
    del warned  # (each holds its source)
    assert after_run <= before, f"{after_run - before} file descriptors left open"
    assert said == [], said
    assert len(reported) == 1 and reported[0].startswith("unclosed <Producer") and \
        f"created at {__file__}" in reported[0] and "as its event loop ended" in reported[0], \
        reported


async def test_producers_dropped_unclosed_are_collected_and_let_go(broker, topic):
    """A handler that makes a started producer per request and forgets it (issue 37): each
    one is collected while the loop runs on, sends the record it held (as close() would; it
    failed with ProducerClosedError before), its tasks end, its sockets close, and it warns
    once, naming the line that made it."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda loop, context: reported.append(context["message"]))
    made_at = f"{__file__}:{sys._getframe().f_lineno + 4}"
    parts: list[weakref.ref] = []

    async def handler() -> RecordFuture:
        producer = Producer(broker.bootstrap, linger_ms=60_000)
        await producer.start()
        parts.extend(weakref.ref(part) for part in (
            producer, producer._cluster, producer._accumulator, producer._sender))
        return await producer.enqueue(topic, b"forgotten")

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    held = [await handler()]  # (the first one's imports and the loop's own sockets)
    gc.collect()
    await _tasks_left()
    fds_before = fds()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for _ in range(100):
            held.append(await handler())
        gc.collect()
        left = await _tasks_left(30)  # (each sends its record first: bounded, for a loaded CI)
        deadline = loop.time() + 30
        while fds() > fds_before and loop.time() < deadline:
            await asyncio.sleep(0.01)
        gc.collect()
    loop.set_exception_handler(None)
    assert left == [], left
    assert fds() <= fds_before, f"{fds() - fds_before} file descriptors left open"
    unclosed = [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
    assert len(unclosed) == 100, [str(w.message) for w in warned]
    assert all(f"created at {made_at}" in message for message in unclosed), unclosed[0]
    del warned  # (each holds its producer as its source)
    gc.collect()
    assert [ref for ref in parts if ref() is not None] == []
    assert len(reported) == 101 and all(
        "was collected, its 1 buffered record(s) were sent before it closed" in r
        for r in reported), reported
    offsets = sorted(future.result().offset for future in held)
    assert offsets == list(range(101))
    got = consume_all(broker.bootstrap, topic, expected=101)
    assert [r.value for r in got] == [b"forgotten"] * 101


async def test_a_transactional_producer_dropped_unclosed_aborts_its_transaction(broker, topic):
    """A handler that makes a transactional producer, sends in a transaction and forgets it:
    collected while the loop runs on, it aborts the transaction (ABORT marker after the
    record it sent; the buffered one fails with TransactionAbortedError) and says so. Before,
    its parts were let go at once, the transaction left open (no marker) for the
    coordinator's timeout."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda loop, context: reported.append(context["message"]))

    async def handler() -> RecordFuture:
        producer = Producer(broker.bootstrap, transactional_id=f"{topic}-dropped",
                            linger_ms=60_000)
        await producer.start()
        producer.begin_transaction()
        await producer.enqueue(topic, b"sent, never committed")
        await producer.flush()
        return await producer.enqueue(topic, b"buffered")

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        buffered = await handler()
        gc.collect()
        left = await _tasks_left(30)  # (the abort's round trips first: bounded, for a loaded CI)
    loop.set_exception_handler(None)
    assert left == [], left
    unclosed = [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
    del warned  # (each holds its producer as its source)
    assert len(unclosed) == 1 and unclosed[0].startswith("unclosed <Producer"), unclosed
    assert len(reported) == 1 and "was collected, its open transaction was aborted, not " \
        "committed (1 record(s) of it still buffered failed)" in reported[0], reported
    assert isinstance(buffered.exception(), TransactionAbortedError)
    outcomes = transaction_outcomes(broker.bootstrap, topic, 1)
    assert (outcomes.aborted, outcomes.committed, outcomes.open) == \
        ([b"sent, never committed"], [], []), outcomes


async def test_sender_failure_reaches_every_caller(broker, topic):
    async with Producer(broker.bootstrap, linger_ms=1000) as producer:
        handle = await producer.enqueue(topic, b"pending")

        def broken(now):
            raise RuntimeError("sender bug")

        producer._sender._run_once = broken
        producer._sender.wake()
        with pytest.raises(RuntimeError, match="sender bug"):
            await asyncio.wait_for(handle, 5)
        with pytest.raises(ProducerClosedError, match="sender bug"):
            await producer.send(topic, b"later")
    gc.collect()


async def test_connection_closed_as_a_request_is_written(broker, topic, monkeypatch):
    """The sender writes a round's requests last: a connection that closed before its write
    sends the batches back for a retry, and each record arrives once."""
    from aioproducer.client.connection import BrokerConnection
    from aioproducer.protocol.messages import ApiKey

    original = BrokerConnection.send
    closed_before_write = []

    def send(self, api_key, body, on_response, **kwargs):
        if api_key == ApiKey.PRODUCE and not closed_before_write:
            closed_before_write.append(self.node_id)
            self.close()  # then the write raises its KafkaConnectionError
        return original(self, api_key, body, on_response, **kwargs)

    monkeypatch.setattr(BrokerConnection, "send", send)
    async with Producer(broker.bootstrap, linger_ms=0) as producer:
        first = await asyncio.wait_for(producer.send(topic, b"first", partition=0), 15)
        second = await asyncio.wait_for(producer.send(topic, b"second", partition=0), 15)
    assert closed_before_write and (first.offset, second.offset) == (0, 1)
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [r.value for r in got] == [b"first", b"second"]


async def test_cancelled_wait_for_metadata(broker, topic):
    async with Producer(broker.bootstrap, allow_auto_create_topics=False,
                        max_block_ms=10_000) as producer:
        waiting = asyncio.create_task(producer.send("not-created-yet", b"v"))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # still looking for the topic's metadata
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert (await producer.send(topic, b"fine")).offset == 0


async def test_idle_topics_are_forgotten_and_come_back(broker, topic_factory):
    # A service writing to many short-lived topics must not fetch all of them for ever.
    idle, busy = topic_factory(2), topic_factory(2)
    async with Producer(broker.bootstrap, metadata_max_idle_ms=1000, metadata_max_age_ms=100,
                        linger_ms=1) as producer:
        await producer.send(idle, b"once", partition=0)
        for i in range(40):  # 2 s of producing to the other topic only
            await producer.send(busy, b"%d" % i)
            await asyncio.sleep(0.05)
        known = producer._cluster.topics
        assert busy in known and idle not in known, "the idle topic's metadata is still fetched"
        assert idle not in producer._accumulator.appendable
        assert (await producer.send(idle, b"again", partition=0)).offset == 1
    assert [r.value for r in consume_all(broker.bootstrap, idle, 2)] == [b"once", b"again"]


async def test_a_topic_forgotten_while_its_record_waits_for_memory_comes_back(proxied_broker):
    """A record waits for buffer memory longer than metadata_max_idle_ms (max_block_ms is
    longer), so its topic's metadata is dropped as idle meanwhile. Its batch must fetch it
    again and be delivered, not wait for a leader until delivery_timeout_ms."""
    cluster = proxied_broker
    for name in ("full", "waiting", "in-use"):
        cluster.create_topic(name, 1)

    async def keep_in_use(calls):
        # Keeps a topic in every metadata request: Tansu answers an empty list with every
        # topic, which would bring the forgotten one back by chance.
        for _ in range(150):  # until cancelled, at most 15 s
            calls.append(asyncio.create_task(producer.enqueue("in-use", b"u")))
            await asyncio.sleep(0.1)

    async with Producer(cluster.bootstrap, batch_size=1024, buffer_memory=2048, linger_ms=0,
                        max_block_ms=15_000, request_timeout_ms=1000,
                        delivery_timeout_ms=15_000, metadata_max_idle_ms=1000,
                        metadata_max_age_ms=200) as producer:
        await producer.send("waiting", b"first")
        in_use: list[asyncio.Task] = []
        using = asyncio.create_task(keep_in_use(in_use))
        cluster.proxy.stall(True)
        full = [await producer.enqueue("full", b"x" * 900) for _ in range(2)]
        waiting = asyncio.create_task(producer.enqueue("waiting", b"second"))
        await asyncio.sleep(2.5)
        assert not waiting.done(), "the buffer was not full"
        assert "waiting" not in producer._cluster.topics, "the topic was not forgotten"
        cluster.proxy.stall(False)
        handle = await asyncio.wait_for(waiting, 10)
        metadata = await asyncio.wait_for(handle, 5)  # (not waiting for delivery_timeout_ms)
        assert metadata.offset == 1
        await asyncio.wait_for(asyncio.gather(*full), 10)
        using.cancel()
        await asyncio.wait_for(asyncio.gather(*in_use), 10)
    got = consume_all(cluster.broker.bootstrap, "waiting", 2)
    assert [r.value for r in got] == [b"first", b"second"]


async def test_a_cancelled_enqueue_buffers_nothing(broker, topic):
    # enqueue() is all or nothing: a caller that is cancelled (a timeout) and tries again
    # must not end up with the record twice.
    async with Producer(broker.bootstrap, batch_size=300) as producer:
        await producer.enqueue(topic, b"a" * 150, partition=0)
        cancelled = asyncio.create_task(producer.enqueue(topic, b"b" * 150, partition=0))
        await asyncio.sleep(0)  # it runs until it yields: its record does not fit the batch
        assert not cancelled.done()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await producer.enqueue(topic, b"c", partition=0)
    assert [r.value for r in consume_all(broker.bootstrap, topic, 2)] == [b"a" * 150, b"c"]


async def test_a_cancelled_enqueue_many_says_what_it_buffered(broker, topic):
    records = [(None, b"%04d" % i) for i in range(1000)]
    async with Producer(broker.bootstrap, batch_size=1000) as producer:
        task = asyncio.create_task(producer.enqueue_many(topic, records, partition=0))
        await asyncio.sleep(0)  # it runs until its first yield (a full batch)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as caught:
            await task
        accepted = await caught.value.accepted
        assert 0 < len(accepted) < 1000
    got = consume_all(broker.bootstrap, topic, len(accepted))
    assert [r.value for r in got] == [value for _, value in records[:len(accepted)]]


async def test_concurrent_appends_fill_batches(broker, topic):
    # Tasks appending at once as batches fill up: the one that finds a batch full yields to
    # let it go, and meanwhile others open the next batch; it must look again and append
    # there, not open yet another batch and leave that one nearly empty.
    from tests.support.readback import fetch_raw_batches

    values = [b"%04d" % i + b"x" * 96 for i in range(800)]
    async with Producer(broker.bootstrap, batch_size=1024, linger_ms=1000) as producer:
        handles = await asyncio.gather(*(producer.enqueue(topic, v, partition=0) for v in values))
        await producer.flush()
        assert all(h.exception() is None for h in handles)
    batches = fetch_raw_batches(broker.bootstrap, topic, 0)
    sizes = [len(b.records) for b in batches]
    assert sorted(r[2] for b in batches for r in b.records) == values
    assert min(sizes[:-1]) == max(sizes), f"records per batch: {sizes}"


async def test_a_sent_batch_takes_no_more_records(broker, topic):
    # Once a batch has gone to the broker, the next record for its partition opens a new batch
    # at once. It used to be taken for a full batch: every linger_ms=0 send woke the sender
    # once more and yielded a loop turn for nothing.
    async with Producer(broker.bootstrap, linger_ms=0) as producer:
        first = await producer.send(topic, b"a", partition=0)
        task = asyncio.create_task(producer.enqueue(topic, b"b", partition=0))
        await asyncio.sleep(0)  # the task runs first, and to the end unless it yields
        assert task.done(), "enqueue() yielded as if the partition's batch were full"
        assert (await task.result()).offset == first.offset + 1


async def test_start_against_a_broker_that_never_answers_ends_within_max_block_ms(
        proxied_broker):
    """The connection is taken, nothing comes back: start() fails after max_block_ms (it
    took request_timeout_ms, 30 s), and starts once the broker answers."""
    cluster = proxied_broker
    cluster.create_topic("silent", 1)
    producer = Producer(cluster.bootstrap, max_block_ms=1000)
    cluster.proxy.stall(True)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(KafkaConnectionError, match="max_block_ms=1000"):
        await asyncio.wait_for(producer.start(), 20)
    assert loop.time() - began < 5
    cluster.proxy.stall(False)
    async with producer:
        assert (await asyncio.wait_for(producer.send("silent", b"v"), 10)).offset == 0
