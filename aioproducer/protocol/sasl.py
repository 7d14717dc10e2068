"""SASL mechanisms as pure state machines: bytes from the server in, bytes to send out.

The connection carries each step in a SaslAuthenticate request (after SaslHandshake names the
mechanism, KIP-152). PLAIN sends the credentials in one message, so use it only over TLS.
SCRAM (RFC 5802, RFC 7677) never sends the password and checks the server's signature, so a
server that does not know the password cannot pose as the broker. OAUTHBEARER (RFC 7628,
KIP-255) sends a bearer token the caller obtained (Confluent Cloud, MSK IAM, Event Hubs...):
like PLAIN, it belongs on TLS.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

from ..errors import AuthenticationError

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

# The iteration counts a SCRAM server may ask for: Kafka's own bounds (ScramMechanism's
# minIterations and maxIterations; a Kafka broker stores no credential outside them). The Java
# client refuses fewer than 4096; more than 16384 only costs the client time (2**31-1 takes
# minutes of CPU), so a server that asks for it is refused too.
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 16384

# The Java client's patterns (OAuthBearerClientInitialResponse): a token is an RFC 6750
# b64token, an extension a name of letters and a value of printable ASCII, space, tab, CR or
# LF; anything else (a \x01) would end a field of the message and inject another.
_TOKEN = re.compile(r"[-_~+/.a-zA-Z0-9]+=*")
_EXTENSION_KEY = re.compile(r"[A-Za-z]+")
_EXTENSION_VALUE = re.compile(r"[\x21-\x7E \t\r\n]+")


class SaslMechanism:
    """One authentication exchange; `step()` until `done`."""

    name: str
    done = False
    # Whether a step may take long enough (SCRAM's key derivation) to run off the event loop.
    costly = False

    def step(self, challenge: bytes | None) -> bytes | None:
        """Answer the server's last message (None at the start); None: nothing more to send."""
        raise NotImplementedError


class Plain(SaslMechanism):
    name = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        self._message: bytes | None = b"\0" + username.encode() + b"\0" + password.encode()

    def __repr__(self) -> str:
        return "<SASL PLAIN>"  # never the credentials

    def step(self, challenge: bytes | None) -> bytes | None:
        if challenge is None:
            message, self._message = self._message, None  # sent once: kept no longer
            return message
        self.done = True
        return None


class Scram(SaslMechanism):
    costly = True  # PBKDF2 with up to SCRAM_MAX_ITERATIONS

    def __init__(self, name: str, username: str, password: str, nonce: str | None = None) -> None:
        if name not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"unknown SCRAM mechanism {name!r}")
        self.name = name
        self._hash = hashlib.sha256 if name.endswith("256") else hashlib.sha512
        self._password = password.encode()
        self._nonce = nonce or secrets.token_urlsafe(24)
        user = username.replace("=", "=3D").replace(",", "=2C")
        self._client_first_bare = f"n={user},r={self._nonce}"
        self._server_signature = b""
        self._state = "start"

    def __repr__(self) -> str:
        return f"<SASL {self.name}>"  # never the credentials

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()

    def step(self, challenge: bytes | None) -> bytes | None:
        if self._state == "start":
            self._state = "first-sent"
            return ("n,," + self._client_first_bare).encode()
        if challenge is None:
            raise AuthenticationError(f"{self.name}: the server sent nothing")
        try:
            message = challenge.decode()
        except UnicodeDecodeError:
            raise AuthenticationError(f"{self.name}: the server's message is not UTF-8") from None
        if self._state == "first-sent":
            self._state = "final-sent"
            return self._client_final(message)
        if self._state == "final-sent":
            fields = _parse(message)
            if "e" in fields:
                raise AuthenticationError(f"{self.name} failed: the server says {fields['e']!r}")
            signature = self._base64(fields.get("v"), "v")
            if not hmac.compare_digest(signature, self._server_signature):
                raise AuthenticationError(
                    f"{self.name}: the server's signature is wrong (not the broker we expected?)")
            self.done = True
            return None
        raise AuthenticationError(f"{self.name}: unexpected message after the exchange ended")

    def _base64(self, text: str | None, field: str) -> bytes:
        if text is None:
            raise AuthenticationError(f"{self.name}: the server's message has no {field}=")
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error:
            raise AuthenticationError(f"{self.name}: the server's {field}= is not base64") from None

    def _client_final(self, server_first: str) -> bytes:
        fields = _parse(server_first)
        if "e" in fields:
            raise AuthenticationError(f"{self.name} failed: the server says {fields['e']!r}")
        nonce, iterations = fields.get("r", ""), fields.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise AuthenticationError(f"{self.name}: malformed server message (its nonce "
                                      "does not extend ours)")
        salt = self._base64(fields.get("s"), "s")
        if not (iterations.isascii() and iterations.isdigit()) or \
                not SCRAM_MIN_ITERATIONS <= int(iterations) <= SCRAM_MAX_ITERATIONS:
            raise AuthenticationError(
                f"{self.name}: the server asks for an iteration count (i=) outside "
                f"{SCRAM_MIN_ITERATIONS}-{SCRAM_MAX_ITERATIONS}, the range Kafka allows "
                "(fewer weakens the password's protection; more would stall the client)")
        salted = hashlib.pbkdf2_hmac(self._hash().name, self._password, salt, int(iterations))
        client_key = self._hmac(salted, b"Client Key")
        stored_key = self._hash(client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


class OAuthBearer(SaslMechanism):
    """The client's one message: the token and any SASL extensions (KIP-342). A server that
    refuses answers with an error document (RFC 7628 3.2.2), which we acknowledge with
    a single 0x01, so that it ends the exchange with its error code."""

    name = "OAUTHBEARER"

    def __init__(self, token: str, extensions: dict[str, str] | None = None) -> None:
        if not _TOKEN.fullmatch(token):
            raise AuthenticationError("the OAUTHBEARER token provider returned an empty token "
                                      "or one with characters a bearer token cannot hold "
                                      "(RFC 6750: letters, digits, -._~+/ and trailing =)")
        for key, value in (extensions or {}).items():
            if not isinstance(key, str) or not _EXTENSION_KEY.fullmatch(key) or key == "auth":
                raise AuthenticationError("an OAUTHBEARER extension's name must be letters "
                                          "only, and not 'auth'")
            if not isinstance(value, str) or not _EXTENSION_VALUE.fullmatch(value):
                raise AuthenticationError(
                    f"OAUTHBEARER extension {key!r}: its value must be printable ASCII, space, "
                    "tab, CR or LF (not shown: it may be a secret)")
        extra = "".join(f"{key}={value}\x01" for key, value in (extensions or {}).items())
        self._message = f"n,,\x01auth=Bearer {token}\x01{extra}\x01".encode()
        self._state = "start"

    def __repr__(self) -> str:
        return "<SASL OAUTHBEARER>"  # never the token

    def step(self, challenge: bytes | None) -> bytes | None:
        if self._state == "start":
            self._state = "sent"
            return self._message
        if challenge:  # the server's error document: acknowledge, it answers with the error
            self._state = "refused"
            return b"\x01"
        self.done = True
        return None


def _parse(message: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in message.split(",") if "=" in part)


def mechanism(name: str, username: str, password: str) -> SaslMechanism:
    """The mechanism named by the `sasl_mechanism` setting (not OAUTHBEARER, whose token
    comes from the caller's provider)."""
    if name == "PLAIN":
        return Plain(username, password)
    return Scram(name, username, password)
