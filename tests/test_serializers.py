"""Serializers that know the topic and headers (aioproducer.Serializer), sync and async, and
Confluent Schema Registry serializers through them: what we wrote is read back with
librdkafka's consumer, and the registry's wire format with confluent-kafka's deserializers
against a stand-in registry the tests start."""

from __future__ import annotations

import asyncio
import json
import struct
import traceback
import uuid

import pytest

from aioproducer import Producer, Serializer, accepted
from aioproducer.errors import InvalidRecordError, SerializationError
from tests.support.readback import consume_all
from tests.support.schema_registry import StandInSchemaRegistry


class PerTopic(Serializer):
    """JSON on topics named in `json_topics`, UTF-16 text elsewhere."""

    def __init__(self, json_topics: set[str]) -> None:
        self.json_topics = json_topics

    def serialize(self, topic, headers, value):
        return json.dumps(value).encode() if topic in self.json_topics else \
            str(value).encode("utf-16-le")


class Tagging(Serializer):
    """UTF-8 text, and a header saying which field and topic made it."""

    def __init__(self, field: str) -> None:
        self.field = field

    def serialize(self, topic, headers, value):
        headers.append((f"{self.field}-from", topic.encode()))
        return value.encode()


class SlowAsync(Serializer):
    """Async: each value waits a little (the earlier records the longest), then is text;
    the value "boom" fails and "int" comes back as an int, not bytes."""

    async def serialize(self, topic, headers, value):
        if value == "boom":
            raise ValueError("cannot encode boom")
        await asyncio.sleep(0.001 * (value if isinstance(value, int) and value < 20 else 0))
        return 13 if value == "int" else str(value).encode()


def countdown(n: int) -> list[int]:
    return list(range(n, 0, -1))  # the first record's serializer sleeps the longest


async def test_a_serializer_sees_the_topic(broker, topic_factory):
    as_json, as_text = topic_factory(1), topic_factory(1)
    values = [{"id": 1}, [2, "two"], "three"]
    async with Producer(broker.bootstrap,
                        value_serializer=PerTopic({as_json}), key_serializer=str.encode) as p:
        for value in values:
            await p.send(as_json, value, key="k")
            await (await p.enqueue(as_text, value, key="k"))
    got_json = consume_all(broker.bootstrap, as_json, expected=3)
    got_text = consume_all(broker.bootstrap, as_text, expected=3)
    assert [json.loads(r.value) for r in got_json] == values
    assert [r.value.decode("utf-16-le") for r in got_text] == [str(v) for v in values]
    assert {r.key for r in got_json + got_text} == {b"k"}  # the plain callable, as before


async def test_serializers_add_headers_after_the_callers(broker, topic):
    async with Producer(broker.bootstrap, key_serializer=Tagging("key"),
                        value_serializer=Tagging("value")) as producer:
        await producer.send(topic, "v1", key="k1", headers=[("trace", b"t-1")])
        await producer.send(topic, "v2", key="k2")  # no headers of its own
        await producer.send(topic, "v3")  # no key: the key serializer is not called
    got = consume_all(broker.bootstrap, topic, expected=3)
    name = topic.encode()
    assert [(r.key, r.value, r.headers) for r in got] == [
        (b"k1", b"v1", [("trace", b"t-1"), ("key-from", name), ("value-from", name)]),
        (b"k2", b"v2", [("key-from", name), ("value-from", name)]),
        (None, b"v3", [("value-from", name)]),
    ]


async def test_a_serializer_adding_a_bad_header_gets_a_typed_error(broker, topic):
    class BadHeader(Serializer):
        def serialize(self, topic, headers, value):
            headers.append(("n", 7))
            return value

    async with Producer(broker.bootstrap, value_serializer=BadHeader()) as producer:
        with pytest.raises(InvalidRecordError, match="header 'n'"):
            await producer.send(topic, b"v")


async def test_async_serializer_keeps_the_order_of_sequential_enqueues(broker, topic):
    async with Producer(broker.bootstrap, value_serializer=SlowAsync()) as producer:
        # The first enqueue() also waits for the topic's metadata.
        futures = [await producer.enqueue(topic, n) for n in countdown(15)]
        offsets = [(await future).offset for future in futures]
        sent = await asyncio.gather(*(producer.send(topic, n) for n in range(100, 110)))
    assert offsets == sorted(offsets)
    got = consume_all(broker.bootstrap, topic, expected=25)
    assert [r.value for r in got[:15]] == [b"%d" % n for n in countdown(15)]
    assert sorted(r.value for r in got[15:]) == [b"%d" % n for n in range(100, 110)]
    assert sorted(md.offset for md in sent) == [r.offset for r in got[15:]]


async def test_async_serializer_errors_are_typed_and_lose_nothing(broker, topic):
    async with Producer(broker.bootstrap, value_serializer=SlowAsync(),
                        key_serializer=SlowAsync()) as producer:
        await producer.enqueue(topic, 1, key=1)
        with pytest.raises(SerializationError,
                           match=f"value_serializer.*{topic}.*ValueError") as failed:
            await producer.enqueue(topic, "boom")
        assert "encode boom" not in _all_text(failed.value)  # the message stays out
        with pytest.raises(SerializationError,
                           match=f"key_serializer.*{topic}.*ValueError") as failed:
            await producer.send(topic, 2, key="boom")
        assert "encode boom" not in _all_text(failed.value)
        with pytest.raises(SerializationError, match=f"returned int for topic '{topic}'"):
            await producer.send(topic, "int")
        await producer.enqueue(topic, 3, key=3)
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [(r.key, r.value) for r in got] == [(b"1", b"1"), (b"3", b"3")]


async def test_async_plain_callable(broker, topic):
    async def encode(value):
        await asyncio.sleep(0)
        return value.upper().encode()

    async with Producer(broker.bootstrap, value_serializer=encode) as producer:
        await producer.send(topic, "loud")
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"LOUD"]


async def test_enqueue_many_with_topic_aware_and_async_serializers(broker, topic):
    async with Producer(broker.bootstrap, key_serializer=Tagging("key"),
                        value_serializer=SlowAsync()) as producer:
        bulk = await producer.enqueue_many(topic, [(f"k{n}", n) for n in countdown(8)])
        assert [md.offset for md in await bulk] == list(range(8))
        with pytest.raises(SerializationError, match=topic) as raised:
            await producer.enqueue_many(topic, [("a", 1), ("b", 2), ("c", "boom"), ("d", 4)])
        assert [md.offset for md in await accepted(raised.value)] == [8, 9]
    got = consume_all(broker.bootstrap, topic, expected=10)
    assert [(r.key, r.value) for r in got] == \
        [(b"k%d" % n, b"%d" % n) for n in countdown(8)] + [(b"a", b"1"), (b"b", b"2")]
    assert all(r.headers == [("key-from", topic.encode())] for r in got)


# -- Confluent Schema Registry -------------------------------------------------------------

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [{"name": "id", "type": "int"}, {"name": "item", "type": "string"}]})


@pytest.fixture
def schema_registry():
    with StandInSchemaRegistry() as registry:
        yield registry


def _schema_id(payload: bytes) -> int:
    """Confluent's wire format: magic byte 0, the schema id as a 4-byte big-endian int."""
    assert payload[0] == 0, payload[:5]
    return struct.unpack(">I", payload[1:5])[0]


async def test_schema_registry_avro_end_to_end(broker, topic_factory, schema_registry):
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AsyncAvroSerializer, AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from aioproducer.schema_registry import SchemaRegistrySerializer

    client = AsyncSchemaRegistryClient({"url": schema_registry.url})
    values = SchemaRegistrySerializer(await AsyncAvroSerializer(client, ORDER))
    keys = SchemaRegistrySerializer(await AsyncAvroSerializer(client, '"string"'), field="key")
    first, second = topic_factory(2), topic_factory(1)
    orders = [{"id": n, "item": f"item-{n}"} for n in range(6)]
    async with Producer(broker.bootstrap, key_serializer=keys, value_serializer=values) as p:
        for order in orders[:4]:
            await p.enqueue(first, order, key=f"user-{order['id'] % 2}")
        await p.send(second, orders[4], key="user-0")
        await p.enqueue_many(second, [("user-1", orders[5])])
        await p.flush()

    registry = SchemaRegistryClient({"url": schema_registry.url})
    order_id = registry.get_latest_version(f"{first}-value").schema_id
    string_id = registry.get_latest_version(f"{first}-key").schema_id
    # One id per distinct schema, whichever topic's subject registered it.
    assert registry.get_latest_version(f"{second}-value").schema_id == order_id
    assert order_id != string_id
    read_values, read_keys = AvroDeserializer(registry), AvroDeserializer(registry)
    for topic, expected in ((first, orders[:4]), (second, orders[4:])):
        got = consume_all(broker.bootstrap, topic, expected=len(expected))
        assert {_schema_id(r.value) for r in got} == {order_id}
        assert {_schema_id(r.key) for r in got} == {string_id}
        decoded = [(read_keys(r.key, SerializationContext(topic, MessageField.KEY)),
                    read_values(r.value, SerializationContext(topic, MessageField.VALUE)))
                   for r in got]
        assert sorted(decoded, key=lambda kv: kv[1]["id"]) == \
            [(f"user-{o['id'] % 2}", o) for o in expected]
    # The serializers asked the registry once per subject, not per record.
    registrations = [path for method, path in schema_registry.requests if method == "POST"]
    assert sorted(registrations) == sorted(f"/subjects/{t}-{f}/versions"
                                           for t in (first, second) for f in ("key", "value"))


async def test_schema_registry_schema_id_in_a_header(broker, topic, schema_registry):
    """Confluent's header schema ids: the serializer appends the id to the record's headers,
    and the payload is the bare Avro body."""
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, \
        SchemaRegistryClient, dual_schema_id_deserializer, header_schema_id_serializer
    from confluent_kafka.schema_registry.avro import AsyncAvroSerializer, AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from aioproducer.schema_registry import SchemaRegistrySerializer

    client = AsyncSchemaRegistryClient({"url": schema_registry.url})
    values = SchemaRegistrySerializer(await AsyncAvroSerializer(
        client, ORDER, conf={"schema.id.serializer": header_schema_id_serializer}))
    order = {"id": 7, "item": "lamp"}
    async with Producer(broker.bootstrap, value_serializer=values) as producer:
        await producer.send(topic, order, headers=[("trace", b"t-7")])
    [got] = consume_all(broker.bootstrap, topic, expected=1)
    registry = SchemaRegistryClient({"url": schema_registry.url})
    guid = registry.get_latest_version(f"{topic}-value").guid
    assert [name for name, _ in got.headers] == ["trace", "__value_schema_id"]
    assert got.headers[1][1] == b"\x01" + uuid.UUID(guid).bytes
    assert got.value == b"\x0e\x08lamp"  # no wire-format prefix: the id is in the header
    read = AvroDeserializer(registry, conf={"schema.id.deserializer": dual_schema_id_deserializer})
    assert read(got.value, SerializationContext(topic, MessageField.VALUE, got.headers)) == order


async def test_schema_registry_rejects_a_record_off_its_schema(broker, topic, schema_registry):
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AsyncAvroSerializer

    from aioproducer.schema_registry import SchemaRegistrySerializer

    client = AsyncSchemaRegistryClient({"url": schema_registry.url})
    values = SchemaRegistrySerializer(await AsyncAvroSerializer(client, ORDER))
    async with Producer(broker.bootstrap, value_serializer=values) as producer:
        await producer.enqueue(topic, {"id": 1, "item": "pen"})
        with pytest.raises(SerializationError, match=f"value_serializer.*{topic}"):
            await producer.enqueue(topic, {"id": "not an int", "item": "pen"})
        await producer.enqueue(topic, {"id": 2, "item": "ink"})
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [r.value[5:] for r in got] == [b"\x02\x06pen", b"\x04\x06ink"]  # Avro: zigzag, len


async def test_schema_registry_json_schema(broker, topic, schema_registry):
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import AsyncJSONSerializer, \
        JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from aioproducer.schema_registry import SchemaRegistrySerializer

    schema = json.dumps({"title": "Reading", "type": "object",
                         "properties": {"celsius": {"type": "number"}},
                         "required": ["celsius"]})
    client = AsyncSchemaRegistryClient({"url": schema_registry.url})
    values = SchemaRegistrySerializer(await AsyncJSONSerializer(schema, client))
    async with Producer(broker.bootstrap, value_serializer=values) as producer:
        await producer.send(topic, {"celsius": 21.5})
        with pytest.raises(SerializationError, match=topic):
            await producer.send(topic, {"fahrenheit": 70})
    got = consume_all(broker.bootstrap, topic, expected=1)
    registry = SchemaRegistryClient({"url": schema_registry.url})
    assert _schema_id(got[0].value) == registry.get_latest_version(f"{topic}-value").schema_id
    read = JSONDeserializer(schema, schema_registry_client=registry)
    assert read(got[0].value, SerializationContext(topic, MessageField.VALUE)) == \
        {"celsius": 21.5}


def _reading_message_class():
    """A protobuf message class built at run time (no generated module to check in)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="reading.proto", package="sensors",
                                               syntax="proto3")
    message = proto.message_type.add(name="Reading")
    field = descriptor_pb2.FieldDescriptorProto
    message.field.add(name="sensor", number=1, type=field.TYPE_STRING,
                      label=field.LABEL_OPTIONAL)
    message.field.add(name="celsius", number=2, type=field.TYPE_DOUBLE,
                      label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sensors.Reading"))


async def test_schema_registry_protobuf(broker, topic, schema_registry):
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import AsyncProtobufSerializer, \
        ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from aioproducer.schema_registry import SchemaRegistrySerializer

    reading = _reading_message_class()
    client = AsyncSchemaRegistryClient({"url": schema_registry.url})
    values = SchemaRegistrySerializer(await AsyncProtobufSerializer(
        reading, client, {"use.deprecated.format": False}))
    sent = [reading(sensor=f"s{n}", celsius=n / 2) for n in range(3)]
    async with Producer(broker.bootstrap, value_serializer=values) as producer:
        for message in sent:
            await producer.enqueue(topic, message)
    got = consume_all(broker.bootstrap, topic, expected=3)
    registry = SchemaRegistryClient({"url": schema_registry.url})
    latest = registry.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    assert {_schema_id(r.value) for r in got} == {latest.schema_id}
    read = ProtobufDeserializer(reading, {"use.deprecated.format": False},
                                schema_registry_client=registry)
    assert [read(r.value, SerializationContext(topic, MessageField.VALUE)) for r in got] == sent


def test_schema_registry_serializer_needs_a_field_it_knows():
    from aioproducer.schema_registry import SchemaRegistrySerializer

    with pytest.raises(ValueError, match="'key' or 'value'"):
        SchemaRegistrySerializer(lambda value, context: b"", field="headers")  # type: ignore


def test_blocking_producer_with_an_async_serializer(broker, topic):
    """BlockingProducer hands records to the same path: an async serializer is awaited on
    the producer's loop, and the thread's records keep their order."""
    from aioproducer import BlockingProducer

    with BlockingProducer(broker.bootstrap, value_serializer=SlowAsync(),
                          key_serializer=Tagging("key")) as producer:
        futures = [producer.produce(topic, n, key="k") for n in countdown(10)]
        with pytest.raises(SerializationError, match=topic):
            producer.send(topic, "boom")
        producer.flush()
    assert [f.result().offset for f in futures] == list(range(10))
    got = consume_all(broker.bootstrap, topic, expected=10)
    assert [r.value for r in got] == [b"%d" % n for n in countdown(10)]
    assert {tuple(r.headers) for r in got} == {(("key-from", topic.encode()),)}


def test_a_serializer_setting_that_is_neither_kind_is_a_config_error():
    from aioproducer.errors import ConfigError

    with pytest.raises(ConfigError, match="value_serializer must be an .*Serializer or a "
                                          "callable returning bytes, not int"):
        Producer("127.0.0.1:9092", value_serializer=42)


def _all_text(exc: BaseException) -> str:
    """str, repr and the traceback with its chain: what a log handler may print."""
    return "\n".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])
