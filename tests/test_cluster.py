"""The simulated cluster (aioproducer.testing.SimulatedCluster) checked against clients we did
not write: librdkafka (confluent-kafka) produces and consumes through it, and kafka-python's
protocol classes (generated from Apache Kafka's JSON schemas) decode its rewritten answers.
Then the current aioproducer Producer against it: what a user's test of their own code sees."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import threading
import time
import traceback
import uuid

import pytest
import trustme
from confluent_kafka import KafkaError as KafkaErrorCode
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from aioproducer import Producer
from aioproducer.client.connection import BrokerConnection
from aioproducer.errors import AuthenticationError, ConfigError, KafkaError
from aioproducer.protocol.sasl import Scram
from aioproducer.testing import (EmbeddedBrokerError, Listener, Principal, SaslFailure,
                                 SimulatedCluster, unsecured_jwt)
from aioproducer.testing.cluster import SASL_MECHANISMS
from tests.support.proxy import FaultProxy
from tests.support.raw import RawConnection, call, record_batch
from tests.support.readback import consume_all, created_with
from tests.support.simulated import require_embedded

NOT_LEADER_OR_FOLLOWER = 6
LEADER_NOT_AVAILABLE = 5


def new_topic(cluster: SimulatedCluster, partitions: int) -> str:
    name = f"c-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, partitions)
    created_with(name, partitions)
    return name


def librdkafka_produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]],
                       settings: dict | None = None, during=None, until=None) -> list:
    """Produce keyed records with librdkafka (idempotent, acks=all); `during(i)` runs after
    the i-th record is handed over; once all are delivered, librdkafka's callbacks are
    served until `until()` is true (10 s at most). Returns the delivery errors (None:
    delivered)."""
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                              "linger.ms": 5, "message.timeout.ms": 30000, **(settings or {})})
    outcomes: list = []
    for i, (key, value) in enumerate(records):
        producer.produce(topic, value, key, on_delivery=lambda err, _: outcomes.append(err))
        producer.poll(0)
        if during is not None:
            during(i)
    assert producer.flush(40) == 0, "librdkafka could not deliver everything in 40 s"
    for _ in range(100):
        if until is None or until():
            break
        producer.poll(0.1)
    else:
        raise AssertionError("librdkafka's callbacks did not come in 10 s")
    return outcomes


def by_key(records) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        out.setdefault(record.key, []).append(record.value)
    return out


def keyed(n: int, keys: int = 12, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(b"key-%d" % (i % keys), b"value-%d" % i) for i in range(start, start + n)]


# -- what clients are told -----------------------------------------------------------------

def test_librdkafka_sees_three_nodes_leading_the_partitions_between_them(cluster):
    topic = new_topic(cluster, 6)
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(
        topic, timeout=10)
    addresses = {f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    assert sorted(metadata.brokers) == [1, 2, 3]
    assert addresses == set(cluster.bootstrap_servers.split(","))
    partitions = metadata.topics[topic].partitions
    assert {p.leader for p in partitions.values()} == {1, 2, 3}
    for index, p in partitions.items():
        assert p.leader == cluster.leader(topic, index)
        assert sorted(p.replicas) == [1, 2, 3] and sorted(p.isrs) == [1, 2, 3]


def test_metadata_and_coordinators_decode_with_kafka_python(cluster):
    topic = new_topic(cluster, 3)
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                              allow_auto_topic_creation=False)
    for version in (1, 7, 9, 12):
        response = call(cluster.address(2), request, version)
        assert [b.node_id for b in response.brokers] == [1, 2, 3]
        assert response.controller_id == 1
        [entry] = response.topics
        assert [(p.partition_index, p.leader_id) for p in entry.partitions] == \
            [(i, cluster.leader(topic, i)) for i in range(3)]
    # Coordinators are spread by key, each on a node of the cluster.
    keys = [f"group-{i}" for i in range(12)]
    response = call(cluster.address(1), FindCoordinatorRequest(key_type=0, coordinator_keys=keys), 4)
    nodes = {c.key: (c.node_id, f"{c.host}:{c.port}") for c in response.coordinators}
    assert {node for node, _ in nodes.values()} == {1, 2, 3}
    assert all(address == cluster.address(node) for node, address in nodes.values())
    old = call(cluster.address(3), FindCoordinatorRequest(key="group-0", key_type=0), 2)
    assert (old.error_code, old.node_id) == (0, nodes["group-0"][0])


def test_racks_show_in_metadata(broker):
    require_embedded(broker)
    with SimulatedCluster(nodes=2, upstream=broker, racks=["az-a", "az-b"]) as cluster:
        request = MetadataRequest(topics=[], allow_auto_topic_creation=False)
        brokers = call(cluster.address(1), request, 12).brokers
    assert [(b.node_id, b.rack) for b in brokers] == [(1, "az-a"), (2, "az-b")]


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_a_node_answers_for_partitions_it_does_not_lead_as_kip_951_says(cluster, version):
    """One Produce to node N for a partition N leads and one it does not: the first is
    written, the second answered NOT_LEADER_OR_FOLLOWER, from v10 on with the leader's id,
    epoch and address (decoded by kafka-python)."""
    topic = new_topic(cluster, 3)
    node = cluster.leader(topic, 0)
    other = next(i for i in range(3) if cluster.leader(topic, i) != node)
    led_by = cluster.leader(topic, other)
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
        data(name=topic, partition_data=[
            data.PartitionProduceData(index=other, records=record_batch(b"refused")),
            data.PartitionProduceData(index=0, records=record_batch(b"kept", b"too"))])])
    response = call(cluster.address(node), request, version)
    [entry] = response.responses
    refused, kept = entry.partition_responses
    assert (refused.index, refused.error_code) == (other, NOT_LEADER_OR_FOLLOWER)
    assert (kept.index, kept.error_code, kept.base_offset) == (0, 0, 0)
    if version >= 10:
        assert (refused.current_leader.leader_id, refused.current_leader.leader_epoch) == \
            (led_by, 0)
        assert [(e.node_id, f"{e.host}:{e.port}") for e in response.node_endpoints] == \
            [(led_by, cluster.address(led_by))]
    records = consume_all(cluster.bootstrap_servers, topic, 2)
    assert [(r.partition, r.value) for r in records] == [(0, b"kept"), (0, b"too")]
    assert cluster.stats.not_leader == 1


# -- producing through it ------------------------------------------------------------------

def test_librdkafka_produces_through_the_cluster_intact_and_in_order(cluster):
    topic = new_topic(cluster, 6)
    records = keyed(600)
    assert librdkafka_produce(cluster.bootstrap_servers, topic, records) == [None] * 600
    stored = consume_all(cluster.bootstrap_servers, topic, 600)
    assert len(stored) == 600
    assert by_key(stored) == by_key_expected(records)
    assert cluster.stats.not_leader == 0  # it sent each batch to its partition's leader


def by_key_expected(records: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for key, value in records:
        out.setdefault(key, []).append(value)
    return out


async def test_aioproducer_produces_through_the_cluster(cluster):
    topic = new_topic(cluster, 6)
    async with Producer(cluster.bootstrap_servers, linger_ms=2) as producer:
        sent = await asyncio.gather(*(producer.send(topic, value, key=key, partition=i % 6)
                                      for i, (key, value) in enumerate(keyed(300, keys=6))))
    assert [md.partition for md in sent] == [i % 6 for i in range(300)]
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 300)
    assert by_key(stored) == by_key_expected(keyed(300, keys=6))
    assert cluster.stats.not_leader == 0


async def test_aioproducer_transaction_through_its_coordinator_node(cluster):
    """FindCoordinator sends the transactional producer to one node (by a hash of its id);
    the transaction's records, spread over three leaders, commit."""
    topic = new_topic(cluster, 3)
    async with Producer(cluster.bootstrap_servers, transactional_id=f"tx-{topic}") as producer:
        async with producer.transaction():
            for i in range(9):
                await producer.enqueue(topic, b"tx-%d" % i, partition=i % 3)
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 9,
                                     isolation_level="read_committed")
    assert sorted(r.value for r in stored) == sorted(b"tx-%d" % i for i in range(9))
    assert cluster.stats.not_leader == 0


# -- leaders that move ---------------------------------------------------------------------

def test_a_moved_leader_sends_librdkafka_to_the_new_one_and_nothing_is_lost(cluster):
    topic = new_topic(cluster, 3)
    records = keyed(900, keys=9)
    moved: list[tuple[int, int]] = []

    produced = [0]  # produce requests the nodes had read at the last move

    def move(i: int) -> None:
        if i in (150, 450, 750):
            # Each move waits for librdkafka to have produced since the last one (so it
            # knows the leaders that move): on a loaded machine its first Metadata can come
            # after all three moves, made 50 ms apart ("librdkafka never met a moved leader"
            # whenever the nodes answered 0.3 s late).
            deadline = time.monotonic() + 30
            while cluster.stats.produce_requests == produced[0]:
                assert time.monotonic() < deadline, "librdkafka produced nothing in 30 s"
                time.sleep(0.01)
            produced[0] = cluster.stats.produce_requests
            for partition in range(3):
                before = cluster.leader(topic, partition)
                after = cluster.move_leader(topic, partition)
                assert after != before
                moved.append((partition, cluster.leader_epoch(topic, partition)))
            time.sleep(0.05)

    errors = librdkafka_produce(cluster.bootstrap_servers, topic, records, during=move)
    assert errors == [None] * 900
    assert cluster.stats.not_leader > 0, "librdkafka never met a moved leader"
    assert cluster.stats.leader_moves == 9
    assert [epoch for _, epoch in moved[-3:]] == [3, 3, 3]
    stored = consume_all(cluster.bootstrap_servers, topic, 900)
    assert len(stored) == 900  # once each
    assert by_key(stored) == by_key_expected(records)


async def test_aioproducer_follows_a_moved_leader(cluster):
    topic = new_topic(cluster, 2)
    async with Producer(cluster.bootstrap_servers, linger_ms=1) as producer:
        first = [await producer.send(topic, b"before-%d" % i, partition=i % 2)
                 for i in range(10)]
        for partition in range(2):
            cluster.move_leader(topic, partition)
        second = [await producer.send(topic, b"after-%d" % i, partition=i % 2)
                  for i in range(10)]
    assert [md.partition for md in first + second] == [i % 2 for i in range(20)]
    assert cluster.stats.not_leader >= 1  # it went to the old leader first
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 20)
    for partition in range(2):
        assert [r.value for r in stored if r.partition == partition] == \
            [b"before-%d" % i for i in range(partition, 10, 2)] + \
            [b"after-%d" % i for i in range(partition, 10, 2)]


async def test_one_connection_per_node_while_leaders_move(cluster):
    """Keyed records to 6 partitions while a partition's leader moves every 150 ms: the
    producer keeps one connection per node, never more (the nodes accepted 3 in all: the
    bootstrap connection became its node's), each request drained for the node that leads
    its partitions now (refusals sent on to the new leader); every record arrives once, in
    order per key."""
    topic = new_topic(cluster, 6)
    keys, sent, futures, seen = 12, 0, [], set()

    async def move_leaders() -> None:
        # This topic's partitions, in turn (chaos() picks among every partition the cluster
        # has seen, which in a full test session are mostly other tests' topics).
        for move in range(16):
            await asyncio.sleep(0.15)
            await asyncio.to_thread(cluster.move_leader, topic, move % 6)

    async with Producer(cluster.bootstrap_servers, linger_ms=5, retry_backoff_ms=20,
                        retry_backoff_max_ms=200) as producer:
        mover = asyncio.create_task(move_leaders())
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 20
        while not mover.done() and loop.time() < give_up:
            for _ in range(120):
                futures.append(await producer.enqueue(
                    topic, b"%06d" % sent, key=b"k%02d" % (sent % keys)))
                sent += 1
            seen.add(producer.metrics().connections)
            await asyncio.sleep(0.02)
        await mover
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        metrics = producer.metrics()
    stats = cluster.stats
    print(f"\n{sent} records through {stats.leader_moves} moves: {stats.not_leader} refused, "
          f"{metrics.leader_redirects} redirected; connections seen {sorted(seen)}")
    assert stats.leader_moves >= 10 and stats.not_leader >= 1
    assert metrics.connections == 3 and max(seen) == 3
    assert stats.connections == 3, f"the nodes accepted {stats.connections} connections"
    assert 1 <= metrics.leader_redirects <= stats.not_leader
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, sent)
    assert len(stored) == sent
    values_by_key: dict[bytes, list[bytes]] = {}
    for record in sorted(stored, key=lambda r: (r.partition, r.offset)):
        values_by_key.setdefault(record.key, []).append(record.value)
    for key, values in values_by_key.items():
        assert values == sorted(values), f"{key!r} out of order"
    assert sum(map(len, values_by_key.values())) == sent


# -- nodes that go down --------------------------------------------------------------------

async def test_every_known_node_down_sends_the_producer_back_to_its_bootstrap_address(cluster):
    """Rebootstrap: the producer's bootstrap address is a proxy to node 1, which metadata
    never names. Every node goes down and the proxy refuses: once all the nodes it knows
    fail, the producer forgets them and knocks at the bootstrap address again (the proxy
    counts the refusals). Node 1 comes back and so does the bootstrap address: through it
    the producer learns the cluster anew (the proxy's connection), and the records sent
    before and during the outage all arrive, once, in order per key."""
    topic = new_topic(cluster, 3)
    node_1 = int(cluster.address(1).rsplit(":", 1)[1])
    with FaultProxy(node_1) as bootstrap:
        async with Producer(f"127.0.0.1:{bootstrap.port}", linger_ms=0,
                            reconnect_backoff_max_ms=200, retry_backoff_ms=20,
                            retry_backoff_max_ms=200, delivery_timeout_ms=60_000) as producer:
            before = [await asyncio.wait_for(producer.send(topic, b"before-%d" % i,
                                                           key=b"k%d" % (i % 3)), 10)
                      for i in range(6)]
            accepted = bootstrap.connections_accepted
            assert accepted == 1 and bootstrap.connections_refused == 0
            bootstrap.refuse(True)
            for node in cluster.node_ids:
                cluster.stop_node(node)
            during = [producer.send(topic, b"during-%d" % i, key=b"k%d" % (i % 3))
                      for i in range(6)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while bootstrap.connections_refused == 0 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert bootstrap.connections_refused >= 1, \
                "the producer never went back to its bootstrap address"
            assert not any(f.done() for f in during)
            cluster.start_node(1)
            bootstrap.heal()
            delivered = await asyncio.wait_for(asyncio.gather(*during), 20)
            assert bootstrap.connections_accepted > accepted
            assert {md.partition for md in before + delivered} <= {0, 1, 2}
            assert producer.metrics().connections == 1  # node 1, the only one up
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 12)
    assert by_key(stored) == {
        b"k%d" % k: [b"before-%d" % i for i in range(k, 6, 3)] +
        [b"during-%d" % i for i in range(k, 6, 3)] for k in range(3)}

def refuses(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), 2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_stopped_node_refuses_and_its_partitions_get_new_leaders(cluster):
    topic = new_topic(cluster, 6)
    led_by_2 = [p for p in range(6) if cluster.leader(topic, p) == 2]
    assert led_by_2
    cluster.stop_node(2)
    assert refuses(cluster.address(2))
    assert all(cluster.leader(topic, p) in (1, 3) for p in range(6))
    metadata = AdminClient({"bootstrap.servers": cluster.address(1)}).list_topics(topic, timeout=10)
    assert sorted(metadata.brokers) == [1, 3]
    for p in led_by_2:
        assert 2 not in metadata.topics[topic].partitions[p].isrs
    records = keyed(120)
    assert librdkafka_produce(cluster.address(1), topic, records) == [None] * 120
    cluster.start_node(2)
    assert not refuses(cluster.address(2))
    metadata = AdminClient({"bootstrap.servers": cluster.address(2)}).list_topics(topic, timeout=10)
    assert sorted(metadata.brokers) == [1, 2, 3]
    assert by_key(consume_all(cluster.bootstrap_servers, topic, 120)) == by_key_expected(records)


async def test_a_partition_without_leader_waits_for_its_node_to_come_back(cluster):
    """stop_node(reelect=False): Metadata says LEADER_NOT_AVAILABLE; the send waits, and
    lands once the node is back."""
    topic = new_topic(cluster, 1)
    leader = cluster.leader(topic, 0)
    cluster.stop_node(leader, reelect=False)
    assert cluster.leader(topic, 0) == -1
    other = next(n for n in cluster.node_ids if n != leader)
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                              allow_auto_topic_creation=False)
    [entry] = call(cluster.address(other), request, 9).topics
    assert [(p.error_code, p.leader_id) for p in entry.partitions] == [(LEADER_NOT_AVAILABLE, -1)]
    async with Producer(cluster.address(other), delivery_timeout_ms=20000,
                        request_timeout_ms=5000) as producer:
        sending = asyncio.ensure_future(producer.send(topic, b"patient"))
        await asyncio.sleep(0.5)
        assert not sending.done()
        await asyncio.to_thread(cluster.start_node, leader)
        md = await asyncio.wait_for(sending, 20)
    assert (md.partition, cluster.leader(topic, 0)) == (0, leader)
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 1)
    assert [r.value for r in stored] == [b"patient"]


# -- throttling, slowness, errors, cuts ----------------------------------------------------

def test_a_throttled_node_says_so_and_mutes_the_connection(cluster):
    """KIP-219: the response carries throttle_time_ms (decoded by kafka-python), and a request
    the client sends before the throttle ends is not read until then, and counted."""
    topic = new_topic(cluster, 1)
    leader = cluster.leader(topic, 0)
    cluster.throttle(leader, 1500)
    data = ProduceRequest.TopicProduceData

    def produce(value: bytes):
        return ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
            data(name=topic, partition_data=[
                data.PartitionProduceData(index=0, records=record_batch(value))])])

    host, port = cluster.address(leader).rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as sock:
        for i, value in enumerate((b"first", b"second")):
            request = produce(value)
            request.with_header(correlation_id=i, client_id="raw")
            sock.sendall(request.encode(version=9, header=True, framed=True))
            size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
            decoded = ProduceResponse.decode(sock.recv(size, socket.MSG_WAITALL), version=9,
                                             header=True)
            assert decoded.throttle_time_ms == 1500
            assert decoded.responses[0].partition_responses[0].error_code == 0
    assert cluster.stats.throttled_responses == 2
    assert cluster.stats.requests_while_throttled == 1  # the second came while muted


def test_librdkafka_reports_the_throttle(cluster):
    """Every Produce response says 250 ms of throttle, and librdkafka's statistics report
    it. Each statistics report covers the responses since the one before: the test serves
    two more reports after the last delivery (flush() returns at the last delivery, which
    may come with the only throttled responses: the records of a slow start go in one
    request per node, so the throttle reached no report in one CI run)."""
    topic = new_topic(cluster, 3)
    for node in cluster.node_ids:
        cluster.throttle(node, 250)
    throttles: list[int] = []
    reports = [0]

    def on_stats(text: str) -> None:
        reports[0] += 1
        for broker in json.loads(text)["brokers"].values():
            throttles.append(broker.get("throttle", {}).get("max", 0))

    at_flush: list[int] = []  # reports served when flush() returned

    def two_more_reports() -> bool:
        """Two reports served since flush() returned (this is first called then)."""
        if not at_flush:
            at_flush.append(reports[0])
        return reports[0] >= at_flush[0] + 2

    records = keyed(60)
    pace = {"statistics.interval.ms": 100, "stats_cb": on_stats, "linger.ms": 0}
    assert librdkafka_produce(cluster.bootstrap_servers, topic, records, pace,
                              until=two_more_reports) == [None] * 60
    seen = (f"throttled responses {cluster.stats.throttled_responses}, requests librdkafka "
            f"sent while throttled {cluster.stats.requests_while_throttled}, broker stats "
            f"reported {len(throttles)}, nonzero {[t for t in throttles if t]}")
    print(f"\n{seen}")
    assert cluster.stats.throttled_responses >= 1, seen
    assert max(throttles, default=0) == 250, seen
    assert by_key(consume_all(cluster.bootstrap_servers, topic, 60)) == by_key_expected(records)


async def test_injected_errors_retriable_then_fatal(cluster):
    topic = new_topic(cluster, 1)
    cluster.fail((topic, 0), 19, times=2)  # NOT_ENOUGH_REPLICAS: retriable
    async with Producer(cluster.bootstrap_servers, retry_backoff_ms=10) as producer:
        md = await producer.send(topic, b"third time lucky")
        assert cluster.stats.injected_errors == 2
        cluster.fail(cluster.leader(topic, 0), 29)  # TOPIC_AUTHORIZATION_FAILED: fatal
        with pytest.raises(KafkaError) as failure:
            await producer.send(topic, b"refused")
    assert type(failure.value).__name__ == "TopicAuthorizationFailedError"
    assert md.offset == 0
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 1)
    assert [r.value for r in stored] == [b"third time lucky"]


async def test_a_slow_node_times_requests_out(cluster):
    topic = new_topic(cluster, 1)
    leader = cluster.leader(topic, 0)
    async with Producer(cluster.bootstrap_servers, request_timeout_ms=300, linger_ms=0,
                        delivery_timeout_ms=700, retry_backoff_ms=20) as producer:
        await producer.send(topic, b"warm-up")
        cluster.slow(leader, 3.0)
        with pytest.raises(TimeoutError):
            await producer.send(topic, b"too slow")
        cluster.slow(leader, 0)
        md = await producer.send(topic, b"fast again")
    assert md.partition == 0


def test_cut_connections_lose_nothing_with_librdkafka(cluster):
    topic = new_topic(cluster, 3)
    records = keyed(1500)

    def cut(i: int) -> None:
        time.sleep(0.001)  # librdkafka sends as it goes, over open connections
        if i % 300 == 299:
            for node in cluster.node_ids:
                cluster.cut(node)

    assert librdkafka_produce(cluster.bootstrap_servers, topic, records, during=cut) == \
        [None] * 1500
    assert cluster.stats.cuts >= 3
    stored = consume_all(cluster.bootstrap_servers, topic, 1500)
    assert len(stored) == 1500
    assert by_key(stored) == by_key_expected(records)


def test_chaos_schedule_with_librdkafka_loses_and_doubles_nothing(cluster):
    topic = new_topic(cluster, 6)
    records = keyed(2000, keys=24)
    chaos = cluster.chaos(seed=26, duration=3.0, move_every=0.15, down_every=1.0, down_for=0.4,
                          throttle_chance=0.2, throttle_ms=(20, 100), cut_chance=0.1)
    try:
        errors = librdkafka_produce(cluster.bootstrap_servers, topic, records,
                                    during=lambda i: time.sleep(0.0015))
    finally:
        chaos.stop()
    assert not chaos.running
    stats = cluster.stats
    print(f"\nchaos: {stats}")
    assert errors == [None] * 2000
    assert stats.leader_moves >= 5 and stats.node_stops >= 1
    assert stats.node_starts == stats.node_stops  # every node it stopped is back
    stored = consume_all(cluster.bootstrap_servers, topic, 2000)
    assert len(stored) == 2000
    assert by_key(stored) == by_key_expected(records)


# -- TLS and SASL --------------------------------------------------------------------------

USERS = {"alice": "wonderland", "bob": "builder"}


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def tls(ca, tmp_path):
    """The server's SSLContext (a certificate for 127.0.0.1 from `ca`) and the CA file."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    return server, str(cafile)


@pytest.fixture
def secured(broker, tls):
    """A cluster with two listeners: PLAINTEXT, and SASL_SSL offering every mechanism."""
    require_embedded(broker)
    server, cafile = tls
    listeners = {"INTERNAL": Listener(),
                 "SECURE": Listener(tls=server, sasl_mechanisms=SASL_MECHANISMS, users=USERS)}
    with SimulatedCluster(nodes=3, upstream=broker, listeners=listeners, lifetime=120) as c:
        yield c, cafile


async def test_aioproducer_over_tls(broker, tls):
    server, cafile = tls
    require_embedded(broker)
    with SimulatedCluster(upstream=broker, listeners={"SSL": Listener(tls=server)}) as cluster:
        topic = new_topic(cluster, 3)
        async with Producer(cluster.bootstrap_servers, security_protocol="SSL",
                            ssl_cafile=cafile) as producer:
            sent = [await producer.send(topic, b"tls-%d" % p, partition=p) for p in range(3)]
        stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 3)
    assert [md.partition for md in sent] == [0, 1, 2]
    assert sorted(r.value for r in stored) == [b"tls-0", b"tls-1", b"tls-2"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_aioproducer_sasl_good_and_bad_passwords(secured, mechanism):
    cluster, cafile = secured
    topic = new_topic(cluster, 3)
    secure = cluster.bootstrap("SECURE")
    settings = {"security_protocol": "SASL_SSL", "ssl_cafile": cafile,
                "sasl_mechanism": mechanism, "sasl_username": "alice"}
    async with Producer(secure, sasl_password="wonderland", **settings) as producer:
        sent = [await producer.send(topic, mechanism.encode(), partition=p) for p in range(3)]
    assert [md.partition for md in sent] == [0, 1, 2]
    assert cluster.stats.authentications >= 2  # bootstrap, then the leaders
    producer = Producer(secure, sasl_password="looking-glass", **settings)
    with pytest.raises(AuthenticationError, match=f"SASL {mechanism} authentication .* failed"):
        await asyncio.wait_for(producer.start(), 10)
    assert cluster.stats.authentication_failures >= 1
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap("INTERNAL"), topic, 3)
    assert sorted(r.value for r in stored) == [mechanism.encode()] * 3


async def test_a_failed_plain_login_leaves_the_password_in_no_local_of_the_traceback(secured):
    """Error reporters (Sentry, traceback's capture_locals) show every frame's locals: the
    PLAIN message, which holds the password, must be in none of them once it is sent."""
    cluster, cafile = secured
    producer = Producer(cluster.bootstrap("SECURE"), security_protocol="SASL_SSL",
                        ssl_cafile=cafile, sasl_mechanism="PLAIN", sasl_username="alice",
                        sasl_password="looking-glass-SECRET")
    with pytest.raises(AuthenticationError) as failure:
        await asyncio.wait_for(producer.start(), 10)
    shown = "".join(traceback.TracebackException.from_exception(
        failure.value, capture_locals=True).format())
    assert "Plain.step" not in shown and "authenticate" in shown  # the frames are there
    assert "looking-glass" not in shown


async def test_scram_key_derivation_runs_off_the_event_loop(secured):
    """PBKDF2 (up to 16384 iterations) in a worker thread: the loop's timers and other
    connections go on meanwhile."""
    cluster, cafile = secured

    class Watched(Scram):
        def step(self, challenge):
            threads.append(threading.get_ident())
            return super().step(challenge)

    threads: list[int] = []
    scram = Watched("SCRAM-SHA-512", "alice", "wonderland")
    host, port = cluster.address(1, "SECURE").rsplit(":", 1)
    conn = await BrokerConnection.connect(
        1, host, int(port), client_id="t", request_timeout=10, connect_timeout=10,
        ssl_context=ssl.create_default_context(cafile=cafile), sasl=scram)
    conn.close()
    assert scram.done and len(threads) == 3
    assert threading.get_ident() not in threads


def test_metadata_advertises_the_listener_the_client_came_in_on(secured):
    cluster, _ = secured
    plain = AdminClient({"bootstrap.servers": cluster.bootstrap("INTERNAL")}).list_topics(
        timeout=10)
    assert {f"{b.host}:{b.port}" for b in plain.brokers.values()} == \
        set(cluster.bootstrap("INTERNAL").split(","))
    assert cluster.address(1, "SECURE") not in cluster.bootstrap("INTERNAL")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_librdkafka_authenticates_by_sasl(secured, mechanism):
    cluster, cafile = secured
    topic = new_topic(cluster, 3)
    settings = {"security.protocol": "SASL_SSL", "ssl.ca.location": cafile,
                "sasl.mechanism": mechanism, "sasl.username": "bob",
                "sasl.password": "builder"}
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap("SECURE"), **settings}) \
        .list_topics(topic, timeout=10)
    assert {f"{b.host}:{b.port}" for b in metadata.brokers.values()} == \
        set(cluster.bootstrap("SECURE").split(","))
    records = keyed(90)
    assert librdkafka_produce(cluster.bootstrap("SECURE"), topic, records, settings) == \
        [None] * 90
    assert by_key(consume_all(cluster.bootstrap("INTERNAL"), topic, 90)) == \
        by_key_expected(records)


def test_librdkafka_with_a_wrong_password_is_told_authentication_failed(secured):
    cluster, cafile = secured
    errors: list = []
    producer = KafkaProducer({
        "bootstrap.servers": cluster.address(1, "SECURE"), "security.protocol": "SASL_SSL",
        "ssl.ca.location": cafile, "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "bob",
        "sasl.password": "wrong", "error_cb": errors.append})
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    assert errors and errors[0].code() == KafkaErrorCode._AUTHENTICATION
    assert "invalid credentials" in errors[0].str()
    assert cluster.stats.authentications == 0


def test_secrets_stay_out_of_reprs(secured):
    cluster, _ = secured
    listener = Listener(sasl_mechanisms=["PLAIN"], users={"alice": "wonderland"})
    for text in (repr(listener), repr(cluster), repr(cluster.stats)):
        assert "wonderland" not in text and "builder" not in text


# -- OAUTHBEARER and session lifetimes (KIP-368) -------------------------------------------

def unsecured_token(subject: str, expires_in: float) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'exp': time.time() + expires_in})}."


def oauth_cluster(broker, **listener):
    require_embedded(broker)
    return SimulatedCluster(upstream=broker, lifetime=120, listeners={
        "OAUTH": Listener(sasl_mechanisms=["OAUTHBEARER", "PLAIN"], users=USERS, **listener)})


LIBRDKAFKA_OAUTH = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                    "enable.sasl.oauthbearer.unsecure.jwt": True,
                    "sasl.oauthbearer.config": "principal=carol"}


def test_librdkafka_oauthbearer_unsecured_jwt(broker):
    with oauth_cluster(broker) as cluster:
        topic = new_topic(cluster, 3)
        records = keyed(60)
        assert librdkafka_produce(cluster.bootstrap_servers, topic, records, LIBRDKAFKA_OAUTH) \
            == [None] * 60
        assert cluster.stats.authentications >= 2
        assert by_key(consume_all(broker.bootstrap, topic, 60)) == by_key_expected(records)


def test_a_validator_that_refuses_the_token_fails_librdkafka(broker):
    def only_dave(token: str) -> Principal:
        principal = unsecured_jwt(token)
        if principal.name != "dave":
            raise SaslFailure(f"{principal.name} may not produce here")
        return principal

    errors: list = []
    with oauth_cluster(broker, oauth_validator=only_dave) as cluster:
        producer = KafkaProducer({"bootstrap.servers": cluster.bootstrap_servers,
                                  "error_cb": errors.append, **LIBRDKAFKA_OAUTH})
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            producer.poll(0.1)
        assert errors and errors[0].code() == KafkaErrorCode._AUTHENTICATION
        assert "carol may not produce here" in errors[0].str()
        assert cluster.stats.authentication_failures >= 1


def test_oauthbearer_on_the_wire_expired_token_and_session_lifetime(broker):
    """Decoded by kafka-python: an expired token is refused with its reason; a good one gets a
    session no longer than the token lives, after which the node hangs up on a request."""
    with oauth_cluster(broker, session_lifetime_ms=60_000) as cluster:
        for expires_in, error, lifetime in ((-5, 58, 0), (0.8, 0, 800)):
            with RawConnection(cluster.bootstrap_servers.split(",")[0]) as connection:
                handshake = connection.request(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1)
                assert (handshake.error_code, sorted(handshake.mechanisms)) == \
                    (0, ["OAUTHBEARER", "PLAIN"])
                message = f"n,,\x01auth=Bearer {unsecured_token('erin', expires_in)}\x01\x01"
                response = connection.request(
                    SaslAuthenticateRequest(auth_bytes=message.encode()), 2)
                assert response.error_code == error
                if error:
                    assert "expired" in response.error_message
                    continue
                assert 0 < response.session_lifetime_ms <= lifetime
                request = MetadataRequest(topics=[], allow_auto_topic_creation=False)
                assert [b.node_id for b in connection.request(request, 9).brokers] == [1, 2, 3]
                time.sleep(response.session_lifetime_ms / 1000 + 0.2)
                with pytest.raises(ConnectionError):
                    connection.request(request, 9)
        assert cluster.stats.expired_sessions == 1


def test_sasl_handshake_v0_carries_bare_tokens(broker):
    """SaslHandshake v0 (before KIP-152): the PLAIN token goes as a bare frame, and so does
    the server's (empty) answer; then the connection serves Kafka requests."""
    with oauth_cluster(broker) as cluster:
        with RawConnection(cluster.address(1)) as connection:
            assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), 0).error_code == 0
            connection.send_frame(b"\0alice\0wonderland")
            assert connection.frame() == b""
            request = MetadataRequest(topics=[], allow_auto_topic_creation=False)
            assert len(connection.request(request, 1).brokers) == 3
        with RawConnection(cluster.address(1)) as connection:
            assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), 0).error_code == 0
            connection.send_frame(b"\0alice\0queen-of-hearts")
            with pytest.raises(ConnectionError):
                connection.frame()


def test_librdkafka_reauthenticates_before_its_session_ends(broker):
    # (Sessions of 2 s: re-authenticating at 85-95% of one leaves 100-300 ms, more than a
    # loaded CI machine's scheduling delays; 700 ms left 35-105, and sessions expired.)
    with oauth_cluster(broker, session_lifetime_ms=2000) as cluster:
        topic = new_topic(cluster, 1)
        records = keyed(120)
        settings = {"sasl.mechanism": "PLAIN", "security.protocol": "SASL_PLAINTEXT",
                    "sasl.username": "alice", "sasl.password": "wonderland", "linger.ms": 0}
        assert librdkafka_produce(cluster.bootstrap_servers, topic, records, settings,
                                  during=lambda i: time.sleep(0.04)) == [None] * 120
        stats = cluster.stats
        assert stats.authentications > stats.connections  # again on the same connections
        assert stats.expired_sessions == 0
        assert by_key(consume_all(broker.bootstrap, topic, 120)) == by_key_expected(records)


async def test_aioproducer_reauthenticates_before_its_session_ends(broker):
    """KIP-368: the node limits sessions to 2 s and hangs up on a request sent after the
    session ended. The producer authenticates again on its open connections before then,
    so no session expires, and every record arrives once, in order. (500 ms sessions left
    25-75 ms, less than a loaded CI machine's scheduling delays: sessions expired.)"""
    with oauth_cluster(broker, session_lifetime_ms=2000) as cluster:
        topic = new_topic(cluster, 1)
        async with Producer(cluster.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="PLAIN", sasl_username="alice",
                            sasl_password="wonderland", linger_ms=0) as producer:
            for i in range(140):  # 7 s or more: three sessions' worth and a half
                await producer.send(topic, b"%03d" % i)
                await asyncio.sleep(0.05)
            metrics = producer.metrics()
        stats = cluster.stats
        stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 140)
    assert stats.expired_sessions == 0
    assert metrics.reauthentications >= 3 and stats.authentications > stats.connections
    assert [r.value for r in stored] == [b"%03d" % i for i in range(140)]


async def test_a_connection_due_to_reauthenticate_does_so_before_it_writes(broker):
    """KIP-368, checked where a request is written, as Java's client does: the producer's
    loop stalls (a CPU-bound handler, a GC pause) with a record buffered, from before its
    connections' re-authentication is due until past their sessions' end (2 s). The late
    timer does not come first: the connection, about to write the record's Produce, sees
    re-authentication due, holds it and authenticates first (the node takes a SaslHandshake
    after the session ended, as Kafka's SocketServer does), so no session expires, and
    every record arrives once, in order. (With the timer alone the Produce was written
    first, read past the session's end, and the node hung up.)"""
    with oauth_cluster(broker, session_lifetime_ms=2000) as cluster:
        topic = new_topic(cluster, 1)
        async with Producer(cluster.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="PLAIN", sasl_username="alice",
                            sasl_password="wonderland", linger_ms=0) as producer:
            await producer.send(topic, b"00")  # every session began before it was answered
            buffered = producer.send(topic, b"01")
            time.sleep(2.3)  # noqa: ASYNC251  (the stall: due at 1.7-1.9 s, ended at 2 s)
            sent = [buffered] + [producer.send(topic, b"%02d" % i) for i in range(2, 20)]
            await asyncio.gather(*sent)
            metrics = producer.metrics()
        stats = cluster.stats
        stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 20)
    assert stats.expired_sessions == 0
    assert metrics.reauthentications >= 1
    assert [r.value for r in stored] == [b"%02d" % i for i in range(20)]


def test_a_request_during_a_sasl_exchange_closes_the_connection(broker):
    """As Kafka's authenticator does: between SaslHandshake and the end of the exchange only
    SaslAuthenticate is taken; a Metadata request there (here in a re-authentication, on an
    authenticated connection) closes the connection, and is counted."""
    with oauth_cluster(broker) as cluster:
        request = MetadataRequest(topics=[], allow_auto_topic_creation=False)
        with RawConnection(cluster.address(1)) as connection:
            assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
            assert connection.request(
                SaslAuthenticateRequest(auth_bytes=b"\0alice\0wonderland"), 2).error_code == 0
            assert len(connection.request(request, 9).brokers) == 3
            assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == 0
            with pytest.raises(ConnectionError):
                connection.request(request, 9)
        assert cluster.stats.requests_during_authentication == 1


async def test_nothing_but_sasl_is_written_while_a_connection_reauthenticates(broker):
    """KIP-368: a transactional producer that fetches metadata every few milliseconds
    (metadata_max_age_ms=0) and commits transaction after transaction, over connections
    whose sessions last 2 s, so they re-authenticate again and again (about three times
    each in 6 s). Every request the producer makes meanwhile (metadata, transaction
    requests, produce) waits until the exchange ends: the nodes, which hang up on anything
    but SaslAuthenticate in it, see none, no session expires, and every committed record
    arrives. (Re-authentication starts at 85-95% of a session, as the Java client's: with
    300 ms sessions that left 15-45 ms, less than one scheduling delay of the 2-core CI
    machine running four test workers, and a session expired there once; with 1 s ones,
    50-150 ms, and sessions expired on a machine more loaded.)"""
    with oauth_cluster(broker, session_lifetime_ms=2000) as cluster:
        topic = new_topic(cluster, 3)
        committed = 0
        async with Producer(cluster.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="PLAIN", sasl_username="alice",
                            sasl_password="wonderland", transactional_id=f"reauth-{topic}",
                            metadata_max_age_ms=0, retry_backoff_ms=5,
                            linger_ms=1) as producer:
            loop = asyncio.get_running_loop()
            end = loop.time() + 6.0
            while loop.time() < end and committed < 30_000:
                async with producer.transaction():
                    for i in range(6):
                        await producer.enqueue(topic, b"%05d" % (committed + i), partition=i % 3)
                committed += 6
            metrics = producer.metrics()
        stats = cluster.stats
        stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, committed,
                                         isolation_level="read_committed")
    print(f"\n{committed} records, {metrics.reauthentications} re-authentications, "
          f"{stats.requests} requests, {stats.connections} connections")
    assert metrics.reauthentications >= 5
    assert stats.requests_during_authentication == 0
    assert stats.expired_sessions == 0
    assert sorted(r.value for r in stored) == [b"%05d" % i for i in range(committed)]


def _jwt(subject: str, lifetime_s: float) -> str:
    """An unsecured JWT (alg none), as Kafka's default OAUTHBEARER validator takes."""
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'exp': time.time() + lifetime_s})}."


async def test_aioproducer_oauthbearer_asks_its_provider_for_each_session(broker):
    """OAUTHBEARER with an async token provider: each connection and each re-authentication
    asks it again (the node's sessions last 2 s), so tokens of four seconds do not run out;
    a provider whose token the node refuses makes start() fail with AuthenticationError
    carrying the node's reason, and no token appears in it. (Sessions of 400 ms left the
    client, which re-authenticates at 85-95% of a session as Java's does, 20-60 ms: a
    session expired once in CI beside four test workers; 1 s ones, 50-150 ms, expired on a
    machine more loaded.)"""
    tokens: list[str] = []

    class Provider:
        async def token(self) -> str:
            tokens.append(_jwt("carol", 4.0))
            return tokens[-1]

    with oauth_cluster(broker, session_lifetime_ms=2000) as cluster:
        topic = new_topic(cluster, 3)
        async with Producer(cluster.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=Provider(),
                            linger_ms=0) as producer:
            for i in range(140):  # 7 s or more
                await producer.send(topic, b"%03d" % i, key=b"k")
                await asyncio.sleep(0.05)
        assert cluster.stats.expired_sessions == 0
        assert len(tokens) >= 4
        stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 140)
        assert [r.value for r in stored] == [b"%03d" % i for i in range(140)]

        expired = _jwt("carol", -5)
        with pytest.raises(AuthenticationError) as refused:
            await Producer(cluster.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                           sasl_mechanism="OAUTHBEARER", max_block_ms=3000,
                           sasl_oauth_token_provider=lambda: expired).start()
        assert "expired" in str(refused.value) and expired not in str(refused.value)


def test_the_cluster_stops_itself_when_its_lifetime_ends(broker):
    require_embedded(broker)
    cluster = SimulatedCluster(upstream=broker, lifetime=0.5).start()
    try:
        address = cluster.address(1)
        assert not refuses(address)
        deadline = time.monotonic() + 10
        while not refuses(address) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert refuses(address)
        with pytest.raises(EmbeddedBrokerError, match="not running"):
            cluster.move_leader("any", 0)
        assert broker.running  # not its to stop: it was given the broker
    finally:
        cluster.stop()


def test_a_task_the_cluster_s_loop_holds_as_it_stops_ends_with_it(broker):
    """A client connection accepted as the cluster stops: the loop's last turns make its
    handler's task (`_accept`), and the stop leaves it unbegun. Dropped with the loop,
    Python warned "coroutine 'SimulatedCluster._accept' was never awaited" (once in a full
    run, stop 51). The loop's end now cancels what it holds and runs it to its end, as
    asyncio.run() does; here a task made in the turn that stops the loop, as that handler's
    is, was left pending."""
    require_embedded(broker)
    cluster = SimulatedCluster(upstream=broker, lifetime=120).start()
    loop, made = cluster._loop, []

    async def handler() -> None:  # (as _accept: never begun)
        await asyncio.sleep(60)

    def made_as_the_loop_stops() -> None:
        made.append(loop.create_task(handler()))
        loop.stop()

    try:
        loop.call_soon_threadsafe(made_as_the_loop_stops)
        cluster._thread.join(10)
    finally:
        cluster.stop()
    [task] = made
    assert task.cancelled(), "the loop's end left the task pending, to be dropped"


def test_bad_arguments_are_refused_clearly(cluster):
    with pytest.raises(ConfigError, match="at least one node"):
        SimulatedCluster(nodes=0)
    with pytest.raises(ConfigError, match="unknown SASL mechanisms.*GSSAPI"):
        Listener(sasl_mechanisms=["GSSAPI"])
    with pytest.raises(ConfigError, match="no node 9: the nodes are"):
        cluster.move_leader("any", 0, to=9)
    with pytest.raises(ConfigError, match="no listener 'SECURE'"):
        cluster.bootstrap("SECURE")
    with pytest.raises(ConfigError, match="times must be at least 1"):
        cluster.fail(1, 19, times=0)
    cluster.stop_node(3)
    with pytest.raises(EmbeddedBrokerError, match="node 3 is down"):
        cluster.move_leader("any", 0, to=3)
