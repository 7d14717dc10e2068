"""SASL and TLS against Apache Kafka's own authenticators: PLAIN, SCRAM-SHA-256/512 (users
made at format time), OAUTHBEARER through Kafka's unsecured JWS validator with sessions that
expire (KIP-368: re-authentication on open connections), and TLS with a client certificate."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from aioproducer import Producer
from aioproducer.errors import AuthenticationError, KafkaConnectionError
from aioproducer.protocol.messages import ApiKey
from tests.real_kafka.conftest import REAUTH_MS
from tests.support.proxy import FaultProxy
from tests.support.readback import consume_all


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_users_made_at_format_time(apache_kafka, make_topic, mechanism):
    topic = make_topic()
    async with Producer(apache_kafka.bootstrap_for("SASL_PLAINTEXT"),
                        security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                        sasl_username="alice", sasl_password="alice-secret") as producer:
        md = await producer.send(topic, mechanism.encode())
    assert md.offset == 0
    assert [r.value for r in consume_all(apache_kafka.bootstrap, topic, 1)] == [mechanism.encode()]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_wrong_password_is_refused(apache_kafka, mechanism):
    producer = Producer(apache_kafka.bootstrap_for("SASL_PLAINTEXT"),
                        security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                        sasl_username="alice", sasl_password="wrong")
    with pytest.raises(AuthenticationError):
        await producer.start()
    await producer.close()


def _unsecured_jwt(subject: str, lifetime_s: float) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    now = time.time()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now, 'exp': now + lifetime_s})}."


async def test_oauthbearer_sessions_are_renewed_on_open_connections(apache_kafka, make_topic):
    """KIP-368: the broker ends each SASL session after connections.max.reauth.ms; the
    producer re-authenticates on the open connection (asking the provider for a token each
    time) and its records keep flowing, none lost."""
    topic = make_topic()
    tokens = []

    def provider() -> str:
        tokens.append(_unsecured_jwt("bob", 3600))
        return tokens[-1]

    async with Producer(apache_kafka.bootstrap_for("SASL_PLAINTEXT"),
                        security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                        sasl_oauth_token_provider=provider, linger_ms=0) as producer:
        deadline = time.monotonic() + 2.5 * REAUTH_MS / 1000
        sent = 0
        while time.monotonic() < deadline:
            await producer.send(topic, b"%d" % sent)
            sent += 1
            await asyncio.sleep(0.2)
        metrics = producer.metrics()
    assert metrics.reauthentications >= 2 and len(tokens) >= 3
    assert metrics.records_failed == 0
    got = consume_all(apache_kafka.bootstrap, topic, expected=sent)
    assert [r.value for r in got] == [b"%d" % i for i in range(sent)]


async def test_a_stalled_loop_reauthenticates_before_it_writes(apache_kafka, make_topic):
    """KIP-368 where a request is written, as Java's client checks it: the producer's loop
    stalls (a CPU-bound handler, a GC pause) with a record buffered, from before its
    sessions' re-authentication is due until past their end. The connection, about to
    write the record's Produce, re-authenticates first (Kafka's SocketServer takes a
    SaslHandshake after the session ended), so Kafka does not hang up on it: nothing is
    retried, and every record arrives once, in order. (With the timer alone the Produce was
    written first, Kafka closed the connection, and the record was retried.)"""
    topic = make_topic()
    async with Producer(apache_kafka.bootstrap_for("SASL_PLAINTEXT"),
                        security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                        sasl_oauth_token_provider=lambda: _unsecured_jwt("bob", 3600),
                        linger_ms=0) as producer:
        await producer.send(topic, b"00")  # every session began before it was answered
        buffered = producer.send(topic, b"01")
        time.sleep(REAUTH_MS / 1000 + 0.5)  # noqa: ASYNC251  (the stall)
        await asyncio.gather(buffered, *(producer.send(topic, b"%02d" % i) for i in range(2, 20)))
        metrics = producer.metrics()
    assert (metrics.retries, metrics.records_failed) == (0, 0)
    assert metrics.reauthentications >= 1
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, 20)
    assert [r.value for r in got] == [b"%02d" % i for i in range(20)]


async def test_re_authentication_does_not_wait_for_the_requests_in_flight(apache_kafka,
                                                                         make_topic):
    """KIP-368 as Java's KafkaChannel does it: the SaslHandshake that renews a session is
    written at once, Produce requests still in flight (Kafka handles a connection's requests
    one at a time, in order, so their answers come before the handshake's, each delivered as
    usual); only what is sent meanwhile waits. It waited for every answer first: a bubble in
    the pipeline each session. Here a proxy holds Kafka's answers from before the session's
    renewal is due until the handshake is written (before: never, while they were held);
    then every record arrives once, in order, none retried."""
    topic = make_topic()
    sasl_port = int(apache_kafka.bootstrap_for("SASL_PLAINTEXT").rsplit(":", 1)[1])
    with FaultProxy(sasl_port) as proxy:
        proxy.front()  # every connection through the proxy
        async with Producer(f"127.0.0.1:{proxy.port}", security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="OAUTHBEARER",
                            sasl_oauth_token_provider=lambda: _unsecured_jwt("bob", 3600),
                            linger_ms=0) as producer:
            await producer.send(topic, b"00")  # every session began before it was answered
            proxy.stall(True)  # Kafka's answers wait in the proxy
            try:
                in_flight = [producer.send(topic, b"%02d" % i) for i in range(1, 4)]
                deadline = time.monotonic() + REAUTH_MS / 1000 + 10
                while not _handshake_with_produce_unanswered(proxy.written) \
                        and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            finally:
                proxy.stall(False)
            written = list(proxy.written)
            await asyncio.gather(*in_flight, *(producer.send(topic, b"%02d" % i)
                                               for i in range(4, 20)))
            metrics = producer.metrics()
    assert _handshake_with_produce_unanswered(written), \
        f"no SaslHandshake written while a Produce was unanswered: {written}"
    assert (metrics.retries, metrics.records_failed) == (0, 0)
    assert metrics.reauthentications >= 1
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, 20)
    assert [r.value for r in got] == [b"%02d" % i for i in range(20)]


def _handshake_with_produce_unanswered(written: list[tuple[int, list[int]]]) -> bool:
    return any(api_key == ApiKey.SASL_HANDSHAKE and ApiKey.PRODUCE in unanswered
               for api_key, unanswered in list(written))


async def test_tls_with_a_client_certificate(apache_kafka, make_topic):
    topic = make_topic()
    async with Producer(apache_kafka.bootstrap_for("SSL"), security_protocol="SSL",
                        ssl_cafile=apache_kafka.ssl_cafile, ssl_certfile=apache_kafka.ssl_certfile,
                        ssl_keyfile=apache_kafka.ssl_keyfile) as producer:
        md = await producer.send(topic, b"over tls")
    assert md.offset == 0
    assert [r.value for r in consume_all(apache_kafka.bootstrap, topic, 1)] == [b"over tls"]


async def test_acks_0_close_over_tls_loses_nothing(apache_kafka, make_topic):
    """At acks=0 a record is done once its request is written; close() over TLS, which cannot
    half-close the connection, closed it at once and Kafka lost what it had not read yet.
    Now close() waits for Kafka's answer to one more request on the connection, which Kafka
    handles only after every request before it."""
    topic = make_topic()
    values = [b"%05d" % i + bytes(2000) for i in range(5000)]
    async with Producer(apache_kafka.bootstrap_for("SSL"), security_protocol="SSL",
                        ssl_cafile=apache_kafka.ssl_cafile, ssl_certfile=apache_kafka.ssl_certfile,
                        ssl_keyfile=apache_kafka.ssl_keyfile, acks=0, enable_idempotence=False,
                        linger_ms=5) as producer:
        for value in values:
            await producer.enqueue(topic, value)
    got = await asyncio.to_thread(consume_all, apache_kafka.bootstrap, topic, len(values))
    assert len(got) == len(values), f"{len(values) - len(got)} records lost at close()"
    assert [r.value for r in got] == values


async def test_tls_without_the_client_certificate_is_refused(apache_kafka):
    """The listener requires a client certificate (ssl.client.auth=required): without one the
    handshake fails, so the certificate in the test above was what let the producer in."""
    producer = Producer(apache_kafka.bootstrap_for("SSL"), security_protocol="SSL",
                        ssl_cafile=apache_kafka.ssl_cafile, request_timeout_ms=5000,
                        socket_connection_setup_timeout_ms=2000,
                        socket_connection_setup_timeout_max_ms=2000)
    with pytest.raises(KafkaConnectionError, match="(?i)bad certificate"):
        await asyncio.wait_for(producer.start(), 30)
    await producer.close()


async def test_a_tls_client_against_kafkas_plaintext_listener_says_so(apache_kafka):
    """security_protocol="SSL" against Kafka's PLAINTEXT listener: Kafka reads the TLS
    ClientHello as a request's size and closes the connection. It said "cannot connect to
    127.0.0.1:PORT: . Is a Kafka broker running there?" (an empty reason, at a broker that
    took the connection); librdkafka asks "connecting to a PLAINTEXT broker listener?"."""
    producer = Producer(apache_kafka.bootstrap, security_protocol="SSL",
                        ssl_cafile=apache_kafka.ssl_cafile, max_block_ms=20_000)
    with pytest.raises(KafkaConnectionError) as raised:
        await asyncio.wait_for(producer.start(), 30)
    said = str(raised.value)
    assert "but its TLS handshake was cut short by the broker" in said, said
    assert "is it a TLS listener? (security_protocol='SSL';" in said, said


async def test_a_client_without_sasl_at_kafkas_sasl_listener_says_so(apache_kafka):
    """security_protocol left at PLAINTEXT against Kafka's SASL_PLAINTEXT listener: Kafka
    answers ApiVersions, then closes the connection at the first other request. It said only
    "connection to 127.0.0.1:PORT lost"."""
    producer = Producer(apache_kafka.bootstrap_for("SASL_PLAINTEXT"), max_block_ms=20_000)
    with pytest.raises(KafkaConnectionError) as raised:
        await asyncio.wait_for(producer.start(), 30)
    said = str(raised.value)
    assert "closed the connection after answering only ApiVersions: is it a SASL listener?" \
        in said, said
