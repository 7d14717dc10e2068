"""TLS and SASL settings.

Tansu 0.6 cannot serve TLS here (its CLI refuses --cert together with --key, and with a
combined PEM the handshake never completes), so TLS is terminated by a proxy built on
Python's ssl module in front of the broker, which advertises the proxy. SASL cannot be
exercised: the memory-storage Tansu has no users; the mechanisms are tested with the RFC
vectors in test_sasl.py.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from aioproducer import Producer, ProducerConfig
from aioproducer.errors import AuthenticationError, ConfigError, KafkaConnectionError
from aioproducer.testing import EmbeddedBroker
from tests.support.ports import free_port
from tests.support.proxy import FaultProxy
from tests.support.readback import fetch_raw_batches


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def tls_broker(ca, tmp_path):
    """A broker reached only through TLS, with a certificate for 127.0.0.1 from `ca`."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    proxy_port = free_port()
    with EmbeddedBroker(advertised_port=proxy_port) as broker:
        with FaultProxy(broker.port, proxy_port, tls=server):
            cafile = tmp_path / "ca.pem"
            ca.cert_pem.write_to_path(str(cafile))
            yield broker, f"127.0.0.1:{proxy_port}", str(cafile)


async def test_produce_over_tls(tls_broker):
    broker, bootstrap, cafile = tls_broker
    broker.create_topic("secure", 1)
    async with Producer(bootstrap, security_protocol="SSL", ssl_cafile=cafile) as producer:
        md = await producer.send("secure", b"encrypted in transit", key=b"k")
    assert md.offset == 0
    [batch] = fetch_raw_batches(f"127.0.0.1:{broker.port}", "secure", 0)
    assert batch.records[0][1:3] == (b"k", b"encrypted in transit")


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


async def test_hostname_is_checked_unless_disabled(ca, tmp_path):
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("kafka.example").configure_cert(server)  # not our address
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    proxy_port = free_port()
    with EmbeddedBroker(advertised_port=proxy_port) as broker, \
            FaultProxy(broker.port, proxy_port, tls=server):
        broker.create_topic("named", 1)
        bootstrap = f"127.0.0.1:{proxy_port}"
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
    proxy_port = free_port()
    with EmbeddedBroker(advertised_port=proxy_port) as broker:
        broker.create_topic("mtls", 1)
        with FaultProxy(broker.port, proxy_port, tls=server):
            bootstrap = f"127.0.0.1:{proxy_port}"
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
