"""Code written for aiokafka, moved over by changing the class name: its verbs are here under
its names (send_and_wait, stop, partitions_for as a set of ids), and its enqueue-then-await
habit is enqueue(). Read back with librdkafka."""

from __future__ import annotations

import asyncio

import pytest

from aioproducer import Producer
from aioproducer.errors import ConfigError
from tests.support.readback import consume_all


async def test_code_written_for_aiokafka_runs(broker, topic_factory):
    topic = topic_factory(3)
    producer = Producer(broker.bootstrap, linger_ms=5, max_request_size=1_048_576)
    await producer.start()
    try:
        assert await producer.partitions_for(topic) == {0, 1, 2}
        metadata = await producer.send_and_wait(topic, b"waited", key=b"k",
                                                headers=[("h", b"1")])
        future = await producer.enqueue(topic, b"enqueued", key=b"k")  # aiokafka: send()
        second = await future
    finally:
        await producer.stop()
    assert (second.partition, second.offset) == (metadata.partition, metadata.offset + 1)
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [(r.key, r.value, r.headers) for r in got] == [
        (b"k", b"waited", [("h", b"1")]), (b"k", b"enqueued", [])]
    assert "closed" in repr(producer)


async def test_aiokafkas_awaited_begin_transaction_runs(broker, topic):
    """aiokafka's begin_transaction() is a coroutine, so its users await it: here it is
    synchronous (the transaction has begun when it returns), and awaiting what it returns
    works too (it was `await None`, a TypeError raised with the transaction begun)."""
    from collections import namedtuple

    TopicPartition = namedtuple("TopicPartition", "topic partition")  # aiokafka's shape
    async with Producer(broker.bootstrap, transactional_id=f"habits-{topic}") as producer:
        await producer.begin_transaction()
        await producer.send(topic, b"in the transaction")
        await producer.send_offsets_to_transaction({TopicPartition(topic, 0): 1}, "habits")
        await producer.commit_transaction()
        producer.begin_transaction()  # (the Java client's way, not awaited, still works)
        await producer.send(topic, b"in the next one")
        await producer.commit_transaction()
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [r.value for r in got] == [b"in the transaction", b"in the next one"]


async def test_aiokafkas_spellings_of_metadata_timestamp_and_no_compression(broker, topic):
    """aiokafka's RecordMetadata calls the record's time `timestamp` (the Java client's
    `timestamp()`), ours `timestamp_ms`: `md.timestamp` raised AttributeError, from send(),
    an enqueue() future and enqueue_many() alike. And its default compression_type=None,
    written out, was refused."""
    stamp = 1_700_000_000_000
    async with Producer(broker.bootstrap, compression_type=None) as producer:
        sent = await producer.send_and_wait(topic, b"sent", timestamp_ms=stamp)
        enqueued = await (await producer.enqueue(topic, b"enqueued", timestamp_ms=stamp + 1))
        bulk = await (await producer.enqueue_many(topic, [(None, b"bulk")],
                                                  timestamp_ms=stamp + 2))
    assert [md.timestamp for md in (sent, enqueued, bulk[0])] == [stamp, stamp + 1, stamp + 2]
    assert sent == (topic, 0, 0, stamp)  # (still the four fields)
    with pytest.raises(AttributeError):
        sent.timestamp = 0  # type: ignore[misc]
    got = consume_all(broker.bootstrap, topic, expected=3)
    assert [r.timestamp_ms for r in got] == [stamp, stamp + 1, stamp + 2]


async def test_an_aiokafka_partitioner_is_refused_with_the_wrapper_that_fits(broker,
                                                                               topic_factory):
    """aiokafka calls a partitioner as (key, all_partitions, available_partitions), we call
    ours with (topic, key, partition_count, available_partitions): one moved over was taken
    by the constructor, then every send() raised "takes 3 positional arguments but 4 were
    given". The constructor now refuses it with a wrapper, and the wrapper places records
    where the aiokafka partitioner says."""
    topic = topic_factory(3)

    def last_partition(key_bytes, all_partitions, available_partitions):
        return all_partitions[-1]

    with pytest.raises(ConfigError, match=r"'.*last_partition' takes \(key_bytes, "
                                          r"all_partitions, available_partitions\)\. An "
                                          r"aiokafka partitioner.* works wrapped"):
        Producer(broker.bootstrap, partitioner=last_partition)
    wrapped = lambda topic, key, count, available: last_partition(  # (the message's)
        key, list(range(count)), available)
    async with Producer(broker.bootstrap, partitioner=wrapped) as producer:
        sent = [await producer.send(topic, b"v%d" % i, key=b"k%d" % i) for i in range(3)]
    assert {md.partition for md in sent} == {2}
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=3)] == \
        [b"v0", b"v1", b"v2"]


async def test_aiokafkas_send_then_await_the_future_runs_and_says_what_to_use(broker, topic):
    """aiokafka's send() returns a future to await later; ours is its send_and_wait() and
    returned the metadata, so `await fut` raised TypeError ("can't be used in 'await'
    expression") with the record sent, and gather() of them raised too. Awaiting the
    metadata now returns it, with a warning naming enqueue() (that loop waits for each
    record)."""
    async with Producer(broker.bootstrap) as producer:
        futures = [await producer.send(topic, b"%d" % i, key=b"k") for i in range(3)]
        with pytest.warns(RuntimeWarning, match=r"aiokafka's `fut = await producer.send\("
                                                r"\.\.\.\)` is `fut = await producer.enqueue"):
            gathered = await asyncio.gather(*futures)  # (aiokafka's documented batch idiom)
        with pytest.warns(RuntimeWarning, match="awaiting it again returns it"):
            first = await futures[0]
    assert [md.offset for md in gathered] == [0, 1, 2] and first == gathered[0]
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=3)] == \
        [b"0", b"1", b"2"]


async def test_aiokafkas_create_batch_names_enqueue_many(broker, topic):
    """aiokafka's create_batch()/send_batch() are enqueue_many() here (the migration table
    says so): the AttributeError said only "no attribute 'create_batch'"."""
    async with Producer(broker.bootstrap) as producer:
        for verb in ("create_batch", "send_batch"):
            with pytest.raises(AttributeError, match=rf"no attribute '{verb}': aiokafka's "
                                                     r"create_batch\(\) and send_batch\(\) are "
                                                     r"`await producer.enqueue_many\("):
                getattr(producer, verb)
        bulk = await (await producer.enqueue_many(topic, [(None, b"a"), (None, b"b")]))
    assert [md.offset for md in bulk] == [0, 1]
