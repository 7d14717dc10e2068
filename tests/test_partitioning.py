"""Where records go: the KIP-794 rules for keyless records (never a partition without a
leader, move on by bytes, adaptively away from loaded partitions and unavailable brokers),
partitioner_ignore_keys, and a custom partitioner. Read back by librdkafka."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid

import pytest
from kafka.protocol.metadata import MetadataResponse

from aioproducer import Producer
from aioproducer._internal.partitioner import StickyPartitioner
from aioproducer.errors import InvalidRecordError
from tests.support.readback import consume_all


async def test_keyless_records_avoid_a_partition_without_a_leader(proxied_broker):
    """Metadata says partition 0 has no leader (LEADER_NOT_AVAILABLE, a broker down): no
    keyless record goes there, so none waits out delivery_timeout_ms for a leader; all are
    delivered to the others."""
    cluster = proxied_broker
    cluster.create_topic("leaderless", 4)

    def no_leader_for_0(response):
        for topic in response.topics:
            for partition in topic.partitions:
                if partition.partition_index == 0:
                    partition.error_code, partition.leader_id = 5, -1
        return response

    cluster.proxy.rewrite_responses(MetadataResponse, no_leader_for_0)
    async with Producer(cluster.bootstrap, linger_ms=0, batch_size=200,
                        delivery_timeout_ms=60_000) as producer:
        placed = await asyncio.wait_for(asyncio.gather(
            *[producer.send("leaderless", b"%04d" % i + b"." * 60) for i in range(300)]), 30)
    partitions = {md.partition for md in placed}
    assert 0 not in partitions and len(partitions) > 1, partitions
    got = consume_all(cluster.broker.bootstrap, "leaderless", expected=300)
    assert sorted(r.value[:4] for r in got) == [b"%04d" % i for i in range(300)]
    assert {r.partition for r in got} == partitions


async def test_keyless_records_move_on_after_batch_size_bytes(broker, topic_factory):
    """Records sent one at a time each go out in a batch of their own (linger_ms=0). The
    sticky partition still moves on once batch_size bytes went to it (KIP-794), instead of
    staying on one partition for as long as no batch fills."""
    topic = topic_factory(4)
    value = b"v" * 90
    async with Producer(broker.bootstrap, linger_ms=0, batch_size=1000) as producer:
        placed = [await producer.send(topic, value) for _ in range(120)]
    runs = [len(list(group)) for _, group in itertools.groupby(md.partition for md in placed)]
    # Each partition got batch_size bytes before the move, batch headers counted as the
    # Java client counts them: the same number of records each time, 1000 bytes' worth of
    # 90-byte values with their record and batch overheads (the last run may be cut short).
    assert len(runs) >= 10 and len(set(runs[:-1])) == 1, runs
    assert 5 <= runs[0] <= 11, runs
    got = consume_all(broker.bootstrap, topic, expected=120)
    assert len(got) == 120


async def test_partitioner_ignore_keys_spreads_keyed_records_like_keyless(broker, topic_factory):
    topic = topic_factory(4)
    async with Producer(broker.bootstrap, partitioner_ignore_keys=True, batch_size=500,
                        linger_ms=0) as producer:
        placed = [await producer.send(topic, b"x" * 100, key=b"same-key") for _ in range(60)]
    assert len({md.partition for md in placed}) > 1  # murmur2 would put all on one


async def test_a_custom_partitioner_places_records(broker, topic_factory):
    """partitioner(topic, key, count, available) decides; None leaves it to the built-in
    rule; an out-of-range answer is a typed error for that record only. enqueue_many's
    records go through it too."""
    topic = topic_factory(3)
    calls = []

    def by_value_length(topic_name, key, count, available):
        calls.append((topic_name, key, count, tuple(available)))
        if key == b"default":
            return None
        if key == b"bad":
            return 7
        return len(key or b"") % count

    async with Producer(broker.bootstrap, partitioner=by_value_length) as producer:
        one = await producer.send(topic, b"v", key=b"a")
        two = await producer.send(topic, b"v", key=b"ab")
        default = await producer.send(topic, b"v", key=b"default")
        with pytest.raises(InvalidRecordError, match="returned 7 .* partitions 0 to 2"):
            await producer.send(topic, b"v", key=b"bad")
        bulk = await producer.enqueue_many(topic, [(b"abc", b"1"), (b"a", b"2")])
        bulk_metadata = await bulk
    assert (one.partition, two.partition) == (1, 2)
    assert calls[0] == (topic, b"a", 3, (0, 1, 2))
    assert default.partition in (0, 1, 2)
    assert [md.partition for md in bulk_metadata] == [0, 1]
    got = consume_all(broker.bootstrap, topic, expected=5)
    assert sorted((r.key, r.partition) for r in got) == sorted(
        [(b"a", 1), (b"ab", 2), (b"default", default.partition), (b"abc", 0), (b"a", 1)])


async def test_a_slow_node_gets_no_keyless_records_while_unavailable(cluster):
    """partitioner_availability_timeout_ms through a Producer on a 3-node SimulatedCluster,
    each keyless record in a batch of its own (so each is placed afresh, KIP-794).

    First all nodes are healthy, at linger_ms=0 with one request in flight per connection:
    records sent one at a time are written by send() itself (no sender round), then bursts
    find a node busy for a round trip. No node is ever unavailable (a node served by send()
    kept the time it last took data of an earlier round, so a burst made it unavailable at
    once). Then one node answers 1 s late: once it has waited longer than the timeout with
    batches ready, no keyless record goes to its partitions; back to speed, with its
    batches delivered, it is available and gets keyless records again. (Whether a node is
    unavailable is read from the producer's sender, the partitioner's source, before each
    send: placing a record is part of the send() call.)"""
    topic = f"avail-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 6)
    led_by = {p: cluster.leader(topic, p) for p in range(6)}
    assert set(led_by.values()) == {1, 2, 3}
    value = b"v" * 60
    marked: list[tuple[int, int]] = []  # (node, record number) seen unavailable

    def unavailable(producer: Producer, i: int) -> set[int]:
        nodes = {n for n in (1, 2, 3) if producer._sender.node_unavailable(n)}
        marked.extend((n, i) for n in nodes)
        return nodes

    settings = dict(linger_ms=0, batch_size=16, partitioner_availability_timeout_ms=300)
    async with Producer(cluster.bootstrap_servers, max_in_flight_requests_per_connection=1,
                        **settings) as producer:
        futures = []
        for i in range(30):  # rounds see every node
            unavailable(producer, i)
            futures.append(producer.send(topic, value))
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        for i in range(40):  # 0.4 s of records written by send() itself
            unavailable(producer, i)
            await asyncio.wait_for(producer.send(topic, value), 10)
            await asyncio.sleep(0.01)
        futures = []
        for i in range(60):  # a burst: nodes busy for a round trip
            unavailable(producer, i)
            futures.append(producer.send(topic, value))
            await asyncio.sleep(0)
            unavailable(producer, i)
        await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert marked == [], f"healthy nodes marked unavailable: {marked[:5]}"

    slow = led_by[0]
    placed: list[tuple[set[int], asyncio.Future]] = []
    async with Producer(cluster.bootstrap_servers, **settings) as producer:
        await asyncio.wait_for(producer.send(topic, value), 10)
        cluster.slow(slow, 1.0)
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        i = 0
        while loop.time() < end and i < 1000:
            placed.append((unavailable(producer, i), producer.send(topic, value)))
            await asyncio.sleep(0.01)
            i += 1
        cluster.slow(slow, 0)
        results = await asyncio.wait_for(asyncio.gather(*(f for _, f in placed)), 20)
        deadline = loop.time() + 5
        while producer._sender.node_unavailable(slow) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert not producer._sender.node_unavailable(slow)
        again = await asyncio.wait_for(asyncio.gather(
            *[producer.send(topic, value) for _ in range(60)]), 10)
    during = [md.partition for (nodes, _), md in zip(placed, results) if slow in nodes]
    assert during, "the slow node was never unavailable"
    assert all(led_by[p] != slow for p in during), \
        f"keyless records went to the unavailable node {slow}: partitions {during}"
    assert {n for n, _ in marked} == {slow}, f"healthy nodes marked: {marked[:5]}"
    assert any(led_by[md.partition] == slow for md in again), \
        "the node got no keyless records after it was back"


async def test_a_node_whose_batches_expired_is_available_again(cluster):
    """A node so slow that its records expire (delivery_timeout_ms) is unavailable while
    they wait; once none is queued for it, it is not (the mark used to stay for good: it
    got no keyless record again, and no batch to clear it with), and once it is back to
    speed keyless records go to it again."""
    topic = f"expired-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 6)
    led_by = {p: cluster.leader(topic, p) for p in range(6)}
    slow, value = led_by[0], b"v" * 60
    async with Producer(cluster.bootstrap_servers, linger_ms=0, batch_size=16,
                        partitioner_availability_timeout_ms=200, request_timeout_ms=800,
                        delivery_timeout_ms=1200, retry_backoff_ms=50) as producer:
        await asyncio.wait_for(producer.send(topic, value), 10)
        cluster.slow(slow, 30)
        loop = asyncio.get_running_loop()
        sent, was_unavailable = [], False
        end = loop.time() + 5  # (the mark comes ~0.2 s in; later on a loaded machine)
        while not was_unavailable and loop.time() < end and len(sent) < 500:
            sent.append(producer.send(topic, value))
            await asyncio.sleep(0.01)
            was_unavailable = producer._sender.node_unavailable(slow)
        results = await asyncio.wait_for(asyncio.gather(*sent, return_exceptions=True), 20)
        cluster.slow(slow, 0)
        assert was_unavailable
        assert any(isinstance(r, TimeoutError) for r in results), "nothing expired"
        deadline = loop.time() + 5  # (the round after the last expiry clears it)
        while producer._sender.node_unavailable(slow) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert not producer._sender.node_unavailable(slow)
        again = await asyncio.wait_for(asyncio.gather(
            *[producer.send(topic, value) for _ in range(60)]), 10)
    assert any(led_by[md.partition] == slow for md in again), \
        "the node got no keyless records after its batches expired"


def _partitioner(queued=lambda topic, p: 0, unavailable=lambda node: False,
                 adaptive=True) -> StickyPartitioner:
    return StickyPartitioner(1000, adaptive, queued, lambda topic, p: 0, unavailable)


def test_adaptive_choice_favours_partitions_with_fewer_batches_waiting():
    """Partition 0's broker is slow: 9 batches wait there, none elsewhere. The weights
    (most + 1 - waiting) make it 1 in 28 as likely as the others are each, not 1 in 3."""
    random.seed(7)
    queued = {0: 9, 1: 0, 2: 0, 3: 0}
    partitioner = _partitioner(lambda topic, p: queued[p])
    leaders = (1, 2, 3, 4)
    chosen = [partitioner.on_new_batch("t", leaders, partitioner.partition("t", leaders), True)
              for _ in range(3000)]
    share_0 = chosen.count(0) / len(chosen)
    assert share_0 < 0.08, share_0
    plain = _partitioner(lambda topic, p: queued[p], adaptive=False)
    chosen = [plain.on_new_batch("t", leaders, plain.partition("t", leaders), True)
              for _ in range(3000)]
    assert chosen.count(0) / len(chosen) > 0.2


def test_an_unavailable_broker_gets_no_keyless_records():
    random.seed(3)
    partitioner = _partitioner(unavailable=lambda node: node == 2)
    leaders = (1, 2, 1, 2)  # partitions 1 and 3 led by the unavailable broker
    chosen = {partitioner.on_new_batch("t", leaders, partitioner.partition("t", leaders), True)
              for _ in range(500)}
    assert chosen == {0, 2}
    everyone_down = _partitioner(unavailable=lambda node: True)
    chosen = {everyone_down.on_new_batch("t", leaders, everyone_down.partition("t", leaders),
                                         True) for _ in range(500)}
    assert chosen == {0, 1, 2, 3}  # then any partition with a leader, rather than none
