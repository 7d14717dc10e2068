"""Confluent Schema Registry serializers (Avro, Protobuf, JSON Schema, in Confluent's wire
format) as aioproducer serializers: `pip install 'aioproducer[schema-registry]'`.

We do not write our own: confluent-kafka's `confluent_kafka.schema_registry` client and
serializers are Confluent's own, kept in step with the registry (subject name strategies,
references, rules, header schema ids). `SchemaRegistrySerializer` only hands them the
record's topic and headers in the SerializationContext they expect. Use their async ones
(`AsyncAvroSerializer` with an `AsyncSchemaRegistryClient`): the sync ones would block the
event loop while they ask the registry (once per subject and schema; cached after).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Literal, cast

from .serializers import MutableHeaders, Serializer

try:
    from confluent_kafka.serialization import MessageField, SerializationContext
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("aioproducer.schema_registry needs confluent-kafka's schema registry "
                      "support: pip install 'aioproducer[schema-registry]'") from exc


class SchemaRegistrySerializer(Serializer[Any]):
    """One of confluent-kafka's schema registry serializers (called as
    `serializer(obj, SerializationContext(topic, field, headers))`, sync or async) as a
    key_serializer or value_serializer. `field` says which one it is: the subject's name
    (`{topic}-key` or `{topic}-value` by default) and a header schema id depend on it.

        serializer = await AsyncAvroSerializer(AsyncSchemaRegistryClient({"url": url}), schema)
        Producer(..., value_serializer=SchemaRegistrySerializer(serializer))
    """

    def __init__(self, serializer: Callable[[Any, SerializationContext], Any],
                 field: Literal["key", "value"] = "value") -> None:
        if field not in ("key", "value"):
            raise ValueError(f"field must be 'key' or 'value', not {field!r}")
        self._serializer = serializer
        self._field = MessageField.KEY if field == "key" else MessageField.VALUE

    def serialize(self, topic: str, headers: MutableHeaders, value: Any
                  ) -> bytes | Awaitable[bytes]:
        """confluent-kafka's serializer's bytes for `value` (schema id in front, or in a
        header it appends to `headers`)."""
        # The same list, not a copy: a header schema id it appends goes out with the record.
        # (Its hint takes str header values too, so the list's type differs, not the list.)
        context = SerializationContext(topic, self._field, cast(Any, headers))
        result: bytes | Awaitable[bytes] = self._serializer(value, context)
        return result
