"""The server's side of SASL for SimulatedCluster: PLAIN, SCRAM (by `scramp`, an implementation
independent of the client's) and OAUTHBEARER (RFC 7628, with an unsecured-JWT validator as
Kafka's default one)."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import time
from typing import Any, Callable, Mapping

TokenValidator = Callable[[str], "Principal"]


class SaslFailure(Exception):
    """The client failed to authenticate; the message is sent to it (never a secret)."""


class Principal:
    """Who authenticated, and until when the credential is good (None: no end)."""

    def __init__(self, name: str, expires_at: float | None = None) -> None:
        self.name = name
        self.expires_at = expires_at

    def __repr__(self) -> str:
        return f"<Principal {self.name!r}>"


class SaslExchange:
    """One authentication: `step()` takes each client message and returns the server's answer;
    `principal` is set once it succeeds."""

    principal: Principal | None = None

    def step(self, message: bytes) -> bytes:
        raise NotImplementedError


class PlainExchange(SaslExchange):
    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users

    def step(self, message: bytes) -> bytes:
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("malformed PLAIN message: expected authzid NUL user NUL password")
        user, password = parts[1].decode(errors="replace"), parts[2]
        expected = self._users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password):
            raise SaslFailure("Authentication failed: Invalid username or password")
        self.principal = Principal(user)
        return b""


class ScramExchange(SaslExchange):
    """RFC 5802 server side by `scramp`: client-first, then client-final."""

    def __init__(self, mechanism: str, credentials: Callable[[str], tuple[Any, ...]]) -> None:
        import scramp  # an extra (testing): Listener checks that it is there

        self._error = scramp.ScramException
        self._server = scramp.ScramMechanism(mechanism).make_server(credentials)
        self._mechanism = mechanism
        self._user: str | None = None

    def step(self, message: bytes) -> bytes:
        try:
            if self._user is None:
                text = message.decode()
                self._server.set_client_first(text)
                self._user = _scram_user(text)
                return self._server.get_server_first().encode()  # type: ignore[no-any-return]
            self._server.set_client_final(message.decode())
            final = self._server.get_server_final().encode()
        except (self._error, UnicodeDecodeError, KeyError):
            raise SaslFailure("Authentication failed during authentication due to invalid "
                              f"credentials with SASL mechanism {self._mechanism}") from None
        self.principal = Principal(self._user)
        return final  # type: ignore[no-any-return]


def _scram_user(client_first: str) -> str:
    bare = client_first.split(",", 2)[2]
    for attribute in bare.split(","):
        if attribute.startswith("n="):
            return attribute[2:].replace("=2C", ",").replace("=3D", "=")
    raise KeyError("n")


class ScramCredentials:
    """Salted credentials per mechanism and user, made once (PBKDF2 is slow on purpose)."""

    ITERATIONS = 4096  # Kafka's minimum

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users
        self._made: dict[tuple[str, str], tuple[Any, ...]] = {}

    def lookup(self, mechanism: str) -> Callable[[str], tuple[Any, ...]]:
        def credentials(user: str) -> tuple[Any, ...]:
            if user not in self._users:
                raise KeyError(user)  # scramp turns it into a failed exchange
            if (mechanism, user) not in self._made:
                import scramp
                self._made[mechanism, user] = scramp.ScramMechanism(mechanism).make_auth_info(
                    self._users[user], iteration_count=self.ITERATIONS)
            return self._made[mechanism, user]
        return credentials

    def __repr__(self) -> str:
        return f"<ScramCredentials of {len(self._users)} users>"


class OAuthBearerExchange(SaslExchange):
    """RFC 7628's client first message `n,,\\x01auth=Bearer <token>\\x01\\x01`; the token is
    the validator's to judge."""

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator

    def step(self, message: bytes) -> bytes:
        try:
            gs2, rest = message.decode().split("\x01", 1)
        except (UnicodeDecodeError, ValueError):
            raise SaslFailure("malformed OAUTHBEARER message") from None
        pairs = dict(item.split("=", 1) for item in rest.split("\x01") if "=" in item)
        scheme, _, token = pairs.get("auth", "").partition(" ")
        if not gs2.startswith(("n,", "y,")) or scheme.lower() != "bearer" or not token:
            raise SaslFailure("malformed OAUTHBEARER message: no 'auth=Bearer <token>'")
        self.principal = self._validator(token)
        return b""


def unsecured_jwt(token: str) -> Principal:
    """Kafka's default validator: an unsecured JWT (`alg` none) with a subject, not expired."""
    try:
        header_part, payload_part = token.split(".")[:2]
        header = json.loads(_b64url(header_part))
        claims = json.loads(_b64url(payload_part))
    except (ValueError, binascii.Error):
        raise SaslFailure("the token is not a JWT (header.payload.signature, base64url)") from None
    if not isinstance(header, dict) or header.get("alg") != "none":
        raise SaslFailure("the token is not an unsecured JWT (alg must be 'none')")
    if not isinstance(claims, dict) or not isinstance(claims.get("sub"), str):
        raise SaslFailure("the token has no 'sub' (subject) claim")
    expires = claims.get("exp")
    if not isinstance(expires, (int, float)):
        raise SaslFailure("the token has no 'exp' (expiry) claim")
    if expires <= time.time():
        raise SaslFailure(f"the token expired at {expires} (now {time.time():.0f})")
    return Principal(claims["sub"], float(expires))


def _b64url(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
