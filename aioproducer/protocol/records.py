"""RecordBatch v2 (magic 2): the writer the producer appends to, and the reader that
`aioproducer consume` (and the tests) decode Fetch responses with.
Layout: https://kafka.apache.org/documentation/#recordbatch

The writer encodes each record into the batch's buffer when it is appended, so a buffered
record costs bytes, not Python objects (the garbage collector's cost of holding objects per
record is what bounds Python producers). Compression runs once, when the batch closes. The
61-byte header is built last and can be built again: the producer id, epoch and base
sequence are known only when the batch is sent, and change when a retry needs a new epoch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import crc32c

from .._speedups import RecordWriter
from ..errors import CorruptMessageError
from .batch_layout import CONTROL, CRC_FROM, HEADER, HEADER_SIZE, TRANSACTIONAL
from .compression import Codec, compress, decompress
from .primitives import encode_varint


Headers = Sequence[tuple[str, "bytes | None"]]


class BatchWriter(RecordWriter):
    """Records of one RecordBatch v2: `try_append(timestamp, key, value, encoded_headers)`
    encodes each record as it comes (in C when the speed-up is built), `close()` seals and
    compresses, `parts()` gives the header and the records as they go on the wire. Its
    fields are RecordWriter's (in C: no Python __init__, and out of the garbage collector's
    way, as at many partitions there is one a record)."""

    __slots__ = ()

    def close(self, codec: Codec, level: int | None = None) -> None:
        """No more appends; compress the records once."""
        self.codec = codec
        records = self.seal()
        self.payload = compress(codec, records, level) if codec else records

    def free(self) -> None:
        """The batch has its final outcome: drop its bytes (record handles that users keep
        hold the batch, and must not hold its records too)."""
        self.payload = None

    def parts(self, *, producer_id: int = -1, producer_epoch: int = -1,
              base_sequence: int = -1,
              transactional: bool = False) -> tuple[bytes, bytes | memoryview]:
        """The batch as it goes on the wire (after close()), in two parts: its 61-byte
        header and its records, not copied next to each other (a Produce request writes a
        large payload where it lies); may be called again for a retry. (The sender makes
        a non-idempotent batch's parts inline, with header()'s defaults: keep the two alike.)"""
        payload = self.payload
        assert payload is not None, "close() the batch before encoding it"
        attributes = (self.codec | TRANSACTIONAL) if transactional else self.codec
        return self.header(payload, attributes, producer_id, producer_epoch,
                           base_sequence), payload

    def encode(self, *, producer_id: int = -1, producer_epoch: int = -1,
               base_sequence: int = -1, transactional: bool = False) -> bytes:
        """The batch as one bytes (parts() joined)."""
        return b"".join(self.parts(producer_id=producer_id, producer_epoch=producer_epoch,
                                   base_sequence=base_sequence, transactional=transactional))


# Zigzag varints of 0 to 63, one byte each: most header counts and lengths (a call per
# varint was half the cost of a record with a header).
_SMALL_VARINTS = [encode_varint(n) for n in range(64)]


def encode_headers(headers: Headers) -> bytes:
    """A record's header section (count, then each name and value), as try_append takes it."""
    small = _SMALL_VARINTS
    count = len(headers)
    out = bytearray(small[count] if count < 64 else encode_varint(count))
    for name, value in headers:
        encoded = name.encode()
        length = len(encoded)
        out += small[length] if length < 64 else encode_varint(length)
        out += encoded
        if value is None:
            out += b"\x01"
        else:
            length = len(value)
            out += small[length] if length < 64 else encode_varint(length)
            out += value
    return bytes(out)


def record_size_upper_bound(key: bytes | None, value: bytes | None,
                            headers: bytes | None) -> int:
    """Wire size of a batch holding only this record (headers encoded), uncompressed."""
    size = HEADER_SIZE + 5 + 1 + 10 + 5 + 5 + 5 + 1  # length, attrs, deltas, lengths, count
    size += len(key) if key is not None else 0
    size += len(value) if value is not None else 0
    size += len(headers) if headers is not None else 0
    return size


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class RecordBatch:
    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & 0x07)

    @property
    def timestamp_type(self) -> str:
        return "LogAppendTime" if self.attributes & 0x08 else "CreateTime"

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)

    @property
    def control_type(self) -> str | None:
        """"COMMIT" or "ABORT" for a control batch (from its record's key), else None."""
        if not self.is_control or not self.records or not self.records[0].key:
            return None
        _, kind = struct.unpack_from(">hh", self.records[0].key)
        return {0: "ABORT", 1: "COMMIT"}.get(kind, f"CONTROL-{kind}")


class _Cursor:
    __slots__ = ("data", "position")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def varint(self) -> int:
        shift = result = 0
        while True:
            if self.position >= len(self.data):
                raise CorruptMessageError("a record ends in the middle of a varint")
            byte = self.data[self.position]
            self.position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise CorruptMessageError("a varint is longer than 10 bytes")

    def take(self, length: int) -> bytes | None:
        if length < 0:
            return None
        end = self.position + length
        if end > len(self.data):
            raise CorruptMessageError("a record is longer than its batch")
        chunk = self.data[self.position:end]
        self.position = end
        return chunk


def read_batches(data: bytes | memoryview) -> list[RecordBatch]:
    """Decode concatenated v2 batches (as a Fetch returns them), checking each CRC-32C.

    A trailing partial batch is ignored, not an error: brokers may cut a Fetch response in
    the middle of a batch. A CRC mismatch raises CorruptMessageError."""
    data = bytes(data)
    batches = []
    position = 0
    while len(data) - position >= HEADER_SIZE:
        fields = HEADER.unpack_from(data, position)
        (base_offset, batch_length, leader_epoch, magic, crc, attributes, last_delta,
         base_ts, max_ts, producer_id, producer_epoch, base_sequence, count) = fields
        end = position + 12 + batch_length
        if batch_length < HEADER_SIZE - 12:
            raise CorruptMessageError(f"batch at offset {base_offset} has length {batch_length}")
        if end > len(data):
            break
        if magic != 2:
            raise CorruptMessageError(
                f"batch at offset {base_offset} has magic {magic}, not 2: a message set "
                "written before Kafka 0.11, which this reader does not read")
        if crc32c.crc32c(data[position + CRC_FROM:end]) != crc:
            raise CorruptMessageError(f"batch at offset {base_offset} fails its CRC-32C")
        payload = data[position + HEADER_SIZE:end]
        if attributes & 0x07:
            payload = decompress(Codec(attributes & 0x07), payload)
        cursor = _Cursor(payload)
        records = []
        for _ in range(count):
            length = cursor.varint()
            record_end = cursor.position + length
            cursor.position += 1  # attributes
            timestamp = base_ts + cursor.varint()
            offset = base_offset + cursor.varint()
            key = cursor.take(cursor.varint())
            value = cursor.take(cursor.varint())
            headers = []
            for _ in range(cursor.varint()):
                name = cursor.take(cursor.varint())
                # (As the Java client takes names: text. A name that is not UTF-8 keeps its
                # bytes, escaped, rather than failing the whole batch.)
                headers.append(((name or b"").decode("utf-8", "surrogateescape"),
                                cursor.take(cursor.varint())))
            if cursor.position != record_end:
                raise CorruptMessageError(f"record at offset {offset} has a wrong length")
            records.append(Record(offset, timestamp, key, value, tuple(headers)))
        batches.append(RecordBatch(base_offset, leader_epoch, magic, crc, attributes, last_delta,
                                   base_ts, max_ts, producer_id, producer_epoch, base_sequence,
                                   tuple(records)))
        position = end
    return batches


def visible_records(batches: Iterable[RecordBatch],
                    aborted_transactions: Iterable[tuple[int, int]] = ()) -> Iterator[Record]:
    """The records a consumer hands on, in offset order: without the control batches
    (transaction markers), nor the records of aborted transactions, given the
    (producer_id, first_offset) pairs a read_committed Fetch lists. As the Java consumer
    does: a producer's transactional batches are dropped from the first offset of its
    aborted transaction up to that transaction's ABORT marker."""
    pending = sorted(aborted_transactions, key=lambda aborted: aborted[1])
    aborting: set[int] = set()
    for batch in batches:
        last_offset = batch.base_offset + batch.last_offset_delta
        while pending and pending[0][1] <= last_offset:
            aborting.add(pending.pop(0)[0])
        if batch.is_control:
            if batch.control_type == "ABORT":
                aborting.discard(batch.producer_id)
        elif not (batch.is_transactional and batch.producer_id in aborting):
            yield from batch.records
