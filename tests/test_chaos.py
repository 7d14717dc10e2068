"""A chaos run on a 3-node simulated cluster (aioproducer.testing.SimulatedCluster in front of
the embedded broker): partition leaders move every 300 ms, a node goes down and comes back,
nodes throttle at random and connections are cut, while an idempotent producer and a
transactional one write keyed, numbered records. Read back by librdkafka from the broker
itself: nothing acknowledged is lost, nothing is written twice, nothing is out of order,
and every future ends within delivery_timeout_ms, and no Produce is written to a node after
the producer read a throttled response from it, until that throttle ended (KIP-219, watched
on the client's connections: see tests/support/throttle_watch.py). The figures are printed
(`-s`) for the README and the issue's note."""

from __future__ import annotations

import asyncio
import collections
import uuid

import pytest

from aioproducer import Producer
from aioproducer.protocol.messages import ApiKey
from aioproducer.testing import SimulatedCluster
from aioproducer.client.connection import BrokerConnection
from tests.support.readback import consume_all
from tests.support.simulated import require_embedded
from tests.support.throttle_watch import ThrottleWatch

KEYS = 12
SETTINGS = dict(linger_ms=5, request_timeout_ms=2_000, delivery_timeout_ms=30_000,
                retry_backoff_ms=20, retry_backoff_max_ms=200, reconnect_backoff_max_ms=200)


@pytest.fixture
def throttle_watch(monkeypatch) -> ThrottleWatch:
    return ThrottleWatch().install(monkeypatch)


def _value(key: int, seq: int) -> bytes:
    return b"%02d:%07d:" % (key, seq) + b"x" * 60


def _check_exactly_once_in_order(broker, topic: str, sent: dict[int, int]) -> int:
    """Every key's numbers 0..sent[key]-1 once each, in order; returns the record count."""
    total = sum(sent.values())
    stored = consume_all(broker.bootstrap, topic, total, timeout=60)
    by_key: dict[int, list[int]] = collections.defaultdict(list)
    for record in stored:
        key, seq = record.value.split(b":")[:2]
        by_key[int(key)].append(int(seq))
    for key, count in sent.items():
        seqs = by_key[key]
        assert len(seqs) == len(set(seqs)), f"key {key}: duplicates"
        assert seqs == sorted(seqs), f"key {key}: out of order"
        assert seqs == list(range(count)), f"key {key}: lost {sorted(set(range(count)) - set(seqs))[:10]}"
    assert len(stored) == total
    return total


async def _produce_through(chaos, producer: Producer, topic: str, batch: int,
                           transactional: bool) -> tuple[dict[int, int], int]:
    """Write numbered records per key while the chaos runs (at most 60 s); in transactions
    of `batch` records when `transactional`. Returns the records per key and the failures."""
    sent = {key: 0 for key in range(KEYS)}
    futures = []
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 60
    while chaos.running and loop.time() < give_up:
        if transactional:
            async with producer.transaction():
                for i in range(batch):
                    key = i % KEYS
                    await producer.enqueue(topic, _value(key, sent[key]), key=b"%d" % key)
                    sent[key] += 1
        else:
            for i in range(batch):
                key = i % KEYS
                futures.append(await producer.enqueue(topic, _value(key, sent[key]),
                                                      key=b"%d" % key))
                sent[key] += 1
        await asyncio.sleep(0.02)
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 45)
    return sent, sum(isinstance(r, BaseException) for r in results)


async def test_idempotent_producer_through_chaos(cluster, broker, throttle_watch):
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 6)
    async with Producer(cluster.bootstrap_servers, **SETTINGS) as producer:
        with cluster.chaos(seed=26, duration=6.0, move_every=0.3, down_every=2.5,
                           down_for=0.6, throttle_chance=0.1, throttle_ms=(20, 200),
                           cut_chance=0.05) as chaos:
            sent, failed = await _produce_through(chaos, producer, topic, 240, False)
        metrics = producer.metrics()
    assert failed == 0
    total = _check_exactly_once_in_order(broker, topic, sent)
    stats = cluster.stats
    print(f"\nidempotent chaos: {total} records, {stats.leader_moves} leader moves, "
          f"{stats.node_stops} node stops, {stats.cuts} cuts, {stats.throttled_responses} "
          f"throttled responses, {stats.not_leader} NOT_LEADER answers; producer: "
          f"{metrics.retries} retries, {metrics.leader_redirects} redirects, "
          f"{metrics.produce_throttle_time_ms} ms throttled, {throttle_watch.throttles_read} "
          f"throttled responses read, {stats.requests_while_throttled} requests reached a "
          "muted node (pipelined before the client read its throttle)")
    assert stats.leader_moves >= 10 and stats.node_stops >= 1
    # The node counts requests that crossed its throttled response on the wire too
    # (requests_while_throttled): what matters is what the client wrote after reading it.
    assert throttle_watch.throttles_read >= 1
    assert throttle_watch.violations == []


async def test_transactional_producer_through_chaos(cluster, broker, throttle_watch):
    topic = f"chaos-tx-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 6)
    async with Producer(cluster.bootstrap_servers, transactional_id=f"chaos-{uuid.uuid4()}",
                        **SETTINGS) as producer:
        with cluster.chaos(seed=27, duration=5.0, move_every=0.3, down_every=2.0,
                           down_for=0.5, throttle_chance=0.1, throttle_ms=(20, 200),
                           cut_chance=0.05) as chaos:
            sent, _ = await _produce_through(chaos, producer, topic, 120, True)
    total = _check_exactly_once_in_order(broker, topic, sent)
    stats = cluster.stats
    print(f"\ntransactional chaos: {total} records in {total // 120} transactions, "
          f"{stats.leader_moves} leader moves, {stats.node_stops} node stops, {stats.cuts} "
          f"cuts, {stats.throttled_responses} throttled responses, "
          f"{throttle_watch.throttles_read} read")
    assert stats.leader_moves >= 8
    assert throttle_watch.violations == []


async def test_the_throttle_watch_catches_a_producer_that_ignores_throttles(
        cluster, monkeypatch, throttle_watch):
    """The watch the chaos runs rely on can fail: with the connection's KIP-219 pause
    switched off, the record after a throttled response is written at once, within the
    throttle, and the watch says so. The producer as it is waits the throttle out instead."""
    topic = f"watched-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1)
    cluster.throttle(cluster.leader(topic, 0), 400)
    loop = asyncio.get_running_loop()

    async def three_records() -> float:
        async with Producer(cluster.bootstrap_servers, linger_ms=0) as producer:
            await producer.send(topic, b"first")  # its response carries the throttle
            started = loop.time()
            for value in (b"second", b"third"):
                await asyncio.wait_for(producer.send(topic, value), 10)
            return loop.time() - started

    took = await three_records()
    assert throttle_watch.throttles_read >= 2 and throttle_watch.violations == []
    assert took >= 0.8, f"two records through two 400 ms throttles took {took:.3f} s"

    monkeypatch.setattr(BrokerConnection, "_note_throttle", lambda self, body: None)
    await three_records()
    assert len(throttle_watch.violations) >= 2, throttle_watch.violations


async def test_a_throttle_holds_every_request_to_that_broker(broker, throttle_watch):
    """KIP-219 as the Java client keeps it: after a throttled response, nothing is sent to
    that broker until the throttle ends, not only Produce. A metadata lookup (a topic the
    producer has not seen) asked during the throttle is written once it ended: the muted node
    reads no request meanwhile (before, the lookup was written at once and waited, unread, in
    the node's socket)."""
    require_embedded(broker)
    with SimulatedCluster(nodes=1, upstream=broker, lifetime=60) as cluster:
        seen, unseen = (f"held-{uuid.uuid4().hex[:8]}" for _ in range(2))
        cluster.create_topic(seen, 1)
        node = cluster.leader(seen, 0)
        loop = asyncio.get_running_loop()
        async with Producer(cluster.bootstrap_servers, linger_ms=0) as producer:
            await asyncio.wait_for(producer.send(seen, b"before"), 10)
            cluster.create_topic(unseen, 2)  # after the producer's metadata: it must ask
            cluster.throttle(node, 600)
            await asyncio.wait_for(producer.send(seen, b"throttled"), 10)
            cluster.throttle(node, 0)
            metadata_before = throttle_watch.written.get(ApiKey.METADATA, 0)
            started = loop.time()
            partitions = await asyncio.wait_for(producer.partitions_for(unseen), 10)
            waited = loop.time() - started
    assert partitions == {0, 1}
    assert throttle_watch.throttles_read == 1
    assert throttle_watch.written.get(ApiKey.METADATA, 0) > metadata_before
    assert throttle_watch.violations == []
    assert cluster.stats.requests_while_throttled == 0
    assert waited >= 0.3, f"the lookup took {waited:.3f} s: it did not wait out the throttle"
