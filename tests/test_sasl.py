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
    for bad in ("", "two words", "ctl\x01"):
        with pytest.raises(AuthenticationError, match="empty token or one with spaces"):
            OAuthBearer(bad)
