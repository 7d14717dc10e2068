"""What aioproducer writes, as Apache Kafka stores it, read back by librdkafka's consumer:
every codec, headers, timestamps, keyed and keyless records, enqueue_many (its full batches
several to a request), idempotence with five requests in flight, a quota's throttle
(KIP-219), the CLI, and a child forked amid sends leaving the parent's connections alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from aioproducer import Producer
from aioproducer.config import ProducerConfig
from aioproducer.tools.reader import TopicReader
from tests.support.forking import SENT_BY_THE_PARENT, fork_amid_sends
from tests.support.readback import consume_all, fetch_until
from tests.support.throttle_watch import ThrottleWatch


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_every_codec_with_headers_timestamps_and_keys(apache_kafka, make_topic, codec):
    topic = make_topic()
    headers = [("h", b"\x00\xff"), ("h", b""), ("empty", None)]
    async with Producer(apache_kafka.bootstrap, compression_type=codec, linger_ms=20) as producer:
        futures = [await producer.enqueue(topic, b"value-%d" % i * 20,
                                          key=None if i % 2 else b"key-%d" % i,
                                          headers=headers, timestamp_ms=1_700_000_000_000 + i)
                   for i in range(200)]
        sent = [await f for f in futures]
    got = consume_all(apache_kafka.bootstrap, topic, expected=200)
    assert [r.offset for r in got] == [md.offset for md in sent] == list(range(200))
    assert [r.value for r in got] == [b"value-%d" % i * 20 for i in range(200)]
    assert [r.key for r in got] == [None if i % 2 else b"key-%d" % i for i in range(200)]
    assert [r.timestamp_ms for r in got] == [1_700_000_000_000 + i for i in range(200)]
    assert all(r.headers == headers for r in got)


async def test_a_log_append_time_topic_gives_each_record_the_brokers_time(apache_kafka,
                                                                        make_topic):
    """A topic stamped by the broker (message.timestamp.type=LogAppendTime): each record's
    metadata, from gather and from awaiting it, has the time the broker wrote and the offset
    it was read back at, not the timestamp the record was given."""
    topic = make_topic(partitions=2, message_timestamp_type="LogAppendTime")
    async with Producer(apache_kafka.bootstrap, linger_ms=20) as producer:
        futures = [await producer.enqueue(topic, b"%03d" % i, partition=i % 2,
                                          timestamp_ms=1_000_000_000_000 + i)
                   for i in range(100)]
        gathered = await asyncio.gather(*futures)
        awaited = [await f for f in futures]
    assert gathered == awaited
    got = {(r.partition, r.offset): r for r in
           consume_all(apache_kafka.bootstrap, topic, expected=100)}
    for i, md in enumerate(gathered):
        record = got[(md.partition, md.offset)]
        assert record.value == b"%03d" % i
        assert record.timestamp_ms == md.timestamp_ms > 1_000_000_000_000 + 100


async def test_enqueue_many_keyed_records_land_where_librdkafka_would_put_them(
        apache_kafka, make_topic):
    from tests.support.readback import partition_for_key_librdkafka

    topic = make_topic(partitions=4)
    keys = [b"user-%d" % i for i in range(400)]
    async with Producer(apache_kafka.bootstrap, linger_ms=5) as producer:
        bulk = await producer.enqueue_many(topic, [(k, b"v-" + k) for k in keys])
        await bulk
    got = consume_all(apache_kafka.bootstrap, topic, expected=400)
    assert sorted(r.value for r in got) == sorted(b"v-" + k for k in keys)
    expected = dict(zip(keys, partition_for_key_librdkafka(apache_kafka.bootstrap, topic, keys)))
    assert {r.key: r.partition for r in got} == expected


async def test_idempotence_with_five_requests_in_flight(apache_kafka, make_topic):
    """Numbered records over 3 partitions, small batches so many requests are in flight at
    once: each read back exactly once, in the order sent within its partition."""
    topic = make_topic(partitions=3)
    n = 6000
    async with Producer(apache_kafka.bootstrap, enable_idempotence=True,
                        max_in_flight_requests_per_connection=5, batch_size=2048,
                        linger_ms=0) as producer:
        futures = [await producer.enqueue(topic, b"%06d" % i, partition=i % 3) for i in range(n)]
        await asyncio.gather(*futures)
    got = consume_all(apache_kafka.bootstrap, topic, expected=n)
    assert len(got) == n
    for p in range(3):
        values = [int(r.value) for r in got if r.partition == p]
        assert values == list(range(p, n, 3))


async def test_enqueue_many_full_batches_share_requests_in_order_once(apache_kafka, make_topic):
    """Keyless records of one enqueue_many call: the full batches go several to a request
    (Kafka takes one batch a partition per request, and refuses a request with two), and each
    record is stored once, in the order of the call within its partition. At acks=0 the
    request count does not hang on the broker's speed (no response is awaited), and close()
    lets the broker read every request before the connection closes (it dropped those not
    read yet)."""
    topic = make_topic(partitions=6)
    n = 30_000
    values = [b"%06d" % i + bytes(94) for i in range(n)]
    # A record acknowledged by each partition first: a new topic's partition may not take
    # writes yet, and at acks=0 Kafka then drops the request and closes the connection.
    async with Producer(apache_kafka.bootstrap, acks=1) as ready:
        await asyncio.gather(*(ready.send(topic, b"ready", partition=p) for p in range(6)))
    async with Producer(apache_kafka.bootstrap, acks=0, batch_size=4096,
                        linger_ms=1000) as producer:
        await producer.enqueue_many(topic, [(None, v) for v in values])
    metrics = producer.metrics()
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, n + 6)
    got = [r for r in got if r.value != b"ready"]
    assert metrics.batches_sent >= 2.5 * metrics.produce_requests, (
        f"{metrics.produce_requests} requests for {metrics.batches_sent} batches")
    assert sorted(r.value for r in got) == values  # each once
    for p in range(6):
        in_partition = [r.value for r in got if r.partition == p]
        assert in_partition == sorted(in_partition)  # in the order of the call


async def test_fire_and_forget_sends_to_a_new_topic_then_close_arrive_once(apache_kafka,
                                                                          make_topic):
    """`create_task(producer.send(...))` for 5,000 records, no task kept, to a topic the
    producer has not used yet, then `await close()`: close() waits for the sends' metadata,
    then sends what they buffered. Each arrives once, each key's records in call order.
    (close() closed the metadata fetch under them: none arrived.)"""
    count = 5000
    producer = Producer(apache_kafka.bootstrap, linger_ms=5)
    await producer.start()
    topic = make_topic(3)  # (after start(): its metadata is not known yet)
    for i in range(count):
        asyncio.create_task(producer.send(topic, b"%d" % i, key=b"%d" % (i % 7)))
    await asyncio.wait_for(producer.close(), 60)
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, count)
    assert sorted(int(r.value) for r in got) == list(range(count))
    for key in range(7):
        values = [int(r.value) for r in got if r.key == b"%d" % key]
        assert values == sorted(values), f"key {key}'s records out of order"


async def test_a_producer_byte_rate_quota_throttles_and_is_honoured(apache_kafka, make_topic,
                                                                   monkeypatch):
    """KIP-219 under a real producer_byte_rate quota: Kafka answers with throttle_time_ms,
    and no request goes to the broker from the moment the producer reads a throttled
    response until the throttle ends (watched on the client's own connections)."""
    topic = make_topic()
    watch = ThrottleWatch().install(monkeypatch)
    apache_kafka.set_quota("throttled-client", producer_byte_rate=50_000)
    try:
        async with Producer(apache_kafka.bootstrap, client_id="throttled-client",
                            linger_ms=5, batch_size=16384) as producer:
            futures = [await producer.enqueue(topic, b"x" * 1000) for _ in range(200)]
            await asyncio.gather(*futures)
            metrics = producer.metrics()
    finally:
        apache_kafka.set_quota("throttled-client")
    assert watch.throttles_read > 0
    assert metrics.produce_throttle_time_ms > 0 and metrics.produce_throttle_time_max_ms > 0
    assert watch.violations == []
    assert len(consume_all(apache_kafka.bootstrap, topic, expected=200)) == 200


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aioproducer", *args], input=stdin,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_the_cli_creates_a_topic_produces_and_consumes(apache_kafka):
    topic = f"cli-{os.getpid()}-{time.monotonic_ns() % 10**8}"
    created = _cli("topic", "create", topic, "--partitions", "2", "--replication-factor", "1",
                   "--config", "retention.ms=3600000", "--bootstrap-servers", apache_kafka.bootstrap)
    assert created.returncode == 0, created.stderr
    produced = _cli("produce", topic, "--bootstrap-servers", apache_kafka.bootstrap,
                    "--key-separator", ":", stdin="a:1\nb:2\nc:3\n")
    assert produced.returncode == 0, produced.stderr
    got = consume_all(apache_kafka.bootstrap, topic, expected=3)
    assert sorted((r.key, r.value) for r in got) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    consumed = _cli("consume", topic, "--bootstrap-servers", apache_kafka.bootstrap,
                    "--from-beginning", "--max", "3", "--timeout", "20", "--key-separator", ":")
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["a:1", "b:2", "c:3"]


async def test_the_reader_from_the_beginning_goes_on_from_where_the_log_starts(apache_kafka,
                                                                            make_topic):
    """`consume --from-beginning` asks for offset 0 (Tansu's ListOffsets EARLIEST can name a
    later batch); where DeleteRecords moved the log's start, Kafka answers that Fetch
    OFFSET_OUT_OF_RANGE and the reader goes on from the log's start: every record after it,
    in order, no error."""
    topic = make_topic()
    async with Producer(apache_kafka.bootstrap, linger_ms=0) as producer:
        for i in range(10):
            await producer.send(topic, b"r-%d" % i)
    apache_kafka.delete_records(topic, 0, 4)
    config = ProducerConfig.from_properties({"bootstrap.servers": apache_kafka.bootstrap})
    got = []
    async with TopicReader(config, topic, from_beginning=True) as reader:
        got += await fetch_until(reader, 6)
    assert [(r.offset, r.value) for r in got] == [(i, b"r-%d" % i) for i in range(4, 10)]


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
def test_a_child_forked_in_a_coroutine_leaves_the_parents_connections_alone(apache_kafka,
                                                                              make_topic):
    """As tests/test_lifecycle.py's, on Apache Kafka (idempotent: a write of the child's
    over the parent's socket would carry the parent's producer id and sequences): the
    child's send is refused naming the fork, and the parent's records, those buffered at
    the fork included, are stored once and in order."""
    topic = make_topic()
    error = asyncio.run(fork_amid_sends(apache_kafka.bootstrap, topic))
    assert error.startswith("ProducerClosedError: this producer was started before os.fork()")
    got = consume_all(apache_kafka.bootstrap, topic, expected=len(SENT_BY_THE_PARENT))
    assert [r.value for r in got] == SENT_BY_THE_PARENT
