"""Faults between producer and broker, injected by a TCP proxy the broker advertises.

What a user must see: with idempotence every record arrives exactly once and in order
whatever the network does; every future ends (acked, or a typed error by delivery_timeout_ms);
flush() and close(timeout) return within their bounds.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
import time

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse
from kafka.protocol.producer import ProduceResponse

from aioproducer import Producer
from aioproducer.errors import (
    BrokerInvalidRecordError,
    CorruptMessageError,
    DeliveryTimeoutError,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    MessageTooLargeError,
    RecordTooLargeError,
    UnsupportedVersionError,
)
from aioproducer.protocol.messages import ApiKey
from tests.support.backpressure import fill_a_broker_that_stops_reading
from tests.support.readback import assert_contiguous_sequences, consume_all, fetch_raw_batches


async def _produce_while(producer: Producer, topic: str, count: int, keys: int,
                         fault) -> list:
    """Enqueue `count` records (key i % keys, value = per-key sequence) while `fault()` runs."""
    fault_task = asyncio.create_task(fault())
    handles = []
    per_key = collections.Counter()
    for i in range(count):
        key = b"k%d" % (i % keys)
        handles.append(await producer.enqueue(topic, b"%s:%06d" % (key, per_key[key]), key))
        per_key[key] += 1
        if i % 100 == 0:
            await asyncio.sleep(0.01)  # spread the records over time, so faults hit mid-stream
    await producer.flush()
    if fault_task.done():
        fault_task.result()  # a fault task that crashed would make the test prove nothing
    fault_task.cancel()
    await asyncio.gather(fault_task, return_exceptions=True)
    return handles


def _assert_exactly_once_in_order(bootstrap: str, topic: str, count: int) -> None:
    got = consume_all(bootstrap, topic, expected=count, timeout=60)
    values = [r.value for r in got]
    duplicates = [v for v, n in collections.Counter(values).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} duplicated, e.g. {duplicates[:3]}"
    assert len(values) == count, f"{count - len(values)} records lost"
    by_key = collections.defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        by_key[r.key].append(int(r.value.split(b":")[1]))
    for key, sequence in by_key.items():
        assert sequence == list(range(len(sequence))), f"key {key!r} out of order"


async def test_idempotent_exactly_once_through_repeated_cuts(proxied_broker):
    """Tens of thousands of records, 5 in flight, every connection cut again and again."""
    cluster = proxied_broker
    topic = f"cuts-{random.randrange(10**6)}"
    cluster.create_topic(topic, 3)
    seed = random.randrange(10**6)
    rng = random.Random(seed)

    async def cut_repeatedly():
        while True:
            await asyncio.sleep(rng.uniform(0.02, 0.15))
            if rng.random() < 0.5:
                cluster.proxy.cut_all()
            else:
                cluster.proxy.cut_after(rng.randrange(1, 5000), direction=rng.choice(["up", "down"]))

    async with Producer(cluster.bootstrap, linger_ms=2, batch_size=4096,
                        max_in_flight_requests_per_connection=5, request_timeout_ms=3000,
                        retry_backoff_ms=10, delivery_timeout_ms=60_000) as producer:
        handles = await _produce_while(producer, topic, 30_000, 24, cut_repeatedly)
    cluster.proxy.heal()  # the read-back below goes through the proxy too
    failed = [h.exception() for h in handles if h.exception() is not None]
    assert not failed, f"seed {seed}: {len(failed)} failed, first {failed[0]!r}"
    assert cluster.proxy.cuts >= 10, f"seed {seed}: only {cluster.proxy.cuts} connections cut"
    _assert_exactly_once_in_order(cluster.broker.bootstrap, topic, 30_000)
    for partition in range(3):  # on the wire: one producer id, contiguous sequences
        batches = fetch_raw_batches(cluster.broker.bootstrap, topic, partition)
        assert len({b.producer_id for b in batches}) == 1, f"seed {seed}"
        assert_contiguous_sequences(batches, f"seed {seed}: ")


async def test_stalled_responses_time_out_and_recover(proxied_broker):
    cluster = proxied_broker
    topic = f"stall-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)

    async def stall_twice():
        for _ in range(2):
            await asyncio.sleep(0.2)
            cluster.proxy.stall(True)
            await asyncio.sleep(1.5)  # longer than request_timeout_ms
            cluster.proxy.stall(False)

    async with Producer(cluster.bootstrap, request_timeout_ms=1000, linger_ms=1,
                        delivery_timeout_ms=30_000) as producer:
        handles = await _produce_while(producer, topic, 5000, 4, stall_twice)
    assert all(h.exception() is None for h in handles)
    _assert_exactly_once_in_order(cluster.broker.bootstrap, topic, 5000)


async def test_broker_down_longer_than_delivery_timeout(proxied_broker):
    """Every pending future fails with DeliveryTimeoutError close to the deadline, flush and
    close return, and the producer works again when the broker is back."""
    cluster = proxied_broker
    topic = f"down-{random.randrange(10**6)}"
    cluster.create_topic(topic, 2)
    async with Producer(cluster.bootstrap, request_timeout_ms=500, linger_ms=5,
                        delivery_timeout_ms=2000, retry_backoff_ms=50) as producer:
        await producer.send(topic, b"before")  # metadata and producer id while up
        cluster.proxy.refuse(True)
        started = time.monotonic()
        handles = [await producer.enqueue(topic, b"lost-%d" % i) for i in range(200)]
        await asyncio.wait_for(producer.flush(), 10)
        elapsed = time.monotonic() - started
        errors = [h.exception() for h in handles]
        assert all(isinstance(e, DeliveryTimeoutError) for e in errors), errors[:3]
        assert 1.9 <= elapsed < 2000 / 1000 + 1.5, f"failed after {elapsed:.2f} s"
        cluster.proxy.refuse(False)
        md = await asyncio.wait_for(producer.send(topic, b"after"), 10)
        assert md.offset >= 0
    got = consume_all(cluster.broker.bootstrap, topic, expected=2)
    assert sorted(r.value for r in got) == [b"after", b"before"]


async def test_a_record_that_expires_awaiting_its_retry_says_so(proxied_broker):
    """The message tells a batch that was sent and then waited for its retry from one that
    never left the buffer: the first may have been written."""
    cluster = proxied_broker
    cluster.create_topic("retry-expired", 1)
    async with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=500,
                        delivery_timeout_ms=1500, retry_backoff_ms=50) as producer:
        await producer.send("retry-expired", b"before")
        cluster.proxy.refuse(True, cut=False)  # no new connection
        cluster.proxy.cut_after(8, "up")  # and the next request is cut mid-frame
        with pytest.raises(DeliveryTimeoutError, match="waited for a retry"):
            await asyncio.wait_for(producer.send("retry-expired", b"lost"), 10)
        assert cluster.proxy.cuts == 1
        cluster.proxy.refuse(False)


async def test_idle_linger_0_send_times_out_by_its_deadline(proxied_broker):
    """At linger_ms=0 an idle producer writes the batch from send() itself, outside the sender's
    rounds; the sender still fails it at delivery_timeout_ms, saying why."""
    cluster = proxied_broker
    topic = f"idle-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    async with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=1000,
                        delivery_timeout_ms=1000) as producer:
        await producer.send(topic, b"before")
        await asyncio.sleep(1.2)  # past the deadlines of everything sent so far
        cluster.proxy.stall(True)
        started = time.monotonic()
        with pytest.raises(DeliveryTimeoutError, match="no response in time"):
            await asyncio.wait_for(producer.send(topic, b"unanswered"), 10)
        elapsed = time.monotonic() - started
        assert 0.95 <= elapsed < 1.5, f"failed after {elapsed:.2f} s"
        cluster.proxy.stall(False)
        md = await asyncio.wait_for(producer.send(topic, b"after"), 10)
        assert md.offset >= 1
    got = [r.value for r in consume_all(cluster.broker.bootstrap, topic, expected=md.offset + 1)]
    # The unanswered record's outcome is unknown: it may have been written, once.
    assert got in ([b"before", b"after"], [b"before", b"unanswered", b"after"]), got


async def test_close_with_timeout_returns_while_broker_is_down(proxied_broker):
    cluster = proxied_broker
    topic = f"close-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    producer = Producer(cluster.bootstrap, request_timeout_ms=1000)
    await producer.start()
    await producer.send(topic, b"up")
    cluster.proxy.refuse(True)
    handle = await producer.enqueue(topic, b"pending")
    started = time.monotonic()
    await asyncio.wait_for(producer.close(timeout=0.5), 5)
    assert time.monotonic() - started < 2
    with pytest.raises(KafkaError):
        await handle


async def test_acks_0_close_does_not_wait_for_the_broker_to_hang_up(proxied_broker):
    """close() at acks=0 learns that a broker has handled every request from its answer to
    one more, not from the broker closing its side after the client's FIN: this proxy (as
    a load balancer may) keeps its side open, and close() waited out request_timeout_ms.
    Nothing written is lost."""
    cluster = proxied_broker
    topic = f"blind-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    values = [b"%05d" % i + bytes(500) for i in range(1000)]
    producer = Producer(cluster.bootstrap, acks=0, enable_idempotence=False, linger_ms=5,
                        request_timeout_ms=15_000)
    await producer.start()
    for value in values:
        await producer.enqueue(topic, value)
    started = time.monotonic()
    await asyncio.wait_for(producer.close(), 30)
    took = time.monotonic() - started
    assert took < 5, f"close() took {took:.1f} s (request_timeout_ms: 15 s)"
    got = await asyncio.to_thread(consume_all, cluster.bootstrap, topic, len(values))
    assert [r.value for r in got] == values


async def test_acks_0_a_broker_that_stops_reading_makes_enqueue_wait(proxied_broker):
    """At acks=0 a batch is done once written, so only the connection's flow control keeps
    the bytes a broker does not take inside buffer_memory: they piled up in the transport's
    buffer, without bound, and enqueue() never waited. Now the connection pauses above
    max_request_size, the records wait in the accumulator, enqueue() raises
    BufferExhaustedError after max_block_ms, and once the broker reads again every record
    accepted arrives, in order, once."""
    cluster = proxied_broker
    topic = f"backed-up-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    accepted = await fill_a_broker_that_stops_reading(cluster.bootstrap, cluster.proxy, topic)
    got = await asyncio.to_thread(consume_all, cluster.bootstrap, topic, len(accepted), 60)
    assert [r.value for r in got] == accepted


async def test_acks_1_a_paused_connection_takes_no_more_requests(proxied_broker):
    """At acks=1 the in-flight limit bounds what is written (5 requests), but not by much
    with large requests: a connection whose broker stopped reading took all five, and held
    up to five requests' worth in its buffer. Now none while its buffer is over one."""
    cluster = proxied_broker
    topic = f"backed-up-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    size = 2 * 1024 * 1024
    accepted = await fill_a_broker_that_stops_reading(
        cluster.bootstrap, cluster.proxy, topic, max_request_size=size, acks=1,
        batch_size=size, buffer_memory=32 * 1024 * 1024, linger_ms=50)
    got = await asyncio.to_thread(consume_all, cluster.bootstrap, topic, len(accepted), 60)
    assert [r.value for r in got] == accepted


async def test_a_silent_cluster_fails_a_send_for_a_new_topic_at_max_block_ms(proxied_broker):
    """The cluster stops answering while a send waits for a new topic's metadata: the send
    fails when max_block_ms is up, not when the far longer request_timeout_ms ends the
    request, and says it could not reach the cluster (UnknownTopicError would advise
    creating a topic that may well exist)."""
    cluster = proxied_broker
    async with Producer(cluster.bootstrap, max_block_ms=1000,
                        request_timeout_ms=30_000) as producer:
        cluster.proxy.stall(True)
        with pytest.raises(KafkaConnectionError, match="'new-topic' within max_block_ms=1000"):
            await asyncio.wait_for(producer.send("new-topic", b"v"), 15)
        cluster.proxy.stall(False)


async def test_with_max_block_ms_0_a_new_topic_is_refused_until_its_metadata_came(
        broker, topic_factory):
    """max_block_ms=0 never waits: a send to a topic whose metadata is not known yet fails
    at once (as in the Java client), saying that the fetch goes on; a send after it came
    goes through."""
    async with Producer(broker.bootstrap, max_block_ms=0) as producer:
        topic = topic_factory(1)  # (Tansu answers the first fetch with every topic it has)
        with pytest.raises(KafkaConnectionError, match="the fetch goes on"):
            await producer.send(topic, b"refused")
        for _ in range(100):  # until the metadata came (at most 5 s)
            try:
                metadata = await producer.send(topic, b"sent")
                break
            except KafkaConnectionError:
                await asyncio.sleep(0.05)
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"sent")]


async def test_a_fatal_error_fetching_metadata_fails_a_send_at_once(proxied_broker):
    """A broker that (after a reconnect) does not offer Metadata at all: the send for a new
    topic fails at once with UnsupportedVersionError (fatal: no retry can help), not after
    max_block_ms of retries as a connection problem."""
    cluster = proxied_broker

    def no_metadata(response):
        response.api_keys = [k for k in response.api_keys if k.api_key != ApiKey.METADATA]
        return response
    async with Producer(cluster.bootstrap, max_block_ms=30_000) as producer:
        cluster.proxy.rewrite_responses(ApiVersionsResponse, no_metadata)
        cluster.proxy.cut_all()  # (a rewrite applies to the connections made after it)
        with pytest.raises(UnsupportedVersionError, match="METADATA"):
            await asyncio.wait_for(producer.send("new-topic", b"v"), 10)


async def test_garbage_from_the_network_is_survived(proxied_broker):
    cluster = proxied_broker
    topic = f"garbage-{random.randrange(10**6)}"
    cluster.create_topic(topic, 2)

    async def garbage():
        for _ in range(3):
            await asyncio.sleep(0.1)
            cluster.proxy.send_garbage()

    async with Producer(cluster.bootstrap, linger_ms=1, request_timeout_ms=2000) as producer:
        handles = await _produce_while(producer, topic, 5000, 8, garbage)
    assert all(h.exception() is None for h in handles)
    _assert_exactly_once_in_order(cluster.broker.bootstrap, topic, 5000)


async def test_soak_random_faults_reconcile(proxied_broker):
    """About 45 s of random faults while records flow. Afterwards acked + failed = sent,
    every acked record is read back exactly once, nothing is read twice, and per key the
    order holds. The seed is in every failure message; AIOPRODUCER_SOAK_SEED replays one."""
    import os

    cluster = proxied_broker
    topic = f"soak-{random.randrange(10**6)}"
    cluster.create_topic(topic, 4)
    seed = int(os.environ.get("AIOPRODUCER_SOAK_SEED", random.randrange(10**6)))
    rng = random.Random(seed)
    injected = collections.Counter()
    duration = 45.0

    async def faults():
        proxy = cluster.proxy
        while True:
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            kind = rng.choice(["cut", "cut_after", "stall", "refuse", "garbage"])
            injected[kind] += 1
            if kind == "cut":
                proxy.cut_all()
            elif kind == "cut_after":
                proxy.cut_after(rng.randrange(1, 20_000), rng.choice(["up", "down"]))
            elif kind == "garbage":
                proxy.send_garbage()
            else:
                toggle = proxy.stall if kind == "stall" else proxy.refuse
                toggle(True)
                try:
                    await asyncio.sleep(rng.uniform(0.2, 1.5))
                finally:
                    toggle(False)

    sent = 0
    handles = []
    per_key = collections.Counter()
    loop = asyncio.get_running_loop()
    async with Producer(cluster.bootstrap, linger_ms=2, batch_size=8192,
                        request_timeout_ms=1000, retry_backoff_ms=20,
                        delivery_timeout_ms=30_000) as producer:
        fault_task = asyncio.create_task(faults())
        deadline = loop.time() + duration
        while loop.time() < deadline and sent < 400_000:
            for _ in range(200):
                key = b"k%d" % (sent % 16)
                handles.append(await producer.enqueue(topic, b"%s:%07d" % (key, per_key[key]), key))
                per_key[key] += 1
                sent += 1
            await asyncio.sleep(0.02)
        if fault_task.done():
            fault_task.result()
        fault_task.cancel()
        await asyncio.gather(fault_task, return_exceptions=True)
        cluster.proxy.heal()  # the read-back below goes through the proxy too
        await asyncio.wait_for(producer.flush(), 60)
    acked = [h for h in handles if h.exception() is None]
    failed = len(handles) - len(acked)
    got = consume_all(cluster.broker.bootstrap, topic, expected=len(acked), timeout=90)
    values = [r.value for r in got]
    report = (f"seed {seed}: sent {sent}, acked {len(acked)}, failed {failed}, read back "
              f"{len(values)}, faults {dict(injected)}")
    print(report)
    assert len(acked) + failed == sent, report
    assert len(values) == len(set(values)), "duplicates: " + report
    assert len(values) == len(acked) and failed == 0, report  # long delivery timeout: all acked
    assert sum(injected.values()) >= 20, "too few faults: " + report
    _assert_exactly_once_in_order(cluster.broker.bootstrap, topic, len(acked))


async def test_slow_network_is_only_slow(proxied_broker):
    cluster = proxied_broker
    cluster.create_topic("slow", 2)
    cluster.proxy.throttle(200_000)  # bytes per second each way: a very slow reader
    async with Producer(cluster.bootstrap, linger_ms=5, request_timeout_ms=10_000) as producer:
        handles = [await producer.enqueue("slow", b"x" * 200 + b"%d" % i) for i in range(2000)]
        await asyncio.wait_for(producer.flush(), 60)
    assert all(h.exception() is None for h in handles)
    cluster.proxy.throttle(None)
    assert len(consume_all(cluster.broker.bootstrap, "slow", expected=2000)) == 2000


async def test_responses_cut_anywhere_are_read(proxied_broker):
    """Responses arriving in 7-byte pieces (frames cut anywhere, the end of one with the start
    of the next), several in one read, or one by one are read alike: every send is
    acknowledged once, in order."""
    cluster = proxied_broker
    cluster.create_topic("pieces", 1)
    async with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=10_000,
                        max_in_flight_requests_per_connection=5) as producer:
        results = []
        for piece in (7, 1000, None):
            cluster.proxy.split(piece)
            results += await asyncio.wait_for(asyncio.gather(
                *(producer.send("pieces", b"%d-%d" % (piece or 0, i)) for i in range(30))), 60)
            results.append(await asyncio.wait_for(producer.send("pieces", b"alone"), 10))
    cluster.proxy.split(None)
    offsets = [m.offset for m in results]
    assert offsets == list(range(len(results))), offsets  # each acked once, in order
    assert len(consume_all(cluster.broker.bootstrap, "pieces", expected=93)) == 93


async def test_without_idempotence_delivery_is_at_least_once(proxied_broker):
    """Idempotence off: through cuts nothing acked is lost; duplicates are possible (and
    documented), so they are counted, not forbidden."""
    cluster = proxied_broker
    cluster.create_topic("at-least-once", 2)
    rng = random.Random(11)

    async def cuts():
        while True:
            await asyncio.sleep(rng.uniform(0.05, 0.2))
            cluster.proxy.cut_after(rng.randrange(1, 3000), rng.choice(["up", "down"]))

    async with Producer(cluster.bootstrap, enable_idempotence=False, acks=1, linger_ms=2,
                        request_timeout_ms=2000, retry_backoff_ms=10) as producer:
        handles = await _produce_while(producer, "at-least-once", 10_000, 8, cuts)
    cluster.proxy.heal()  # the read-back below goes through the proxy too
    assert all(h.exception() is None for h in handles)
    values = {r.value for r in consume_all(cluster.broker.bootstrap, "at-least-once", 10_000)}
    assert len(values) == 10_000  # every record at least once


# -- a broker's size limit (Tansu has none: the proxy enforces one) -------------------------

def _assert_offsets_match(metadata, values: list[bytes], consumed) -> None:
    """Each record's metadata names where a consumer found it."""
    found = {r.value: (r.partition, r.offset) for r in consumed}
    assert [(m.partition, m.offset) for m in metadata] == [found[value] for value in values]


@pytest.mark.parametrize("idempotence,codec,api", [(True, "none", "enqueue"),
                                                   (False, "lz4", "enqueue_many")])
async def test_batches_over_the_brokers_limit_are_split_until_they_fit(proxied_broker,
                                                                        idempotence, codec, api):
    """The broker refuses 64 KiB batches (its limit is 3,000 bytes): each is sent again in
    halves until the pieces fit, and every record arrives once, in order, where its metadata
    says. buffer_memory holds four batches of the ~6 the records fill: memory a split kept
    would run out."""
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("split", 3)
    records = [(b"k%d" % (i % 7), b"%06d:" % i + os.urandom(100)) for i in range(3000)]
    values = [value for _, value in records]
    async with Producer(cluster.bootstrap, batch_size=65536, linger_ms=20,
                        buffer_memory=4 * 65536, max_block_ms=10_000,
                        enable_idempotence=idempotence, compression_type=codec,
                        # Without idempotence a split, like a retry, keeps the order only
                        # with one request in flight.
                        **({} if idempotence else {"acks": 1,
                                                   "max_in_flight_requests_per_connection": 1})
                        ) as producer:
        if api == "enqueue":
            handles = [await producer.enqueue("split", value, key) for key, value in records]
            await producer.flush()
            metadata = [handle.result() for handle in handles]  # raises the first failure
        else:
            bulk = await producer.enqueue_many("split", records)
            metadata = list(await bulk)
    assert cluster.proxy.refused_batches >= 3, "the limit never bit: the test proves nothing"
    consumed = consume_all(cluster.broker.bootstrap, "split", len(values))
    assert sorted(r.value for r in consumed) == sorted(values)  # each once
    for key in range(7):  # per key (so per partition), in the order sent
        sent = [value for k, value in records if k == b"k%d" % key]
        assert [r.value for r in consumed if r.key == b"k%d" % key] == sent
    _assert_offsets_match(metadata, values, consumed)
    if idempotence:
        for partition in range(3):
            batches = fetch_raw_batches(cluster.broker.bootstrap, "split", partition)
            assert len({b.producer_id for b in batches}) == 1
            assert_contiguous_sequences(batches)


async def test_a_record_over_the_brokers_limit_fails_alone(proxied_broker):
    """One record among 200 sent together is too large even on its own: its send() raises
    MessageTooLargeError saying so, and the others are delivered once, in order (idempotent:
    the sequence numbers it used up are not left as a gap)."""
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("too-large", 1)
    values = [b"%04d:" % i + b"v" * 100 for i in range(200)]
    values.insert(120, b"big:" + os.urandom(5000))
    async with Producer(cluster.bootstrap, batch_size=65536, linger_ms=50) as producer:
        results = await asyncio.gather(*(producer.send("too-large", value) for value in values),
                                       return_exceptions=True)
    big = results.pop(120)
    values.pop(120)
    assert isinstance(big, MessageTooLargeError) and isinstance(big, RecordTooLargeError)
    assert re.search("a record of 5[0-9]{3} bytes", str(big)), big
    assert not [r for r in results if isinstance(r, BaseException)]
    consumed = consume_all(cluster.broker.bootstrap, "too-large", len(values))
    assert [r.value for r in consumed] == values
    _assert_offsets_match(results, values, consumed)
    sessions = collections.defaultdict(list)
    for b in fetch_raw_batches(cluster.broker.bootstrap, "too-large", 0):
        sessions[(b.producer_id, b.producer_epoch)].append(b)
    for batches in sessions.values():
        assert_contiguous_sequences(batches)


async def test_enqueue_many_answers_for_its_own_records_of_a_split_batch(proxied_broker):
    """enqueue_many's 60 records share a batch with another call's record that is too large
    on its own: the batch is split, that record fails, and the 60, all written, succeed."""
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("bulk-split", 1)
    records = [(None, b"%04d:" % i + b"v" * 100) for i in range(60)]
    async with Producer(cluster.bootstrap, batch_size=65536, linger_ms=200) as producer:
        bulk = await producer.enqueue_many("bulk-split", records)
        big = await producer.enqueue("bulk-split", b"big:" + os.urandom(5000))
        await producer.flush()
    assert isinstance(big.exception(), MessageTooLargeError)
    assert bulk.exception() is None
    metadata = list(bulk.result())
    consumed = consume_all(cluster.broker.bootstrap, "bulk-split", len(records))
    _assert_offsets_match(metadata, [value for _, value in records], consumed)


async def test_failures_names_the_one_record_of_a_split_batch_that_failed(proxied_broker):
    """enqueue_many's 61 records fill one batch over the broker's limit, and record 30 is too
    large even on its own: the batch is split, that piece fails, the others are written.
    failures() names record 30 alone, with MessageTooLargeError, and the 60 it does not name
    are the ones a consumer reads, in order. (A review of failures(): it asks each record's
    batch, and a split batch's piece, for its own outcome.)"""
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("bulk-split-failed", 1)
    records = [(None, b"%04d:" % i + b"v" * 100) for i in range(60)]
    records.insert(30, (None, b"big:" + os.urandom(5000)))
    async with Producer(cluster.bootstrap, batch_size=65536, linger_ms=200) as producer:
        bulk = await producer.enqueue_many("bulk-split-failed", records)
        with pytest.raises(MessageTooLargeError):
            await asyncio.wait_for(bulk, 10)
    assert cluster.proxy.refused_batches >= 1, "the limit never bit: the test proves nothing"
    assert [(f.index, type(f.error)) for f in bulk.failures()] == [(30, MessageTooLargeError)]
    written = [value for i, (_, value) in enumerate(records) if i != 30]
    consumed = consume_all(cluster.broker.bootstrap, "bulk-split-failed", len(written))
    assert [r.value for r in consumed] == written


@pytest.mark.parametrize("code", [6, 9, 13], ids=["NOT_LEADER", "REPLICA_NOT_AVAILABLE",
                                                 "NETWORK_EXCEPTION"])
async def test_errors_that_say_the_leader_may_have_moved_refresh_metadata(proxied_broker, code):
    """A Produce answer that says the partition's leader may be elsewhere makes the producer
    look the leaders up again (the Java client's InvalidMetadataException codes); the record
    is written once."""
    cluster = proxied_broker
    cluster.create_topic("moved", 1)
    armed, refused = [], []
    lookups: list[float] = []

    def refuse_once(response):
        if not armed or refused:
            return None
        for topic in response.responses:
            for partition in topic.partition_responses:
                partition.error_code, partition.base_offset = code, -1
        refused.append(len(lookups))
        return response

    def count(response):
        lookups.append(time.monotonic())
    cluster.proxy.rewrite_responses(ProduceResponse, refuse_once)
    cluster.proxy.rewrite_responses(MetadataResponse, count)
    async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=300) as producer:
        await producer.send("moved", b"warm-up")
        armed.append(True)
        await asyncio.wait_for(producer.send("moved", b"v"), 10)
        for _ in range(30):  # lookups are at least retry_backoff_ms apart
            if len(lookups) > refused[0]:
                break
            await asyncio.sleep(0.1)
    assert refused and len(lookups) > refused[0], "no metadata lookup after the refusal"
    # The broker had written the batch it was made to refuse: the retry is a duplicate it
    # drops (Tansu then answers offset -1, see tansu.md).
    got = consume_all(cluster.broker.bootstrap, "moved", expected=2)
    assert [r.value for r in got] == [b"warm-up", b"v"]


async def test_thousands_of_retries_without_backoff_end_in_a_delivery_timeout(proxied_broker):
    """retry_backoff_ms=0 and a broker that keeps answering a retriable error at once: the
    batch is retried more than 1,024 times before delivery_timeout_ms, and then fails with
    DeliveryTimeoutError; the producer goes on (2 ** attempts as a float overflowed there,
    and the sender task died)."""
    cluster = proxied_broker
    cluster.create_topic("no-backoff", 1)
    armed = []

    def time_out(response):
        if not armed:
            return None
        for topic in response.responses:
            for partition in topic.partition_responses:
                partition.error_code, partition.base_offset = 7, -1  # REQUEST_TIMED_OUT
        return response
    cluster.proxy.rewrite_responses(ProduceResponse, time_out)
    async with Producer(cluster.bootstrap, linger_ms=0, enable_idempotence=False, acks=1,
                        retry_backoff_ms=0, retry_backoff_max_ms=0, request_timeout_ms=2000,
                        delivery_timeout_ms=10_000) as producer:
        await asyncio.wait_for(producer.send("no-backoff", b"before"), 10)
        armed.append(True)
        with pytest.raises(DeliveryTimeoutError):
            await asyncio.wait_for(producer.send("no-backoff", b"retried"), 20)
        assert producer.metrics().retries > 1024
        armed.clear()
        after = await asyncio.wait_for(producer.send("no-backoff", b"after"), 10)
    assert after.offset > 0


async def test_a_leader_missing_from_the_brokers_listed_is_looked_up_again(proxied_broker):
    """A metadata answer names a partition leader it does not list among the brokers (a
    broker caught mid-change): the producer cannot connect to it, so it asks again, as for
    an unknown leader, and the record is delivered, not failed at delivery_timeout_ms."""
    cluster = proxied_broker
    cluster.create_topic("unlisted", 1)
    unlisted = []

    def unlisted_leader(response):
        if len(unlisted) == 2:
            return None
        for topic in response.topics:
            for partition in topic.partitions:
                partition.leader_id = 222
        unlisted.append(True)
        return response
    cluster.proxy.rewrite_responses(MetadataResponse, unlisted_leader)
    async with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=1000,
                        delivery_timeout_ms=10_000) as producer:
        metadata = await asyncio.wait_for(producer.send("unlisted", b"v"), 20)
    assert len(unlisted) == 2
    got = consume_all(cluster.broker.bootstrap, "unlisted", expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"v")]


async def test_metadata_max_age_0_refreshes_at_most_every_retry_backoff(proxied_broker):
    """metadata_max_age_ms=0 (allowed, as in the Java client) means metadata is always old:
    an idle producer refreshes it every retry_backoff_ms, not back to back as fast as the
    broker answers."""
    cluster = proxied_broker
    cluster.create_topic("max-age-0", 1)
    lookups = []
    cluster.proxy.rewrite_responses(MetadataResponse, lambda response: lookups.append(1))
    async with Producer(cluster.bootstrap, metadata_max_age_ms=0,
                        retry_backoff_ms=100) as producer:
        await producer.send("max-age-0", b"v")
        lookups.clear()
        await asyncio.sleep(1)
        assert 1 <= len(lookups) <= 15, f"{len(lookups)} metadata requests in 1 s"


async def test_a_duplicate_answer_to_a_first_attempt_is_reported(proxied_broker, caplog):
    """DUPLICATE_SEQUENCE_NUMBER means the broker has the batch from an earlier attempt, so it
    counts as written (as in the Java client). For a batch sent only once there was no
    earlier attempt: the broker is wrong, and the log says so (the record may be lost)."""
    cluster = proxied_broker
    cluster.create_topic("dup-first", 1)
    armed = []

    def duplicate(response):
        if armed != [True]:
            return None
        armed.append("used")
        for topic in response.responses:
            for partition in topic.partition_responses:
                partition.error_code, partition.base_offset = 46, -1
        return response
    cluster.proxy.rewrite_responses(ProduceResponse, duplicate)
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        await producer.send("dup-first", b"warm-up")
        armed.append(True)
        with caplog.at_level("WARNING", logger="aioproducer"):
            metadata = await asyncio.wait_for(producer.send("dup-first", b"v"), 10)
    assert metadata.offset == -1
    assert "sent once, was answered as a duplicate" in caplog.text


@pytest.mark.parametrize("retry_backoff_ms", [50, 0])
async def test_an_outage_is_retried_with_growing_backoff(proxied_broker, retry_backoff_ms):
    """While the broker is unreachable, metadata lookups back off up to retry_backoff_max_ms
    (as the Java client's do, KIP-580) instead of knocking every retry_backoff_ms: a
    handful of connection attempts in 3 s, not one per 50 ms. With retry_backoff_ms=0 the
    connection attempts still wait for reconnect_backoff_ms (not ~1,000 a second, each
    logged). The records waiting meanwhile, for a known topic and for a topic new to the
    producer, are delivered once the broker is back."""
    cluster = proxied_broker
    cluster.create_topic("outage", 1)
    cluster.create_topic("outage-new", 1)
    async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=retry_backoff_ms,
                        retry_backoff_max_ms=1000, reconnect_backoff_max_ms=1000,
                        delivery_timeout_ms=60_000) as producer:
        await producer.send("outage", b"before")
        cluster.proxy.refuse(True)
        waiting = await producer.enqueue("outage", b"during")
        new_topic = asyncio.create_task(producer.send("outage-new", b"new"))
        await asyncio.sleep(3)
        attempts = cluster.proxy.connections_refused
        cluster.proxy.refuse(False)
        metadata = await asyncio.wait_for(waiting, 10)
        await asyncio.wait_for(new_topic, 10)
    assert attempts <= 20, f"{attempts} connection attempts in 3 s"
    got = consume_all(cluster.broker.bootstrap, "outage-new", expected=1)
    assert [r.value for r in got] == [b"new"]
    got = consume_all(cluster.broker.bootstrap, "outage", expected=2)
    assert [(r.offset, r.value) for r in got] == [(0, b"before"), (metadata.offset, b"during")]


async def test_a_produce_response_with_a_null_array_closes_the_connection_and_is_retried(
        proxied_broker, caplog):
    """A negative count for an array that may not be null (a broken broker) is a
    CorruptMessageError at decode, handled as a connection error: the connection closes and
    the batch is retried on a new one, not left to delivery_timeout_ms after a TypeError in
    the response callback."""
    cluster = proxied_broker
    cluster.create_topic("null-array", 1)
    armed, broken = [], []

    def null_partitions_once(response):
        if not armed or broken:
            return None
        broken.append(True)
        for topic in response.responses:
            topic.partition_responses = None  # kafka-python writes a count of -1
        return response

    cluster.proxy.rewrite_responses(ProduceResponse, null_partitions_once)
    async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=50,
                        delivery_timeout_ms=60_000) as producer:
        await producer.send("null-array", b"warm-up")
        accepted = cluster.proxy.connections_accepted
        armed.append(True)
        metadata = await asyncio.wait_for(producer.send("null-array", b"v"), 10)
    assert broken and metadata.partition == 0
    assert cluster.proxy.connections_accepted > accepted  # the bad connection was closed
    assert not [r for r in caplog.records if r.exc_info]  # no callback traceback logged
    got = consume_all(cluster.broker.bootstrap, "null-array", expected=2)
    assert [r.value for r in got] == [b"warm-up", b"v"]


async def test_a_metadata_response_with_a_null_array_is_a_corrupt_message(proxied_broker):
    """Metadata that says brokers=null: start() failed with a TypeError; now it fails with a
    CorruptMessageError (retriable) that names the field, the connection is closed, and
    the producer starts once the broker answers properly."""
    cluster = proxied_broker
    cluster.create_topic("null-brokers", 1)
    broken = []

    def null_brokers_once(response):
        if broken:
            return None
        broken.append(True)
        response.brokers = None
        return response

    cluster.proxy.rewrite_responses(MetadataResponse, null_brokers_once)
    producer = Producer(cluster.bootstrap, retry_backoff_ms=50)
    with pytest.raises(CorruptMessageError, match="brokers is null") as failure:
        await producer.start()
    assert failure.value.retriable
    async with producer:
        metadata = await asyncio.wait_for(producer.send("null-brokers", b"v"), 10)
    assert broken and metadata.offset == 0


@pytest.mark.parametrize("host, port, says", [
    (None, 70000, "port 70000 is not 1-65535"),
    (None, -5, "port -5 is not 1-65535"),
    ("127.0.0.1\x00evil", None, "control characters"),
    ("a" * 300 + ".example", None, "not a DNS name"),
])
async def test_a_broker_address_no_client_can_reach_is_refused_with_a_warning(
        proxied_broker, caplog, host, port, says):
    """Metadata that names a broker at a port out of range, a host with a NUL or a label
    over 63 characters: the connect task raised OverflowError/ValueError/UnicodeError,
    which nobody logged, and records just expired. Now the address is refused as the
    metadata is read, with a warning that says why; its partitions have no leader, and the
    records fail at delivery_timeout_ms as for any leader that cannot be reached."""
    cluster = proxied_broker
    cluster.create_topic("bad-address", 1)

    def bad_address(response):
        for broker in response.brokers:
            broker.host = host if host is not None else broker.host
            broker.port = port if port is not None else broker.port
        return response

    cluster.proxy.rewrite_responses(MetadataResponse, bad_address)
    async with Producer(cluster.bootstrap, request_timeout_ms=1000, delivery_timeout_ms=1500,
                        max_block_ms=1500) as producer:
        with pytest.raises(DeliveryTimeoutError):
            await asyncio.wait_for(producer.send("bad-address", b"v"), 10)
    warned = [r.getMessage() for r in caplog.records if "broker 111" in r.getMessage()]
    assert warned and says in warned[0] and "ignored" in warned[0]
    assert "\x00" not in warned[0] and "aaaa" not in warned[0]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


_KEYS = [b"k%d" % i for i in range(12)]


def _failing_in_two_partitions(cluster) -> tuple[str, dict[int, type]]:
    """A topic of 3 partitions whose brokers refuse, for good, the first batch for partition
    1 (INVALID_RECORD) and for partition 2 (INVALID_TIMESTAMP); each of _KEYS's records'
    index, if it is in one of those, with the error it gets (murmur2 placed, as kafka-python
    places a key)."""
    from kafka.partitioner.default import murmur2

    topic = f"bulk-failed-{os.urandom(4).hex()}"
    cluster.create_topic(topic, 3)
    cluster.fail((topic, 1), BrokerInvalidRecordError.error_code)
    cluster.fail((topic, 2), InvalidTimestampError.error_code)
    errors = {1: BrokerInvalidRecordError, 2: InvalidTimestampError}
    partitions = [(murmur2(key) & 0x7FFFFFFF) % 3 for key in _KEYS]
    assert set(partitions) == {0, 1, 2}
    return topic, {i: errors[p] for i, p in enumerate(partitions) if p in errors}


def _check_told(cluster, topic: str, expected: dict[int, type], failures, first) -> None:
    """`failures` names every failed record by index with its own error, `first` is the
    first of them in input order, and exactly the records not named were written."""
    assert [(f.index, type(f.error)) for f in failures] == sorted(expected.items())
    assert type(first) is expected[min(expected)]
    got = consume_all(cluster.bootstrap_servers, topic, expected=len(_KEYS) - len(expected))
    assert sorted(r.key for r in got) == sorted(k for i, k in enumerate(_KEYS)
                                               if i not in expected)


async def test_an_enqueue_many_whose_records_fail_in_two_partitions_tells_which(cluster):
    """enqueue_many's records go to three partitions; two partitions' batches fail for good,
    each with its own error. The BulkFuture raises the first failure in input order, and
    failures() names every record that failed, by index, with its typed error: the others
    were written. Only the first error was told: the user could not tell which records to
    send again (sending all again would write partition 0's twice)."""
    topic, expected = _failing_in_two_partitions(cluster)
    async with Producer(cluster.bootstrap_servers, linger_ms=50, acks=1,
                        enable_idempotence=False) as producer:
        bulk = await producer.enqueue_many(topic, [(key, b"v") for key in _KEYS])
        with pytest.raises(KafkaError) as raised:
            await asyncio.wait_for(bulk, 10)
        _check_told(cluster, topic, expected, bulk.failures(), raised.value)


def test_a_produce_many_whose_records_fail_in_two_partitions_tells_which(cluster):
    """As enqueue_many's, through BlockingProducer.produce_many()'s thread future."""
    from aioproducer import BlockingProducer

    topic, expected = _failing_in_two_partitions(cluster)
    with BlockingProducer(cluster.bootstrap_servers, linger_ms=50, acks=1,
                          enable_idempotence=False) as producer:
        bulk = producer.produce_many(topic, [(key, b"v") for key in _KEYS])
        first = bulk.exception(10)
        _check_told(cluster, topic, expected, bulk.failures(), first)


async def test_a_bug_part_way_through_settling_a_response_leaves_no_record_waiting(
        broker, topic_factory, monkeypatch):
    """settle_produce (compiled) raises after it settled the response's first batch (a bug
    of ours, as a split batch's piece whose completion raises): the first batch's record
    had its outcome set, but was never finished (its memory held, flush() waiting for it
    for good) nor its callbacks run (an await of it hung until close()); the second was out
    of flight and failed by nothing. Now the first's record is acknowledged, the second's
    fails saying why, and flush() returns."""
    from aioproducer._internal import sender as sender_module

    settle, raised = sender_module.settle_produce, []

    def broken(batches, responses, in_flight, run_watchers, all_or_none):
        if len(batches) < 2 or raised:
            return settle(batches, responses, in_flight, run_watchers, all_or_none)
        raised.append(True)
        settle(batches[:1], responses, in_flight, run_watchers, all_or_none)
        in_flight.pop(batches[1], None)  # (taken out, then the bug struck)
        raise RuntimeError("the settling's bug")

    monkeypatch.setattr(sender_module, "settle_produce", broken)
    topic = topic_factory(2)  # (one broker leads both: one request holds both batches)
    async with Producer(broker.bootstrap, acks=1, linger_ms=50,
                        delivery_timeout_ms=120_000) as producer:
        await producer.send(topic, b"warm", partition=0)  # (one batch: settled as usual)
        first = await producer.enqueue(topic, b"first", partition=0)
        second = await producer.enqueue(topic, b"second", partition=1)
        settled = await asyncio.wait_for(
            asyncio.gather(first, second, return_exceptions=True), 30)  # (far below 120 s)
        await asyncio.wait_for(producer.flush(), 30)
    assert raised, "no response held two batches"
    assert settled[0].offset == 1
    assert isinstance(settled[1], KafkaError) and "could not be handled" in str(settled[1])
    assert isinstance(settled[1].__cause__, RuntimeError)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_bug_in_handling_a_produce_response_fails_its_records_at_once_and_says_so(
        cluster, monkeypatch, caplog, idempotent):
    """The handling of a partition's error raises (a bug of ours, as topicid-17 met one in
    _on_partition_error): the record fails at once with an error that says so, chained to
    the bug, which is logged with its traceback; before, its batch stayed in flight until
    delivery_timeout_ms (120 s here), nothing said. Later records are sent as usual (an
    idempotent producer's after a new producer id: the failed batch used its sequence);
    without idempotence a record of another partition answered with it is sent too (an
    idempotent producer's response with an error is handled batch by batch: one the bug
    left unsettled fails with it)."""
    from aioproducer._internal.sender import Sender

    def broken(self, *args):
        raise RuntimeError("the handler's bug")

    monkeypatch.setattr(Sender, "_on_partition_error", broken)
    topic = f"handler-bug-{os.urandom(4).hex()}"
    cluster.create_topic(topic, 2)
    cluster.fail((topic, 0), BrokerInvalidRecordError.error_code)  # (its handling raises)
    expected = [b"later"]
    async with Producer(cluster.bootstrap_servers, acks="all" if idempotent else 1,
                        enable_idempotence=idempotent, delivery_timeout_ms=120_000) as producer:
        with caplog.at_level("ERROR", logger="aioproducer"):
            refused = await producer.enqueue(topic, b"refused", partition=0)
            other = None if idempotent else await producer.enqueue(topic, b"other", partition=1)
            with pytest.raises(KafkaError, match="could not be handled") as raised:
                await asyncio.wait_for(refused, 30)  # (a bound far below the 120 s)
            if other is not None:
                assert (await asyncio.wait_for(other, 30)).partition == 1
                expected.append(b"other")
            later = await asyncio.wait_for(producer.send(topic, b"later", partition=0), 30)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "the handler's bug" in str(raised.value)
    logged = [r for r in caplog.records if r.levelname == "ERROR" and r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info[1] is raised.value.__cause__
    assert later.offset == 0  # the refused record was not written; the later one was
    got = consume_all(cluster.bootstrap_servers, topic, expected=len(expected))
    assert sorted(r.value for r in got) == sorted(expected)
