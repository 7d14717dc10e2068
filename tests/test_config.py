"""Settings: Java-client defaults, Kafka property files, and the idempotence rules."""

import dataclasses
import logging
import pickle

import pytest

from aioproducer import Producer, ProducerConfig, ProducerSettings
from aioproducer.errors import ConfigError, ERROR_CLASSES, ProducerFencedError, error_for_code


def test_defaults_follow_the_java_client():
    """The Java client's defaults, but batch_size (256 KiB, not 16 KiB: a batch reserves
    memory as it grows, and 10 KB records made a batch each; the README's Settings)."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="a:1,[::1]:2")
    assert config.bootstrap_addresses == (("a", 1), ("::1", 2))
    # (a comma too many, as a script joining addresses leaves one: skipped, as by Java's)
    assert ProducerConfig.from_kwargs(bootstrap_servers="a:1, [::1]:2, ").bootstrap_addresses \
        == (("a", 1), ("::1", 2))
    assert (config.acks, config.enable_idempotence, config.linger_ms, config.batch_size) == \
        (-1, True, 5, 262144)
    assert (config.buffer_memory, config.max_block_ms, config.delivery_timeout_ms) == \
        (33554432, 60000, 120000)
    assert config.max_in_flight_requests_per_connection == 5
    assert (config.socket_connection_setup_timeout_ms,
            config.socket_connection_setup_timeout_max_ms) == (10000, 30000)


def test_a_small_buffer_memory_alone_bounds_the_defaulted_batch_size():
    """buffer_memory below the default batch_size, batch_size not given: batches as large as
    the memory holds, not a ConfigError about a setting the user never set."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="h:1", buffer_memory=8192)
    assert config.batch_size == 8192
    with pytest.raises(ConfigError, match="buffer_memory \\(8192\\) must be at least batch_size"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", buffer_memory=8192, batch_size=16384)


@pytest.mark.parametrize("low, high", [("retry_backoff_ms", "retry_backoff_max_ms"),
                                       ("socket_connection_setup_timeout_ms",
                                        "socket_connection_setup_timeout_max_ms")])
def test_a_maximum_below_its_base_is_refused(low, high):
    with pytest.raises(ConfigError, match=f"{high} \\(500\\) must be at least {low} \\(600\\)"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", **{low: 600, high: 500})


def test_from_properties_takes_kafka_names_and_strings():
    config = ProducerConfig.from_properties({
        "bootstrap.servers": "h:9092", "linger.ms": "20", "acks": "1",
        "enable.idempotence": "false", "compression.type": "lz4"})
    assert (config.linger_ms, config.acks, config.enable_idempotence,
            config.compression_type) == (20, 1, False, "lz4")
    # The name suggested as it was written: a properties file's, the CLI's --producer-props.
    with pytest.raises(ConfigError, match=r"did you mean 'linger\.ms'"):
        ProducerConfig.from_properties({"bootstrap.servers": "h:1", "linger.mss": "1"})
    with pytest.raises(ConfigError, match="did you mean 'linger_ms'"):
        ProducerConfig.from_properties({"bootstrap.servers": "h:1", "linger_mss": "1"})
    with pytest.raises(ConfigError, match="linger_ms must be an integer"):
        ProducerConfig.from_properties({"bootstrap.servers": "h:1", "linger.ms": "soon"})


@pytest.mark.parametrize("given, said", [
    ("message.max.bytes", "; did you mean 'max.request.size'? (librdkafka's name)"),
    ("message.timeout.ms", "; did you mean 'delivery.timeout.ms'? (librdkafka's name)"),
    ("socket.timeout.ms", "; did you mean 'request.timeout.ms'? (librdkafka's name)"),
    ("queue.buffering.max.ms", "; did you mean 'linger.ms'? (librdkafka's name)"),
    ("batch.num.messages", ": not needed (batch.size bounds a batch, in bytes)"),
    ("max_batch_size", "; did you mean 'batch_size'? (aiokafka's name)"),
    ("loop", ": not needed (a producer runs on the event loop that starts it)"),
    # (a confluent-kafka user's config dict: no hint, or the wrong setting, before)
    ("ssl.ca.location", "; did you mean 'ssl.cafile'? (librdkafka's name)"),
    ("ssl.certificate.location", "; did you mean 'ssl.certfile'? (librdkafka's name)"),
    ("ssl.key.location", "; did you mean 'ssl.keyfile'? (librdkafka's name)"),
    ("error_cb", (": not needed (errors reach each record's future (and BlockingProducer's "
                  "on_delivery); on_delivery_error is told of every record that failed for "
                  "good)")),
    ("statistics.interval.ms", (": not needed (producer.metrics() gives the statistics "
                                "when asked)")),
    ("debug", ": not needed (the 'aioproducer' logger at DEBUG logs what the producer does)"),
    # (a Java client's property file: the nearest name was the wrong setting, or none)
    ("connections.max.idle.ms", (": not needed (the producer keeps one connection per broker "
                                 "it uses)")),
    ("receive.buffer.bytes", ": not needed (the operating system sizes the socket's buffers)"),
    ("client.dns.lookup", (": not needed (every address a host name resolves to is tried in "
                           "turn)")),
    ("partitioner.class", ("; did you mean 'partitioner'? (the Java client's name; ours takes "
                           "a callable)")),
    ("sasl.jaas.config", (": not needed (the JAAS line's username and password go in "
                          "sasl.username and sasl.password)")),
    ("interceptor.classes", ": not needed (hooks=[ProducerHooks subclass instances] do their "
                            "work)"),
    # (the TLS and SASL lines of a Java or librdkafka property file: the nearest name was
    # another setting, "did you mean 'ssl.password'?" for the truststore's password, or none)
    ("message.send.max.retries", "; did you mean 'retries'? (librdkafka's name)"),
    ("ssl.key.password",
     "; did you mean 'ssl.password'? (the Java client's and librdkafka's name)"),
    ("ssl.certificate.pem", "; did you mean 'ssl.cert.pem'? (librdkafka's name)"),
    ("ssl.truststore.certificates", "; did you mean 'ssl.ca.pem'? (the Java client's name)"),
    ("ssl.keystore.certificate.chain",
     "; did you mean 'ssl.cert.pem'? (the Java client's name)"),
    ("ssl.keystore.key", "; did you mean 'ssl.key.pem'? (the Java client's name)"),
    *((name, (": a Java truststore is not read here: give its CA certificates as a PEM file "
              "in ssl.cafile (keytool -exportcert -rfc writes one)"))
      for name in ("ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type")),
    *((name, (": a Java keystore is not read here: give the client's certificate and private "
              "key as PEM files in ssl.certfile and ssl.keyfile (the key's password in "
              "ssl.password)"))
      for name in ("ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type")),
    *((name, (": TLS versions and ciphers are the ssl module's defaults, or those of an "
              "ssl.SSLContext given as the ssl_context keyword"))
      for name in ("ssl.protocol", "ssl.enabled.protocols", "ssl.cipher.suites")),
    ("enable.ssl.certificate.verification", (
        ": the broker's certificate is always verified, unless by an ssl.SSLContext given as "
        "the ssl_context keyword (ssl.check.hostname=false skips only the host name check)")),
    *((name, (": GSSAPI (Kerberos) is not supported; sasl.mechanism is PLAIN, "
              "SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"))
      for name in ("sasl.kerberos.service.name", "sasl.kerberos.keytab",
                   "sasl.kerberos.principal")),
])
def test_other_clients_setting_names_are_told_ours(given, said):
    """A confluent-kafka user's properties (librdkafka's names) or an aiokafka user's keywords:
    the nearest of our names was the wrong setting (message.max.bytes: "did you mean
    'receive.message.max.bytes'", the largest response) or none at all."""
    with pytest.raises(ConfigError) as raised:
        if "." in given:
            ProducerConfig.from_properties({"bootstrap.servers": "h:1", given: "5"})
        else:
            Producer("h:1", **{given: 5})
    assert str(raised.value) == f"unknown setting {given!r}{said}"


def test_a_java_property_files_value_serializer_class_names_value_serializer():
    """It said "give it as a keyword, key_serializer=str.encode" for value.serializer too."""
    with pytest.raises(ConfigError) as raised:
        ProducerConfig.from_properties({
            "bootstrap.servers": "h:1",
            "value.serializer": "org.apache.kafka.common.serialization.StringSerializer"})
    assert str(raised.value).endswith("give it as a keyword, value_serializer=str.encode")


def test_a_java_property_files_serializer_class_says_what_to_give():
    """`key.serializer=org.apache...StringSerializer`, in every Java client's property file:
    it said only "key_serializer cannot be given as text"."""
    with pytest.raises(ConfigError) as raised:
        ProducerConfig.from_properties({
            "bootstrap.servers": "h:1",
            "key.serializer": "org.apache.kafka.common.serialization.StringSerializer"})
    assert str(raised.value) == (
        "key_serializer must be a Python callable (bytes values need none), not the text "
        "'org.apache.kafka.common.serialization.StringSerializer': give it as a keyword, "
        "key_serializer=str.encode")


def test_security_protocol_takes_any_case_as_the_java_client_does():
    """A properties file written for the Java client may say `security.protocol=ssl`."""
    config = ProducerConfig.from_properties({
        "bootstrap.servers": "h:9092", "security.protocol": "sasl_ssl",
        "sasl.username": "u", "sasl.password": "p"})
    assert config.security_protocol == "SASL_SSL"
    plain = ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol="Plaintext")
    assert plain.security_protocol == "PLAINTEXT"
    with pytest.raises(ConfigError, match="SASL_PLAINTEXT needs sasl_username"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol="sasl_plaintext")
    for wrong in ("tls", 1):
        with pytest.raises(ConfigError, match="security_protocol must be one of"):
            ProducerConfig.from_kwargs(bootstrap_servers="h:1", security_protocol=wrong)


def test_acks_takes_an_int_enum_but_not_a_float_or_bool():
    import enum

    class Acks(enum.IntEnum):
        LEADER = 1
    assert ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks=Acks.LEADER).acks == 1
    # Any case, as compression_type and security_protocol take ("ALL" was refused).
    assert ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks="ALL").acks == -1
    for wrong in (1.0, True, "al"):
        with pytest.raises(ConfigError, match="acks must be"):
            ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks=wrong)


def test_compression_type_takes_any_case_as_security_protocol_does():
    """`compression_type="LZ4"` was refused while security_protocol took any case (and
    librdkafka's compression.codec takes "LZ4")."""
    for given, codec in (("LZ4", "lz4"), ("GZip", "gzip"), ("Zstd", "zstd"), ("NONE", "none")):
        assert ProducerConfig.from_kwargs(bootstrap_servers="h:1",
                                          compression_type=given).compression_type == codec
    assert ProducerConfig.from_properties({"bootstrap.servers": "h:1",
                                           "compression.type": "SNAPPY"}
                                          ).compression_type == "snappy"
    assert ProducerConfig.from_kwargs(bootstrap_servers="h:1", compression_type="ZSTD",
                                      compression_level=19).compression_level == 19
    for wrong in ("lz5", 4):
        with pytest.raises(ConfigError, match="compression_type must be one of"):
            ProducerConfig.from_kwargs(bootstrap_servers="h:1", compression_type=wrong)


class _Index:
    """An int-like as numpy's and pandas' integers are: __index__, not an int."""

    def __init__(self, number: int) -> None:
        self.number = number

    def __index__(self) -> int:
        return self.number


def test_int_settings_take_numpy_integers_and_other_int_likes():
    """Settings read from a DataFrame or a numpy array are numpy integers: they were
    refused ("linger_ms must be an int, not int64"). Any int-like (its __index__) is the
    int it stands for, checked as one; a bool or a float is still refused."""
    numpy = pytest.importorskip("numpy")
    for make in (numpy.int64, numpy.int32, numpy.uint16, _Index):
        config = ProducerConfig.from_kwargs(
            bootstrap_servers="h:1", linger_ms=make(5), batch_size=make(32768),
            acks=make(1), compression_type="gzip", compression_level=make(6),
            retries=make(3), max_in_flight_requests_per_connection=make(5))
        assert (config.linger_ms, config.batch_size, config.acks, config.compression_level,
                config.retries) == (5, 32768, 1, 6, 3), make
        assert all(type(value) is int for value in (
            config.linger_ms, config.batch_size, config.acks, config.compression_level,
            config.retries, config.max_in_flight_requests_per_connection)), make
    assert Producer("h:1", linger_ms=numpy.int64(7)).config.linger_ms == 7
    with pytest.raises(ConfigError, match="linger_ms must be between 0 and"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", linger_ms=numpy.int64(-1))
    for wrong in (True, numpy.float64(5.0), 5.0):
        with pytest.raises(ConfigError, match="linger_ms must be an int"):
            ProducerConfig.from_kwargs(bootstrap_servers="h:1", linger_ms=wrong)


def test_settings_read_from_the_environment_as_text_say_how_to_give_them():
    """A twelve-factor app reads its settings from os.environ, all text: `linger_ms="10"`
    was refused with "must be an int, not str" and nothing on the way that takes text, and
    `enable_idempotence="false"` invites bool(), which is True. Both now say; the way they
    name (from_properties, with the snake-case names the app already used) then works."""
    environ = {"KAFKA_LINGER_MS": "10", "KAFKA_IDEMPOTENCE": "false"}
    with pytest.raises(ConfigError, match=r"linger_ms must be an int, not str \('10'\): "
                                          r"int\(\) it; ProducerConfig.from_properties"):
        Producer("h:1", linger_ms=environ["KAFKA_LINGER_MS"])  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match=r"not 'false' \(bool\(\) of any text but '' is "
                                          r"True\); ProducerConfig.from_properties"):
        Producer("h:1", enable_idempotence=environ["KAFKA_IDEMPOTENCE"])  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match=r"linger_ms must be an int, not float \(5.0\)$"):
        Producer("h:1", linger_ms=5.0)  # type: ignore[call-overload]  # (no hint: not text)
    config = ProducerConfig.from_properties({
        "bootstrap_servers": "h:1", "linger_ms": environ["KAFKA_LINGER_MS"],
        "enable_idempotence": environ["KAFKA_IDEMPOTENCE"]})
    assert Producer(config=config).config.linger_ms == 10
    assert config.enable_idempotence is False


def test_compression_type_none_is_aiokafkas_spelling_of_none():
    """aiokafka's default is compression_type=None: code moved over says so, and gets no
    compression (the setting reads "none", the Java client's spelling, once validated)."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="h:1", compression_type=None)
    assert config.compression_type == "none"
    assert Producer("h:1", compression_type=None).config.compression_type == "none"
    assert Producer(config=ProducerConfig("h:1", compression_type=None)
                    ).config.compression_type == "none"
    with pytest.raises(ConfigError, match="compression_type must be one of none, gzip, "
                                          "snappy, lz4, zstd, not 'null'"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", compression_type="null")
    with pytest.raises(ConfigError, match=r"compression_level must be between -1 and 9 "
                                          r"with compression_type='gzip'"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", compression_type="gzip",
                                   compression_level=10)


def test_a_listener_given_as_a_bootstrap_server_says_what_to_drop():
    """advertised.listeners' spelling, copied into bootstrap_servers."""
    with pytest.raises(ConfigError, match="'PLAINTEXT://kafka:9092' is not \"host:port\" .*: "
                                          "drop PLAINTEXT:// \\(a listener's name; "
                                          "security_protocol says how to connect\\)$"):
        ProducerConfig.from_kwargs(bootstrap_servers="PLAINTEXT://kafka:9092")
    with pytest.raises(ConfigError, match="is empty"):
        ProducerConfig.from_kwargs(bootstrap_servers=" , ")


@pytest.mark.parametrize("servers", ["h1:9092;h2:9092", "h1:9092 h2:9092", "h1:9092; h2:9092"])
def test_addresses_separated_otherwise_than_by_commas_are_told_how(servers):
    """A list copied from a shell variable or a semicolon-separated setting."""
    with pytest.raises(ConfigError, match="is not \"host:port\" .*: separate addresses with "
                                          "commas, 'h1:9092,h2:9092'$"):
        ProducerConfig.from_kwargs(bootstrap_servers=servers)


def test_defaulted_idempotence_turns_off_quietly_when_settings_conflict():
    assert not ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks=1).enable_idempotence
    assert not ProducerConfig.from_kwargs(bootstrap_servers="h:1", retries=0).enable_idempotence
    with pytest.raises(ConfigError, match="enable_idempotence conflicts with retries=0"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", retries=0, enable_idempotence=True)
    # A transactional producer at acks=0: the message names what the user set.
    with pytest.raises(ConfigError, match="^transactional_id needs idempotence, which "
                                          "conflicts with acks=0 \\(needs \"all\"\\)$"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks=0, transactional_id="t")
    with pytest.raises(ConfigError, match="^enable_idempotence conflicts with acks=1"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks=1, transactional_id="t",
                                   enable_idempotence=True)
    with pytest.raises(ConfigError, match="transactional_id needs"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", transactional_id="t",
                                   enable_idempotence=False)


async def test_a_config_given_to_a_producer_with_a_transactional_id_needs_idempotence():
    """A ProducerConfig with idempotence off (told so, or turned off by acks=1) and then a
    transactional id (dataclasses.replace, as Spark tasks did): the Producer refuses it with
    a ConfigError, not an AssertionError at the first transaction."""
    no_idempotence = ProducerConfig.from_kwargs(bootstrap_servers="h:1", enable_idempotence=False)
    with pytest.raises(ConfigError, match="transactional_id needs enable_idempotence=True"):
        Producer(config=dataclasses.replace(no_idempotence, transactional_id="t"))
    with pytest.raises(ConfigError, match="transactional_id needs enable_idempotence=True"):
        Producer(config=ProducerConfig("h:1", enable_idempotence=False, transactional_id="t"))
    acks_1 = ProducerConfig.from_kwargs(bootstrap_servers="h:1", acks=1)
    with pytest.raises(ConfigError, match="transactional_id needs idempotence, which conflicts "
                                          "with acks=1"):
        Producer(config=dataclasses.replace(acks_1, transactional_id="t"))
    assert Producer(config=dataclasses.replace(
        ProducerConfig.from_kwargs(bootstrap_servers="h:1"), transactional_id="t")
    ).config.enable_idempotence


def test_every_kafka_error_code_has_a_named_pickleable_exception():
    assert len(ERROR_CLASSES) > 120
    for code, cls in ERROR_CLASSES.items():
        exc = error_for_code(code, "context")
        assert isinstance(exc, cls) and exc.error_code == code
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)
    assert error_for_code(6).retriable and not error_for_code(10).retriable
    assert isinstance(error_for_code(90), ProducerFencedError) and error_for_code(90).fatal
    assert error_for_code(47).abortable and not error_for_code(47).fatal  # KIP-588
    assert error_for_code(35).fatal and not error_for_code(29).fatal
    assert "error code 999" in str(error_for_code(999))


def test_the_typed_settings_are_the_settings_the_config_takes():
    """ProducerSettings (what type checkers see) and ProducerConfig (what is validated) list
    the same settings: a new setting in one and not the other fails here."""
    fields = {f.name for f in dataclasses.fields(ProducerConfig)} - {
        "bootstrap_servers", "bootstrap_addresses"}  # (a parameter of its own; derived)
    assert set(ProducerSettings.__annotations__) == fields


def test_a_shared_client_properties_file_is_read_as_librdkafka_reads_it(caplog):
    """The client.properties Confluent Cloud gives for every client at once (producer,
    consumer, Schema Registry): the consumer's and Schema Registry's settings are skipped
    with one WARNING (librdkafka: "is a consumer property and will be ignored by this
    producer instance"), and what is refused is listed at once, never with a value. It
    stopped at the first line it could not use: session.timeout.ms said "did you mean
    'transaction.timeout.ms'?"."""
    properties = {
        "bootstrap.servers": "h:9092", "security.protocol": "SASL_SSL",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                            "username='KEY' password='SECRET';",
        "sasl.mechanism": "PLAIN", "client.dns.lookup": "use_all_dns_ips",
        "session.timeout.ms": "45000", "acks": "all", "group.id": "orders",
        "schema.registry.url": "https://psrc.example", "basic.auth.credentials.source":
        "USER_INFO", "basic.auth.user.info": "SR_KEY:SR_SECRET"}
    with caplog.at_level(logging.WARNING, logger="aioproducer"), \
            pytest.raises(ConfigError) as raised:
        ProducerConfig.from_properties(properties)
    assert str(raised.value).splitlines() == [
        "unknown setting 'sasl.jaas.config': not needed (the JAAS line's username and password "
        "go in sasl.username and sasl.password)",
        "unknown setting 'client.dns.lookup': not needed (every address a host name resolves "
        "to is tried in turn)"]
    del properties["sasl.jaas.config"], properties["client.dns.lookup"]
    config = ProducerConfig.from_properties(
        {**properties, "sasl.username": "KEY", "sasl.password": "SECRET"})
    assert (config.security_protocol, config.acks) == ("SASL_SSL", -1)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "ignoring session.timeout.ms, group.id, schema.registry.url, "
        "basic.auth.credentials.source, basic.auth.user.info: settings of a consumer or of "
        "Schema Registry's client, not of a producer"], said
    assert "SECRET" not in str(raised.value) + "".join(said)
