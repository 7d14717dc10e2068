"""SASL mechanisms against the RFC test vectors (Tansu's memory build cannot create users, so
the exchange with a broker is not exercised here)."""

import pytest

from aioproducer.errors import AuthenticationError
from aioproducer.protocol.sasl import OAuthBearer, Plain, Scram


def test_scram_sha_256_rfc7677_vector():
    scram = Scram("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.step(None) == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert scram.step(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert scram.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert scram.done


def test_scram_rejects_a_server_that_does_not_know_the_password():
    scram = Scram("SCRAM-SHA-512", "user", "pencil", nonce="abc")
    scram.step(None)
    scram.step(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(AuthenticationError, match="signature"):
        scram.step(b"v=AAAA")
    assert not scram.done


def test_scram_server_error_and_bad_nonce():
    scram = Scram("SCRAM-SHA-256", "user", "pencil", nonce="abc")
    scram.step(None)
    with pytest.raises(AuthenticationError, match="malformed"):
        scram.step(b"r=other,s=AAAA,i=1")


def test_credentials_never_in_repr():
    for mech in (Plain("alice", "s3cret"), Scram("SCRAM-SHA-256", "alice", "s3cret")):
        assert "s3cret" not in repr(mech) and "alice" not in repr(mech)


def test_plain_message():
    plain = Plain("alice", "s3cret")
    assert plain.step(None) == b"\0alice\0s3cret"
    assert plain.step(b"") is None and plain.done


def test_oauthbearer_message_and_refusal():
    """RFC 7628's client message: the token and the SASL extensions (KIP-342). A server
    that refuses sends an error document, acknowledged with 0x01, after which it answers
    with its error code."""
    bearer = OAuthBearer("eyJ.tok.en", {"logicalCluster": "lkc-1"})
    assert bearer.step(None) == b"n,,\x01auth=Bearer eyJ.tok.en\x01logicalCluster=lkc-1\x01\x01"
    assert bearer.step(b"") is None and bearer.done
    refused = OAuthBearer("eyJ.tok.en")
    refused.step(None)
    assert refused.step(b'{"status":"invalid_token"}') == b"\x01" and not refused.done
    assert "eyJ" not in repr(bearer)
    for bad in ("", "two words", "ctl\x01", "new\nline", "tab\t", "caf\u00e9", "=leading"):
        with pytest.raises(AuthenticationError, match="empty token or one with characters"):
            OAuthBearer(bad)
    OAuthBearer("a-b_c.d~e+f/g==")  # every character RFC 6750's b64token allows


def _server_first(scram: Scram, rest: bytes) -> bytes:
    scram.step(None)
    return b"r=" + scram._nonce.encode() + b"srv," + rest


@pytest.mark.parametrize("rest, says", [
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4095", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=16385", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=2147483647", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=abc", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=-1", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=\xd9\xa4\xd9\xa0\xd9\xa9\xd9\xa6", "iteration count"),
    (b"s=W22ZaJ0SNY7soEsUEjb6gQ==", "iteration count"),  # no i=
    (b"i=4096", "no s="),
    (b"s=not*base64,i=4096", "not base64"),
    (b"s=W22Z\xff\xfe,i=4096", "not UTF-8"),
])
def test_scram_refuses_every_malformed_server_first_message(rest, says):
    """The Java client refuses fewer than 4096 iterations; more than Kafka's 16384 would
    stall the client (2**31-1: minutes of CPU); a count that is no number, a missing or
    broken salt, or bytes that are no UTF-8 are an AuthenticationError, never a bare
    ValueError or UnicodeDecodeError out of start(). No proof is sent for any of them."""
    scram = Scram("SCRAM-SHA-512", "user", "pencil")
    with pytest.raises(AuthenticationError, match=says):
        scram.step(_server_first(scram, rest))


@pytest.mark.parametrize("final", [b"\xff\xfe", b"v=***", b"nothing=here"])
def test_scram_refuses_a_malformed_server_final_message(final):
    scram = Scram("SCRAM-SHA-256", "user", "pencil")
    scram.step(_server_first(scram, b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"))
    with pytest.raises(AuthenticationError):
        scram.step(final)
    assert not scram.done


def test_scram_takes_kafkas_whole_range_of_iteration_counts():
    for iterations in (b"4096", b"16384"):
        scram = Scram("SCRAM-SHA-256", "user", "pencil")
        assert scram.step(_server_first(scram, b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=" + iterations))


@pytest.mark.parametrize("extensions", [
    {"traceId": "a\x01auth=Bearer other"},  # would inject a field into the message
    {"bad name": "v"}, {"auth": "v"}, {"x1": "v"}, {"ok": ""}, {"ok": "caf\u00e9"},
    {"ok": "nul\x00"},
])
def test_oauthbearer_extensions_follow_the_java_clients_patterns(extensions):
    with pytest.raises(AuthenticationError, match="extension"):
        OAuthBearer("eyJ.tok.en", extensions)


def test_oauthbearer_extension_values_may_hold_what_java_allows():
    bearer = OAuthBearer("tok", {"logicalCluster": "lkc-1 x\t\r\n~!"})
    assert bearer.step(None).endswith(b"logicalCluster=lkc-1 x\t\r\n~!\x01\x01")


def test_plain_keeps_no_copy_of_the_credentials_once_sent():
    plain = Plain("alice", "s3cret")
    plain.step(None)
    assert not any(b"s3cret" in value for value in vars(plain).values()
                   if isinstance(value, bytes))
