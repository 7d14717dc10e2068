"""Read back what was written, with code we did not write: librdkafka's consumer, and
kafka-python's record-batch reader for the raw batches (control records, producer ids)."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from kafka.record import MemoryRecords


@dataclass(frozen=True)
class Consumed:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp_ms: int


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=10)
    return sorted(metadata.topics[topic].partitions)


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 30,
                isolation_level: str = "read_uncommitted") -> list[Consumed]:
    """Every record of `topic` from the beginning: stops after `expected` (plus half a second
    more, to catch duplicates) or at `timeout`, returning what it got."""
    # A reset goes back to the start, not to librdkafka's default end: once (a CI run under
    # load) its fetch of a Spark test's partition 0 was reset, and it read from offset 494 on.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "readback",
                         "enable.auto.commit": False, "isolation.level": isolation_level,
                         "fetch.wait.max.ms": 50, "auto.offset.reset": "earliest"})
    out: list[Consumed] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                         for p in _partitions(consumer, topic)])
        deadline = time.monotonic() + timeout
        extra_until = None
        while time.monotonic() < deadline:
            if extra_until is None and len(out) >= expected:
                extra_until = time.monotonic() + 0.5
            if extra_until is not None and time.monotonic() > extra_until:
                break
            for message in consumer.consume(10_000, 0.2):
                if message.error():
                    raise KafkaException(message.error())
                out.append(Consumed(message.topic(), message.partition(), message.offset(),
                                    message.key(), message.value(), message.headers() or [],
                                    message.timestamp()[1]))
    finally:
        consumer.close()
    return out


def partition_for_key_librdkafka(bootstrap: str, topic: str, keys: list[bytes]) -> list[int]:
    """Where librdkafka's murmur2_random partitioner puts each key (the Java client's choice)."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    landed: dict[int, int] = {}

    def report(i: int):
        def on_delivery(err, message):
            if err is None:
                landed[i] = message.partition()
        return on_delivery

    for i, key in enumerate(keys):
        producer.produce(topic, b"probe", key, on_delivery=report(i))
    producer.flush(30)
    return [landed[i] for i in range(len(keys))]


@dataclass(frozen=True)
class RawBatch:
    base_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    control_type: str | None
    records: list  # (offset, key, value, headers)
    size: int  # bytes, as stored (as written, on a broker that keeps batches as they come)
    next_offset: int  # the offset after the batch's last


def assert_contiguous_sequences(batches: list[RawBatch], context: str = "") -> None:
    """One producer session's batches: base sequences start at 0 and leave no gap."""
    expected = 0
    for b in batches:
        assert b.base_sequence == expected, f"{context}sequence gap at offset {b.base_offset}"
        expected += len(b.records)


def _fetch_v4(bootstrap: str, topic: str, partition: int, offset: int) -> tuple[int, bytes]:
    """One Fetch v4 request on a plain socket; returns (high watermark, records bytes)."""
    host, port = bootstrap.rsplit(":", 1)
    name = topic.encode()
    body = (struct.pack(">iiiib", -1, 100, 1, 16 << 20, 0)
            + struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
            + struct.pack(">i", 1) + struct.pack(">iqi", partition, offset, 16 << 20))
    header = struct.pack(">hhih", 1, 4, 1, 8) + b"readback"
    frame = header + body
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(sock, 4))[0]
        data = _read(sock, size)
    position = 4 + 4  # correlation id, throttle time
    position += 4  # topics count (1)
    (name_length,) = struct.unpack_from(">h", data, position)
    position += 2 + name_length + 4  # name, partitions count (1)
    _, error_code, high_watermark, _, aborted = struct.unpack_from(">ihqqi", data, position)
    position += 26 + max(aborted, 0) * 16
    if error_code:
        raise RuntimeError(f"fetch {topic}-{partition}@{offset}: error {error_code}")
    (records_length,) = struct.unpack_from(">i", data, position)
    position += 4
    return high_watermark, data[position:position + max(records_length, 0)]


def _read(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def fetch_raw_batches(bootstrap: str, topic: str, partition: int,
                      offset: int = 0) -> list[RawBatch]:
    """Every batch of a partition as stored, from `offset`, control batches included,
    decoded by kafka-python."""
    batches: list[RawBatch] = []
    for _ in range(10_000):
        high_watermark, data = _fetch_v4(bootstrap, topic, partition, offset)
        if offset >= high_watermark or not data:
            break
        records = MemoryRecords(data)
        progressed = False
        while True:
            batch = records.next_batch()
            if batch is None:
                break
            assert batch.validate_crc(), f"{topic}-{partition}: CRC mismatch at {batch.base_offset}"
            items = list(batch)
            control_type = None
            if batch.is_control_batch and items:
                control_type = {0: "ABORT", 1: "COMMIT"}[struct.unpack(">hh", items[0].key)[1]]
            batches.append(RawBatch(
                batch.base_offset, batch.producer_id, batch.producer_epoch, batch.base_sequence,
                batch.is_transactional, batch.is_control_batch, control_type,
                [(r.offset, r.key, r.value, list(r.headers)) for r in items],
                batch.size_in_bytes, batch.base_offset + batch.last_offset_delta + 1))
            offset = batches[-1].next_offset
            progressed = True
        if not progressed:
            break
    return batches


@dataclass(frozen=True)
class Outcomes:
    """A topic's record values by what became of them, decoded from the raw batches and
    control markers (Tansu's read_committed consumers also see aborted records): in
    transactions committed, aborted, not ended yet; and written outside any transaction."""

    committed: list[bytes]
    aborted: list[bytes]
    open: list[bytes]
    plain: list[bytes]


class OutcomeReader:
    """Outcomes of a topic's records, read on from where the last read() stopped (a run
    watched while it writes is read once, not once per look)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._bootstrap, self._topic = bootstrap, topic
        self._next = [0] * partitions  # offset to read from, per partition
        self._committed: list[bytes] = []
        self._aborted: list[bytes] = []
        self._plain: list[bytes] = []
        # A transaction's records in a partition are followed there by its marker.
        self._pending: dict[tuple[int, int], list[bytes]] = {}

    def read(self) -> Outcomes:
        for partition, offset in enumerate(self._next):
            for batch in fetch_raw_batches(self._bootstrap, self._topic, partition, offset):
                values = [r[2] for r in batch.records]
                key = (partition, batch.producer_id)
                if batch.is_control:
                    (self._committed if batch.control_type == "COMMIT" else self._aborted
                     ).extend(self._pending.pop(key, []))
                elif batch.is_transactional:
                    self._pending.setdefault(key, []).extend(values)
                else:
                    self._plain.extend(values)
                self._next[partition] = batch.next_offset
        return Outcomes(list(self._committed), list(self._aborted),
                        [v for values in self._pending.values() for v in values],
                        list(self._plain))


def transaction_outcomes(bootstrap: str, topic: str, partitions: int) -> Outcomes:
    return OutcomeReader(bootstrap, topic, partitions).read()
