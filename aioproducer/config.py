"""ProducerConfig: Kafka's producer settings in snake case, validated, with clear errors.

Defaults follow the Java client (idempotent, acks=all) so configurations carry over; where
Kafka 4.0 changed a default (linger.ms 0 -> 5, KIP-1030) we take the new one.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import operator
import os
import re
import ssl
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence, TypedDict, Union

from .errors import ConfigError
from .hooks import ProducerHooks
from .protocol.compression import Codec
from .protocol.sasl import MECHANISMS as _SASL
from .serializers import Serializer, SerializerSetting

log = logging.getLogger(__name__)

_CODECS = tuple(codec.name.lower() for codec in Codec)
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_RECOVERY_STRATEGIES = ("rebootstrap", "none")
_MAX_INT = 2**31 - 1
# compression_level: what each codec's library accepts (gzip: zlib's -1 default and 0-9; zstd:
# its negative fast levels up to 22; lz4 takes any int, clamped).
_LEVELS = {"gzip": (-1, 9), "zstd": (-131072, 22)}


class TokenProvider(Protocol):
    """Where OAUTHBEARER tokens come from (aiokafka's AbstractTokenProvider fits): `token()`
    returns the token, or an awaitable of it, and is asked again for each connection and
    each re-authentication, so it can hand out a fresh token before the last expires. An
    optional `extensions()` returns SASL extensions (KIP-342), e.g. Confluent Cloud's
    logicalCluster and identityPoolId."""

    def token(self) -> str | Awaitable[str]:
        """The token to authenticate with now (a fresh one before the last expires)."""
        ...


# A TokenProvider, or a plain callable returning the token (or an awaitable of it).
TokenSource = Union[TokenProvider, Callable[[], Union[str, Awaitable[str]]]]

_ADDRESS = re.compile(r"^\s*(?:\[(?P<ipv6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\s\[\]]+)):(?P<port>\d+)\s*$")


class ProducerSettingsBase(TypedDict, total=False):
    """ProducerSettings but the serializers, which Producer's constructor takes by name (they
    type its keys and values)."""

    client_id: str
    acks: int | str
    enable_idempotence: bool
    linger_ms: int
    batch_size: int
    buffer_memory: int
    max_block_ms: int
    max_request_size: int
    receive_message_max_bytes: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    retries: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    reconnect_backoff_ms: int
    reconnect_backoff_max_ms: int
    socket_connection_setup_timeout_ms: int
    socket_connection_setup_timeout_max_ms: int
    max_in_flight_requests_per_connection: int
    compression_type: str | None  # (None: aiokafka's spelling of "none")
    compression_level: int | None
    metadata_max_age_ms: int
    metadata_max_idle_ms: int
    metadata_recovery_strategy: str
    metadata_recovery_rebootstrap_trigger_ms: int
    metadata_cluster_check_enable: bool
    allow_auto_create_topics: bool
    enable_metrics_push: bool
    transactional_id: str | None
    transaction_timeout_ms: int
    on_delivery_error: Callable[[BaseException, str, int, int], object] | None
    hooks: Sequence[ProducerHooks]
    partitioner: Callable[[str, bytes | None, int, Sequence[int]], int | None] | None
    partitioner_adaptive_partitioning_enable: bool
    partitioner_availability_timeout_ms: int
    partitioner_ignore_keys: bool
    security_protocol: str
    ssl_context: ssl.SSLContext | None
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    ssl_check_hostname: bool
    ssl_password: str | None
    ssl_ca_pem: str | None
    ssl_cert_pem: str | None
    ssl_key_pem: str | None
    sasl_mechanism: str
    sasl_username: str | None
    sasl_password: str | None
    sasl_oauth_token_provider: TokenSource | None


class ProducerSettings(ProducerSettingsBase, total=False):
    """The settings `Producer(...)` and `BlockingProducer(...)` take as keywords, typed, so a
    type checker catches a misspelt name or a wrong type (ProducerConfig validates the
    values when the producer is made; tests/test_config.py keeps the two lists one)."""

    key_serializer: SerializerSetting | None
    value_serializer: SerializerSetting | None


@dataclasses.dataclass(frozen=True)
class ProducerConfig:
    """Validated producer settings, for `Producer(config=...)`. Build with
    `from_kwargs(**settings)` or, from Kafka's dotted names and string values,
    `from_properties({"bootstrap.servers": "localhost:9092", "linger.ms": "5"})`. One built
    directly, `ProducerConfig(...)`, is validated when a Producer takes it."""

    bootstrap_servers: str | Sequence[str]
    client_id: str = "aioproducer"
    acks: Any = "all"
    enable_idempotence: bool = True
    linger_ms: int = 5
    batch_size: int = 262144  # (the Java client's is 16384: see the README's Settings)
    buffer_memory: int = 33554432
    max_block_ms: int = 60000
    max_request_size: int = 1048576
    # The largest response accepted (librdkafka's setting and default): a larger one closes
    # the connection before it is buffered. A hostile or broken broker's Metadata response
    # takes ~17 times its size in memory once decoded.
    receive_message_max_bytes: int = 100_000_000
    request_timeout_ms: int = 30000
    delivery_timeout_ms: int = 120000
    retries: int = _MAX_INT
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    socket_connection_setup_timeout_ms: int = 10000
    socket_connection_setup_timeout_max_ms: int = 30000
    max_in_flight_requests_per_connection: int = 5
    compression_type: str = "none"
    compression_level: int | None = None
    metadata_max_age_ms: int = 300000
    metadata_max_idle_ms: int = 300000  # stop fetching metadata of topics unused this long
    # KIP-899/KIP-1102: "rebootstrap" forgets the brokers metadata named and starts again from
    # bootstrap_servers when none of them can be reached, when none has given metadata for
    # metadata_recovery_rebootstrap_trigger_ms, or when a broker asks (REBOOTSTRAP_REQUIRED);
    # "none" keeps asking the known brokers.
    metadata_recovery_strategy: str = "rebootstrap"
    metadata_recovery_rebootstrap_trigger_ms: int = 300000
    # KIP-1242: tell each broker, when connecting, which cluster and node id the metadata said
    # is there; a broker that is not it (an address reused by another broker or cluster)
    # answers REBOOTSTRAP_REQUIRED instead of taking requests meant for another. Needs a
    # broker with ApiVersions v5 (Kafka 4.4) and the "rebootstrap" strategy.
    metadata_cluster_check_enable: bool = True
    allow_auto_create_topics: bool = True
    # KIP-714: push the producer's metrics to a broker that asks for them (one whose operator
    # set up a telemetry plugin and a client-metrics subscription), as the Java client does.
    enable_metrics_push: bool = True
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60000
    # A Serializer (given the topic and headers too) or a plain (obj) -> bytes callable.
    key_serializer: SerializerSetting | None = None
    value_serializer: SerializerSetting | None = None
    # Called as on_delivery_error(error, topic, partition, record_count) for each batch of
    # records that failed for good, whether or not anyone awaits them; errors it raises are
    # logged. Without it, such failures are logged (at most one line per 10 s).
    on_delivery_error: Callable[[BaseException, str, int, int], object] | None = None
    # ProducerHooks told of records, batches and requests as they go (aioproducer.hooks;
    # aioproducer.observability has OpenTelemetry's and Prometheus's).
    hooks: Sequence[ProducerHooks] = ()
    # Called as partitioner(topic, key, partition_count, partitions_with_a_leader) for each
    # record sent without an explicit partition, after serialization; returns the partition,
    # or None for the built-in choice (murmur2 of the key; keyless: sticky, KIP-794).
    partitioner: Callable[[str, bytes | None, int, Sequence[int]], int | None] | None = None
    # KIP-794, for keyless records: fewer records to partitions with more batches waiting
    # (a slow broker's); with a timeout, none to a broker that took no data for that long.
    partitioner_adaptive_partitioning_enable: bool = True
    partitioner_availability_timeout_ms: int = 0
    partitioner_ignore_keys: bool = False  # keyed records placed as keyless ones are
    security_protocol: str = "PLAINTEXT"
    ssl_context: Any = None  # an ssl.SSLContext; else one is built from the ssl_* settings
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    # The private key's password (ssl_keyfile or ssl_key_pem), and PEM text in place of the
    # files (a secret store's value, say): CA certificates, the client's certificate, its key.
    ssl_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_ca_pem: str | None = None
    ssl_cert_pem: str | None = None
    ssl_key_pem: str | None = dataclasses.field(default=None, repr=False)
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = dataclasses.field(default=None, repr=False)
    sasl_oauth_token_provider: Any = dataclasses.field(default=None, repr=False)
    # Derived by validation, not settings:
    bootstrap_addresses: tuple[tuple[str, int], ...] = dataclasses.field(default=(), repr=False)

    @classmethod
    def from_kwargs(cls, **settings: Any) -> "ProducerConfig":
        names = _setting_names()
        for name in settings:
            if name not in names:
                raise ConfigError(f"unknown setting {name!r}{_suggest(name, names)}")
        if "bootstrap_servers" not in settings:
            raise ConfigError("bootstrap_servers is required, e.g. \"localhost:9092\"")
        explicit_idempotence = settings.get("enable_idempotence")
        config = cls(**settings)
        return config._validated(explicit_idempotence, "batch_size" in settings)

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any]) -> "ProducerConfig":
        """Settings as Kafka's tools and property files give them: dotted names, string values."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        settings: dict[str, Any] = {}
        unknown: list[str] = []
        skipped: list[str] = []
        for key, raw in properties.items():
            name = key.strip().replace(".", "_").replace("-", "_")
            if name in _NOT_A_PRODUCERS:
                skipped.append(key.strip())
            elif name not in _setting_names():
                suggestion = _suggest(name, _setting_names())
                if "." in key:  # said in the key's own spelling: linger.ms, not linger_ms
                    suggestion = _dotted(suggestion)
                unknown.append(f"unknown setting {key!r}{suggestion}")
            else:
                settings[name] = _parse(name, fields[name].default, raw)
        if unknown:  # all at once: a file is not fixed one run per line
            raise ConfigError("\n".join(unknown))
        if skipped:
            log.warning("ignoring %s: settings of a consumer or of Schema Registry's client, "
                        "not of a producer", ", ".join(skipped))
        return cls.from_kwargs(**settings)

    def _check_tls(self, protocol: str) -> None:
        """The TLS settings' types, and combinations that would otherwise be ignored without a
        word. Values are never shown: some are secrets."""
        if self.ssl_context is not None and not isinstance(self.ssl_context, ssl.SSLContext):
            raise ConfigError("ssl_context must be an ssl.SSLContext")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"{name} must be a file path (str or os.PathLike), not "
                                  f"{type(value).__name__}")
        for name in ("ssl_password", "ssl_ca_pem", "ssl_cert_pem", "ssl_key_pem"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                hint = ": decode it first (.decode())" if isinstance(value, bytes) else ""
                raise ConfigError(f"{name} must be a str, not {type(value).__name__}{hint}")
        given = [name for name in _TLS_MATERIAL if getattr(self, name) is not None]
        if given and not protocol.endswith("SSL"):
            raise ConfigError(f"{', '.join(given)} given, but security_protocol={protocol} does "
                              "not use TLS: set security_protocol='SSL' (or 'SASL_SSL')")
        beside = [name for name in given if name != "ssl_context"]
        if self.ssl_context is not None and beside:
            raise ConfigError(f"{', '.join(beside)} would be ignored: ssl_context is used as "
                              "given (load the files into it, or leave ssl_context out)")
        if self.ssl_certfile is not None and self.ssl_cert_pem is not None:
            raise ConfigError("give the client certificate once: ssl_certfile or ssl_cert_pem")
        if self.ssl_keyfile is not None and self.ssl_key_pem is not None:
            raise ConfigError("give the private key once: ssl_keyfile or ssl_key_pem")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ConfigError("ssl_keyfile needs ssl_certfile (the certificate it is the key of)")
        if self.ssl_key_pem is not None and self.ssl_cert_pem is None:
            raise ConfigError("ssl_key_pem needs ssl_cert_pem (the certificate it is the key of)")
        if self.ssl_password is not None and self.ssl_certfile is None and \
                self.ssl_cert_pem is None:
            raise ConfigError("ssl_password is the client key's password: it needs the client "
                              "certificate and key (ssl_certfile/ssl_keyfile or "
                              "ssl_cert_pem/ssl_key_pem)")

    def _validated(self, explicit_idempotence: Any,
                   explicit_batch_size: bool = True) -> "ProducerConfig":
        # An int-like (numpy's and pandas' integers: a setting read from a DataFrame) is the
        # int it stands for; a bool is not a number here.
        whole: dict[str, Any] = {name: _whole(getattr(self, name)) for name, _ in _INT_SETTINGS}
        whole.update(compression_level=_whole(self.compression_level), acks=_whole(self.acks))
        self = dataclasses.replace(self, **{name: number for name, number in whole.items()
                                            if number is not None})
        changes: dict[str, Any] = {"bootstrap_addresses": _parse_bootstrap(self.bootstrap_servers)}
        # None is aiokafka's default spelling of no compression; "none" (Java's) is kept. Any
        # case, as security_protocol (the Java client's are lowercase, librdkafka any case);
        # acks="ALL" as well.
        codec = "none" if self.compression_type is None else self.compression_type
        codec = codec.lower() if isinstance(codec, str) else codec
        acks = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}.get(
            self.acks.strip().lower() if isinstance(self.acks, str) else
            self.acks if isinstance(self.acks, int) and not isinstance(self.acks, bool)
            else None)
        if acks is None:
            raise ConfigError(f"acks must be 0, 1 or \"all\" (or -1), not {self.acks!r}")
        changes["acks"] = acks
        for name, low in _INT_SETTINGS:
            _check_int(name, getattr(self, name), low)
        if codec not in _CODECS:
            raise ConfigError(f"compression_type must be one of {', '.join(_CODECS)}, not "
                              f"{self.compression_type!r}")
        changes["compression_type"] = codec
        if self.compression_level is not None:
            low, high = _LEVELS.get(codec, (-131072, _MAX_INT))
            _check_int("compression_level", self.compression_level, low, high,
                       f" with compression_type={codec!r}")
        # Any case, as the Java client takes it (a properties file may say "ssl").
        protocol = self.security_protocol.upper() if isinstance(self.security_protocol, str) \
            else self.security_protocol
        if protocol not in _PROTOCOLS:
            raise ConfigError(f"security_protocol must be one of {', '.join(_PROTOCOLS)}, not "
                              f"{self.security_protocol!r}")
        changes["security_protocol"] = protocol
        if protocol.startswith("SASL"):
            if self.sasl_mechanism not in _SASL:
                raise ConfigError(f"sasl_mechanism must be one of {', '.join(_SASL)}, not "
                                  f"{self.sasl_mechanism!r}")
            if self.sasl_mechanism == "OAUTHBEARER":
                provider = self.sasl_oauth_token_provider
                if not callable(getattr(provider, "token", None)) and not callable(provider):
                    raise ConfigError(
                        "sasl_mechanism=OAUTHBEARER needs sasl_oauth_token_provider: a callable "
                        "returning the token (or an awaitable of it), or an object with a "
                        "token() method")
            elif not self.sasl_username or self.sasl_password is None:
                raise ConfigError(f"security_protocol={protocol} needs "
                                  "sasl_username and sasl_password")
        else:  # (ignored, a SASL listener closed the connection: "connection ... lost")
            given = [name for name in ("sasl_username", "sasl_password",
                                       "sasl_oauth_token_provider")
                     if getattr(self, name) is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} given, but security_protocol={protocol} "
                                  "does not use SASL: set security_protocol='SASL_SSL' (or "
                                  "'SASL_PLAINTEXT')")
        self._check_tls(protocol)
        for name in ("enable_idempotence", "allow_auto_create_topics", "enable_metrics_push",
                     "metadata_cluster_check_enable",
                     "ssl_check_hostname",
                     "partitioner_adaptive_partitioning_enable", "partitioner_ignore_keys"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                hint = f" (bool() of any text but '' is True){_FROM_TEXT}" \
                    if isinstance(value, str) else ""
                raise ConfigError(f"{name} must be True or False, not {value!r}{hint}")
        strategy = self.metadata_recovery_strategy.lower() \
            if isinstance(self.metadata_recovery_strategy, str) else None  # any case, as Java
        if strategy not in _RECOVERY_STRATEGIES:
            raise ConfigError(f"metadata_recovery_strategy must be one of "
                              f"{', '.join(_RECOVERY_STRATEGIES)}, not "
                              f"{self.metadata_recovery_strategy!r}")
        changes["metadata_recovery_strategy"] = strategy
        if not isinstance(self.client_id, str):
            raise ConfigError(f"client_id must be a str, not {self.client_id!r}")
        _check_wire_string("client_id", self.client_id)
        for name in ("sasl_username", "sasl_password"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name} must be a str, not {type(value).__name__}")
            if value is not None:
                _check_wire_string(name, value, show=False)
        if self.transactional_id is not None and (
                not isinstance(self.transactional_id, str) or not self.transactional_id):
            raise ConfigError(f"transactional_id must be a non-empty str, not "
                              f"{self.transactional_id!r}")
        for name in ("key_serializer", "value_serializer"):
            serializer = getattr(self, name)
            if serializer is not None and not isinstance(serializer, Serializer) and \
                    not callable(serializer):
                raise ConfigError(f"{name} must be an aioproducer.serializers.Serializer or a "
                                  f"callable returning bytes, not {type(serializer).__name__}")
        if self.partitioner is not None:
            _check_partitioner(self.partitioner)
        if isinstance(self.hooks, ProducerHooks) or not isinstance(self.hooks, (list, tuple)) \
                or not all(isinstance(hook, ProducerHooks) for hook in self.hooks):
            raise ConfigError("hooks must be a list of aioproducer.hooks.ProducerHooks "
                              f"instances, not {self.hooks!r:.100}")
        changes["hooks"] = tuple(self.hooks)
        if self.on_delivery_error is not None and not callable(self.on_delivery_error):
            raise ConfigError("on_delivery_error must be a callable taken (error, topic, "
                              "partition, record_count)")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ConfigError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be at least linger_ms "
                f"+ request_timeout_ms ({self.linger_ms} + {self.request_timeout_ms})")
        for base, most in (("retry_backoff_ms", "retry_backoff_max_ms"),
                           ("socket_connection_setup_timeout_ms",
                            "socket_connection_setup_timeout_max_ms")):
            if getattr(self, most) < getattr(self, base):
                raise ConfigError(f"{most} ({getattr(self, most)}) must be at least {base} "
                                  f"({getattr(self, base)})")
        batch_size = min(self.batch_size, self.max_request_size)  # a batch fits in a request
        if not explicit_batch_size:  # only defaulted: no larger than buffer_memory holds
            batch_size = min(batch_size, self.buffer_memory)
        if batch_size != self.batch_size:
            changes["batch_size"] = batch_size
        if self.buffer_memory < batch_size:
            raise ConfigError(f"buffer_memory ({self.buffer_memory}) must be at least batch_size "
                              f"({batch_size}): a full batch takes batch_size bytes of it")
        conflicts = [text for bad, text in (
            (acks != -1, f"acks={self.acks!r} (needs \"all\")"),
            (self.retries == 0, "retries=0 (needs > 0)"),
            (self.max_in_flight_requests_per_connection > 5,
             f"max_in_flight_requests_per_connection="
             f"{self.max_in_flight_requests_per_connection} (needs <= 5)"),
        ) if bad]
        # Idempotence off with a transactional id: as told, or as one of ProducerConfig(...)
        # or dataclasses.replace() came (a Producer has no transactions without it).
        if self.transactional_id is not None and self.enable_idempotence is False and (
                explicit_idempotence is False or not conflicts):
            raise ConfigError("transactional_id needs enable_idempotence=True")
        if conflicts and (explicit_idempotence is True or self.transactional_id is not None):
            # (a user who set a transactional id and acks=1 never named enable_idempotence)
            cause = "enable_idempotence" if explicit_idempotence is True else \
                "transactional_id needs idempotence, which"
            raise ConfigError(f"{cause} conflicts with " + ", ".join(conflicts))
        if conflicts:
            changes["enable_idempotence"] = False  # only defaulted: off, as in the Java client
        return dataclasses.replace(self, **changes)


# The TLS settings that give a context its certificates and keys (ssl_check_hostname aside).
_TLS_MATERIAL = ("ssl_context", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
                 "ssl_ca_pem", "ssl_cert_pem", "ssl_key_pem")


def ssl_context_for(config: ProducerConfig) -> ssl.SSLContext | None:
    """The TLS context for SSL and SASL_SSL: the given one, or one that verifies brokers
    against ssl_cafile (else the system's CAs), with a client certificate if configured."""
    if not config.security_protocol.endswith("SSL"):
        return None
    if config.ssl_context is not None:
        given: ssl.SSLContext = config.ssl_context
        return given
    try:
        context = ssl.create_default_context(cafile=config.ssl_cafile,
                                             cadata=config.ssl_ca_pem)
        if config.ssl_certfile:
            context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile,
                                    password=_key_password(config.ssl_password))
        elif config.ssl_cert_pem:
            _load_pem_chain(context, config.ssl_cert_pem, config.ssl_key_pem, config.ssl_password)
    except ConfigError:  # _no_key_password's
        raise
    except (OSError, ssl.SSLError, ValueError) as exc:
        # The cause named, never a key or a password (no chained exception to show them).
        if isinstance(exc, ssl.SSLError):
            cause = exc.reason or type(exc).__name__  # BAD_DECRYPT: a wrong ssl_password
        elif isinstance(exc, OSError):
            cause = f"{exc.strerror or type(exc).__name__}: {exc.filename or ''}"
        else:
            cause = type(exc).__name__
        raise ConfigError(f"cannot load the TLS files or PEM text (ssl_cafile/ssl_ca_pem, "
                          f"ssl_certfile/ssl_cert_pem, ssl_keyfile/ssl_key_pem, "
                          f"ssl_password): {cause}") from None
    context.check_hostname = config.ssl_check_hostname
    return context


def _load_pem_chain(context: ssl.SSLContext, cert: str, key: str | None,
                    password: str | None) -> None:
    """load_cert_chain() from PEM text: Python's ssl reads certificates and keys only from
    files, so they go to a private temporary directory for the call and are removed."""
    with tempfile.TemporaryDirectory(prefix="aioproducer-tls-") as directory:
        cert_path = Path(directory, "cert.pem")
        cert_path.write_text(cert)
        key_path = None
        if key:
            key_path = Path(directory, "key.pem")
            key_path.touch(mode=0o600)
            key_path.write_text(key)
        context.load_cert_chain(cert_path, key_path, password=_key_password(password))


def _check_wire_string(name: str, value: str, show: bool = True) -> None:
    """A string the client writes as Kafka's STRING (an int16 length): UTF-8 (a lone
    surrogate is not) of at most 32767 bytes. Failing here, not at start() with a
    UnicodeEncodeError or struct.error."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ConfigError(f"{name} is not valid Unicode text (it holds a lone surrogate)"
                          + (f": {value!r}" if show else "")) from None
    if size > 32767:
        raise ConfigError(f"{name} is {size} bytes of UTF-8; Kafka's strings hold at most 32767")


def _key_password(password: str | None) -> str | Callable[[], str]:
    return password if password is not None else _no_key_password


def _no_key_password() -> str:
    """The password callback when ssl_password is not set: an encrypted key fails at once,
    where OpenSSL would otherwise prompt on the terminal and block start()."""
    raise ConfigError("the client's private key (ssl_keyfile/ssl_key_pem) is encrypted: give "
                      "its password as ssl_password")


def _setting_names() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(ProducerConfig)
                     if f.name != "bootstrap_addresses")


# Other clients' names (librdkafka's, as confluent-kafka takes them, and aiokafka's) for
# what has another name here, or needs no setting. difflib's nearest name for some was wrong:
# receive_message_max_bytes (the size of a response) for librdkafka's message.max.bytes (of
# a record), request_timeout_ms for message.timeout.ms (a record's whole time).
_OTHER_CLIENTS: dict[str, tuple[str | None, str]] = {
    "message_max_bytes": ("max_request_size", "librdkafka's name"),
    "queue_buffering_max_ms": ("linger_ms", "librdkafka's name"),
    "queue_buffering_max_kbytes": ("buffer_memory", "librdkafka's name; ours is in bytes"),
    "queue_buffering_max_messages": (None, "buffer_memory bounds the buffer, in bytes"),
    "batch_num_messages": (None, "batch_size bounds a batch, in bytes"),
    "message_timeout_ms": ("delivery_timeout_ms", "librdkafka's name"),
    "socket_timeout_ms": ("request_timeout_ms", "librdkafka's name"),
    "compression_codec": ("compression_type", "librdkafka's name"),
    "request_required_acks": ("acks", "librdkafka's name"),
    "topic_metadata_refresh_interval_ms": ("metadata_max_age_ms", "librdkafka's name"),
    "sasl_mechanisms": ("sasl_mechanism", "librdkafka's name"),
    "ssl_ca_location": ("ssl_cafile", "librdkafka's name"),
    "ssl_certificate_location": ("ssl_certfile", "librdkafka's name"),
    "ssl_key_location": ("ssl_keyfile", "librdkafka's name"),
    "error_cb": (None, ("errors reach each record's future (and BlockingProducer's "
                        "on_delivery); on_delivery_error is told of every record that failed "
                        "for good")),
    "stats_cb": (None, "producer.metrics() gives the statistics when asked"),
    "statistics_interval_ms": (None, "producer.metrics() gives the statistics when asked"),
    "debug": (None, "the 'aioproducer' logger at DEBUG logs what the producer does"),
    "max_batch_size": ("batch_size", "aiokafka's name"),
    "sasl_plain_username": ("sasl_username", "aiokafka's name"),
    "sasl_plain_password": ("sasl_password", "aiokafka's name"),
    "loop": (None, "a producer runs on the event loop that starts it"),
    "api_version": (None, "the producer agrees on versions with each broker"),
    # The Java client's, from its property files, for what is done another way here.
    "sasl_jaas_config": (None, ("the JAAS line's username and password go in sasl_username "
                                "and sasl_password")),
    "ssl_endpoint_identification_algorithm": ("ssl_check_hostname", (
        "the Java client's name: true checks the broker's hostname (the default), an empty "
        "value is false")),
    "partitioner_class": ("partitioner", "the Java client's name; ours takes a callable"),
    "interceptor_classes": (None, "hooks=[ProducerHooks subclass instances] do their work"),
    "metric_reporters": (None, ("producer.metrics(), or aioproducer.observability's "
                                "OpenTelemetry and Prometheus adapters")),
    "connections_max_idle_ms": (None, "the producer keeps one connection per broker it uses"),
    "send_buffer_bytes": (None, "the operating system sizes the socket's buffers"),
    "receive_buffer_bytes": (None, "the operating system sizes the socket's buffers"),
    "client_dns_lookup": (None, "every address a host name resolves to is tried in turn"),
    "message_send_max_retries": ("retries", "librdkafka's name"),
    "ssl_key_password": ("ssl_password", "the Java client's and librdkafka's name"),
    "ssl_certificate_pem": ("ssl_cert_pem", "librdkafka's name"),
    "ssl_truststore_certificates": ("ssl_ca_pem", "the Java client's name"),
    "ssl_keystore_certificate_chain": ("ssl_cert_pem", "the Java client's name"),
    "ssl_keystore_key": ("ssl_key_pem", "the Java client's name"),
}

# A consumer's and Schema Registry's client's settings, which a properties file shared by
# every client holds (Confluent Cloud's client.properties): from_properties() skips them with
# a warning, as librdkafka ("a consumer property and will be ignored by this producer
# instance") and the Java client ("supplied but isn't a known config") do.
_NOT_A_PRODUCERS = frozenset({
    "group_id", "group_instance_id", "group_protocol", "group_remote_assignor",
    "session_timeout_ms", "heartbeat_interval_ms", "max_poll_records", "max_poll_interval_ms",
    "auto_offset_reset", "enable_auto_commit", "auto_commit_interval_ms", "isolation_level",
    "fetch_min_bytes", "fetch_max_bytes", "fetch_max_wait_ms", "max_partition_fetch_bytes",
    "partition_assignment_strategy", "key_deserializer", "value_deserializer", "check_crcs",
    "exclude_internal_topics", "client_rack", "default_api_timeout_ms",
    "schema_registry_url", "basic_auth_credentials_source", "basic_auth_user_info",
    "schema_registry_basic_auth_user_info"})

_TRUSTSTORE = ("a Java truststore is not read here: give its CA certificates as a PEM file in "
               "ssl_cafile (keytool -exportcert -rfc writes one)")
_KEYSTORE = ("a Java keystore is not read here: give the client's certificate and private key "
             "as PEM files in ssl_certfile and ssl_keyfile (the key's password in ssl_password)")
_TLS_VERSIONS = ("TLS versions and ciphers are the ssl module's defaults, or those of an "
                 "ssl.SSLContext given as the ssl_context keyword")
_KERBEROS = ("GSSAPI (Kerberos) is not supported; sasl_mechanism is "
             f"{', '.join(_SASL[:-1])} or {_SASL[-1]}")
# Other clients' settings for what is done otherwise here, or not at all (the nearest of our
# names was the wrong setting: "did you mean 'ssl.password'?" for the truststore's password).
_NOT_HERE: dict[str, str] = {
    "ssl_truststore_location": _TRUSTSTORE,
    "ssl_truststore_password": _TRUSTSTORE,
    "ssl_truststore_type": _TRUSTSTORE,
    "ssl_keystore_location": _KEYSTORE,
    "ssl_keystore_password": _KEYSTORE,
    "ssl_keystore_type": _KEYSTORE,
    "ssl_protocol": _TLS_VERSIONS,
    "ssl_enabled_protocols": _TLS_VERSIONS,
    "ssl_cipher_suites": _TLS_VERSIONS,
    "enable_ssl_certificate_verification": (
        "the broker's certificate is always verified, unless by an ssl.SSLContext given as the "
        "ssl_context keyword (ssl_check_hostname=false skips only the host name check)"),
    "sasl_kerberos_service_name": _KERBEROS,
    "sasl_kerberos_keytab": _KERBEROS,
    "sasl_kerberos_principal": _KERBEROS,
}


def _check_partitioner(partitioner: Any) -> None:
    """A partitioner that cannot take our four arguments failed each send() with a
    TypeError from its call; aiokafka's take three (key, all_partitions, available)."""
    takes = "a callable taking (topic, key, partition_count, available_partitions)"
    if not callable(partitioner):
        raise ConfigError(f"partitioner must be {takes}")
    try:
        signature = inspect.signature(partitioner)
    except (TypeError, ValueError):  # (a builtin may have none to read: it is called as is)
        return
    try:
        signature.bind("topic", b"key", 1, [0])
    except TypeError:
        raise ConfigError(
            f"partitioner must be {takes} and return a partition or None; "
            f"{getattr(partitioner, '__qualname__', partitioner)!r} takes {signature}. An "
            "aiokafka partitioner, (key, all_partitions, available_partitions), works "
            "wrapped: lambda topic, key, count, available: "
            "partitioner(key, list(range(count)), available)") from None


def other_clients_setting(key: str) -> str | None:
    """What from_properties() says of `key` if it is another client's setting name
    (librdkafka's, the Java client's, aiokafka's: a name, safe to show), else None."""
    name = key.strip().replace(".", "_").replace("-", "_")
    if name in _NOT_HERE or name in _OTHER_CLIENTS:
        return f"unknown setting {key!r}" + _dotted(_suggest(name, _setting_names()))
    return None


def _dotted(text: str) -> str:
    """The setting names in `text` spelt as in a properties file (ssl.cafile), but for
    ssl_context, which only a keyword can give."""
    return re.sub(r"[a-z]+(?:_[a-z0-9]+)+", lambda m: m[0].replace("_", ".")
                  if m[0] in _setting_names() and m[0] != "ssl_context" else m[0], text)


def _suggest(name: str, names: frozenset[str]) -> str:
    if name in _NOT_HERE:
        return f": {_NOT_HERE[name]}"
    if name in _NOT_A_PRODUCERS:  # (as a keyword: from_properties() skips it)
        return ": a consumer's or Schema Registry's client's setting, not a producer's"
    ours, note = _OTHER_CLIENTS.get(name, (None, ""))
    if ours is not None:
        return f"; did you mean {ours!r}? ({note})"
    if note:
        return f": not needed ({note})"
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# The int settings, each with its least value.
_INT_SETTINGS = (("linger_ms", 0), ("batch_size", 1), ("buffer_memory", 1), ("max_block_ms", 0),
                 ("max_request_size", 1), ("receive_message_max_bytes", 1 << 16),
                 ("request_timeout_ms", 1), ("delivery_timeout_ms", 1), ("retries", 0),
                 ("retry_backoff_ms", 0), ("retry_backoff_max_ms", 0),
                 ("reconnect_backoff_ms", 0), ("reconnect_backoff_max_ms", 0),
                 ("socket_connection_setup_timeout_ms", 1),
                 ("socket_connection_setup_timeout_max_ms", 1),
                 ("max_in_flight_requests_per_connection", 1), ("metadata_max_age_ms", 0),
                 ("metadata_max_idle_ms", 1000), ("metadata_recovery_rebootstrap_trigger_ms", 1),
                 ("transaction_timeout_ms", 1), ("partitioner_availability_timeout_ms", 0))


def _whole(value: Any) -> int | None:
    """An int-like that is not an int (numpy.int64: its __index__) as an int; else None
    (an int itself, a bool, anything else: the checks take it as it is)."""
    if type(value) is int or isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)
    except Exception:  # (a broken __index__: refused as what it is)
        return None


# What an int or bool setting given as text (read from os.environ, say) is told.
_FROM_TEXT = "; ProducerConfig.from_properties({...}) takes settings as text and parses them"


def _check_int(name: str, value: Any, low: int, high: int = _MAX_INT, where: str = "") -> None:
    if type(value) is not int:
        hint = f": int() it{_FROM_TEXT}" if isinstance(value, str) else ""
        raise ConfigError(f"{name} must be an int, not {type(value).__name__} ({value!r})"
                          f"{hint}")
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}{where}, not {value}")


def _parse(name: str, default: Any, raw: Any) -> Any:
    """A property file's string value, as the type of the setting's default."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConfigError(f"{name} must be true or false, not {raw!r}")
    if name == "acks" or isinstance(default, str) or name.startswith(("ssl_", "sasl_")) or \
            name == "transactional_id":
        return text
    if isinstance(default, int) or name == "compression_level":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {raw!r}") from None
    if name == "bootstrap_servers":
        return text
    if name.endswith("_serializer"):  # (a Java class name, from a Java property file)
        raise ConfigError(f"{name} must be a Python callable (bytes values need none), not "
                          f"the text {raw!r}: give it as a keyword, {name}=str.encode")
    raise ConfigError(f"{name} cannot be given as text")


def _parse_bootstrap(servers: Any) -> tuple[tuple[str, int], ...]:
    if isinstance(servers, Mapping):  # confluent-kafka's Producer({"bootstrap.servers": ...})
        raise ConfigError("bootstrap_servers is an address, not a dict of properties: pass "
                          "settings as keywords, Producer(\"host:9092\", linger_ms=5), or "
                          "Kafka's dotted names as Producer(config=ProducerConfig."
                          "from_properties({\"bootstrap.servers\": \"host:9092\", ...}))")
    items = servers.split(",") if isinstance(servers, str) else servers
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"bootstrap_servers must be \"host:port,...\" or a list of "
                          f"\"host:port\", not {servers!r}")
    addresses = []
    for item in items:
        if isinstance(servers, str) and not item.strip():
            continue  # "h:9092," (joined in a script, say): skipped, as the Java client does
        match = _ADDRESS.match(item)
        port = int(match["port"]) if match else 0
        if not match or not 0 < port < 65536:
            # A listener as advertised.listeners spells it ("PLAINTEXT://kafka:9092")
            scheme, found, _ = item.strip().partition("://")
            parts = re.split(r"[;\s]+", item.strip())
            hint = (f": drop {scheme}:// (a listener's name; security_protocol says how to "
                    "connect)") if found else \
                f": separate addresses with commas, {','.join(parts)!r}" \
                if len(parts) > 1 and all(map(_ADDRESS.match, parts)) else ""
            raise ConfigError(f"bootstrap_servers: {item!r} is not \"host:port\" (e.g. "
                              f"\"localhost:9092\" or \"[::1]:9092\"){hint}")
        addresses.append((match["ipv6"] or match["host"], port))
    if not addresses:
        raise ConfigError("bootstrap_servers is empty: give at least one \"host:port\"")
    return tuple(addresses)
