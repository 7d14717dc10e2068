"""Records we produce are read back intact, once, in order, by librdkafka's consumer."""

from __future__ import annotations

import asyncio
import collections
import random

import pytest

from aioproducer import Producer, RecordMetadata
from tests.support.columns import columns_of
from tests.support.readback import (
    assert_contiguous_sequences,
    consume_all,
    fetch_raw_batches,
    partition_for_key_librdkafka,
)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 6
KEYS = [f"user-{i}".encode() for i in range(64)]


def _record(i: int, rng: random.Random) -> tuple[bytes | None, bytes | None, list]:
    """A varied record: keyed or keyless, empty/None/large values, headers of every shape."""
    key = None if i % 7 == 0 else KEYS[i % len(KEYS)]
    if i % 1000 == 3:
        value: bytes | None = None
    elif i % 1000 == 5:
        value = b""
    elif i % 5000 == 11:
        value = rng.randbytes(300_000)  # larger than batch_size: a batch of its own
    else:
        value = b"%d:" % i + rng.randbytes(rng.randrange(0, 200))
    headers: list = []
    if i % 3 == 0:
        headers = [("seq", b"%d" % i), ("empty", b""), ("null", None), ("seq", b"dup")]
    return key, value, headers


@pytest.mark.parametrize("codec", CODECS)
async def test_round_trip_every_codec(broker, topic_factory, codec):
    topic = topic_factory(PARTITIONS)
    rng = random.Random(f"round-trip-{codec}")
    count = 20_000
    sent = [_record(i, rng) for i in range(count)]
    async with Producer(broker.bootstrap, compression_type=codec, linger_ms=5) as producer:
        handles = [await producer.enqueue(topic, value, key, headers=headers,
                                          timestamp_ms=1_700_000_000_000 + i)
                   for i, (key, value, headers) in enumerate(sent)]
        await producer.flush()
        metadata = [h.result() for h in handles]

    got = consume_all(broker.bootstrap, topic, expected=count, timeout=60)
    assert len(got) == count, f"read back {len(got)} of {count} records"
    by_position = {(r.partition, r.offset): r for r in got}
    assert len(by_position) == count, "a record was read twice"
    for i, ((key, value, headers), md) in enumerate(zip(sent, metadata)):
        assert isinstance(md, RecordMetadata) and md.topic == topic
        record = by_position[(md.partition, md.offset)]  # the offset we reported is right
        assert record.key == key and record.value == value, f"record {i} changed"
        assert record.headers == headers
        assert record.timestamp_ms == md.timestamp_ms == 1_700_000_000_000 + i

    # Per key, records arrive in the order they were sent, all on one partition.
    positions = collections.defaultdict(list)
    for (key, _, _), md in zip(sent, metadata):
        if key is not None:
            positions[key].append((md.partition, md.offset))
    for key, where in positions.items():
        assert len({p for p, _ in where}) == 1, f"key {key!r} spread over partitions"
        offsets = [o for _, o in where]
        assert offsets == sorted(offsets), f"key {key!r} reordered"


async def test_keyed_partition_matches_librdkafka(broker, topic_factory):
    topic = topic_factory(PARTITIONS)
    keys = [b"k%d" % i for i in range(300)] + [b"", b"\x00\xff" * 20, "ключ".encode()]
    expected = partition_for_key_librdkafka(broker.bootstrap, topic, keys)
    async with Producer(broker.bootstrap) as producer:
        ours = await asyncio.gather(*(producer.send(topic, b"v", key) for key in keys))
    assert [md.partition for md in ours] == expected


async def test_send_returns_after_ack_with_metadata(broker, topic):
    async with Producer(broker.bootstrap, linger_ms=0) as producer:
        first = await producer.send(topic, b"one", key=b"k", headers=[("source", b"web")])
        second = await producer.send(topic, b"two", key=b"k")
    assert (first.topic, first.partition) == (topic, 0)
    assert second.offset == first.offset + 1
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [(r.value, r.headers) for r in got] == [(b"one", [("source", b"web")]), (b"two", [])]


async def test_many_concurrent_senders(broker, topic_factory):
    """The async-service shape: many tasks awaiting send() at once share batches."""
    topic = topic_factory(3)

    async def worker(producer: Producer, w: int) -> list[RecordMetadata]:
        return [await producer.send(topic, b"%d-%d" % (w, i), key=b"w%d" % w) for i in range(20)]

    async with Producer(broker.bootstrap, linger_ms=2) as producer:
        results = await asyncio.gather(*(worker(producer, w) for w in range(200)))
    for per_worker in results:  # each worker's records are in order on their partition
        assert len({md.partition for md in per_worker}) == 1
        offsets = [md.offset for md in per_worker]
        assert offsets == sorted(set(offsets))
    got = consume_all(broker.bootstrap, topic, expected=4000)
    assert sorted(r.value for r in got) == sorted(b"%d-%d" % (w, i) for w in range(200) for i in range(20))


async def test_serializers(broker, topic_factory):
    import json

    serialized = []

    def to_json(value):
        serialized.append(value)
        return json.dumps(value).encode()

    async with Producer(broker.bootstrap, key_serializer=str.encode,
                        value_serializer=to_json) as producer:
        topic = topic_factory(1)  # created after the start: the producer has no metadata for it
        # The first record waits for the topic's metadata: it is still serialized once.
        await producer.send(topic, {"id": 1}, key="user-1")
        await producer.send(topic, {"id": 2}, key="user-2")
    assert serialized == [{"id": 1}, {"id": 2}]
    records = consume_all(broker.bootstrap, topic, expected=2)
    assert sorted((r.key, r.value) for r in records) == [
        (b"user-1", b'{"id": 1}'), (b"user-2", b'{"id": 2}')]


@pytest.mark.parametrize("acks", [0, 1, "all"])
async def test_acks_settings(broker, topic, acks):
    async with Producer(broker.bootstrap, acks=acks, enable_idempotence=False) as producer:
        handles = [await producer.enqueue(topic, b"%d" % i) for i in range(500)]
        await producer.flush()
    offsets = [h.result().offset for h in handles]
    if acks == 0:
        assert set(offsets) == {-1}  # nobody told us
    else:
        assert offsets == list(range(500))
    got = consume_all(broker.bootstrap, topic, expected=500)
    assert [r.value for r in got] == [b"%d" % i for i in range(500)]


async def test_acks_0_sends_every_batch_queued_behind_another(broker, topic):
    """At acks=0 no response wakes the sender: batches queued behind others in one partition
    (concurrent sends filling batch after batch) must still go, each round after the last,
    not wait for the next metadata refresh minutes later."""
    async with Producer(broker.bootstrap, acks=0, batch_size=1024, linger_ms=5) as producer:
        sends = asyncio.gather(*(producer.send(topic, b"%05d" % i + bytes(95))
                                 for i in range(2000)))
        await asyncio.wait_for(sends, 10)
        assert producer.metrics().batches_sent >= 100  # (~10 records a batch)
    got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 2000)
    assert [r.value for r in got] == [b"%05d" % i + bytes(95) for i in range(2000)]


async def test_acks_0_close_loses_nothing_written_to_the_connection(broker, topic):
    """At acks=0 a batch is done once its request is handed to the connection; close() then
    waits for the broker to have handled those requests before it closes the connection (it
    threw away what the broker had not read yet: 1,480 records of 2,000 lost)."""
    values = [b"%05d" % i + bytes(2000) for i in range(2000)]
    async with Producer(broker.bootstrap, acks=0, enable_idempotence=False,
                        linger_ms=5) as producer:
        for value in values:
            await producer.enqueue(topic, value)
    got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, len(values))
    assert len(got) == len(values), f"{len(values) - len(got)} records lost at close()"
    assert [r.value for r in got] == values


async def test_idempotent_producer_writes_one_producer_id_with_contiguous_sequences(broker, topic):
    async with Producer(broker.bootstrap, batch_size=1024, linger_ms=1) as producer:
        for i in range(3000):
            await producer.enqueue(topic, b"%05d" % i)
        await producer.flush()
    batches = [b for b in fetch_raw_batches(broker.bootstrap, topic, 0) if not b.is_control]
    assert len(batches) > 10
    assert len({b.producer_id for b in batches}) == 1 and batches[0].producer_id >= 0
    assert_contiguous_sequences(batches)
    assert [r[2] for b in batches for r in b.records] == [b"%05d" % i for i in range(3000)]


@pytest.mark.parametrize("idempotence", [True, False])
async def test_linger_0_idle_and_busy_sends_keep_one_order(broker, topic, idempotence):
    """At linger_ms=0 an idle producer writes a new batch from send() itself, a busy one
    gathers records in sender rounds: on the wire the records in the order sent (under one
    producer id, sequences contiguous, when idempotent), and the busy stretch still batched."""
    async with Producer(broker.bootstrap, linger_ms=0, enable_idempotence=idempotence) as producer:
        for i in range(20):  # one at a time: each finds the producer idle
            await producer.send(topic, b"%03d" % i, partition=0)
        await asyncio.gather(*(producer.send(topic, b"%03d" % i, partition=0)
                               for i in range(20, 220)))
        for i in range(220, 240):
            await producer.send(topic, b"%03d" % i, partition=0)
    batches = fetch_raw_batches(broker.bootstrap, topic, 0)
    if idempotence:
        assert len({b.producer_id for b in batches}) == 1 and batches[0].producer_id >= 0
        assert_contiguous_sequences(batches)
    assert [r[2] for b in batches for r in b.records] == [b"%03d" % i for i in range(240)]
    assert len(batches) <= 60, f"{len(batches)} batches: the 200 concurrent sends were not batched"


async def test_enqueue_many_round_trip(broker, topic_factory):
    topic = topic_factory(PARTITIONS)
    records = [(KEYS[i % len(KEYS)] if i % 3 else None, b"bulk-%d" % i) for i in range(30_000)]
    async with Producer(broker.bootstrap, batch_size=4096) as producer:
        bulk = await producer.enqueue_many(topic, records[:20_000])
        more = await producer.enqueue_many(topic, iter(records[20_000:]), timestamp_ms=123)
        metadata = [*await bulk, *await more]
    assert len(metadata) == 30_000
    got = {(r.partition, r.offset): r for r in consume_all(broker.bootstrap, topic, 30_000)}
    assert len(got) == 30_000
    expected = partition_for_key_librdkafka(broker.bootstrap, topic_factory(PARTITIONS), KEYS)
    for (key, value), md in zip(records, metadata):
        record = got[(md.partition, md.offset)]
        assert (record.key, record.value) == (key, value)
        if key is not None:
            assert md.partition == expected[KEYS.index(key)]
    assert {md.timestamp_ms for md in metadata[20_000:]} == {123}


async def test_enqueue_many_bad_record_keeps_what_was_accepted(broker, topic):
    from aioproducer.errors import InvalidRecordError

    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match="value must be bytes") as caught:
            await producer.enqueue_many(topic, [(None, b"a"), (None, b"b"), (None, "text")])
        accepted = caught.value.accepted
        assert len(accepted) == 2
        assert [md.offset for md in await accepted] == [0, 1]
    assert [r.value for r in consume_all(broker.bootstrap, topic, 2)] == [b"a", b"b"]


async def test_enqueue_many_reads_columns_where_they_lie(broker, topic_factory):
    """Records given as the speed-up's Columns (keys and values in Arrow's binary layout, as
    the Spark data source hands them over) arrive as the cells held them: keyed ones in the
    Java client's partitions, null keys and values, empty ones, across many batches. A record
    that cannot be sent ends the call as a bad tuple would: the records before it stay
    buffered and are delivered, and `accepted` holds them."""
    from aioproducer._speedups import Columns
    from aioproducer.errors import RecordTooLargeError

    topic, rng = topic_factory(PARTITIONS), random.Random(9)
    pairs = [(None if i % 7 == 0 else KEYS[i % len(KEYS)],
              None if i % 500 == 3 else b"" if i % 500 == 5 else b"col-%d" % i)
             for i in range(20_000)]
    async with Producer(broker.bootstrap, batch_size=4096, max_request_size=100_000
                        ) as producer:
        bulk = await producer.enqueue_many(topic, columns_of(Columns, rng, pairs))
        metadata = list(await bulk)
        too_large = [(None, b"first"), (None, b"second"), (None, b"x" * 200_000), (None, b"4")]
        with pytest.raises(RecordTooLargeError) as caught:
            await producer.enqueue_many(topic, columns_of(Columns, rng, too_large))
        assert len(caught.value.accepted) == 2
        metadata += await caught.value.accepted
    got = {(r.partition, r.offset): r for r in consume_all(broker.bootstrap, topic, 20_002)}
    assert len(got) == len(metadata) == 20_002
    expected = partition_for_key_librdkafka(broker.bootstrap, topic_factory(PARTITIONS), KEYS)
    for (key, value), md in zip(pairs + too_large[:2], metadata):
        record = got[(md.partition, md.offset)]
        assert (record.key, record.value) == (key, value)
        if key is not None:
            assert md.partition == expected[KEYS.index(key)]


async def test_enqueue_many_takes_pairs_of_any_bytes_like(broker, topic):
    from aioproducer.errors import InvalidRecordError

    async with Producer(broker.bootstrap) as producer:
        mixed = await producer.enqueue_many(
            topic, [[b"k", b"list"], (None, bytearray(b"ba")), (b"k2", memoryview(b"mv"))])
        assert all(md.offset >= 0 for md in await mixed) and len(mixed) == 3
        with pytest.raises(InvalidRecordError, match=r"\(key, value\) pairs.*record 1") as caught:
            await producer.enqueue_many(topic, [(None, b"x"), (None, b"y", b"z")])
        assert [md.offset for md in await caught.value.accepted] == [3]
    values = sorted(r.value for r in consume_all(broker.bootstrap, topic, 4))
    assert values == [b"ba", b"list", b"mv", b"x"]


async def test_enqueue_many_writes_several_full_batches_a_request_while_it_appends(
        broker, topic_factory):
    """One enqueue_many call of keyless records fills batch after batch, each on the sticky
    partition it moves on to: the sender writes them while the call goes on, several full
    batches a request (a loop turn per full batch made a request per batch whenever the
    broker kept up: issue 42), and the broker stores each record once, in the order of the
    call within its partition. With acks=0 nothing waits for a response, so the request count
    does not hang on the broker's speed: each turn the sender gets writes what is full."""
    topic = topic_factory(PARTITIONS)
    count = 20_000
    values = [b"%06d" % i + bytes(94) for i in range(count)]
    async with Producer(broker.bootstrap, acks=0, batch_size=4096, linger_ms=1000) as producer:
        await producer.enqueue_many(topic, [(None, v) for v in values])
        written_in_the_call = producer.metrics().produce_requests
        await producer.flush()
        metrics = producer.metrics()
        # (read back before closing: see test_acks_0_sends_every_batch_queued_behind_another)
        got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, count)
    assert written_in_the_call > 0, "the sender wrote nothing while the call appended"
    assert metrics.batches_sent >= 400  # ~37 records a batch
    assert metrics.batches_sent >= 2.5 * metrics.produce_requests, (
        f"{metrics.produce_requests} requests for {metrics.batches_sent} batches")
    assert sorted(r.value for r in got) == values  # each once
    for p in range(PARTITIONS):
        in_partition = [r.value for r in got if r.partition == p]
        assert in_partition == sorted(in_partition)  # in the order of the call
