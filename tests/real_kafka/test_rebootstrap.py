"""Rebootstrapping on Apache Kafka 4.4, every acknowledged record read back once, in order,
with confluent-kafka's consumer.

KIP-1102's trigger: the address a broker advertised vanishes (a host whose packets are
dropped: connections, open and new, stay silent), the broker comes back advertising another
one, and the bootstrap address leads to it. The producer leaves the vanished address after
metadata_recovery_rebootstrap_trigger_ms, not after request_timeout_ms and
socket_connection_setup_timeout_ms.

KIP-1242: the address a broker advertised leads to a broker of another cluster (with the same
node id and topic). Asked at connection time which cluster and node it is meant to be
(ApiVersions v5), Kafka 4.4 answers REBOOTSTRAP_REQUIRED, the one place it sends that error
(tests/test_rebootstrap.py has it in Metadata answers, on the simulated cluster)."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections import defaultdict
from typing import Callable

import pytest

from aioproducer import Producer
from aioproducer.protocol import messages
from aioproducer.protocol.messages import ApiKey
from aioproducer.testing import ApacheKafka, ApacheKafkaUnavailable
from aioproducer.testing.pytest_plugin import REQUIRE_ENV
from tests.support.readback import consume_all

PARTITIONS = 3


class VanishingAddress:
    """127.0.0.1:port, relayed to a broker's port (`upstream_port()`, asked at each new
    connection) until `vanish()`; from then on a host that is gone: nothing passes either
    way, and no connection, open or new, is answered or closed. `cut()` closes the
    connections relayed so far. Runs in the test's event loop."""

    def __init__(self, upstream_port: Callable[[], int]) -> None:
        self._upstream_port = upstream_port  # asked at each connection
        self._gone = asyncio.Event()
        self._closed = asyncio.Event()
        self._transports: set[asyncio.BaseTransport] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> "VanishingAddress":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closed.set()
        assert self._server is not None
        self._server.close()
        for transport in list(self._transports):
            transport.abort()

    def vanish(self) -> None:
        self._gone.set()

    def cut(self) -> None:
        for transport in list(self._transports):
            transport.abort()

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self._transports.add(writer.transport)
        upstream: asyncio.StreamWriter | None = None
        try:
            if not self._gone.is_set():
                up_reader, upstream = await asyncio.open_connection("127.0.0.1",
                                                                    self._upstream_port())
                self._transports.add(upstream.transport)
                pipes = [asyncio.ensure_future(self._pipe(reader, upstream)),
                         asyncio.ensure_future(self._pipe(up_reader, writer))]
                ended = asyncio.ensure_future(self._gone.wait())
                done, _ = await asyncio.wait([*pipes, ended],
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in (*pipes, ended):
                    task.cancel()
                if ended not in done:
                    return  # a side closed before the address vanished: as a relay does
            await self._closed.wait()  # gone: silent, and open, until the test ends
        except OSError:
            pass
        finally:
            writer.transport.abort()
            if upstream is not None:
                upstream.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


async def produce(producer: Producer, topic: str, numbers: range) -> list:
    return [await producer.enqueue(topic, b"%d" % n, partition=n % PARTITIONS)
            for n in numbers]


def own_kafka(**options: object) -> ApacheKafka:
    """A node of the test's own (it is restarted with another config): skipped without Java
    or Maven, failed if AIOPRODUCER_REQUIRE_KAFKA=1, as the plugin's apache_kafka is."""
    try:
        return ApacheKafka(1, **options)  # type: ignore[arg-type]
    except ApacheKafkaUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"Apache Kafka is required but cannot run: {exc}", pytrace=False)
        pytest.skip(f"Apache Kafka cannot run here: {exc}")


@pytest.mark.slow
async def test_a_vanished_broker_address_is_left_for_the_bootstrap_servers(caplog):
    """The broker advertises a relay's address; the producer bootstraps through the broker's
    own port. The relayed address vanishes, the broker restarts advertising its own port, and
    the records held meanwhile are acknowledged within seconds of its return (without the
    trigger: not before request_timeout_ms + socket_connection_setup_timeout_ms, two
    minutes here), then read back once each, in order."""
    kafka: ApacheKafka | None = None

    def kafka_port() -> int:
        assert kafka is not None
        return port_of(kafka.bootstrap)

    async with VanishingAddress(kafka_port) as relay:
        kafka = own_kafka(broker_config={
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{relay.port}"})
        await asyncio.to_thread(kafka.start)
        try:
            topic = f"rb-{uuid.uuid4().hex[:10]}"
            await asyncio.to_thread(kafka.create_topic, topic, PARTITIONS)
            caplog.set_level(logging.WARNING, logger="aioproducer")
            loop = asyncio.get_running_loop()
            async with Producer(kafka.bootstrap, linger_ms=5, metadata_max_age_ms=1000,
                                request_timeout_ms=60_000, delivery_timeout_ms=300_000,
                                socket_connection_setup_timeout_ms=60_000,
                                socket_connection_setup_timeout_max_ms=60_000,
                                metadata_recovery_rebootstrap_trigger_ms=2000) as producer:
                await asyncio.gather(*await produce(producer, topic, range(100)))
                assert producer.metrics().rebootstraps == 0
                relay.vanish()
                pending = asyncio.gather(*await produce(producer, topic, range(100, 400)))
                await asyncio.to_thread(kafka.stop_node, 0)
                await asyncio.to_thread(kafka.start_node, 0, config={
                    "advertised.listeners": f"PLAINTEXT://{kafka.bootstrap}"})
                back = loop.time()
                await asyncio.wait_for(pending, 20)
                took = loop.time() - back
                await asyncio.gather(*await produce(producer, topic, range(400, 450)))
                metrics = producer.metrics()
            got = await asyncio.to_thread(consume_all, kafka.bootstrap, topic, 450)
        finally:
            await asyncio.to_thread(kafka.stop)
    print(f"\nacknowledged {took:.1f} s after the broker was back; "
          f"{metrics.rebootstraps} rebootstraps")
    assert metrics.rebootstraps >= 1
    assert any("no broker has given metadata for" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING), caplog.text
    by_partition: dict[int, list[int]] = defaultdict(list)
    for record in got:
        by_partition[record.partition].append(int(record.value))
    for partition, numbers in by_partition.items():
        assert numbers == sorted(numbers), f"partition {partition} out of order"
    assert sorted(n for numbers in by_partition.values() for n in numbers) == list(range(450))


def end_offset(bootstrap: str, topic: str) -> int:
    """Partition 0's high watermark, as librdkafka reads it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offset"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)[1]
    finally:
        consumer.close()


@pytest.mark.slow
@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
async def test_an_address_leading_to_another_cluster_is_refused_and_left(apache_kafka, caplog,
                                                                         monkeypatch, check):
    """Cluster A's broker advertises a relay's address; the producer bootstraps through the
    broker's own port and sends 100 records through the relay. The relay is moved to the
    broker of another cluster B: node 0 too, with a topic of the same name, which would take
    a Produce request meant for A. Checked (metadata_cluster_check_enable, the default),
    B answers the producer's ApiVersions REBOOTSTRAP_REQUIRED: the producer rebootstraps
    (and again, backing off, as A's metadata names the relay still), sends B nothing, and
    once the relay leads back to A delivers the 200 records held meanwhile: A has the 300,
    once, in order. Unchecked, B takes records meant for A, as Kafka clients before 4.4 let
    it: at Produce v12, which names topics by name. (At v13 B refused the first misrouted
    request, UNKNOWN_TOPIC_ID: A's topic id is not B's; it took none before the relay led
    back to A, though a metadata answer through the relay would give the producer B's id.)"""
    if not check:
        monkeypatch.setitem(messages.CLIENT_VERSIONS, ApiKey.PRODUCE, (3, 12))
    relay_to: dict[str, ApacheKafka] = {"kafka": apache_kafka}  # (until A is made)
    async with VanishingAddress(lambda: port_of(relay_to["kafka"].bootstrap)) as relay:
        a = relay_to["kafka"] = own_kafka(broker_config={
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{relay.port}"})
        await asyncio.to_thread(a.start)
        try:
            topic = f"misrouted-{uuid.uuid4().hex[:10]}"
            await asyncio.to_thread(a.create_topic, topic, 1)
            await asyncio.to_thread(apache_kafka.create_topic, topic, 1)
            caplog.set_level(logging.WARNING, logger="aioproducer")
            values = [b"%03d" % n for n in range(300)]
            async with Producer(a.bootstrap, linger_ms=5, reconnect_backoff_ms=100,
                                metadata_cluster_check_enable=check,
                                delivery_timeout_ms=120_000) as producer:
                await asyncio.gather(*[await producer.enqueue(topic, v) for v in values[:100]])
                relay_to["kafka"] = apache_kafka
                relay.cut()
                held = [await producer.enqueue(topic, v) for v in values[100:]]
                pending = asyncio.gather(*held, return_exceptions=True)
                # The relay leads to B until the producer has been there: refused (checked)
                # or a record taken (unchecked). A fixed 3 s did not make sure it had: a
                # reconnect that took longer found A again, and neither case showed.
                for _ in range(600):
                    if producer.metrics().rebootstraps or any(f.done() for f in held):
                        break
                    await asyncio.sleep(0.05)
                relay_to["kafka"] = a
                relay.cut()
                outcomes = await asyncio.wait_for(pending, 60)
                metrics = producer.metrics()
            # (Unchecked, A holds fewer than 300: the read would wait out its 30 s.)
            on_a = await asyncio.to_thread(consume_all, a.bootstrap, topic, 300) if check else []
        finally:
            await asyncio.to_thread(a.stop)
    on_b = await asyncio.to_thread(end_offset, apache_kafka.bootstrap, topic)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not check:
        assert on_b > 0, "B took no record: the unchecked case does not show the hazard"
        return
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert on_b == 0, f"{on_b} records meant for cluster A went to cluster B"
    assert [r.value for r in on_a] == values
    assert metrics.rebootstraps >= 1
    assert any("REBOOTSTRAP_REQUIRED" in w and f"127.0.0.1:{relay.port} is not broker 0" in w
               for w in warnings), warnings
