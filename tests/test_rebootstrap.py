"""Rebootstrap (KIP-899, KIP-1102): when the brokers the producer knows stop serving it, it
goes back to bootstrap_servers, and on to whatever cluster they lead to now, if it is the same
cluster (by id). Through two simulated clusters in front of one real broker: the "old" one the
producer learns first, and the "new" one the bootstrap address (a FaultProxy) leads to later,
so every record lands in one log whichever way it went, and is read back with librdkafka.

Apache Kafka 4.4 never answers Metadata with REBOOTSTRAP_REQUIRED (its KafkaApis uses the
error only for ApiVersions v5's cluster check, KIP-1242): the simulated cluster sends it on
command. The trigger on real Kafka: tests/real_kafka/test_rebootstrap.py."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict

import pytest

from aioproducer import Producer, ProducerConfig
from aioproducer.errors import ConfigError
from aioproducer.testing import SimulatedCluster
from tests.support.proxy import FaultProxy
from tests.support.readback import consume_all
from tests.support.simulated import require_embedded

PARTITIONS = 3


def port_of(cluster: SimulatedCluster, node_id: int = 1) -> int:
    return int(cluster.address(node_id).rpartition(":")[2])


@pytest.fixture
def clusters(broker):
    """(old, new, front): two simulated clusters of three nodes in front of the session's
    broker, and the bootstrap address, a proxy to the old cluster's node 1 until a test
    points it at the new one."""
    require_embedded(broker)
    with SimulatedCluster(3, upstream=broker, lifetime=120) as old, \
            SimulatedCluster(3, upstream=broker, lifetime=120) as new, \
            FaultProxy(port_of(old)) as front:
        yield old, new, front


def new_topic(broker) -> str:
    name = f"rb-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, PARTITIONS)
    return name


async def produce(producer: Producer, topic: str, numbers: range) -> list:
    """Enqueue keyed records (key: the partition's name, value: the number), in order."""
    return [await producer.enqueue(topic, b"%d" % n, key=b"k%d" % (n % PARTITIONS),
                                   partition=n % PARTITIONS) for n in numbers]


def assert_once_in_order(broker, topic: str, count: int) -> None:
    """Every record 0..count-1 is in the log once, each partition's in the order sent."""
    got = consume_all(broker.bootstrap, topic, expected=count)
    by_partition: dict[int, list[int]] = defaultdict(list)
    for record in got:
        by_partition[record.partition].append(int(record.value))
    for partition, numbers in by_partition.items():
        assert numbers == sorted(numbers), f"partition {partition} out of order: {numbers}"
    assert sorted(n for numbers in by_partition.values() for n in numbers) == \
        list(range(count)), f"{len(got)} records read back for {count} sent"


async def until(condition, timeout: float = 5) -> None:
    """Wait (at most `timeout` s) for `condition()`; the test's assertions say if it came."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)


def rebootstrap_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "rebootstrapping" in r.getMessage()]


async def test_a_broker_asking_for_it_sends_the_producer_back_to_bootstrap(broker, clusters,
                                                                           caplog):
    """KIP-1102: a Metadata answer (v13) with REBOOTSTRAP_REQUIRED makes the producer forget
    the brokers it knows, though they still answer, and take what bootstrap_servers lead to
    now. Records go on to the new cluster's nodes, none lost, none twice, in order."""
    old, new, front = clusters
    topic = new_topic(broker)
    caplog.set_level(logging.WARNING, logger="aioproducer")
    async with Producer(f"127.0.0.1:{front.port}", metadata_max_age_ms=200,
                        linger_ms=2) as producer:
        await asyncio.gather(*await produce(producer, topic, range(60)))
        front.upstream_port = port_of(new, 2)
        old.require_rebootstrap()
        pending = await produce(producer, topic, range(60, 300))
        await asyncio.wait_for(asyncio.gather(*pending), 10)
        await until(lambda: old.stats.rebootstraps_required == 1)  # (a refresh: 200 ms)
        moved = new.stats.produce_requests
        await asyncio.gather(*await produce(producer, topic, range(300, 360)))
        metrics = producer.metrics()
    assert old.stats.rebootstraps_required == 1
    assert new.stats.produce_requests > moved, "records still go to the old cluster"
    assert metrics.rebootstraps == 1
    assert any("REBOOTSTRAP_REQUIRED" in line for line in rebootstrap_lines(caplog)), \
        caplog.text
    assert_once_in_order(broker, topic, 360)


async def test_brokers_that_stop_answering_are_left_after_the_trigger(broker, clusters,
                                                                      caplog):
    """KIP-1102's trigger: the known brokers still take connections but answer nothing (a
    request would wait request_timeout_ms, a reconnect socket_connection_setup_timeout_ms,
    for each of them), while the bootstrap address leads to live brokers. After
    metadata_recovery_rebootstrap_trigger_ms without metadata the producer goes back to
    bootstrap_servers: the records held by the silent brokers are sent again there, in
    order, once."""
    old, new, front = clusters
    topic = new_topic(broker)
    caplog.set_level(logging.WARNING, logger="aioproducer")
    async with Producer(f"127.0.0.1:{front.port}", metadata_max_age_ms=200, linger_ms=2,
                        metadata_recovery_rebootstrap_trigger_ms=1000) as producer:
        await asyncio.gather(*await produce(producer, topic, range(60)))
        for node_id in old.node_ids:
            old.slow(node_id, 3600)
        front.upstream_port = port_of(new)
        pending = await produce(producer, topic, range(60, 300))
        # Well within request_timeout_ms (30 s) and socket_connection_setup_timeout_ms (10 s):
        # without the trigger nothing is acknowledged in this time.
        await asyncio.wait_for(asyncio.gather(*pending), 8)
        metrics = producer.metrics()
    assert metrics.rebootstraps == 1
    lines = rebootstrap_lines(caplog)
    assert len(lines) == 1 and "no broker has given metadata for" in lines[0], lines
    assert f"127.0.0.1:{front.port}" in lines[0]
    assert_once_in_order(broker, topic, 300)


async def test_a_rebootstrap_into_another_cluster_is_refused(broker, clusters, caplog):
    """The bootstrap address now leads to a cluster with another id: the producer
    rebootstraps, refuses its metadata (no record goes to it), and waits; once the address
    leads to our cluster again, the records held go there."""
    old, new, front = clusters
    topic = new_topic(broker)
    caplog.set_level(logging.WARNING, logger="aioproducer")
    with SimulatedCluster(3, upstream=broker, lifetime=120, cluster_id="someone-else") as other:
        async with Producer(f"127.0.0.1:{front.port}", metadata_max_age_ms=200, linger_ms=2,
                            metadata_recovery_rebootstrap_trigger_ms=1000) as producer:
            await asyncio.gather(*await produce(producer, topic, range(30)))
            for node_id in old.node_ids:
                old.slow(node_id, 3600)
            front.upstream_port = port_of(other)
            front.cut_all()
            pending = asyncio.gather(*await produce(producer, topic, range(30, 90)))
            await until(lambda: "'someone-else', not 'tansu_cluster'" in caplog.text, 8)
            assert "'someone-else', not 'tansu_cluster'" in caplog.text, caplog.text
            assert not pending.done()
            front.upstream_port = port_of(new)
            front.cut_all()
            await asyncio.wait_for(pending, 10)
            rebootstraps = producer.metrics().rebootstraps
    assert other.stats.produce_requests == 0
    assert rebootstraps >= 1
    assert_once_in_order(broker, topic, 90)


async def test_with_the_none_strategy_the_producer_stays_with_the_brokers_it_knows(
        broker, clusters, caplog):
    """metadata_recovery_strategy="none" (KIP-899): a request to rebootstrap is logged and
    not followed; the producer keeps to the brokers metadata named."""
    old, new, front = clusters
    topic = new_topic(broker)
    caplog.set_level(logging.WARNING, logger="aioproducer")
    async with Producer(f"127.0.0.1:{front.port}", metadata_max_age_ms=200, linger_ms=2,
                        metadata_recovery_strategy="none") as producer:
        await asyncio.gather(*await produce(producer, topic, range(30)))
        front.upstream_port = port_of(new)
        old.require_rebootstrap()
        await until(lambda: old.stats.rebootstraps_required == 1)
        await asyncio.gather(*await produce(producer, topic, range(30, 90)))
        metrics = producer.metrics()
    assert old.stats.rebootstraps_required == 1
    assert new.stats.connections == 0 and metrics.rebootstraps == 0
    assert "metadata_recovery_strategy='none'" in caplog.text
    assert_once_in_order(broker, topic, 90)


@pytest.mark.parametrize("settings, message", [
    ({"metadata_recovery_strategy": "sometimes"},
     "metadata_recovery_strategy must be one of rebootstrap, none, not 'sometimes'"),
    ({"metadata_recovery_strategy": None}, "metadata_recovery_strategy must be one of"),
    ({"metadata_recovery_rebootstrap_trigger_ms": 0},
     "metadata_recovery_rebootstrap_trigger_ms must be between 1 and"),
    ({"metadata_recovery_rebootstrap_trigger_ms": "5000"},
     "metadata_recovery_rebootstrap_trigger_ms must be an int"),
    ({"metadata_cluster_check_enable": "no"},
     "metadata_cluster_check_enable must be True or False"),
])
def test_bad_recovery_settings_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        ProducerConfig.from_kwargs(bootstrap_servers="localhost:9092", **settings)


def test_recovery_settings_from_properties():
    config = ProducerConfig.from_properties({
        "bootstrap.servers": "localhost:9092", "metadata.recovery.strategy": "NONE",
        "metadata.recovery.rebootstrap.trigger.ms": "60000",
        "metadata.cluster.check.enable": "false"})
    assert config.metadata_recovery_strategy == "none"
    assert config.metadata_recovery_rebootstrap_trigger_ms == 60000
    assert config.metadata_cluster_check_enable is False
    defaults = ProducerConfig.from_kwargs(bootstrap_servers="localhost:9092")
    assert (defaults.metadata_recovery_strategy, defaults.metadata_recovery_rebootstrap_trigger_ms,
            defaults.metadata_cluster_check_enable) == ("rebootstrap", 300000, True)


async def test_a_broker_advertising_an_unreachable_address_is_named_once(caplog):
    """The first Kafka a newcomer runs (a broker in a container advertising the container's
    name): bootstrap_servers answers, the address the broker advertises does not. The
    producer rebootstrapped several times a second with a WARNING each (about 40 lines in
    8 s), each saying "Is a Kafka broker running there? (check bootstrap_servers)" of an
    address bootstrap_servers does not hold. One WARNING (per 10 s) now, naming the
    broker's advertised address as the place to look; the record fails in its time."""
    from aioproducer.errors import DeliveryTimeoutError
    from aioproducer.testing import EmbeddedBroker
    from tests.support.ports import free_port

    caplog.set_level(logging.DEBUG, logger="aioproducer")
    with EmbeddedBroker(advertised_port=free_port()) as broker:  # (advertises a dead port)
        async with Producer(f"127.0.0.1:{broker.port}", linger_ms=0, request_timeout_ms=1000,
                            delivery_timeout_ms=3000) as producer:
            with pytest.raises(DeliveryTimeoutError):
                await asyncio.wait_for(producer.send("advertised", b"lost"), 10)
            assert producer.metrics().rebootstraps > 1
            await producer.close(timeout=0)
    lines = rebootstrap_lines(caplog)
    assert len(lines) == 1, lines
    assert f"cannot connect to 127.0.0.1:{broker.advertised_port}" in lines[0]
    assert "It is where broker 111 says it is (its advertised.listeners)" in lines[0], lines[0]
    assert "check bootstrap_servers" not in lines[0]
    # (a single Kafka node restarting, a developer's daily case, gets this line too: on Kafka
    # 4.4 it said only to check the advertised address, the bootstrap address itself)
    assert lines[0].endswith("is the broker up, and that address reachable from here?"), lines[0]


async def test_a_broker_advertising_an_unreachable_address_is_asked_at_a_backing_off_pace(
        monkeypatch):
    """Against a broker advertising an address the client cannot reach, the producer goes
    back to bootstrap_servers each time the advertised one fails to connect. Each
    rebootstrap started the broker's reconnect backoff afresh, and it asked the bootstrap
    broker for metadata ~5 times a second for as long as a record waited. The backoff now
    keeps growing (to reconnect_backoff_max_ms, 1 s by default) across rebootstraps."""
    from aioproducer.errors import DeliveryTimeoutError
    from aioproducer.protocol.messages import ApiKey
    from aioproducer.testing import EmbeddedBroker
    from tests.support.leadership import WireLog
    from tests.support.ports import free_port

    wire = WireLog().install(monkeypatch)
    with EmbeddedBroker(advertised_port=free_port()) as broker:  # (advertises a dead port)
        async with Producer(f"127.0.0.1:{broker.port}", linger_ms=0, request_timeout_ms=1000,
                            delivery_timeout_ms=9000) as producer:
            sending = asyncio.ensure_future(producer.send("advertised", b"lost"))
            await asyncio.sleep(2)  # (the backoff grows to its cap: 50 ms doubled 5 times)
            counted_from = len(wire.events)
            await asyncio.sleep(5)
            window = wire.events[counted_from:]
            rebootstraps = producer.metrics().rebootstraps
            with pytest.raises(DeliveryTimeoutError):
                await asyncio.wait_for(sending, 10)
            await producer.close(timeout=0)
    asked = [e for e in window if e.out and e.api_key == ApiKey.METADATA]
    assert rebootstraps > 2
    assert len(asked) <= 8, f"{len(asked)} metadata requests in 5 s"
