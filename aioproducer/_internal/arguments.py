"""What the producer's verbs check in their arguments, and the errors that say what is wrong
(InvalidRecordError, SerializationError, InvalidTopicError, ConfigError): one place for the
rules, so each verb reads as its steps."""

from __future__ import annotations

import inspect
import operator
import struct
import time
from typing import Any, Awaitable, Callable, Iterator, Mapping, NamedTuple

from .._speedups._py import SECONDS_LIKE_BELOW
from ..errors import (
    ConfigError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaError,
    SerializationError,
)
from ..protocol.records import Headers, encode_headers
from ..serializers import MutableHeaders, Serializer, SerializerSetting

BYTES_TYPES = (bytes, bytearray, memoryview)
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


# A key or value serializer as intake calls it: (topic, headers, obj) -> bytes or an awaitable.
SerializerCall = Callable[[str, MutableHeaders, Any], Any]


def serializer_call(serializer: SerializerSetting | None) -> SerializerCall | None:
    """One way to call either kind, decided once: a Serializer's own method, or a plain
    `(obj) -> bytes` callable that ignores the topic and headers."""
    if serializer is None:
        return None
    if isinstance(serializer, Serializer):
        return serializer.serialize
    return lambda topic, headers, obj: serializer(obj)


def serialize(call: SerializerCall, obj: Any, what: str, topic: str,
              headers: MutableHeaders) -> bytes | Awaitable[Any]:
    """The serializer's bytes, or the awaitable an async one returned (to be awaited and
    then given to `serialized`)."""
    failed: type[BaseException] | None = None
    try:
        data = call(topic, headers, obj)
    except Exception as exc:
        failed = type(exc)
    if failed is not None:  # raised outside the except block: see _serializer_failed
        raise _serializer_failed(what, topic, failed)
    if type(data) is not bytes and inspect.isawaitable(data):
        return data
    return serialized(data, what, topic)


async def serialize_async(awaitable: Awaitable[Any], what: str, topic: str) -> bytes:
    failed: type[BaseException] | None = None
    try:
        data = await awaitable
    except Exception as exc:
        failed = type(exc)
    if failed is not None:
        raise _serializer_failed(what, topic, failed)
    return serialized(data, what, topic)


def serialized(data: Any, what: str, topic: str) -> bytes:
    if not isinstance(data, BYTES_TYPES):
        # json.dumps is the usual one: it returns str.
        hint = (f" (encode the text it returns: e.g. lambda {what[0]}: json.dumps({what[0]})"
                ".encode())" if isinstance(data, str) else "")
        raise SerializationError(f"{what}_serializer returned {type(data).__name__} for topic "
                                 f"{topic!r}; it must return bytes{hint}")
    return bytes(data)


def _serializer_failed(what: str, topic: str, failed: type[BaseException]) -> SerializationError:
    """The serializer's exception by its type only, and neither the cause nor the context of
    ours: its message often holds the value (`'SSN 123-45-6789' is not an int`), which would
    reach logs and error reporters. (As for a failing OAUTHBEARER token provider.)"""
    module = failed.__module__
    name = failed.__qualname__ if module == "builtins" else f"{module}.{failed.__qualname__}"
    return SerializationError(
        f"{what}_serializer failed on a {what} for topic {topic!r} with {name} (its message "
        f"is not shown: it may hold the {what}; call the serializer yourself to see it)")


def as_bytes(obj: Any, what: str) -> bytes:
    if isinstance(obj, BYTES_TYPES):
        return bytes(obj)
    hint = (f" (encode it first, e.g. {what}.encode(), or set {what}_serializer)"
            if isinstance(obj, str) else f" (set {what}_serializer to convert it)")
    raise InvalidRecordError(f"{what} must be bytes or None, not {type(obj).__name__}{hint}")


class OffsetCommit(NamedTuple):
    """An offset send_offsets_to_transaction() commits (the next one to read), with what
    the consumer gave with it: TxnOffsetCommit's committed_metadata and committed_leader_epoch
    (-1: unknown), as the Java client commits an OffsetAndMetadata's."""

    offset: int
    metadata: str | None = None
    leader_epoch: int = -1


def checked_offsets(offsets: Any) -> dict[tuple[str, int], OffsetCommit]:
    """send_offsets_to_transaction's offsets, checked before any request goes out. A mapping's
    values are offsets, or OffsetAndMetadata-likes (.offset and .metadata, and .leader_epoch
    if any: aiokafka's and kafka-python's, keyed by their TopicPartition tuples). A list of
    objects is confluent-kafka's TopicPartitions, as `consumer.position(consumer.assignment())`
    gives them: a partition not read from yet has a logical offset there (OFFSET_INVALID,
    -1001), which is left out, as librdkafka's own producer does."""
    items: list[Any]
    try:
        items = [(*tp, _offset_commit(value)) for tp, value in offsets.items()] \
            if isinstance(offsets, Mapping) else \
            [(tp.topic, tp.partition, _offset_commit(tp)) for tp in offsets
             if not (type(tp.offset) is int and tp.offset < 0)]
    except (TypeError, AttributeError):
        items = [None]
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], str)
                and type(item[1]) is int and item[1] >= 0 and item[2] is not None):
            raise InvalidRecordError(
                "offsets must map (topic: str, partition: int >= 0) to an offset (int >= 0) "
                "or an OffsetAndMetadata (.offset, .metadata: str or None, and .leader_epoch "
                "if any: int or None), or list objects with .topic, .partition and .offset; "
                f"got {offsets!r}")
    return {(str.__str__(topic), partition): commit for topic, partition, commit in items}


def _offset_commit(value: Any) -> OffsetCommit | None:
    """An offset (an int, or an object's .offset, with its .metadata and .leader_epoch if it
    has them) as an OffsetCommit; None if any of them is not of its type."""
    offset = value if type(value) is int else value.offset
    metadata = getattr(value, "metadata", None)
    epoch = getattr(value, "leader_epoch", None)
    if type(offset) is not int or offset < 0 or \
            not (metadata is None or isinstance(metadata, str)) or \
            not (epoch is None or type(epoch) is int and epoch >= -1):
        return None
    return OffsetCommit(offset, None if metadata is None else str.__str__(metadata),
                        -1 if epoch is None else epoch)


def iterate_records(records: Any) -> Iterator[Any]:
    if isinstance(records, Mapping):  # (iterated, it gives its keys alone)
        raise InvalidRecordError("records must be an iterable of (key, value) pairs, not a "
                                 f"{type(records).__name__}: pass records.items()")
    if hasattr(records, "itertuples") and hasattr(records, "columns"):  # pandas, iterated,
        # gives its column names ("not str (record 0: 'key')")
        raise InvalidRecordError(
            f"records must be an iterable of (key, value) pairs, not a {type(records).__name__}"
            " (iterated, it gives its column names): pass "
            "df[['key', 'value']].itertuples(index=False, name=None)")
    try:
        return iter(records)
    except TypeError:
        raise InvalidRecordError("records must be an iterable of (key, value) pairs, not "
                                 f"{type(records).__name__}") from None


def check_timeout(what: str, timeout: float | None) -> None:
    if timeout is not None and (type(timeout) not in (int, float) or not timeout >= 0):
        raise ConfigError(f"{what} must be None or seconds >= 0, not {timeout!r}")


def topic_str(topic: Any) -> str:
    """The topic as a plain str: a str subclass (a str Enum, say) gives its text."""
    if not isinstance(topic, str):
        raise InvalidRecordError(f"topic must be a str, not {type(topic).__name__}")
    return str.__str__(topic)


def as_int(number: Any) -> Any:
    """An int-like (what operator.index() takes: numpy's and pandas' integers, an IntEnum) as
    the int it stands for; anything else as given, for the caller to refuse. A bool is no
    partition or timestamp: it stays a bool. (The speed-up's Appender does the same.)"""
    if isinstance(number, bool):
        return number
    try:
        return operator.index(number)
    except Exception:  # (no __index__, or a broken one: refused as the type it is)
        return number


def checked_timestamp(timestamp_ms: Any) -> int:
    if timestamp_ms is None:
        return int(time.time() * 1000)
    if type(timestamp_ms) is not int:
        timestamp_ms = as_int(timestamp_ms)
    if type(timestamp_ms) is not int or not 0 <= timestamp_ms < 1 << 63:  # Kafka's int64
        raise InvalidRecordError("timestamp_ms must be an int from 0 to 2**63-1 (ms since the "
                                 f"epoch), not {timestamp_ms!r}{_timestamp_hint(timestamp_ms)}")
    return timestamp_ms


def _timestamp_hint(timestamp_ms: Any) -> str:
    """How to make the int of milliseconds from what was given instead: time.time() (a float
    of seconds) or a datetime, as other clients' users give them."""
    if isinstance(timestamp_ms, float) and 0 < timestamp_ms < SECONDS_LIKE_BELOW:
        return ": seconds? int(time.time() * 1000) for now"
    if hasattr(timestamp_ms, "timestamp") and callable(timestamp_ms.timestamp):
        return ": int(when.timestamp() * 1000) for a datetime"
    return ""


def checked_headers(headers: Headers) -> MutableHeaders:
    if isinstance(headers, (str, bytes, Mapping)) or not hasattr(headers, "__iter__"):
        hint = " (a header name may repeat: pass list(headers.items()))" \
            if isinstance(headers, Mapping) else ""
        raise InvalidRecordError(f"headers must be a sequence of (str, bytes | None) pairs, "
                                 f"not {type(headers).__name__}{hint}")
    checked = []
    for item in headers:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidRecordError(f"each header must be a (str, bytes | None) tuple, not "
                                     f"{item!r:.80}")
        name, value = item
        if type(name) is not str:
            raise InvalidRecordError(f"header names must be str, not {type(name).__name__} ({name!r})")
        if value is not None and not isinstance(value, BYTES_TYPES):
            hint = " (encode it: .encode())" if isinstance(value, str) else ""
            raise InvalidRecordError(f"header {name!r} must have a bytes or None value, not "
                                     f"{type(value).__name__}{hint}")
        checked.append((name, None if value is None else bytes(value)))
    return checked


def encode_checked_headers(headers: Headers) -> bytes:
    try:
        return encode_headers(checked_headers(headers))
    except UnicodeEncodeError as exc:
        raise InvalidRecordError(f"a header name is not valid text ({exc})") from None


def check_topic_name(topic: str) -> None:
    if not topic or topic in (".", "..") or len(topic) > 249 or not _TOPIC_CHARS.issuperset(topic):
        raise InvalidTopicError(
            f"invalid topic name {topic!r}: use 1-249 characters of ASCII letters, digits, "
            "'.', '_' and '-'")


def bad_partition(topic: str, partition: Any, count: int) -> KafkaError:
    if type(partition) is not int:
        return InvalidRecordError(f"partition must be an int or None, not {type(partition).__name__}")
    return InvalidRecordError(
        f"partition {partition} does not exist: topic {topic!r} has {count} partition(s), "
        f"0..{count - 1}")


_LIBRDKAFKA_GROUP = b"CGMDv2:"  # confluent-kafka's consumer_group_metadata(): librdkafka's form


def group_fields(group_metadata: Any) -> dict[str, Any]:
    """send_offsets_to_transaction's group: a group id, an object (or mapping) with group_id
    and the KIP-447 fencing fields, or what confluent-kafka's consumer_group_metadata()
    returns."""
    group: dict[str, Any]
    if isinstance(group_metadata, str):
        group = {"group_id": group_metadata}
    elif isinstance(group_metadata, bytes) and group_metadata.startswith(_LIBRDKAFKA_GROUP):
        group = _librdkafka_group(group_metadata)
    elif isinstance(group_metadata, Mapping):
        group = dict(group_metadata)
    else:
        group = {name: getattr(group_metadata, name) for name in
                 ("group_id", "generation_id", "member_id", "group_instance_id")
                 if hasattr(group_metadata, name)}
    if not group.get("group_id"):
        raise InvalidRecordError(
            f"group_metadata must be a group id or carry a group_id, not {group_metadata!r}")
    return group


def _librdkafka_group(data: bytes) -> dict[str, Any]:
    """librdkafka's serialized group metadata (rd_kafka_consumer_group_metadata_write): the
    magic, the generation as a native int32, the group id and member id each ended by a NUL,
    a byte that is 1 when there is no group instance id, else the id ended by a NUL."""
    try:
        (generation,) = struct.unpack_from("=i", data, len(_LIBRDKAFKA_GROUP))
        group_id, member_id, rest = data[len(_LIBRDKAFKA_GROUP) + 4:].split(b"\0", 2)
        instance = None if rest[:1] == b"\x01" else rest[1:].split(b"\0", 1)[0].decode()
        return {"group_id": group_id.decode(), "generation_id": generation,
                "member_id": member_id.decode(), "group_instance_id": instance}
    except (struct.error, ValueError, UnicodeDecodeError):
        raise InvalidRecordError(
            f"group_metadata looks like confluent-kafka's but cannot be read: {data!r}") from None
