"""TLS and SASL settings.

Tansu 0.6 cannot serve TLS here (its CLI refuses --cert together with --key, and with a
combined PEM the handshake never completes), so TLS is terminated by a proxy built on
Python's ssl module in front of the broker, which advertises the proxy. The memory-storage
Tansu has no users, so SASL is served by a SimulatedCluster (aioproducer.testing) in front of
it; the mechanisms themselves are tested with the RFC vectors in test_sasl.py. Secrets
(passwords, keys, tokens, what a token provider raised) stay out of reprs, errors and logs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import select
import ssl
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from aioproducer import Producer, ProducerConfig
from aioproducer.errors import AuthenticationError, ConfigError, KafkaConnectionError
from aioproducer.testing import EmbeddedBroker, Listener, SimulatedCluster
from tests.support.backpressure import fill_a_broker_that_stops_reading
from tests.support.proxy import FaultProxy
from tests.support.readback import fetch_raw_batches
from tests.support.simulated import require_embedded


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def tls_proxy(ca, tmp_path):
    """A broker reached only through TLS, with a certificate for 127.0.0.1 from `ca`, and
    the proxy that terminates it: (broker, proxy, bootstrap, CA file)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    with FaultProxy(tls=server) as proxy, \
            EmbeddedBroker(advertised_port=proxy.port) as broker:
        proxy.upstream_port = broker.port
        cafile = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(cafile))
        yield broker, proxy, f"127.0.0.1:{proxy.port}", str(cafile)


@pytest.fixture
def tls_broker(tls_proxy):
    """(broker, bootstrap, CA file) of `tls_proxy`."""
    broker, _, bootstrap, cafile = tls_proxy
    return broker, bootstrap, cafile


async def test_produce_over_tls(tls_broker):
    broker, bootstrap, cafile = tls_broker
    broker.create_topic("secure", 1)
    async with Producer(bootstrap, security_protocol="SSL", ssl_cafile=cafile) as producer:
        md = await producer.send("secure", b"encrypted in transit", key=b"k")
    assert md.offset == 0
    [batch] = fetch_raw_batches(f"127.0.0.1:{broker.port}", "secure", 0)
    assert batch.records[0][1:3] == (b"k", b"encrypted in transit")


async def test_acks_0_close_over_tls_loses_nothing(tls_broker):
    """At acks=0 a record is done once its request is written. TLS cannot half-close the
    connection (no FIN after the last request), so close() closed it at once and the broker
    lost what it had not read yet; now close() waits for the broker's answer to one more
    request, which it handles only after those before it."""
    broker, bootstrap, cafile = tls_broker
    broker.create_topic("blind", 1)
    values = [b"%05d" % i + bytes(2000) for i in range(2000)]
    async with Producer(bootstrap, security_protocol="SSL", ssl_cafile=cafile, acks=0,
                        enable_idempotence=False, linger_ms=5) as producer:
        for value in values:
            await producer.enqueue("blind", value)
    batches = await asyncio.to_thread(fetch_raw_batches, f"127.0.0.1:{broker.port}", "blind", 0)
    stored = [record[2] for batch in batches for record in batch.records]
    assert len(stored) == len(values), f"{len(values) - len(stored)} records lost at close()"
    assert stored == values


async def test_acks_0_a_broker_that_stops_reading_makes_enqueue_wait_over_tls(tls_proxy):
    """asyncio's TLS transport pauses its protocol too: at acks=0 the bytes a broker does not
    take wait in the accumulator (enqueue() raises BufferExhaustedError after max_block_ms),
    not in the TLS transport's buffer, and every record accepted arrives once it reads."""
    broker, proxy, bootstrap, cafile = tls_proxy
    broker.create_topic("backed-up", 1)
    accepted = await fill_a_broker_that_stops_reading(
        bootstrap, proxy, "backed-up", security_protocol="SSL", ssl_cafile=cafile)
    batches = await asyncio.to_thread(fetch_raw_batches, f"127.0.0.1:{broker.port}",
                                      "backed-up", 0)
    assert [record[2] for batch in batches for record in batch.records] == accepted


async def test_wrong_ca_is_refused_clearly(tls_broker, tmp_path):
    _, bootstrap, _ = tls_broker
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    producer = Producer(bootstrap, security_protocol="SSL", ssl_cafile=str(other))
    with pytest.raises(AuthenticationError, match="TLS handshake .* failed.*ssl_cafile"):
        await asyncio.wait_for(producer.start(), 10)


async def test_a_start_that_cannot_read_its_tls_files_can_be_retried(tls_broker, ca, tmp_path):
    """The CA file is not there yet when the service starts (a secret mounted late): start()
    says so, and the same producer starts once it is there, as after any failed start (it
    used to say "this producer was closed; create a new one")."""
    broker, bootstrap, _ = tls_broker
    broker.create_topic("late-ca", 1)
    cafile = tmp_path / "late-ca.pem"
    producer = Producer(bootstrap, security_protocol="SSL", ssl_cafile=str(cafile))
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        await asyncio.wait_for(producer.start(), 10)
    ca.cert_pem.write_to_path(str(cafile))
    await asyncio.wait_for(producer.start(), 10)
    try:
        assert (await asyncio.wait_for(producer.send("late-ca", b"v"), 10)).offset == 0
    finally:
        await asyncio.wait_for(producer.close(), 10)


async def test_plaintext_client_against_tls_broker_fails_clearly(tls_broker):
    _, bootstrap, _ = tls_broker
    producer = Producer(bootstrap, request_timeout_ms=2000)
    with pytest.raises(Exception, match=bootstrap):
        await asyncio.wait_for(producer.start(), 15)


async def test_a_tls_client_against_a_plaintext_listener_says_so(broker):
    """security_protocol="SSL" against a PLAINTEXT listener (the embedded broker's, which
    reads the TLS ClientHello as the start of a request and waits for the rest): it said
    "connecting to ... timed out after 1.0 s: is the broker reachable from here?", though the
    connection was made and the broker took it."""
    # (3 s: the TCP connect itself must not time out on a loaded machine)
    producer = Producer(broker.bootstrap, security_protocol="SSL",
                        socket_connection_setup_timeout_ms=3000,
                        socket_connection_setup_timeout_max_ms=3000, max_block_ms=20_000)
    with pytest.raises(KafkaConnectionError) as raised:
        await asyncio.wait_for(producer.start(), 30)
    said = str(raised.value)
    assert f"connected to {broker.bootstrap}, but its TLS handshake" in said, said
    assert "is it a TLS listener? (security_protocol='SSL';" in said, said
    assert "is the broker reachable from here" not in said, said


async def test_hostname_is_checked_unless_disabled(ca, tmp_path):
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("kafka.example").configure_cert(server)  # not our address
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    with FaultProxy(tls=server) as proxy, \
            EmbeddedBroker(advertised_port=proxy.port) as broker:
        proxy.upstream_port = broker.port
        broker.create_topic("named", 1)
        bootstrap = f"127.0.0.1:{proxy.port}"
        with pytest.raises(AuthenticationError, match="TLS handshake"):
            await Producer(bootstrap, security_protocol="SSL", ssl_cafile=str(cafile)).start()
        async with Producer(bootstrap, security_protocol="SSL", ssl_cafile=str(cafile),
                            ssl_check_hostname=False) as producer:
            assert (await producer.send("named", b"v")).offset == 0


def test_security_settings_are_validated_and_secrets_hidden():
    with pytest.raises(ConfigError, match="sasl_username and sasl_password"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol="SASL_SSL")
    with pytest.raises(ConfigError, match="security_protocol"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol="TLS")
    with pytest.raises(ConfigError, match="sasl_mechanism"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol="SASL_PLAINTEXT",
                                   sasl_mechanism="GSSAPI", sasl_username="u", sasl_password="p")
    config = ProducerConfig.from_kwargs(
        bootstrap_servers="h:1", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_username="alice", sasl_password="s3cret-pw")
    assert "s3cret-pw" not in repr(config) and "s3cret-pw" not in repr(Producer(config=config))


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
@pytest.mark.parametrize("given", [
    {"sasl_username": "alice", "sasl_password": "alice-secret"},
    {"sasl_username": "alice"},
    {"sasl_oauth_token_provider": lambda: "token"},
])
def test_sasl_credentials_without_a_sasl_security_protocol_are_refused(protocol, given):
    """Credentials given but security_protocol left at PLAINTEXT (or SSL): they were ignored,
    and at Kafka's SASL_PLAINTEXT listener start() said only "connection to 127.0.0.1:PORT
    lost" (Kafka closes a connection that sends Metadata before authenticating). Refused when
    the producer is made, as TLS files with a plaintext protocol are, never showing a value."""
    names = ", ".join(given)
    with pytest.raises(ConfigError) as raised:
        Producer("h:1", security_protocol=protocol, **given)
    assert str(raised.value) == (
        f"{names} given, but security_protocol={protocol} does not use SASL: set "
        "security_protocol='SASL_SSL' (or 'SASL_PLAINTEXT')")
    assert "alice-secret" not in str(raised.value)


def test_tls_settings_of_the_wrong_type_or_that_would_be_ignored_are_refused():
    """A ConfigError when the producer is made, naming the setting and never its value (some
    are secrets): before, bytes PEM text raised a bare TypeError at start(), and TLS files
    given with a plaintext protocol, beside ssl_context, or a key without its certificate
    were ignored without a word."""
    def refused(match: str, **settings: Any) -> str:
        with pytest.raises(ConfigError, match=match) as caught:
            Producer("h:1", **{"security_protocol": "SSL", **settings})
        return str(caught.value)

    message = refused("ssl_cert_pem must be a str, not bytes: decode it first",
                      ssl_cert_pem=b"-----BEGIN CERTIFICATE-----")
    assert "BEGIN" not in message
    assert "s3cret" not in refused("ssl_key_pem must be a str, not bytes",
                                   ssl_cert_pem="cert", ssl_key_pem=b"s3cret")
    refused("ssl_password must be a str, not int", ssl_certfile="c.pem", ssl_password=1234)
    refused("ssl_cafile must be a file path", ssl_cafile=123)
    refused("ssl_cafile given, but security_protocol=PLAINTEXT does not use TLS: set "
            "security_protocol='SSL'", security_protocol="PLAINTEXT", ssl_cafile="ca.pem")
    refused("ssl_cafile would be ignored: ssl_context is used as given",
            ssl_context=ssl.create_default_context(), ssl_cafile="ca.pem")
    refused("ssl_keyfile needs ssl_certfile", ssl_keyfile="key.pem")
    refused("ssl_key_pem needs ssl_cert_pem", ssl_key_pem="key")
    refused("give the client certificate once", ssl_certfile="c.pem", ssl_cert_pem="cert")
    refused("give the private key once", ssl_certfile="c.pem", ssl_keyfile="k.pem",
            ssl_key_pem="key")
    assert "hunter2" not in refused("ssl_password is the client key's password",
                                    ssl_cafile="ca.pem", ssl_password="hunter2")
    # What is right passes, a pathlib.Path as a file path too (files are read at start()).
    Producer("h:1", security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u",
             sasl_password="p", ssl_cafile=Path("ca.pem"), ssl_certfile="c.pem",
             ssl_keyfile="k.pem", ssl_password="pw", ssl_check_hostname=False)
    Producer("h:1", ssl_check_hostname=False)  # not a file: fine with PLAINTEXT


def _encrypted_key_pem(leaf: trustme.LeafCert, password: bytes) -> str:
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.BestAvailableEncryption(password)).decode()


async def test_client_certificate_from_pem_text_with_a_key_password(ca):
    """Mutual TLS with the CA, the client's certificate and its encrypted key given as PEM
    text (a secret store's values) and the key's password: the broker's TLS end requires
    the certificate and gets it; a wrong password is a ConfigError naming the settings, not
    the secrets; no repr shows the key or the password."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    server.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(server)
    client_leaf = ca.issue_cert("client@example.com")
    key_pem = _encrypted_key_pem(client_leaf, b"key-pw-42")
    settings = dict(security_protocol="SSL", ssl_ca_pem=ca.cert_pem.bytes().decode(),
                    ssl_cert_pem="".join(p.bytes().decode() for p in client_leaf.cert_chain_pems),
                    ssl_key_pem=key_pem, ssl_password="key-pw-42")
    with FaultProxy(tls=server) as proxy, \
            EmbeddedBroker(advertised_port=proxy.port) as broker:
        proxy.upstream_port = broker.port
        broker.create_topic("mtls", 1)
        bootstrap = f"127.0.0.1:{proxy.port}"
        async with Producer(bootstrap, **settings) as producer:
            assert "key-pw-42" not in repr(producer.config)
            assert "PRIVATE KEY" not in repr(producer.config)
            assert (await producer.send("mtls", b"v")).offset == 0
        with pytest.raises(ConfigError, match="ssl_password") as refused:
            await Producer(bootstrap, **dict(settings, ssl_password="wrong")).start()
        assert "wrong" not in str(refused.value) and "PRIVATE" not in str(refused.value)
        # Without a client certificate the broker's end refuses the handshake (under TLS
        # 1.3 the client learns it only as the connection closes).
        with pytest.raises(KafkaConnectionError):
            async with Producer(bootstrap, security_protocol="SSL",
                                ssl_ca_pem=settings["ssl_ca_pem"], max_block_ms=3000,
                                request_timeout_ms=3000, delivery_timeout_ms=6000) as bare:
                await bare.send("mtls", b"w")


# -- secrets in errors and logs, through SASL on a SimulatedCluster ------------------------

def _jwt(subject: str, lifetime_s: float) -> str:
    """An unsecured JWT (alg none), as Kafka's default OAUTHBEARER validator takes."""
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'exp': time.time() + lifetime_s})}."


def _all_text(exc: BaseException) -> str:
    """What a user or a log handler may print of an exception: str, repr and the traceback
    with its chain (cause and context)."""
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])


def _sasl_cluster(broker, **listener):
    require_embedded(broker)
    return SimulatedCluster(upstream=broker, lifetime=60, listeners={
        "SASL": Listener(sasl_mechanisms=["OAUTHBEARER", "PLAIN"], users={"alice": "x"},
                         **listener)})


async def test_a_failing_token_provider_leaks_nothing_it_raised(broker, caplog):
    """A token provider whose exception text holds a secret (a client secret in a refused
    token request, say), both when the producer starts and when it re-authenticates: the
    AuthenticationError names the provider and the exception's type, and neither it (str,
    repr, traceback with its cause and context) nor the log shows the secret."""
    secret = f"client_secret=SECRET-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)

    class LeakyProvider:
        def __init__(self, good_tokens: int) -> None:
            self.good_tokens = good_tokens
            self.calls = 0

        def __repr__(self) -> str:
            return f"<LeakyProvider {secret}>"  # a provider's repr is no safer

        async def token(self) -> str:
            self.calls += 1
            if self.calls > self.good_tokens:
                raise RuntimeError(f"the identity provider refused {secret}")
            return _jwt("carol", 60)

    with _sasl_cluster(broker, session_lifetime_ms=300) as cluster:
        settings = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                        max_block_ms=3000)
        with pytest.raises(AuthenticationError) as refused:
            await asyncio.wait_for(Producer(cluster.bootstrap_servers,
                                            sasl_oauth_token_provider=LeakyProvider(0),
                                            **settings).start(), 10)
        error = refused.value
        assert secret not in _all_text(error)
        assert error.__cause__ is None and error.__context__ is None
        assert "LeakyProvider" in str(error) and "RuntimeError" in str(error)

        # Good tokens for the first connections, then the provider fails: at the
        # re-authentication (sessions of 300 ms), which closes the connection.
        topic = f"leaky-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, 1)
        provider = LeakyProvider(2)
        async with Producer(cluster.bootstrap_servers, sasl_oauth_token_provider=provider,
                            delivery_timeout_ms=2000, request_timeout_ms=1000,
                            **settings) as producer:
            await asyncio.wait_for(producer.send(topic, b"v"), 10)
            deadline = time.monotonic() + 5
            while provider.calls <= 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
        assert provider.calls > 2, "no re-authentication asked the provider again"
    warnings = [r.getMessage() for r in caplog.records if "re-authenticating" in r.getMessage()]
    assert warnings and "LeakyProvider" in warnings[0], warnings
    assert secret not in caplog.text
    for record in caplog.records:
        if record.exc_info and record.exc_info[1] is not None:
            assert secret not in _all_text(record.exc_info[1])


async def test_no_secret_in_debug_logs_during_sasl_connects(broker, ca, caplog):
    """Every SASL mechanism over mutual TLS with an encrypted client key, with sessions of
    300 ms (so connections re-authenticate), a wrong password and an expired token: at
    DEBUG, no log record (message, arguments or traceback) holds the SASL password, the
    key's password, the key or an OAUTHBEARER token, and neither do the errors raised."""
    require_embedded(broker)
    caplog.set_level(logging.DEBUG)
    sasl_password, key_password = f"sasl-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    tokens: list[str] = []

    async def provider() -> str:
        tokens.append(_jwt("carol", 60))
        return tokens[-1]

    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    server.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(server)
    client_leaf = ca.issue_cert("client@example.com")
    key_pem = _encrypted_key_pem(client_leaf, key_password.encode())
    tls = dict(ssl_ca_pem=ca.cert_pem.bytes().decode(), ssl_key_pem=key_pem,
               ssl_cert_pem="".join(p.bytes().decode() for p in client_leaf.cert_chain_pems),
               ssl_password=key_password)
    mechanisms = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
    listener = Listener(tls=server, sasl_mechanisms=mechanisms, users={"alice": sasl_password},
                        session_lifetime_ms=300)
    errors: list[BaseException] = []
    with SimulatedCluster(upstream=broker, lifetime=60, listeners={"SECURE": listener}) as cluster:
        topic = f"secret-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, 3)
        for mechanism in mechanisms:
            sasl = dict(sasl_oauth_token_provider=provider) if mechanism == "OAUTHBEARER" \
                else dict(sasl_username="alice", sasl_password=sasl_password)
            async with Producer(cluster.bootstrap_servers, security_protocol="SASL_SSL",
                                sasl_mechanism=mechanism, linger_ms=0, **sasl, **tls) as producer:
                for i in range(6):  # 0.6 s: each connection re-authenticates
                    await asyncio.wait_for(producer.send(topic, b"v", partition=i % 3), 10)
                    await asyncio.sleep(0.1)
                assert producer.metrics().reauthentications >= 1
        for wrong in (dict(sasl_mechanism="SCRAM-SHA-512", sasl_username="alice",
                           sasl_password=sasl_password + "-wrong"),
                      dict(sasl_mechanism="OAUTHBEARER",
                           sasl_oauth_token_provider=lambda: _expired_token(tokens))):
            with pytest.raises(AuthenticationError) as refused:
                await asyncio.wait_for(Producer(cluster.bootstrap_servers,
                                                security_protocol="SASL_SSL", max_block_ms=3000,
                                                **wrong, **tls).start(), 10)
            errors.append(refused.value)
        assert cluster.stats.authentication_failures >= 2
    secrets = [sasl_password, key_password, "PRIVATE KEY", key_pem.splitlines()[1], *tokens]
    assert len(tokens) >= 3
    assert any(r.name.startswith("aioproducer") for r in caplog.records), \
        "aioproducer logged nothing at DEBUG: the check would be empty"
    texts = [caplog.text] + [_all_text(e) for e in errors] + [
        _all_text(r.exc_info[1]) for r in caplog.records if r.exc_info and r.exc_info[1]]
    for secret in secrets:
        for text in texts:
            assert secret not in text


def _expired_token(tokens: list[str]) -> str:
    tokens.append(_jwt("carol", -5))
    return tokens[-1]


_LOAD_IN_A_TERMINAL = """
import os, sys
os.open(sys.argv[1], os.O_RDWR)  # a session leader opening a tty: its controlling terminal
from aioproducer.config import ProducerConfig, ssl_context_for
config = ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol="SSL", **{
    "ssl_cert" + sys.argv[2]: sys.argv[3], "ssl_key" + sys.argv[2]: sys.argv[4]})
try:
    ssl_context_for(config)
except Exception as exc:
    print("raised", type(exc).__name__, exc, flush=True)
"""


@pytest.mark.parametrize("given", ["pem", "file"])
def test_an_encrypted_key_without_a_password_fails_instead_of_prompting(ca, tmp_path, given):
    """Without ssl_password, OpenSSL asks for an encrypted key's password on the terminal
    ("Enter PEM pass phrase:") and start() blocks until someone types; now a ConfigError says
    the key needs ssl_password. Run with a terminal (a pseudo-terminal), where the prompt
    would appear."""
    leaf = ca.issue_cert("client@example.com")
    cert = "".join(p.bytes().decode() for p in leaf.cert_chain_pems)
    key = _encrypted_key_pem(leaf, b"key-pw-42")
    if given == "file":
        (tmp_path / "cert.pem").write_text(cert)
        (tmp_path / "key.pem").write_text(key)
        args = ["file", str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")]
    else:
        args = ["_pem", cert, key]
    master, slave = os.openpty()
    try:
        child = subprocess.Popen([sys.executable, "-c", _LOAD_IN_A_TERMINAL, os.ttyname(slave),
                                  *args], stdin=slave, stdout=slave, stderr=slave,
                                 start_new_session=True)
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 30
        while child.poll() is None and b"pass phrase" not in seen and \
                time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:  # the child closed its end
                    break
        if child.poll() is None:
            child.kill()
        child.wait(10)
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert b"pass phrase" not in seen, seen
    assert b"raised ConfigError" in seen and b"give its password as ssl_password" in seen, seen


@pytest.mark.parametrize("settings, says", [
    ({"client_id": "bad\udc80"}, "client_id is not valid Unicode"),
    ({"client_id": "x" * 40_000}, "client_id is 40000 bytes"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
      "sasl_password": 12345}, "sasl_password must be a str, not int"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
      "sasl_password": "s3cret\udc80"}, "sasl_password is not valid Unicode"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": b"u",
      "sasl_password": "p"}, "sasl_username must be a str, not bytes"),
])
def test_client_id_and_sasl_credentials_are_checked_when_the_producer_is_made(settings, says):
    """They failed only at start() (UnicodeEncodeError, struct.error, AttributeError)."""
    with pytest.raises(ConfigError, match=says) as refused:
        Producer("h:1", **settings)
    assert "s3cret" not in str(refused.value)
