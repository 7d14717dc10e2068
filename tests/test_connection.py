"""One multiplexed broker connection: responses are handed to their requests' callbacks
straight from the socket's data callback, so one request's trouble must not reach another's."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import socket
import time
import tracemalloc

from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

from aioproducer import Producer
from aioproducer.client import connection
from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.messages import ApiKey
from tests.support.readback import consume_all

METADATA = {"topics": [], "allow_auto_topic_creation": False}


async def _connect(broker) -> BrokerConnection:
    host, port = broker.bootstrap.rsplit(":", 1)
    return await BrokerConnection.connect(-1, host, int(port), client_id="t",
                                          request_timeout=10, connect_timeout=10)


async def test_a_failing_response_callback_is_reported_and_the_connection_goes_on(broker):
    reported: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    conn = await _connect(broker)
    try:
        def broken(body, exc):
            raise RuntimeError("a bug in the callback")

        conn.send(ApiKey.METADATA, METADATA, broken)
        after = await conn.request(ApiKey.METADATA, METADATA)  # pipelined behind it
        assert after["brokers"], "the request after the failing callback got no answer"
        assert not conn.closed
        assert [type(c["exception"]) for c in reported] == [RuntimeError]
        assert "METADATA response callback" in reported[0]["message"]
    finally:
        conn.close()


async def test_a_cancelled_request_leaves_the_others_alone(broker):
    reported: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    conn = await _connect(broker)
    try:
        cancelled = asyncio.ensure_future(conn.request(ApiKey.METADATA, METADATA))
        await asyncio.sleep(0)  # written; its response is still to come
        cancelled.cancel()
        after = await conn.request(ApiKey.METADATA, METADATA)
        assert cancelled.cancelled()
        assert after["brokers"]
        assert not conn.closed and not reported
    finally:
        conn.close()


async def test_closing_fails_every_pending_request(broker):
    conn = await _connect(broker)
    outcomes: list[tuple] = []
    conn.send(ApiKey.METADATA, METADATA, lambda body, exc: outcomes.append((body, exc)))
    waiting = asyncio.ensure_future(conn.request(ApiKey.METADATA, METADATA))
    await asyncio.sleep(0)
    conn.close()
    results = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 5)
    assert "closed" in str(results[0])
    assert len(outcomes) == 1 and outcomes[0][0] is None and "closed" in str(outcomes[0][1])


async def test_a_broker_before_kafka_2_4_is_asked_again_at_its_apiversions_version(
        proxied_broker):
    """Brokers before Kafka 2.4 speak ApiVersions up to v2: they answer our v3 with
    UNSUPPORTED_VERSION in a v0 body that lists what they speak. The producer asks again at
    v2, on every connection, and works."""
    cluster = proxied_broker
    asked: list[int] = []

    def before_2_4(response):
        asked.append(response.version)
        if response.version <= 2:
            return None
        return ApiVersionsResponse(version=0, error_code=35, api_keys=[
            ApiVersionsResponse.ApiVersion(
                version=0, api_key=k.api_key, min_version=k.min_version,
                max_version=min(k.max_version, 2) if k.api_key == ApiKey.API_VERSIONS
                else k.max_version)
            for k in response.api_keys])
    cluster.proxy.rewrite_responses(ApiVersionsResponse, before_2_4)
    cluster.create_topic("old-broker", 1)
    async with Producer(cluster.bootstrap) as producer:
        metadata = await producer.send("old-broker", b"hello")
    assert asked and asked == [3, 2] * (len(asked) // 2)
    got = consume_all(cluster.broker.bootstrap, "old-broker", expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"hello")]


async def test_a_bootstrap_address_the_brokers_advertise_otherwise_is_let_go_quietly(
        proxied_broker, caplog):
    """Bootstrapped as localhost, the broker advertises 127.0.0.1: the bootstrap connection
    is closed as no longer needed, without a report of a lost connection or an extra
    metadata fetch to recover from one."""
    cluster = proxied_broker
    cluster.create_topic("renamed", 1)
    fetches: list[int] = []
    cluster.proxy.rewrite_responses(MetadataResponse, lambda response: fetches.append(1))
    caplog.set_level(logging.INFO, logger="aioproducer")
    for bootstrap in (cluster.bootstrap, cluster.bootstrap.replace("127.0.0.1", "localhost")):
        fetches.clear()
        async with Producer(bootstrap, linger_ms=0) as producer:
            await producer.send("renamed", b"v")
            await asyncio.sleep(0.2)  # time for a fetch the close would have asked for
        assert len(fetches) == 1, bootstrap
    assert "closed" not in caplog.text


async def test_a_large_request_costs_no_copy_of_itself_to_write(proxied_broker):
    """A Produce request of large batches is written as its parts (its head, then each
    batch's records where they lie). Python 3.11's plain socket transport joined them first
    (asyncio's default writelines()), then copied what the socket did not take twice more:
    a 6 MB record took 2.6x its size in memory for a moment, 1.4x now (and the CPU of the
    copies: ~0.1 us a KB). Now only what the socket does not take is copied, once, into the
    transport's buffer. (uvloop's and 3.12's transports write the parts where they lie.)"""
    cluster = proxied_broker
    topic = f"large-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    value = os.urandom(6_000_000)  # more than the kernel's socket buffers take
    async with Producer(cluster.bootstrap, acks=1, linger_ms=0, enable_idempotence=False,
                        max_request_size=8 * 1024 * 1024) as producer:
        await producer.partitions_for(topic)
        cluster.proxy.stop_reading(True)  # the socket takes only what its buffers hold
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            future = await producer.enqueue(topic, value)
            deadline = time.monotonic() + 10
            while producer.metrics().produce_requests < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
            cluster.proxy.stop_reading(False)
        assert (await asyncio.wait_for(future, 30)).offset == 0
    # The batch's buffer, and at most the request again in the transport's buffer.
    assert peak < 2 * len(value), f"{peak / len(value):.1f}x the record's size"


class _HostWithoutIPv6:
    """The socket module as a host booted with IPv6 off sees it: `localhost` names ::1 first
    (as /etc/hosts often does), and an AF_INET6 socket cannot be made (EAFNOSUPPORT)."""

    def __getattr__(self, name: str):
        return getattr(socket, name)

    @staticmethod
    def getaddrinfo(host, port, *args, **kwargs):
        if host != "localhost":
            return socket.getaddrinfo(host, port, *args, **kwargs)
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    @staticmethod
    def socket(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
        return socket.socket(family, *args, **kwargs)


async def test_an_address_whose_family_the_host_cannot_make_gives_way_to_the_next(
        broker, topic, monkeypatch):
    """`localhost` on a host with IPv6 off: ::1's socket cannot be made, and 127.0.0.1 is
    tried next, as asyncio's create_connection does (the first address's failure ended the
    connect: KafkaConnectionError 'Address family not supported by protocol')."""
    monkeypatch.setattr(connection, "socket", _HostWithoutIPv6())
    port = broker.bootstrap.rsplit(":", 1)[1]
    async with Producer(f"localhost:{port}", linger_ms=0) as producer:
        metadata = await producer.send(topic, b"over IPv4")
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"over IPv4"]
    assert metadata.offset == 0
