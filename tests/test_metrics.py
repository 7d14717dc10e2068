"""Producer.metrics(): the counters agree with what the broker stored and with the faults
the producer went through."""

from __future__ import annotations

import asyncio

import pytest

from aioproducer import Producer, ProducerMetrics
from aioproducer.errors import DeliveryTimeoutError, MessageTooLargeError
from tests.support.readback import consume_all, fetch_raw_batches


async def test_metrics_count_what_the_broker_stored(broker, topic_factory):
    """Records, batches and bytes counted as sent are what the broker holds, batch for batch
    (read back with kafka-python); nothing is left pending or held once flushed."""
    topic = topic_factory(3)
    producer = Producer(broker.bootstrap, batch_size=2048, linger_ms=5)
    assert producer.metrics() == ProducerMetrics(buffer_memory_available=33554432)
    async with producer:
        for i in range(1000):
            await producer.enqueue(topic, b"v" * 100, key=b"key-%d" % (i % 13))
        await producer.flush()
        metrics = producer.metrics()
    stored = [batch for partition in range(3)
              for batch in fetch_raw_batches(broker.bootstrap, topic, partition)]
    assert (metrics.records_sent, metrics.records_failed, metrics.records_pending) == (1000, 0, 0)
    assert metrics.batches_sent == len(stored) > 3  # batch_size made several per partition
    assert sum(len(batch.records) for batch in stored) == 1000
    assert metrics.bytes_sent == sum(batch.size for batch in stored)
    # idempotent by default: the producer id the broker stored with every batch
    assert {batch.producer_id for batch in stored} == {metrics.producer_id} and \
        metrics.producer_id >= 0 and metrics.transaction_state == ""
    assert 1 <= metrics.produce_requests == metrics.produce_responses <= metrics.batches_sent
    assert metrics.produce_latency_s > 0
    assert 0 < metrics.produce_latency_avg_s <= metrics.produce_latency_s
    assert (metrics.retries, metrics.splits, metrics.requests_in_flight) == (0, 0, 0)
    assert metrics.buffer_memory_available == producer.config.buffer_memory
    assert metrics.connections >= 1 and metrics.waiting_for_memory == 0
    assert (metrics.state, metrics.oldest_pending_s) == ("started", 0.0)
    assert producer.metrics().state == "closed"


async def test_metrics_say_how_long_the_oldest_record_waits(proxied_broker):
    """oldest_pending_s grows while no broker takes the records (a readiness signal), and is
    0 again once they are acknowledged."""
    cluster = proxied_broker
    cluster.create_topic("waiting", 1)
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        await producer.send("waiting", b"warm-up")
        cluster.proxy.stall(True)
        handle = await producer.enqueue("waiting", b"held")
        await asyncio.sleep(0.5)
        held = producer.metrics()
        cluster.proxy.heal()
        await asyncio.wait_for(handle, 10)
        assert 0.5 <= held.oldest_pending_s < 5 and held.records_pending == 1, held
        assert producer.metrics().oldest_pending_s == 0.0


async def test_metrics_count_retries_splits_and_failures(proxied_broker):
    """A request cut on its way is retried, a batch over the broker's limit is split, a record
    over it alone fails, and records that outlive delivery_timeout_ms fail: each is counted,
    and every record accepted is counted once, as sent or as failed."""
    cluster = proxied_broker
    cluster.create_topic("counted", 1)
    async with Producer(cluster.bootstrap, linger_ms=50, request_timeout_ms=1000,
                        delivery_timeout_ms=2000, retry_backoff_ms=50) as producer:
        await producer.send("counted", b"warm-up")
        cluster.proxy.cut_after(8, "up")  # the next request is cut before it arrives
        await asyncio.wait_for(producer.send("counted", b"retried"), 10)
        cluster.proxy.message_max_bytes(3000)
        cluster.proxy.cut_all()  # (the limit applies to the connections made after it)
        handles = [await producer.enqueue("counted", b"%04d" % i + b"x" * 96) for i in range(50)]
        await asyncio.wait_for(asyncio.gather(*handles), 10)  # ~5.5 kB: split to fit 3,000
        with pytest.raises(MessageTooLargeError):
            await asyncio.wait_for(producer.send("counted", b"x" * 4000), 10)
        cluster.proxy.stall(True)
        with pytest.raises(DeliveryTimeoutError):
            await asyncio.wait_for(producer.send("counted", b"timed out"), 10)
        metrics = producer.metrics()
        cluster.proxy.stall(False)
    assert metrics.retries >= 1 and metrics.splits >= 1
    assert metrics.records_failed == 2 and metrics.records_pending == 0
    assert metrics.records_sent == 52
    stored = {r.value for r in consume_all(cluster.broker.bootstrap, "counted", expected=52)}
    assert {b"warm-up", b"retried"} | {b"%04d" % i + b"x" * 96 for i in range(50)} <= stored
