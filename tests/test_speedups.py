"""The compiled speed-up and its pure-Python twin: built, and indistinguishable.

Both implementations are imported directly and fed the same inputs; every output (bytes,
counts, sizes, partitions, statuses) must match. What either one writes is read back by
kafka-python in test_protocol.py and by librdkafka in test_roundtrip.py; CI runs those
again with AIOPRODUCER_PURE_PYTHON=1.
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextvars
import gc
import os
import random
import struct
import subprocess
import sys
import threading
import types
import uuid
import weakref
from typing import NamedTuple

import pytest

from aioproducer import _speedups
from aioproducer._internal.transactions import TransactionManager
from aioproducer._speedups import _py
from aioproducer.client.cluster import Cluster
from aioproducer.client.tasks import TaskSet
from aioproducer.config import ProducerConfig
from aioproducer.errors import CorruptMessageError
from aioproducer.protocol import messages
from aioproducer.protocol.messages import ApiKey
from aioproducer.protocol.primitives import compile_writer
from aioproducer.protocol.records import read_batches
from tests.support.columns import columns_of

try:
    from aioproducer._speedups import _c
except ImportError:  # reported by test_compiled_speedup_is_in_use
    _c = None

needs_c = pytest.mark.skipif(_c is None, reason="the C speed-up did not build")
BOTH = [_py, pytest.param(_c, marks=needs_c)]


def test_compiled_speedup_is_in_use():
    if os.environ.get("AIOPRODUCER_PURE_PYTHON", "") not in ("", "0"):
        assert _speedups.IMPLEMENTATION == "python"
        return
    assert _c is not None, (
        "aioproducer._speedups._c did not build: reinstall with a C compiler and the Python "
        "headers (`pip install -e .` prints the compiler's error)")
    assert _speedups.IMPLEMENTATION == "c"


# Kafka's own vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
           b"a-little-bit-longer-string": -1486304829,
           b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}


@pytest.mark.parametrize("impl", [_py, pytest.param(_c, marks=needs_c)], ids=["python", "c"])
def test_murmur2_matches_kafka(impl):
    for data, expected in MURMUR2.items():
        assert impl.murmur2(data) == expected
        assert impl.partition_for_key(data, 7) == (expected & 0x7FFFFFFF) % 7
    with pytest.raises(ValueError):
        impl.partition_for_key(b"k", 0)


@needs_c
def test_murmur2_same_in_both():
    rng = random.Random(5)
    for _ in range(5000):
        data = rng.randbytes(rng.randrange(0, 70))
        n = rng.randrange(1, 300)
        assert _c.murmur2(data) == _py.murmur2(data)
        assert _c.partition_for_key(data, n) == _py.partition_for_key(data, n)


def _random_record(rng: random.Random, base: int):
    timestamp = base + rng.choice([0, 0, 1, -1, 63, 64, -65, 8191, 8192, 10**6, -(2**40), 2**45])
    key = rng.choice([None, b"", rng.randbytes(rng.randrange(1, 200))])
    value = rng.choice([None, b"", rng.randbytes(rng.randrange(1, 300)),
                        rng.randbytes(rng.randrange(8000, 20000))])
    headers = rng.choice([None, b"\x00", b"\x02\x02h\x02x\x08null\x01"])
    return timestamp, key, value, headers


@needs_c
@pytest.mark.parametrize("limit", [100, 2000, 16384, 1 << 30])
def test_record_writer_same_bytes(limit):
    rng = random.Random(limit)
    for _ in range(60):
        base = rng.randrange(0, 2**42)
        c, py = _c.RecordWriter(base, limit), _py.RecordWriter(base, limit)
        for _ in range(rng.randrange(1, 150)):
            record = _random_record(rng, base)
            assert c.try_append(*record) == py.try_append(*record)
            assert (c.count, c.size, c.max_timestamp) == (py.count, py.size, py.max_timestamp)
        assert c.base_timestamp == py.base_timestamp == base
        records = c.seal()
        assert records == py.seal()
        for payload in (records, rng.randbytes(rng.randrange(0, 500))):  # as sent or compressed
            header = (rng.choice([0, 1, 4, 0x14]), rng.choice([-1, 0, 2**63 - 1]),
                      rng.choice([-1, 0, 32767]), rng.choice([-1, 0, 2**31 - 1]))
            assert c.header(payload, *header) == py.header(payload, *header)
        # Sealed: no more appends, and nothing changes. Sealed again (the accumulator seals a
        # retried batch it expires or fails): no records.
        assert not c.try_append(base, None, b"x", None)
        assert not py.try_append(base, None, b"x", None)
        assert (c.count, c.size) == (py.count, py.size)
        assert c.seal() == py.seal() == b""


@needs_c
def test_record_writer_takes_any_bytes_like_and_refuses_others():
    c, py = _c.RecordWriter(0, 1 << 20), _py.RecordWriter(0, 1 << 20)
    for key in (bytearray(b"k"), memoryview(b"key"), bytearray(), memoryview(b"")):
        assert c.try_append(0, key, key, None) and py.try_append(0, key, key, None)
    assert c.seal() == py.seal()
    with pytest.raises(TypeError):
        _c.RecordWriter(0, 100).try_append(0, "text", b"v", None)


@needs_c
def test_record_writers_grow_from_their_pool_alike():
    """A writer drawing on a MemoryPool raises its own limit when a record does not fit:
    doubling, or just what the record needs when the double is not free, never past `most`
    nor the pool's free bytes, and not while the pool is paused (records wait in line)."""
    rng = random.Random(7)
    for available in (0, 300, 700, 2500, 1 << 20):
        for most in (200, 1024, 16384):
            pools = _c.MemoryPool(available), _py.MemoryPool(available)
            writers = _c.RecordWriter(0, 128), _py.RecordWriter(0, 128)
            for pool, writer in zip(pools, writers):
                writer.reserved = 128
                writer.draw_from(pool, most)
            for i in range(300):
                if i == 150:
                    for pool in pools:
                        pool.paused = True
                record = (i, rng.randbytes(8), rng.randbytes(rng.randrange(0, 60)), None)
                c, py = (w.try_append(*record) for w in writers)
                assert c == py, (available, most, i)
                states = [(w.count, w.size, w.limit, w.reserved, p.available)
                          for w, p in zip(writers, pools)]
                assert states[0] == states[1], (available, most, i)
                count, size, limit, reserved, free = states[0]
                assert (size <= limit or count == 1) and limit <= max(most, 128)
                assert reserved >= limit
                assert reserved + free == 128 + available  # nothing made, nothing lost
            assert writers[0].seal() == writers[1].seal()
    with pytest.raises(TypeError):
        _c.RecordWriter(0, 100).draw_from(object(), 100)


@pytest.mark.parametrize("impl", [_py, pytest.param(_c, marks=needs_c)], ids=["python", "c"])
def test_watch_batches_registers_with_each_pending_batch_once(impl):
    """An enqueue_many future goes on the `_bulks` list of each distinct batch of its
    records that is not done, in order of first appearance; it counts them."""

    class Batch:
        def __init__(self, done, bulks):
            self.done, self._bulks = done, bulks

    earlier = object()
    a, b, c, d = Batch(False, None), Batch(True, None), Batch(False, [earlier]), Batch(False, None)
    bulk = object()
    assert impl.watch_batches([a, a, b, c, a, d, c, b], bulk) == 3
    assert (a._bulks, b._bulks, c._bulks, d._bulks) == ([bulk], None, [earlier, bulk], [bulk])
    assert impl.watch_batches([], bulk) == 0

    def fields(done, bulks):  # a ProducerBatch's own fields, read where they lie in C
        batch = impl.BatchFields((1,), "t", 0, impl.RecordWriter(0, 100), object(), 0.0, 0.0, 0)
        batch.done, batch._bulks = done, bulks
        return batch

    a, b, c, d = fields(False, None), fields(True, None), fields(False, [earlier]), \
        fields(False, [bulk, earlier])  # (told of it before, by another pass)
    assert impl.watch_batches([a, a, b, c, a, d, c, b, d], bulk) == 3
    assert (a._bulks, b._bulks, c._bulks, d._bulks) == \
        ([bulk], None, [earlier, bulk], [bulk, earlier, bulk])


def _run_append_many(impl, records, partitions, *, fixed=-1, sticky=-1, open_parts=None,
                     limit=16384):
    """One append_many call on fresh writers; everything it produced."""
    open_parts = range(partitions) if open_parts is None else open_parts
    writers = [impl.RecordWriter(1000, limit) if p in open_parts else None
               for p in range(partitions)]
    batches = [f"batch-{p}" if w is not None else None for p, w in enumerate(writers)]
    out_batches: list = []
    out_deltas = bytearray()
    result = impl.append_many(records, 0, batches, writers, fixed, sticky, 1005, out_batches,
                              out_deltas)
    return result, out_batches, bytes(out_deltas), [w and (w.count, w.seal()) for w in writers]


@needs_c
def test_append_many_same_in_both():
    rng = random.Random(11)
    keys = [rng.randbytes(16) for _ in range(50)]
    cases = [
        ({}, [(rng.choice(keys), rng.randbytes(rng.randrange(0, 200))) for _ in range(3000)]),
        ({"fixed": 2}, [(rng.choice(keys + [None]), b"v") for _ in range(500)]),
        ({"sticky": 1}, [(rng.choice([None, keys[0]]), b"v") for _ in range(500)]),
        ({"sticky": -1}, [(keys[1], b"v"), (None, b"v"), (keys[2], b"v")]),  # keyless: Python
        ({}, [(keys[0], b"v"), [keys[1], b"v"]]),  # not a tuple
        ({}, [(keys[0], b"v"), (keys[1], "text")]),  # not bytes
        ({}, [(keys[0], b"v"), (bytearray(b"k"), b"v")]),  # bytes-like: Python converts it
        ({}, [(keys[0], b"v"), (keys[1], b"v", b"extra")]),
        ({"open_parts": {0, 1}}, [(k, b"v") for k in keys]),  # a partition without a batch
        ({"limit": 300}, [(k, b"v" * 40) for k in keys]),  # a full batch
    ]
    for options, records in cases:
        c = _run_append_many(_c, records, 6, **options)
        py = _run_append_many(_py, records, 6, **options)
        assert c == py, options


@pytest.mark.parametrize("impl", [_py, pytest.param(_c, marks=needs_c)], ids=["python", "c"])
def test_append_many_outcomes(impl):
    keys = [b"key-%d" % i for i in range(100)]
    (index, status, partition), out_batches, deltas, writers = _run_append_many(
        impl, [(k, b"v") for k in keys], 6)
    assert (index, status, partition) == (100, impl.DONE, -1)
    assert out_batches == [f"batch-{impl.partition_for_key(k, 6)}" for k in keys]
    assert sum(count for count, _ in writers) == 100
    (index, status, partition), *_ = _run_append_many(
        impl, [(keys[0], b"v")] * 3 + [(keys[0], "text")], 6)
    assert (index, status, partition) == (3, impl.NEEDS_PYTHON, -1)
    (index, status, partition), *_ = _run_append_many(impl, [(None, b"v")], 6, sticky=4,
                                                      open_parts={0})
    assert (index, status, partition) == (0, impl.NEEDS_BATCH, 4)
    with pytest.raises(ValueError):
        impl.append_many([], 0, [None], [None, None], -1, -1, 0, [], bytearray())


# -- Columns: enqueue_many's records in Arrow's binary layout ---------------------------------

def _columns(impl, rng: random.Random, pairs: list, keyless: bool = False):
    return columns_of(impl.Columns, rng, pairs, keyless)


def _random_pairs(rng: random.Random, count: int, keys: list) -> list:
    return [(rng.choice(keys), rng.choice([None, b"", rng.randbytes(rng.randrange(1, 200))]))
            for _ in range(count)]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_columns_are_the_rows_they_lay_out(impl):
    """Read where they lie: each row's key and value as bytes, None for a null cell (whatever
    bytes it spans), "" for an empty one, from the slice's own rows, with 4- or 8-byte
    offsets; without a key column every key is None. A sequence, as enqueue_many takes."""
    rng = random.Random(3)
    for _ in range(40):
        pairs = _random_pairs(rng, rng.randrange(0, 60), [None, b"", b"k", rng.randbytes(20)])
        columns = _columns(impl, rng, pairs)
        assert len(columns) == len(pairs)
        assert list(columns) == [columns[i] for i in range(len(pairs))] == pairs
        if pairs:
            assert columns[-1] == pairs[-1]
        with pytest.raises(IndexError):
            columns[len(pairs)]
        keyless = _columns(impl, rng, pairs, keyless=True)
        assert list(keyless) == [(None, v) for _, v in pairs]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_columns_refuse_buffers_they_would_read_past(impl):
    """Checked when made, so that the compiled loop never reads outside a buffer: offsets
    that fall, start below 0 or end past the data; buffers too short for the rows; a bad
    offset size or first row; what is not a column or not a buffer."""
    offsets = array.array("i", [0, 2, 5]).tobytes()
    good = (None, offsets, b"abcde", 0, 4)
    assert list(impl.Columns(2, good, good)) == [(b"ab", b"ab"), (b"cde", b"cde")]
    for count, keys, values, error in [
        (2, None, (None, array.array("i", [0, 3, 2]).tobytes(), b"abc", 0, 4), ValueError),
        (2, None, (None, array.array("i", [-1, 0, 2]).tobytes(), b"abc", 0, 4), ValueError),
        (2, None, (None, offsets, b"abcd", 0, 4), ValueError),  # past the data
        (3, None, good, ValueError),  # offsets for 2 rows
        (2, None, (None, offsets, b"abcde", 1, 4), ValueError),
        (2, None, (b"", offsets, b"abcde", 0, 4), ValueError),  # no bitmap byte
        (2, None, (None, offsets, b"abcde", 0, 2), ValueError),
        (2, None, (None, offsets, b"abcde", -1, 4), ValueError),
        (-1, None, good, ValueError),
        (2, good, None, TypeError),
        (2, good[:4], good, TypeError),
        (2, None, [None, offsets, b"abcde", 0, 4], TypeError),
        (2, None, (None, "text", b"abcde", 0, 4), TypeError),
        (2, None, (None, offsets, b"abcde", 0.0, 4), TypeError),
    ]:
        with pytest.raises(error):
            impl.Columns(count, keys, values)


@needs_c
def test_append_many_reads_columns_as_it_reads_tuples():
    """The same records as Columns or as a list of tuples: the same batches, offset deltas,
    record bytes and stops, in both implementations."""
    rng = random.Random(17)
    keys = [rng.randbytes(16) for _ in range(50)]
    cases = [
        ({}, _random_pairs(rng, 3000, keys + [b""])),
        ({"fixed": 2}, _random_pairs(rng, 500, keys + [None])),
        ({"sticky": 1}, _random_pairs(rng, 500, [None, keys[0]])),
        ({"sticky": -1}, [(keys[1], b"v"), (None, b"v"), (keys[2], b"v")]),  # keyless: Python
        ({"open_parts": {0, 1}}, [(k, b"v") for k in keys]),  # a partition without a batch
        ({"limit": 300}, [(k, b"v" * 40) for k in keys]),  # a full batch
    ]
    for options, pairs in cases:
        as_tuples = _run_append_many(_py, pairs, 6, **options)
        for impl in (_c, _py):
            got = _run_append_many(impl, _columns(impl, rng, pairs), 6, **options)
            assert got == as_tuples, (impl.__name__, options)
    keyless = _random_pairs(rng, 500, [None])
    for impl in (_c, _py):
        assert _run_append_many(impl, _columns(impl, rng, keyless, keyless=True), 6,
                                sticky=3) == _run_append_many(_py, keyless, 6, sticky=3)
    with pytest.raises(TypeError):  # the other implementation's
        _run_append_many(_c, _columns(_py, rng, keyless), 6, sticky=3)


# -- the Produce codec: C for the common case, the generated codec for everything --------------

PRODUCE_VERSIONS = range(messages.CLIENT_VERSIONS[ApiKey.PRODUCE][0],
                         messages.CLIENT_VERSIONS[ApiKey.PRODUCE][1] + 1)


def _batch_parts(rng: random.Random, size: int) -> tuple[bytes, memoryview]:
    """A batch as the sender gives it: its header, and its sealed records (a memoryview)."""
    writer = _c.RecordWriter(0, 1 << 30)
    writer.try_append(0, None, rng.randbytes(size), None)
    payload = writer.seal()
    return writer.header(payload, 0, -1, -1, -1), payload


def _random_produce_body(rng: random.Random) -> dict:
    return {
        "transactional_id": rng.choice([None, "", "txn-é" * rng.randrange(1, 40)]),
        "acks": rng.choice([-1, 0, 1]),
        "timeout_ms": rng.choice([0, 30_000, 2**31 - 1]),
        "topic_data": [
            {"name": rng.choice(["t", "tøpic-" * rng.randrange(1, 30)]),
             "topic_id": rng.randbytes(16),  # (v13+ write it, not the name)
             "partition_data": [
                 {"index": rng.choice([0, 5, 2**31 - 1]),
                  "records": rng.choice([None, b"", rng.randbytes(rng.randrange(1, 300)),
                                         rng.randbytes(rng.randrange(16_000, 40_000)),
                                         _batch_parts(rng, rng.randrange(0, 300)),
                                         _batch_parts(rng, rng.randrange(16_000, 40_000))])}
                 for _ in range(rng.randrange(0, 4))]}
            for _ in range(rng.randrange(0, 4))],
    }


def _random_produce_response(rng: random.Random) -> dict:
    return {
        "responses": [
            {"name": rng.choice(["t", "tøpic-" * rng.randrange(1, 30)]),
             "topic_id": rng.randbytes(16),
             "partition_responses": [
                 {"index": rng.randrange(0, 2**31), "error_code": rng.choice([0, 0, 6, 87, -1]),
                  "base_offset": rng.choice([-1, 0, 2**63 - 1]),
                  "log_append_time_ms": rng.choice([-1, 2**41]),
                  "log_start_offset": rng.choice([-1, 0, 2**40]),
                  "record_errors": [], "error_message": rng.choice([None, "", "nöt leader"])}
                 for _ in range(rng.randrange(0, 4))]}
            for _ in range(rng.randrange(0, 3))],
        "throttle_time_ms": rng.choice([0, 1, 2**31 - 1]),
    }


def _produce_response_frame(version: int, response: dict) -> bytes:
    """The frame a broker would send (after the size prefix), by the generated writer."""
    flexible = version >= messages.FLEXIBLE_FROM[ApiKey.PRODUCE]
    parts = [b"\x00\x00\x00\x07" + (b"\x00" if flexible else b"")]  # correlation id, tags
    compile_writer(messages._RESPONSES[ApiKey.PRODUCE], version, flexible)(parts, response)
    return b"".join(parts)


@needs_c
@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_request_same_bytes_in_both(version):
    rng = random.Random(version)
    for _ in range(200):
        body = _random_produce_body(rng)
        client_id = rng.choice([None, "", "aioproducer-ü"])
        frame = _c.encode_produce(version, 2**31 - 1, client_id, body)
        python = messages._encode_request(ApiKey.PRODUCE, version, 2**31 - 1, client_id, body)
        payloads = [p["records"][1] for t in body["topic_data"] for p in t["partition_data"]
                    if type(p["records"]) is tuple]
        large = [payload for payload in payloads if len(payload) >= 16384]
        if large:  # written where they lie: the frame is its parts, the payloads among them
            # (a sealed writer's as a memoryview of it: what transports write), in both; the
            # Python twin also keeps large records given as bytes
            for written in (python, frame):
                referenced = [part for part in written if any(
                    part is p or type(part) is memoryview and part.obj is p for p in large)]
                assert type(written) is list and len(referenced) == len(large)
                assert all(type(part) in (bytes, memoryview) for part in written)
            assert all(type(part) is bytes for part in frame if part not in referenced)
        c_bytes, python_bytes = (b"".join(f) if type(f) is list else f for f in (frame, python))
        assert c_bytes == python_bytes


@needs_c
@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_same_dict_in_both(version):
    rng = random.Random(version)
    for _ in range(200):
        response = _random_produce_response(rng)
        frame = _produce_response_frame(version, response)
        body = _c.decode_produce(version, frame)
        assert body == messages._decode_response(ApiKey.PRODUCE, version, frame)
        assert [[p["base_offset"] for p in t["partition_responses"]] for t in body["responses"]] \
            == [[p["base_offset"] for p in t["partition_responses"]]
                for t in response["responses"]]
        for end in range(len(frame)):  # cut short: the generated codec says what is wrong
            assert _c.decode_produce(version, frame[:end]) is None


@pytest.mark.parametrize("implementation", BOTH)
def test_produce_v13_topic_ids_are_their_16_bytes(implementation):
    """A topic id is a bytes object of 16 in a Produce v13 request and answer, in both twins
    (a uuid.UUID cost ~1 us a topic of every request and answer to make and read back); one
    that is not is refused saying so, not written as something else. (The pure-Python twin
    leaves every Produce request and answer to the generated codec.)"""
    topic_id = bytes(range(16))
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "by-name", "topic_id": topic_id,
         "partition_data": [{"index": 0, "records": b"x"}]}]}
    python = messages._encode_request(ApiKey.PRODUCE, 13, 1, "c", body)
    assert python.count(topic_id) == 1 and b"by-name" not in python
    frame = implementation.encode_produce(13, 1, "c", body)
    assert frame == (python if implementation is _c else None)
    for wrong in (uuid.UUID(bytes=topic_id), topic_id[:15], bytearray(topic_id)):
        odd = dict(body, topic_data=[dict(body["topic_data"][0], topic_id=wrong)])
        assert implementation.encode_produce(13, 1, "c", odd) is None
        with pytest.raises(ValueError, match="topic_id is a uuid: 16 bytes, not "):
            messages.encode_request(ApiKey.PRODUCE, 13, 1, "c", odd)
    answer = _produce_response_frame(13, {"responses": [{"topic_id": topic_id,
        "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 5}]}]})
    generated = messages._decode_response(ApiKey.PRODUCE, 13, answer)
    assert [t["topic_id"] for t in generated["responses"]] == [topic_id]
    assert type(generated["responses"][0]["topic_id"]) is bytes
    assert implementation.decode_produce(13, answer) == \
        (generated if implementation is _c else None)


@needs_c
def test_produce_codec_leaves_uncommon_cases_to_python():
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 1000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x"}]}]}
    assert _c.encode_produce(11, 1, "c", body) is not None
    uncommon = [
        (2, body), (14, body),  # versions it does not know
        (13, body),  # a topic without its id (the generated codec writes the zero id)
        (13, dict(body, topic_data=[dict(body["topic_data"][0], topic_id=bytes(15))])),
        (13, dict(body, topic_data=[dict(body["topic_data"][0], topic_id=uuid.UUID(int=1))])),
        (11, {k: v for k, v in body.items() if k != "acks"}),  # a default to fill in
        (11, dict(body, acks=True)), (11, dict(body, acks=1 << 15)),
        (11, dict(body, topic_data=tuple(body["topic_data"]))),
        (11, dict(body, topic_data=[{"name": "t", "partition_data": [
            {"index": 0, "records": bytearray(b"x")}]}])),
        (11, dict(body, transactional_id="\udc80")),  # cannot be encoded: Python says so
    ]
    for version, odd in uncommon:
        assert _c.encode_produce(version, 1, "c", odd) is None, odd
    with pytest.raises(UnicodeEncodeError):
        messages.encode_request(ApiKey.PRODUCE, 11, 1, "c", uncommon[-1][1])

    partition = {"index": 0, "error_code": 87, "base_offset": -1, "log_append_time_ms": -1,
                 "log_start_offset": -1, "error_message": "invalid record",
                 "record_errors": [{"batch_index": 3, "batch_index_error_message": "bad"}]}
    response = {"responses": [{"name": "t", "partition_responses": [partition]}],
                "throttle_time_ms": 0}
    frame = _produce_response_frame(11, response)
    assert _c.decode_produce(11, frame) is None  # record errors: read by Python
    assert messages.decode_response(ApiKey.PRODUCE, 11, frame)["responses"][0][
        "partition_responses"][0]["record_errors"] == partition["record_errors"]
    tagged = frame[:-1] + b"\x01\x05\x01\x07"  # an unknown tag in the body's last tag section
    assert _c.decode_produce(11, tagged) is None
    assert messages.decode_response(ApiKey.PRODUCE, 11, tagged)["throttle_time_ms"] == 0
    bad_name = _produce_response_frame(8, {"responses": [{"name": "tt", "partition_responses": []}],
                                           "throttle_time_ms": 0}).replace(b"tt", b"t\xff")
    assert _c.decode_produce(8, bad_name) is None
    with pytest.raises(CorruptMessageError, match="UTF-8"):
        messages.decode_response(ApiKey.PRODUCE, 8, bad_name)


# -- what keeps a record's future and metadata out of the garbage collector's way ----------

@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_same_context_compares_values_by_identity(impl):
    var, other = contextvars.ContextVar("var"), contextvars.ContextVar("other")

    def copy_with(**values: object) -> contextvars.Context:
        def set_them() -> contextvars.Context:
            for name, value in values.items():
                (var if name == "var" else other).set(value)
            return contextvars.copy_context()
        return contextvars.Context().run(set_them)

    value = [1]
    base = copy_with(var=value)
    assert impl.same_context(base, base) and impl.same_context(base, copy_with(var=value))
    assert not impl.same_context(base, copy_with(var=[1]))  # equal, not the same object
    assert not impl.same_context(base, copy_with(var=value, other=2))
    assert not impl.same_context(copy_with(var=value, other=2), base)
    assert not impl.same_context(base, copy_with(other=value))
    assert impl.same_context(contextvars.Context(), contextvars.Context())


class _Metadata(NamedTuple):
    topic: str
    offset: int


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_new_tuple_is_tuple_new(impl):
    made = impl.new_tuple(_Metadata, ("t", 5))
    assert type(made) is _Metadata and made == ("t", 5) and made.offset == 5


@needs_c
def test_new_tuple_untracks_only_tuples_that_hold_no_references():
    assert not gc.is_tracked(_c.new_tuple(_Metadata, ("t", 5)))
    assert gc.is_tracked(_c.new_tuple(_Metadata, ("t", [5])))  # a list may lead back to it


class _Batch:
    def __init__(self, untracked: list | None) -> None:
        self._untracked = untracked


@needs_c
def test_record_fields_stay_untracked_only_while_their_batch_lists_them():
    class Future(_c.RecordFields):
        __slots__ = ()

    listed = _Batch([])
    future = Future(listed, 3, 1000)
    assert not gc.is_tracked(future) and listed._untracked == [future]
    assert (future._batch, future._offset_delta, future._timestamp) == (listed, 3, 1000)
    assert future._callback is None
    future._callback = print
    future._track()
    future._track()  # (twice is once)
    assert gc.is_tracked(future)
    for batch in (_Batch(None), object()):  # done, or not a batch: tracked from the start
        assert gc.is_tracked(Future(batch, 0, 0))
    with pytest.raises(TypeError):
        Future(listed, 0)
    batch = _Batch([])  # once tracked, a cycle through its future is collected
    in_cycle = Future(batch, 0, 0)
    in_cycle._track()
    in_cycle._callback = [in_cycle].append  # the future -> a list's method -> the future
    collected = weakref.ref(batch)
    del batch, in_cycle
    gc.collect()
    assert collected() is None


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_a_writer_keeps_its_payload_and_codec(impl):
    """What goes on the wire once sealed, kept by the writer (BatchWriter.close() sets it)."""
    writer = impl.RecordWriter(0, 100)
    assert (writer.payload, writer.codec) == (None, 0)
    assert writer.try_append(0, None, b"v", None)
    writer.payload, writer.codec = writer.seal(), 3
    assert (bytes(writer.payload), writer.codec) == (_records_of(impl, b"v"), 3)
    writer.payload = None
    assert writer.payload is None


def _records_of(impl, value: bytes) -> bytes:
    writer = impl.RecordWriter(0, 100)
    assert writer.try_append(0, None, value, None)
    return bytes(writer.seal())


def test_a_batch_writer_is_out_of_the_collectors_way():
    """At many partitions there is a writer a record: it holds nothing that could lead back
    to it, so the garbage collector need not walk it (the C one's)."""
    from aioproducer.protocol.compression import Codec
    from aioproducer.protocol.records import BatchWriter
    writer = BatchWriter(0, 100)
    assert writer.try_append(0, None, b"v", None)
    writer.close(Codec.NONE)
    compiled = _speedups.IMPLEMENTATION == "c"
    assert gc.is_tracked(writer) is not compiled and writer.parts()[1] == writer.payload


BATCH_STARTS = {"attempts": 0, "retry_at": 0.0, "base_sequence": -1, "producer_id": -1,
                "producer_epoch": -1, "done": False, "full": False, "_watchers": None,
                "_bulks": None, "pieces": None, "parent": None, "first_delta": 0,
                "_untracked": []}


async def test_an_acknowledged_batch_is_out_of_the_collectors_way():
    """At many partitions the record futures users keep hold a batch each: one acknowledged
    whole leads to nothing that leads back to it, and the garbage collector need not walk it
    (the C one). A failed one, split one or piece stays tracked: a failure's traceback may
    hold frames, and a split batch and its pieces hold each other."""
    from aioproducer._internal.batch import ProducerBatch, RecordFuture
    from aioproducer.protocol.records import BatchWriter
    loop = asyncio.get_running_loop()

    def batch() -> ProducerBatch:
        return ProducerBatch((1,), "t", 0, BatchWriter(0, 100), loop.create_future(), 0.0,
                             60.0, 0)

    acked, failed, split = batch(), batch(), batch()
    records = [RecordFuture(acked, 0, 0), RecordFuture(failed, 0, 0)]
    acked.complete(5, -1)
    failed.fail(RuntimeError("refused"))
    pieces = [batch(), batch()]
    split.split_into(pieces)
    pieces[0].complete(7, -1)
    compiled = _speedups.IMPLEMENTATION == "c"
    assert gc.is_tracked(acked) is not compiled
    # Nor its asyncio future, resolved, nor its records' futures (which stay out of the
    # collector's way while it is pending: it lets them go when done).
    assert gc.is_tracked(acked.future) is not compiled
    assert gc.is_tracked(RecordFuture(batch(), 0, 0)) is not compiled
    assert gc.is_tracked(failed.future)
    assert gc.is_tracked(failed) and gc.is_tracked(pieces[0])
    pieces[1].complete(8, -1)  # the split batch is done too, with its pieces
    assert gc.is_tracked(split)
    failed.complete(6, -1)  # (an answer after it expired: it stays failed, and tracked)
    assert gc.is_tracked(failed)
    assert (await records[0]).offset == 5 and (await asyncio.gather(records[0]))[0].offset == 5
    with pytest.raises(RuntimeError):
        await records[1]


async def test_a_done_batch_lets_go_of_the_record_futures_nobody_keeps():
    """The C batch chains its records' futures while pending (each holds the one made
    before it, where a list held them before), and holds those watched in an array:
    once the batch is acknowledged, or fails, and their callbacks ran, the futures nobody
    keeps are freed, those older than one kept too (the kept one lets go of the one before
    it as its callbacks run). (Both twins: the suite runs again with
    AIOPRODUCER_PURE_PYTHON=1.)"""
    from aioproducer._internal.batch import ProducerBatch, RecordFuture
    from aioproducer.protocol.records import BatchWriter
    loop = asyncio.get_running_loop()
    compiled = _speedups.IMPLEMENTATION == "c"

    class Future(RecordFuture):  # (no __slots__: weak references)
        pass

    for outcome in ("acked", "failed"):
        batch = ProducerBatch((1,), "t", 2, BatchWriter(0, 100), loop.create_future(), 0.0,
                              60.0, 0)
        futures = [Future(batch, delta, 1000) for delta in range(4)]
        assert batch._untracked == (futures if compiled else [])
        for delta in (1, 2, 3):
            futures[delta].add_done_callback(lambda future: None)
        made, kept = [weakref.ref(future) for future in futures], futures[2]
        del futures
        if outcome == "acked":
            batch.complete(40, -1)
            assert (await kept) == ("t", 2, 42, 1000)
        else:
            batch.fail(RuntimeError("refused"))
            assert isinstance(kept.exception(), RuntimeError) and gc.is_tracked(kept)
        await asyncio.sleep(0)  # (the callbacks run)
        assert batch._untracked is None and batch._watchers is None
        # The kept future keeps none of the others (in C the chain did: 0 and 1).
        assert [future() is not None for future in made] == [False, False, True, False]
        del kept
        assert [future() for future in made] == [None] * 4


async def test_a_batch_runs_its_records_callbacks_once_in_the_order_they_were_added():
    """The records of a batch given callbacks (gather's, a Task's wake-up) are called back
    in the order the callbacks were added, whatever order the records were made in, and a
    record given a callback again after its callbacks were removed is called back once.
    (The C batch keeps them in an array, marking each record it holds.)"""
    from aioproducer._internal.batch import ProducerBatch, RecordFuture
    from aioproducer.protocol.records import BatchWriter
    loop = asyncio.get_running_loop()
    batch = ProducerBatch((1,), "t", 2, BatchWriter(0, 100), loop.create_future(), 0.0, 60.0,
                          0)
    futures = [RecordFuture(batch, delta, 1000) for delta in range(4)]
    ran: list[int] = []

    def called(future) -> None:
        ran.append(future.result().offset)

    for delta in (2, 0, 3, 1):
        futures[delta].add_done_callback(called)
    assert futures[0].remove_done_callback(called) == 1
    futures[0].add_done_callback(called)  # (watched again: called back once)
    assert batch._watchers == [futures[delta] for delta in (2, 0, 3, 1)] + \
        ([] if _speedups.IMPLEMENTATION == "c" else [futures[0]])
    batch.complete(10, -1)
    await asyncio.sleep(0)
    assert ran == [12, 10, 13, 11] and batch._watchers is None
    futures[1].add_done_callback(called)  # done: called back soon
    await asyncio.sleep(0)
    assert ran[4:] == [11]


def _batch_with_records(count: int):
    from aioproducer._internal.batch import ProducerBatch, RecordFuture
    from aioproducer.protocol.records import BatchWriter
    batch = ProducerBatch((1,), "t", 2, BatchWriter(0, 100),
                          asyncio.get_running_loop().create_future(), 0.0, 60.0, 0)
    return batch, [RecordFuture(batch, delta, 1000) for delta in range(count)]


async def test_callbacks_added_while_a_batchs_callbacks_run_each_run_once():
    """While a batch's records are called back (20: more than the C batch's first array
    holds), a callback adds callbacks: to a record further on whose callback was removed
    (still watched: called back in this run), to one further on with a callback, to itself
    and to a record never watched (done: soon). Each runs once, in the order asyncio
    futures would run them."""
    batch, futures = _batch_with_records(25)
    ran: list[object] = []

    def called(future) -> None:
        ran.append(future.result().offset - 100)

    def first(future) -> None:
        called(future)
        futures[5].add_done_callback(lambda f: ran.append(("again", 5)))
        futures[7].add_done_callback(lambda f: ran.append(("more", 7)))
        futures[0].add_done_callback(lambda f: ran.append(("again", 0)))
        futures[22].add_done_callback(lambda f: ran.append(("late", 22)))

    futures[0].add_done_callback(first)
    for future in futures[1:20]:
        future.add_done_callback(called)
    assert futures[5].remove_done_callback(called) == 1
    batch.complete(100, -1)
    for _ in range(3):
        await asyncio.sleep(0)
    assert ran == [0, 1, 2, 3, 4, ("again", 5), 6, 7, ("more", 7)] + list(range(8, 20)) + \
        [("again", 0), ("late", 22)]
    assert batch._watchers is None


async def test_a_record_left_by_an_interrupted_run_of_callbacks_is_called_back_later():
    """A callback raising KeyboardInterrupt ends the run of its batch's callbacks (it
    propagates, as from asyncio's loop); a record not reached, its callback removed before,
    then given one, is called back: it is not left marked as watched (in C) by a batch that
    no longer holds it."""
    from aioproducer._internal.batch import _run_callbacks
    batch, futures = _batch_with_records(3)
    ran: list[int] = []

    def interrupt(future) -> None:
        raise KeyboardInterrupt

    def called(future) -> None:
        ran.append(future.result().offset)

    futures[0].add_done_callback(interrupt)
    futures[1].add_done_callback(called)
    futures[2].add_done_callback(called)
    assert futures[1].remove_done_callback(called) == 1
    batch.complete(10, -1)
    with pytest.raises(KeyboardInterrupt):
        _run_callbacks(batch._take_watchers())
    futures[1].add_done_callback(called)
    for _ in range(3):
        await asyncio.sleep(0)
    assert 11 in ran and ran.count(11) == 1


async def test_a_cancelled_record_of_a_batch_is_called_back_once():
    """A watched record's future is cancelled while its batch is pending: its callback runs
    once, seeing it cancelled, and not again when the batch completes; a callback added to
    it later runs once; its batch-mates are called back with their metadata."""
    batch, futures = _batch_with_records(10)
    ran: list[object] = []

    def called(future) -> None:
        ran.append("cancelled" if future.cancelled() else future.result().offset)

    for future in futures:
        future.add_done_callback(called)
    assert futures[3].cancel()
    await asyncio.sleep(0)
    assert ran == ["cancelled"]
    futures[3].add_done_callback(called)
    batch.complete(50, -1)
    for _ in range(3):
        await asyncio.sleep(0)
    assert ran == ["cancelled"] * 2 + [50 + delta for delta in range(10) if delta != 3]


async def test_a_batch_in_a_reference_cycle_with_its_watched_records_is_collected():
    """A batch holding records watched (more than its first array: 40) whose callbacks lead
    back to it, dropped pending: the collector frees the batch and every record (in C it
    visits each record the batch holds, and clears them)."""
    from aioproducer._internal.batch import RecordFuture
    batch, _ = _batch_with_records(0)
    batch._untracked = None  # (records made now are the collector's from the start)

    class Future(RecordFuture):  # (no __slots__: weak references)
        pass

    futures = [Future(batch, delta, 1000) for delta in range(40)]
    for future in futures:
        future.add_done_callback(lambda f, batch=batch: batch)
    if _speedups.IMPLEMENTATION == "c":
        assert set(map(id, futures)) <= set(map(id, gc.get_referents(batch)))
    made = [weakref.ref(future) for future in futures]
    del futures, future, batch
    gc.collect()
    assert [future() for future in made] == [None] * 40


@pytest.mark.parametrize("pure", ["1", ""], ids=["python", "c"])
def test_a_batch_of_a_million_records_lets_their_futures_go(pure):
    """A batch lets its records' futures go one by one, not by recursion: the C chain of
    them, freed by each future freeing the one before it, overflowed the C stack (a
    batch_size of 16 MiB holds a million records). RecordFields itself, as a Python
    subclass's instances are freed by CPython's trashcan, which bounds that recursion. In
    a child process, which a crash ends."""
    code = """if True:
        import asyncio
        from aioproducer import _speedups
        from aioproducer._internal.batch import ProducerBatch
        from aioproducer.protocol.records import BatchWriter
        loop = asyncio.new_event_loop()
        batch = ProducerBatch((1,), "t", 0, BatchWriter(0, 100), loop.create_future(), 0.0,
                              60.0, 0)
        for delta in range(1_000_000):
            _speedups.RecordFields(batch, delta, 0)
        batch.complete(0, -1)
        print(_speedups.IMPLEMENTATION, "let go")
    """
    if not pure and _c is None:
        pytest.skip("the C speed-up did not build")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "AIOPRODUCER_PURE_PYTHON": pure}, timeout=120,
                          check=False)
    assert (done.returncode, done.stdout) == (0, f"{'python' if pure else 'c'} let go\n"), \
        done.stderr[-2000:]


_UNTRACKS = pytest.mark.skipif(
    _speedups.IMPLEMENTATION != "c",
    reason="the pure-Python twin cannot untrack objects from the garbage collector (only C "
           "can): nothing to check there")


@_UNTRACKS
async def test_a_pending_batch_is_out_of_the_collectors_way_until_it_fails_or_splits():
    """At many partitions a batch is opened every record or two: one the accumulator opens
    (its asyncio future, its partition's queue and that queue's key with it) starts out of
    the garbage collector's way, as does the list of records watching it (gather's) and its
    payload once sealed, so that no pending batch is promoted to the collector's oldest
    generation, whose growth brings full collections (each walking every object the
    process holds). A failure or a split, which may lead back to it, hands it back."""
    from aioproducer._internal.batch import ProducerBatch, RecordFuture
    from aioproducer.protocol.records import BatchWriter
    acc = _accumulator_parts(_c, asyncio.get_running_loop())
    acc._batch_type, acc._writer_type = ProducerBatch, BatchWriter
    acked, failed, split = (acc.open_new("t", p, b"k", b"v", 1000, 3) for p in range(3))
    for batch in (acked, failed, split):
        assert not gc.is_tracked(batch) and not gc.is_tracked(batch.future)
    queue = acc._batches[("t", 0)]
    assert not gc.is_tracked(queue) and not any(gc.is_tracked(tp) for tp in acc._batches)
    record = RecordFuture(acked, 0, 1000)
    record.add_done_callback(lambda future: None)
    assert acked._watchers == [record] and not gc.is_tracked(record)
    assert acc._take(("t", 0), queue) is acked
    payload = acked.writer.payload
    assert payload == acked.writer.parts()[1] and len(payload) == acked.writer.size - 61
    assert not gc.is_tracked(payload)
    acked.complete(5, -1)
    assert not gc.is_tracked(acked) and not gc.is_tracked(acked.future)
    assert (await record).offset == 5
    failed.fail(RuntimeError("refused"))
    assert gc.is_tracked(failed) and gc.is_tracked(failed.future)
    split.split_into([ProducerBatch((3, i), "t", 2, BatchWriter(0, 100),
                                    asyncio.get_running_loop().create_future(), 0.0, 60.0, 0)
                      for i in range(2)])
    assert gc.is_tracked(split) and gc.is_tracked(split.future)


@_UNTRACKS
async def test_a_pending_batch_s_enqueue_many_futures_are_out_of_the_collectors_way():
    """The list of enqueue_many futures a pending batch keeps (`_bulks`, one a batch: at
    10,000 partitions ~12,000 a run of 200k records, promoted while pending, set off a
    full collection) is out of the garbage collector's way while its batch is, and is
    handed back with the batch (a split)."""
    from aioproducer._internal.batch import ProducerBatch
    from aioproducer.protocol.records import BatchWriter
    acc = _accumulator_parts(_c, asyncio.get_running_loop())
    acc._batch_type, acc._writer_type = ProducerBatch, BatchWriter
    pending, split = (acc.open_new("t", p, b"k", b"v", 1000, 3) for p in range(2))
    bulk = types.SimpleNamespace(_pending=2, done=lambda: False, _resolve=lambda: None)
    assert _c.watch_batches([pending, split], bulk) == 2
    assert pending._bulks == [bulk] and not gc.is_tracked(pending._bulks)
    assert not gc.is_tracked(split._bulks)
    split.split_into([ProducerBatch((2, i), "t", 1, BatchWriter(0, 100),
                                    asyncio.get_running_loop().create_future(), 0.0, 60.0, 0)
                      for i in range(2)])
    assert gc.is_tracked(split) and gc.is_tracked(split._bulks)
    tracked = ProducerBatch((9,), "t", 2, BatchWriter(0, 100),
                            asyncio.get_running_loop().create_future(), 0.0, 60.0, 0)
    assert _c.watch_batches([tracked], bulk) == 1 and gc.is_tracked(tracked._bulks)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_batch_fields_start_alike_and_hand_the_reservation_to_the_writer(impl):
    class Batch(impl.BatchFields):
        __slots__ = ()

    writer, future = impl.RecordWriter(0, 100), object()
    batch = Batch((3, 1), "t", 2, writer, future, 1.5, 61.5, 1024)
    assert writer.reserved == 1024  # the writer counts the memory the batch holds
    given = {"number": (3, 1), "topic": "t", "partition": 2, "writer": writer,
             "future": future, "created": 1.5, "deadline": 61.5}
    assert {name: getattr(batch, name) for name in {**given, **BATCH_STARTS}} == \
        {**given, **BATCH_STARTS}
    assert type(batch.retry_at) is float and type(batch.done) is bool
    other = Batch((4,), "t", 0, impl.RecordWriter(0, 100), future, 0.0, 0.0, 0)
    assert other._untracked == [] and other._untracked is not batch._untracked
    batch.attempts, batch.pieces, batch._untracked = 2, [other], None
    assert (batch.attempts, batch.pieces, batch._untracked) == (2, [other], None)
    assert not hasattr(batch, "__dict__")  # slots only
    with pytest.raises(TypeError):
        Batch((5,), "t", 0, writer, future, 0.0, 0.0)
    # A future of a record in it registers in its list (the C one reads the slot), and a
    # cycle through its fields is collected.
    records = _future_class(impl)(other, 0, 0)
    assert other._untracked == [records] or impl is _py
    other._untracked = None  # (as when it is done: the list and its futures go)
    marker = _Batch(None)
    marker.batch, other.parent = other, marker
    collected = weakref.ref(marker)
    del marker, other, records, batch  # (batch.pieces holds other)
    gc.collect()
    assert collected() is None


def _answers_once_acknowledged(impl, loop) -> list:
    """What record futures of batches completed with edge outcomes answer (each question),
    and what they answer for a batch that expired before its answer came."""
    class Batch(impl.BatchFields):
        __slots__ = ()

    def answers(record) -> tuple:
        failure = record.exception()
        return (record.done(), record.cancelled(), repr(failure),
                None if failure is not None else tuple(record.result()))

    seen = []
    for base, appended, delta in [(5, -1, 0), (5, -1, 3), (-1, -1, 2), (1 << 40, 1 << 41, 7),
                                  ((1 << 63) - 1, -1, 1), (-(1 << 63), -1, 1), (True, -1, 1)]:
        batch = Batch((1,), "t", 2, impl.RecordWriter(0, 100), loop.create_future(), 0.0,
                      60.0, 0)
        record = _future_class(impl)(batch, delta, 1234)
        batch.complete(base, appended)
        seen.append(answers(record))
    expired = Batch((2,), "t", 2, impl.RecordWriter(0, 100), loop.create_future(), 0.0, 60.0, 0)
    record = _future_class(impl)(expired, 0, 1234)
    expired.future.set_exception(TimeoutError("expired in flight"))
    expired.complete(9, -1)  # (the answer after it expired: it stays failed)
    seen.append(answers(record))
    return seen


@needs_c
async def test_a_record_of_an_acknowledged_batch_answers_alike_in_both():
    """The C record future answers from its batch's fields once the batch is acknowledged
    (the batch's asyncio future and its result's tuple were three more objects out of the
    CPU's caches per record at 10,000 partitions): the same answers as the Python one, which
    asks the batch's future, for unknown (-1) and huge offsets, a log-append time, and a
    batch that expired before its answer came."""
    loop = asyncio.get_running_loop()
    both = [_answers_once_acknowledged(impl, loop) for impl in (_py, _c)]
    assert both[0] == both[-1]
    assert both[0][1] == (True, False, "None", ("t", 2, 8, 1234))
    assert both[0][3][3] == ("t", 2, (1 << 40) + 7, 1 << 41)
    assert both[0][-1][:3] == (True, False, "TimeoutError('expired in flight')")


@needs_c
@pytest.mark.parametrize("base, timestamp", [(-(1 << 63), (1 << 63) - 1),
                                             ((1 << 63) - 1, -(1 << 63)), (5, (1 << 63) - 1)])
def test_a_timestamp_delta_past_int64_wraps_alike_in_both(base, timestamp):
    """Out-of-range timestamps (the producer takes only 0 to 2**63-1, but a RecordWriter can
    be given any): the delta wraps to 64 bits as Java's long arithmetic does, in C without
    a signed overflow (undefined behaviour, flagged by UBSan), in Python the same way."""
    written = []
    for impl in (_py, _c):
        writer = impl.RecordWriter(base, 1 << 20)
        assert writer.try_append(timestamp, b"k", b"v", None)
        written.append(writer.seal())
    assert written[0] == written[1]
    assert len(written[0]) < 30  # a 10-byte varint at most, not an unbounded one


class _Collides:
    """A dict key with the hash of "index" whose __eq__, run by the C encoder's lookup of a
    partition's "index", drops the partition's records (their only reference): the old
    encoder had fetched them before, borrowed, and then read freed memory."""

    armed = False  # (inserting "index" into the dict compares with it too)

    def __init__(self, partition: dict) -> None:
        self.partition = partition

    def __hash__(self) -> int:
        return hash("index")

    def __eq__(self, other: object) -> bool:
        if self.armed:
            self.partition.pop("records", None)
        return False


@needs_c
def test_the_c_produce_encoder_holds_what_a_lookup_may_free():
    """produce_body kept borrowed references across dict lookups: a key whose __eq__ drops
    a value fetched before made it read freed memory (AddressSanitizer, with
    PYTHONMALLOC=malloc: heap-use-after-free; see tests/README.md). It now holds them, and
    a body that changed under it is left to the generated codec. In a build without the
    sanitizer the old read went unnoticed: this test is the one that run catches it with."""
    for _ in range(20):
        partition: dict = {}
        collides = _Collides(partition)
        partition[collides] = 0  # first: the lookup of "index" meets it first
        partition["records"] = os.urandom(4096)
        partition["index"] = 0
        collides.armed = True
        body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000,
                "topic_data": [{"name": "t", "partition_data": [partition]}]}
        assert _c.encode_produce(9, 1, "c", body) is None


# -- a record's future: its append, the Future protocol asyncio calls, its callbacks ---------

class _Outcome(NamedTuple):  # RecordMetadata's shape
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class _FakeBatch:
    """What a RecordFuture asks of its batch: its asyncio future, pieces, topic, partition,
    watch(); and, split, metadata() and exception_for() per record."""

    def __init__(self, future, pieces=None) -> None:
        self.future = future
        self.pieces = pieces
        self.topic, self.partition = "t", 4
        self.watched: list = []
        self._untracked: list = []

    def watch(self, record) -> None:
        self.watched.append(record)

    def metadata(self, delta, timestamp):
        return ("split", delta, timestamp)

    def exception_for(self, delta):
        return KeyError(delta)


def _future_class(impl):
    class Future(impl.RecordFields):
        __slots__ = ()
        _metadata_type = _Outcome
    return Future


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_append_record_appends_to_the_open_batch_and_makes_the_future(impl):
    Future = _future_class(impl)
    writers = [None, impl.RecordWriter(1000, 200), None]
    batches = [None, "batch-1", None]
    alike = impl.RecordWriter(1000, 200)
    futures = []
    for i in range(10):
        future = impl.append_record(batches, writers, 1, 1000 + i, b"k", b"v" * 20,
                                    b"\x02\x02h\x02v" if i == 3 else None, Future)
        if future is None:
            break
        assert alike.try_append(1000 + i, b"k", b"v" * 20, b"\x02\x02h\x02v" if i == 3 else None)
        futures.append(future)
    assert 1 < len(futures) < 10  # full at 200 bytes: None, and nothing appended
    assert writers[1].count == len(futures) and writers[1].seal() == alike.seal()
    assert [(type(f), f._batch, f._offset_delta, f._timestamp) for f in futures] == \
        [(Future, "batch-1", i, 1000 + i) for i in range(len(futures))]
    for partition in (0, 2, 3, -1):  # no open batch, or no such partition
        assert impl.append_record(batches, writers, partition, 0, b"k", b"v", None,
                                  Future) is None
    with pytest.raises(TypeError):
        impl.append_record(batches, writers, 1, 0, "text", b"v", None, Future)
    with pytest.raises(TypeError):
        impl.append_record(batches, writers[:2], 1, 0, b"k", b"v", None, Future)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
def test_append_record_refuses_a_key_or_value_not_bytes_whatever_the_partition(impl):
    # The C checked the partition first: None (the Python path) for a str key given with a
    # partition out of range or without an open batch, where the Python twin raised.
    Future = _future_class(impl)
    writers, batches = [None, impl.RecordWriter(0, 200)], [None, "batch-1"]
    for partition in (0, 1, 2, -1):
        for key, value in (("text", b"v"), (b"k", bytearray(b"v"))):
            with pytest.raises(TypeError, match="bytes or None"):
                impl.append_record(batches, writers, partition, 0, key, value, None, Future)
    assert writers[1].count == 0


@needs_c
def test_the_c_future_registers_with_its_batch_as_its_constructor_does():
    Future = _future_class(_c)
    batch = _FakeBatch(None)
    future = _c.append_record([batch], [_c.RecordWriter(0, 1 << 20)], 0, 5, None, b"v", None,
                              Future)
    assert batch._untracked == [future] and not gc.is_tracked(future)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_the_future_protocol_asks_the_batch(impl):
    loop = asyncio.get_running_loop()
    Future = _future_class(impl)
    pending = _FakeBatch(loop.create_future())
    record = Future(pending, 3, 1234)
    assert (record.done(), record.cancelled(), record.get_loop()) == (False, False, loop)
    for ask in (record.result, record.exception):
        with pytest.raises(asyncio.InvalidStateError):
            ask()
    pending.future.set_result((100, -1))
    assert record.done() and not record.cancelled() and record.exception() is None
    result = record.result()
    assert type(result) is _Outcome and result == ("t", 4, 103, 1234)
    pending.future = loop.create_future()
    pending.future.set_result((-1, 777))  # acks=0 (no offset); log-append time
    assert record.result() == ("t", 4, -1, 777)
    failed = _FakeBatch(loop.create_future())
    failed.future.set_exception(ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        Future(failed, 0, 0).result()
    assert isinstance(Future(failed, 0, 0).exception(), ValueError)
    cancelled = _FakeBatch(loop.create_future())
    cancelled.future.cancel("why")
    assert Future(cancelled, 0, 0).cancelled()
    with pytest.raises(asyncio.CancelledError, match="why"):
        Future(cancelled, 0, 0).result()
    split = _FakeBatch(loop.create_future(), pieces=[])
    split.future.set_result((-1, -1))
    assert Future(split, 7, 99).result() == ("split", 7, 99)
    assert Future(split, 7, 99).exception().args == (7,)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_done_callbacks_are_kept_then_run_in_order_in_their_contexts(impl):
    Future = _future_class(impl)
    var = contextvars.ContextVar("var", default="unset")
    batch = _FakeBatch(asyncio.get_running_loop().create_future())
    record = Future(batch, 0, 0)
    seen = []

    def saw(tag):
        def callback(future):
            assert future is record
            seen.append((tag, var.get()))
            var.set("changed by " + tag)  # in its own copy: the next one does not see it
        return callback

    var.set("first")
    record.add_done_callback(saw("a"))
    assert batch.watched == [record]  # the batch is told once, at the first callback
    var.set("second")
    record.add_done_callback(saw("b"))
    given = contextvars.copy_context()
    given.run(var.set, "given")
    record.add_done_callback(saw("c"), context=given)
    assert batch.watched == [record]
    with pytest.raises(TypeError):
        record.add_done_callback(saw("d"), contxt=given)
    reported = []
    impl.run_callbacks(lambda *args: reported.append(args), [record])
    assert seen == [("a", "first"), ("b", "second"), ("c", "given")]
    assert given[var] == "changed by c"  # that very context, as asyncio runs it
    assert var.get() == "second" and not reported
    impl.run_callbacks(lambda *args: reported.append(args), [record])  # each ran once
    assert len(seen) == 3 and record._callback is None and not record._more_callbacks


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_what_a_done_callback_raises_is_reported_and_the_rest_run(impl):
    Future = _future_class(impl)
    loop = asyncio.get_running_loop()
    records = [Future(_FakeBatch(loop.create_future()), i, 0) for i in range(3)]
    ran = []

    def fails(future):
        raise ValueError(future._offset_delta)

    records[0].add_done_callback(fails)
    records[0].add_done_callback(ran.append)
    records[1].add_done_callback(ran.append)
    reported = []
    impl.run_callbacks(lambda *args: reported.append(args), records)
    assert ran == records[:2]
    [(record, fn, error)] = reported
    assert record is records[0] and fn is fails and type(error) is ValueError
    assert error.__traceback__ is not None
    records[2].add_done_callback(lambda future: sys.exit(3))
    records[2].add_done_callback(ran.append)
    with pytest.raises(SystemExit):  # (as asyncio's loop lets it through)
        impl.run_callbacks(lambda *args: reported.append(args), [records[2]])
    assert len(reported) == 1


_GIVEN = 1700000000005  # a timestamp_ms given (one below 1e11, seconds-like, goes to `later`)


class _Started:
    """What an Appender reads of a started producer's parts: the lifecycle's state, thread
    and running loop, the cluster's topics, the accumulator's line and open batches."""

    def __init__(self, impl, loop) -> None:
        self.state, self.thread, self.loop_running = "started", threading.get_ident(), \
            loop.is_running
        self.topics = {"t": types.SimpleNamespace(leaders=(1, 1, 1))}
        self.line: collections.deque = collections.deque()
        self.appendable = {"t": (["batch-0", "batch-1", "batch-2"],
                                 [impl.RecordWriter(0, 300) for _ in range(3)])}


def _appender(impl, parts, *, ready=True, python_only=False, partition_in_python=False,
              check_can_send=None, open_new=None):
    later_calls: list = []

    def later(*args, **kwargs):
        later_calls.append((args, kwargs))
        return "later"

    appender = impl.Appender(later, _future_class(impl), ready, parts, "started",
                             lambda: 1700000000.1234, python_only, partition_in_python)
    assert appender("t", b"v") == "later" and later_calls.pop() == (("t", b"v"), {})
    appender.attach(parts, parts, check_can_send, lambda topic, leaders: 2, open_new)
    return appender, later_calls


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_the_appender_appends_the_common_case_and_hands_on_the_rest(impl):
    parts = _Started(impl, asyncio.get_running_loop())
    appender, later_calls = _appender(impl, parts)
    key = b"k"  # murmur2 of b"k" over 3 partitions
    by_key = impl.partition_for_key(key, 3)
    appended = [(await appender("t", b"v", partition=1, timestamp_ms=_GIVEN), 1, _GIVEN),
                (await appender("t", b"v", key), by_key, 1700000000123),
                (await appender("t", None, key=key, headers=None), by_key, 1700000000123),
                (await appender("t", b"v"), 2, 1700000000123)]  # keyless: the sticky one
    seen = {}
    for future, partition, timestamp in appended:
        delta = seen[partition] = seen.get(partition, -1) + 1
        assert (future._batch, future._offset_delta, future._timestamp) == \
            (f"batch-{partition}", delta, timestamp)
    assert not later_calls
    refused = [(("t", b"v"), {"headers": [("h", b"v")]}), (("t", b"v"), {"other": 1}),
               (("t", b"v", b"k"), {"key": b"k"}), (("t",), {}), (("t", b"v", None, 3), {}),
               (("t", "text"), {}), (("t", b"v", bytearray(b"k")), {}), ((b"t", b"v"), {}),
               (("unknown", b"v"), {}), (("t", b"v"), {"partition": 3}),
               (("t", b"v"), {"partition": -1}), (("t", b"v"), {"partition": True}),
               (("t", b"v"), {"timestamp_ms": -1}), (("t", b"v"), {"timestamp_ms": 1 << 63}),
               (("t", b"v"), {"timestamp_ms": 1.5}), (("t", b"v" * 300), {}),
               (("t", b"v"), {"timestamp_ms": 1700000000})]  # (seconds: `later` warns)
    for args, kwargs in refused:
        assert appender(*args, **kwargs) == "later"
        assert later_calls.pop() == (args, kwargs)
    for change in ("state", "thread", "loop", "line", "topic"):
        parts = _Started(impl, asyncio.get_running_loop())
        if change == "state":
            parts.state = "closing"
        elif change == "thread":
            parts.thread += 1
        elif change == "loop":
            parts.loop_running = lambda: False
        elif change == "line":
            parts.line.append("waiting")
        else:
            parts.topics["t"] = types.SimpleNamespace(leaders=())
        appender, later_calls = _appender(impl, parts)
        assert appender("t", b"v", b"k") == "later" and len(later_calls) == 1, change
    for settings in ({"python_only": True}, {"partition_in_python": True},
                     {"check_can_send": _raises}):
        appender, later_calls = _appender(impl, _Started(impl, asyncio.get_running_loop()),
                                          **settings)
        assert appender("t", b"v") == "later" and len(later_calls) == 1, settings
    appender, _ = _appender(impl, _Started(impl, asyncio.get_running_loop()),
                            partition_in_python=True, check_can_send=lambda: None)
    assert (await appender("t", b"v", partition=0))._batch == "batch-0"


def _raises():
    raise RuntimeError("not in a transaction")


class _Index:
    """An int-like as numpy's and pandas' integers are: __index__, not an int."""

    def __init__(self, number: object) -> None:
        self.number = number

    def __index__(self) -> int:
        if isinstance(self.number, BaseException):
            raise self.number
        return self.number  # type: ignore[return-value]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_each_record_is_stamped_with_the_millisecond_of_its_call(impl):
    """A record given no timestamp gets int(time.time() * 1000) of its own call, also when
    the one before it had the same millisecond (the C path reuses that int) or another."""
    parts = _Started(impl, asyncio.get_running_loop())
    times = iter([1700000000.1234, 1700000000.12349, 1700000000.1241, 1700000000.1241,
                  1700000001.0, 1700000000.9999])
    appender = impl.Appender(lambda *args, **kwargs: "later", _future_class(impl), True,
                             parts, "started", lambda: next(times), False, False)
    appender.attach(parts, parts, None, lambda topic, leaders: 2, None)
    stamps = [(await appender("t", b"v", partition=1))._timestamp for _ in range(6)]
    assert stamps == [1700000000123, 1700000000123, 1700000000124, 1700000000124,
                      1700000001000, 1700000000999]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_the_appender_takes_an_int_like_partition_and_timestamp(impl):
    """A partition or timestamp given as numpy.int64 (pandas' column of them, say) is the
    int it stands for: appended by the common case, its future holding a plain int; a bool,
    an __index__ that fails, or one out of range goes to `later`, which refuses it."""
    parts = _Started(impl, asyncio.get_running_loop())
    appender, later_calls = _appender(impl, parts)
    future = await appender("t", b"v", partition=_Index(1), timestamp_ms=_Index(_GIVEN))
    assert (future._batch, future._offset_delta, future._timestamp) == ("batch-1", 0, _GIVEN)
    assert type(future._timestamp) is int and not later_calls
    sending, _ = _appender(impl, parts, ready=False)
    assert sending("t", b"v", partition=_Index(2))._batch == "batch-2"
    refused = [{"partition": _Index(3)}, {"partition": _Index(-1)},
               {"partition": _Index(ValueError("no"))}, {"partition": False},
               {"timestamp_ms": _Index(-1)}, {"timestamp_ms": _Index(1 << 63)},
               {"timestamp_ms": _Index(TypeError("no"))}, {"timestamp_ms": True}]
    for kwargs in refused:
        assert appender("t", b"v", **kwargs) == "later", kwargs
        assert later_calls.pop() == (("t", b"v"), kwargs)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_the_appender_opens_a_batch_where_a_placed_record_has_none(impl):
    """A keyed record, or one given its partition, whose partition has no open batch goes
    into a new one from open_new (at many partitions, one record a batch): no Python path.
    Where open_new opens none (memory short, say) or raises, and for a keyless record (the
    sticky partitioner moves on with a new batch) or a full open batch (closed first), the
    record goes to `later`, which does it all."""
    parts = _Started(impl, asyncio.get_running_loop())
    parts.appendable["t"][1][0] = None  # partition 0: no open batch
    parts.appendable["t"][1][2] = None  # nor 2, the sticky one
    opened: list = []
    outcome: list = ["new-batch"]

    def open_new(*args):
        opened.append(args)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    appender, later_calls = _appender(impl, parts, open_new=open_new)
    future = await appender("t", b"v", partition=0, timestamp_ms=_GIVEN)
    assert (future._batch, future._offset_delta, future._timestamp) == ("new-batch", 0, _GIVEN)
    assert opened.pop() == ("t", 0, None, b"v", _GIVEN, 3) and not later_calls
    key = next(k for k in (b"a", b"b", b"c", b"d", b"e", b"f")
               if impl.partition_for_key(k, 3) in (0, 2))
    placed = impl.partition_for_key(key, 3)
    sending, sent_later = _appender(impl, parts, ready=False, open_new=open_new)
    future = sending("t", b"w", key)  # send(): the future itself
    assert (future._batch, future._offset_delta, future._timestamp) == \
        ("new-batch", 0, 1700000000123)
    assert opened.pop() == ("t", placed, key, b"w", 1700000000123, 3) and not sent_later
    for refusal in (None, RuntimeError("short of memory")):
        outcome[0] = refusal
        assert appender("t", b"v", partition=0) == "later"
        assert opened.pop()[:2] == ("t", 0) and later_calls.pop() == (("t", b"v"),
                                                                     {"partition": 0})
    outcome[0] = "new-batch"
    assert appender("t", b"v") == "later"  # keyless: the sticky partition (2) has none
    assert (await appender("t", b"v", partition=1))._batch == "batch-1"
    assert appender("t", b"v" * 300, partition=1) == "later"  # the open batch is full
    assert not opened and len(later_calls) == 2
    with_none, later_calls = _appender(impl, parts)  # no opener: `later`, as before
    assert with_none("t", b"v", partition=0) == "later" and len(later_calls) == 1


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_ready_awaitable_gives_its_result_and_is_a_coroutine_to_asyncio(impl):
    parts = _Started(impl, asyncio.get_running_loop())
    sending, _ = _appender(impl, parts, ready=False)
    future = sending("t", b"v", partition=0)
    assert isinstance(future, impl.RecordFields)  # send(): the future itself
    ready = impl.Ready("result")
    assert await ready == "result" and await ready == "result"
    assert asyncio.iscoroutine(ready) and not asyncio.isfuture(ready)
    assert await asyncio.create_task(impl.Ready("task")) == "task"
    assert await asyncio.gather(impl.Ready(1), impl.Ready(2)) == [1, 2]
    with pytest.raises(StopIteration) as stop:
        impl.Ready((1, 2)).send(None)
    assert stop.value.value == (1, 2)
    for thrown in (KeyError("k"), KeyError):
        with pytest.raises(KeyError):
            ready.throw(thrown)
    with pytest.raises(KeyError, match="given"):
        ready.throw(KeyError, KeyError("given"))
    assert ready.close() is None
    cancelled = asyncio.create_task(impl.Ready("never"))
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_future_reads_its_batch_as_the_batch_class_says_now(impl):
    """The C future reads a slotted batch's attributes from its slots (asyncio.gather has it
    read a dozen per record); a class changed since, or another class, is read anew."""
    loop = asyncio.get_running_loop()

    class Slotted:
        __slots__ = ("future", "pieces", "topic", "partition", "_untracked", "_watchers")

        def __init__(self, future) -> None:
            self.future, self.pieces, self.topic, self.partition = future, None, "s", 1
            self._untracked, self._watchers = [], []

    Future = _future_class(impl)
    acknowledged = loop.create_future()
    acknowledged.set_result((10, -1))
    record = Future(Slotted(acknowledged), 2, 5)
    assert record.result() == ("s", 1, 12, 5) and record.get_loop() is loop
    failed = loop.create_future()
    failed.set_exception(KeyError("moved"))
    Slotted.future = property(lambda self: failed)  # the class changes: no slot read now
    assert isinstance(record.exception(), KeyError)
    other = _FakeBatch(acknowledged)
    assert Future(other, 3, 7).result() == ("t", 4, 13, 7)
    assert isinstance(record.exception(), KeyError)
    del Slotted.future
    with pytest.raises(AttributeError):
        record.done()


class _Clock:
    """A loop's time() that moves only when told, and its futures."""

    def __init__(self, loop) -> None:
        self.now, self.loop = 100.0, loop

    def time(self) -> float:
        return self.now

    def create_future(self):
        return self.loop.create_future()


def _accumulator_parts(impl, loop):
    """An AccumulatorFields of `impl` with its fields set as the RecordAccumulator sets them,
    and the methods and hooks of the accumulator that the opening and taking call, which
    record what they were asked."""

    class Batch(impl.BatchFields):
        __slots__ = ()

        @property
        def record_count(self):  # (as ProducerBatch's: the sequencer reads it)
            return self.writer.count

    class Writer(impl.RecordWriter):
        __slots__ = ()

        def close(self, codec, level=None):  # (as BatchWriter's, but for the compressing)
            self.codec = codec
            records = self.seal()
            self.payload = (b"compressed", level) if codec else records

    class Accumulator(impl.AccumulatorFields):
        def open_batches(self, topic, partitions):
            self.calls.append(("open_batches", topic, partitions))
            open_ = self.appendable.setdefault(topic, ([], []))
            for listed in open_:
                del listed[partitions:]
                listed.extend([None] * (partitions - len(listed)))
            return open_

        def _count_linger_bound(self, now):
            self.calls.append(("count_linger_bound", now))
            self._lone_acked_at = None

        def _wake_failed(self, exc):
            self.calls.append(("wake_failed", repr(exc)))

    accumulator = Accumulator()
    accumulator.calls = []
    accumulator.closing = False
    accumulator.line = collections.deque()
    accumulator._pool = impl.MemoryPool(4096)
    accumulator._loop = _Clock(loop)
    accumulator._batch_size, accumulator._first_reserve = 2048, 1024
    accumulator._max_request_size, accumulator.buffer_memory = 3000, 4096
    accumulator._linger, accumulator._delivery_timeout = 0.005, 120.0
    accumulator._batches, accumulator.appendable, accumulator.incomplete = {}, {}, set()
    accumulator._txn = None
    accumulator._quiet_until, accumulator._expiry_floor = float("inf"), float("inf")
    accumulator._round_by = 0.0
    accumulator._batches_created = 0
    accumulator._said_linger_bound, accumulator._lone_acked_at = False, None
    accumulator._lone_in_a_row = 3
    accumulator.wake_sender = lambda: accumulator.calls.append(("wake_sender",))
    accumulator.wake_sender_for = lambda batch, opened: accumulator.calls.append(
        ("wake_sender_for", batch.number, opened))
    accumulator.touched = {}
    accumulator._batch_type, accumulator._writer_type = Batch, Writer
    accumulator._drained_bytes, accumulator._codec, accumulator._compression_level = {}, 0, None
    return accumulator


def _accumulator_state(accumulator) -> dict:
    """What the opening and taking leave behind, comparable across the implementations."""
    def batch(b):
        return None if b is None else (b.number, b.topic, b.partition, b.created, b.deadline,
                                       b.writer.count, b.writer.reserved, b.writer.limit,
                                       b.writer.size, b.writer.base_timestamp, b.full,
                                       b.attempts, b.future.done())
    return {
        "available": accumulator._pool.available,
        "batches": {tp: [batch(b) for b in queue] for tp, queue in accumulator._batches.items()},
        "order": list(accumulator._batches),
        "appendable": {t: ([batch(b) for b in open_[0]],
                           [w is (b.writer if b is not None else None)
                            for b, w in zip(*open_)])
                       for t, open_ in accumulator.appendable.items()},
        "incomplete": sorted(b.number for b in accumulator.incomplete),
        "fields": (accumulator._quiet_until, accumulator._expiry_floor,
                   accumulator._batches_created, accumulator._lone_in_a_row,
                   accumulator._lone_acked_at),
        "touched": dict(accumulator.touched),
        "drained": dict(accumulator._drained_bytes),
        "calls": list(accumulator.calls),
    }


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_record_of_an_opened_batch_answers_its_batch_future_s_loop(impl):
    """The C batch the accumulator opens keeps its asyncio future's loop, which its records'
    futures answer get_loop() with (gather asks every record: the asyncio future was one
    more object out of the CPU's caches per record at 10,000 partitions). That is the
    future's loop, not the accumulator's `_loop` (here a stand-in that makes the futures),
    before and after the batch is acknowledged, as the Python one answers."""
    loop = asyncio.get_running_loop()
    acc = _accumulator_parts(impl, loop)
    assert acc._loop is not loop
    batch = acc.open_new("t", 1, b"key", b"v", 1000, 3)
    record = _future_class(impl)(batch, 0, 1000)
    assert record.get_loop() is loop and batch.future.get_loop() is loop
    batch.complete(5, -1)
    assert record.get_loop() is loop and record.result() == ("t", 1, 5, 1000)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_batch_opened_whose_wake_raises_keeps_its_record(impl):
    """Waking the sender for a new batch comes after its record is in it and it is queued:
    a wake that raises (a bug of ours: uvloop's timer Handle had no when()) goes to
    _wake_failed, and the opening still returns the batch with its memory held. It raised,
    and the Appender appended the record again from the start (into that same batch), with
    the memory given back while the batch held it."""
    acc = _accumulator_parts(impl, asyncio.get_running_loop())

    def wake_sender_for(batch, opened):
        raise AttributeError("'uvloop.loop.Handle' object has no attribute 'when'")

    acc.wake_sender_for = wake_sender_for
    batch = acc.open_new("t", 1, b"key", b"v" * 100, 1000, 3)
    assert batch is not None and batch.writer.count == 1
    state = _accumulator_state(acc)
    assert [b[0] for b in state["batches"][("t", 1)]] == [batch.number]
    assert state["available"] == 4096 - 1024  # held by the batch
    assert state["calls"][-1] == ("wake_failed", "AttributeError(\"'uvloop.loop.Handle' "
                                                 "object has no attribute 'when'\")")


def _open_and_take(impl, loop) -> list:
    """The same openings and takings on an accumulator of `impl`; what each left."""
    acc = _accumulator_parts(impl, loop)
    states, seen = [], []
    first = acc.open_new("t", 1, b"key", b"v" * 100, 1000, 3)
    seen.append(first)
    states.append(_accumulator_state(acc))
    acc._loop.now = 100.5
    seen.append(acc._open("t", 1, 1500, None, b"w" * 10, b"\x02\x02h\x02v", 700, 3, 100.5))
    states.append(_accumulator_state(acc))  # queued behind the first: no longer quiet
    acc._lone_acked_at = 100.4  # a lone record's ack came just before: counted
    seen.append(acc.open_new("u", 5, None, None, 2000, 2))  # the topic grows to 6 partitions
    states.append(_accumulator_state(acc))
    refused = [("t", 0, b"k", b"v" * 3000, 3000, 3),  # over max_request_size
               ("t", 0, bytearray(b"k"), b"v", 3000, 3),  # not bytes: the Python path's
               ("t", 0, b"k", "text", 3000, 3),
               ("t", 0, b"k", b"v" * 2100, 3000, 3)]  # 2,194 bytes: more than is free
    for args in refused:
        seen.append(acc.open_new(*args))
    acc.line.append("waiting")
    seen.append(acc.open_new("t", 0, b"k", b"v", 3000, 3))  # behind the line
    acc.line.clear()
    acc.closing = True
    seen.append(acc.open_new("t", 0, b"k", b"v", 3000, 3))
    acc.closing = False
    states.append(_accumulator_state(acc))  # (none of those did anything)
    taken = acc._take(("t", 1), acc._batches[("t", 1)])  # the first: its queue to the back
    seen.append(taken)
    states.append(_accumulator_state(acc) | {"payload": bytes(taken.writer.payload),
                                             "codec": taken.writer.codec})
    acc._codec, acc._compression_level = 1, 6  # compressed: the writer's close() does it
    queue = acc._batches[("u", 5)]
    assert acc._take(("u", 5), queue) is seen[2] and not queue
    states.append(_accumulator_state(acc) | {"payload": seen[2].writer.payload})
    acc._txn = _transaction_manager(transactional_id="t-id")
    acc._txn.sequencer.start(1000, 2)
    acc._txn._partitions.update({("t", 0), ("t", 1)})
    seen.append(acc.open_new("t", 2, b"k", b"v", 4000, 3))  # new to the transaction
    seen.append(acc.open_new("t", 0, b"k", b"v", 4000, 3))  # in it already
    taken = acc._take(("t", 1), acc._batches[("t", 1)])  # the second, numbered
    states.append(_accumulator_state(acc) | {"numbered": (
        taken.producer_id, taken.producer_epoch, taken.base_sequence,
        acc._txn.sequencer._next_sequence)})
    return [[None if b is None else b.number for b in seen], states]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_the_accumulator_opens_and_takes_batches(impl):
    """open_new() opens a batch for a record placed where its partition has none (the
    Appender's and enqueue_many's short path), with no Python frame in C: its memory
    reserved, queued, listed as the partition's open batch, incomplete, the sender woken;
    else it does nothing. _take() takes a queued batch for a request and seals it."""
    seen, states = _open_and_take(impl, asyncio.get_running_loop())
    assert seen == [(1,), (2,), (3,), None, None, None, None, None, None, (1,), (4,), (5,)]
    alike = impl.RecordWriter(1000, 1024)
    assert alike.try_append(1000, b"key", b"v" * 100, None)
    opened = states[0]
    assert opened["available"] == 4096 - 1024  # its first reservation
    first = ((1,), "t", 1, 100.0, 220.0, 1, 1024, 1024, alike.size, 1000, False, 0, False)
    assert opened["batches"] == {("t", 1): [first]}
    assert opened["appendable"] == {"t": ([None, first, None], [True, True, True])}
    assert opened["incomplete"] == [(1,)] and opened["touched"] == {"t": 100.0}
    # A new linger end; no lone record acknowledged before it: none in a row.
    assert opened["fields"] == (100.0 + 0.005, 220.0, 1, 0, None)
    assert opened["calls"] == [("open_batches", "t", 3),  # a topic new to it: its lists
                               ("wake_sender_for", (1,), True)]
    second = states[1]
    assert second["fields"][0] == 0.0  # queued behind another batch: sendable now
    assert second["available"] == 4096 - 1024  # (_open takes memory reserved already)
    assert [b[0] for b in second["batches"][("t", 1)]] == [(1,), (2,)]
    assert second["appendable"]["t"][0][1][0] == (2,)  # the partition's open batch now
    assert states[2]["calls"][-3:] == [("count_linger_bound", 100.5),
                                       ("open_batches", "u", 6),
                                       ("wake_sender_for", (3,), True)]
    assert states[2]["appendable"]["u"][0][5][0] == (3,)
    assert states[3] == states[2]  # the refusals did nothing
    taken = states[4]
    assert taken["order"] == [("u", 5), ("t", 1)] and taken["drained"] == {("t", 1): alike.size}
    assert taken["appendable"]["t"][0][1][0] == (2,)  # (not the batch taken)
    assert taken["payload"] == bytes(alike.seal()) and taken["codec"] == 0
    assert states[5]["payload"] == (b"compressed", 6) and ("u", 5) not in states[5]["order"]
    assert states[6]["calls"][-2:] == [("wake_sender",), ("wake_sender_for", (5,), True)]
    assert states[6]["appendable"]["t"][0][1] is None  # taken: no longer open
    assert states[6]["numbered"] == (1000, 2, 0, {("t", 1): 1})
    assert states[6]["available"] == 0


@needs_c
async def test_the_accumulator_opens_and_takes_alike_in_both():
    loop = asyncio.get_running_loop()
    assert _open_and_take(_c, loop) == _open_and_take(_py, loop)


def _lingering_openings(impl, loop) -> list:
    """Batches opened while the sender sleeps with a round due by loop time 100.004 (their
    linger ends at 100.005): which of them woke it (the calls each left)."""
    woke = []
    for case in ("asleep", "awake", "round later", "queued behind", "line", "closing",
                 "full", "no producer id", "transaction failed", "producer id"):
        acc = _accumulator_parts(impl, loop)
        acc.open_new("t", 0, b"k", b"v", 1000, 3)  # (the topic's lists made)
        acc._round_by = {"awake": 0.0, "round later": 100.006}.get(case, 100.004)
        if case == "line":
            acc.line.append("waiting")
        acc.closing = case == "closing"
        if case.endswith(("producer id", "failed")):
            acc._txn = types.SimpleNamespace(
                is_transactional=False, has_producer_id=case != "no producer id",
                error=RuntimeError("fenced") if case == "transaction failed" else None)
        partition = 0 if case == "queued behind" else 1
        value = b"v" * (2100 if case == "full" else 10)
        acc.calls.clear()
        batch = acc._open("t", partition, 1000, b"k", value, None, 2200, 3, 100.0)
        assert batch.writer.count == 1 and batch in acc.incomplete
        woke.append((case, acc.calls))
    return woke


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_batch_that_only_lingers_past_the_sleeping_sender_s_round_wakes_nothing(impl):
    """While the sender sleeps with a round due (`_round_by`) before a new batch's linger
    ends, and the batch only lingers (alone in its partition, under batch_size, nobody in
    line, not closing, its transaction able to send), Sender.wake_for would only find its
    timer set early enough: the opening does not call it (~10,000 instructions a batch, a
    batch every 17 records at 10,000 partitions). Every other opening still wakes it. On
    main every one of them called wake_sender_for."""
    woke = dict(_lingering_openings(impl, asyncio.get_running_loop()))
    assert woke.pop("asleep") == [] and woke.pop("producer id") == []
    for case, calls in woke.items():
        assert [call[0] for call in calls] == ["wake_sender_for"], case


@needs_c
async def test_a_batch_that_only_lingers_wakes_alike_in_both():
    loop = asyncio.get_running_loop()
    assert _lingering_openings(_c, loop) == _lingering_openings(_py, loop)


class _Interrupted(BaseException):
    """What may strike any Python line the opening runs (KeyboardInterrupt, say)."""


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_batch_queued_before_its_opening_raised_keeps_its_memory(impl):
    """Most of the opening's Python runs after the batch is queued: the sender's wake.
    Raising there, the batch stays queued and gives its memory back when it is done:
    open_new gave it back at once as well, so the pool counted it twice (4096 free with a
    batch of 1024 queued) and buffer_memory bounded nothing."""
    acc = _accumulator_parts(impl, asyncio.get_running_loop())

    def wake(batch, opened):
        raise _Interrupted

    acc.wake_sender_for = wake
    with pytest.raises(_Interrupted):
        acc.open_new("t", 1, b"key", b"v" * 100, 1000, 3)
    assert [b.number for b in acc._batches[("t", 1)]] == [(1,)]
    assert acc._pool.available == 4096 - 1024


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_batch_kept_by_an_interrupted_opening_goes_with_the_interrupt(impl):
    """The opening's wake raised (a KeyboardInterrupt, say) after its batch was queued: the
    batch, holding the caller's record, rides on that exception for the caller to count
    (taken once), and no field of the accumulator keeps it. It was kept in one, cleared
    only by the line's next opening: after an interrupt in enqueue() (the Appender) or in
    its turn in line (append_granted), it held the batch on, for a later caller to take."""
    acc = _accumulator_parts(impl, asyncio.get_running_loop())

    def wake(batch, opened):
        raise _Interrupted

    acc.wake_sender_for = wake
    with pytest.raises(_Interrupted) as caught:
        acc.open_new("t", 1, b"key", b"v", 1000, 3)
    [batch] = acc._batches[("t", 1)]
    assert acc not in gc.get_referrers(batch), "the accumulator keeps the batch"
    from aioproducer._internal.accumulator import take_kept

    assert take_kept(caught.value) == (batch, 0)
    assert take_kept(caught.value) is None


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
@pytest.mark.parametrize("raised", [_Interrupted, RuntimeError])
async def test_a_batch_kept_by_a_failed_report_of_a_failed_wake_goes_with_that_failure(
        impl, raised):
    """The opening's wake raised an Exception (a bug of ours), and reporting it
    (_wake_failed) raised too: a Ctrl-C as it ran the loop's exception handler, or a bug of
    its own. The batch, queued and holding the caller's record, rides on what it raised, as
    on a KeyboardInterrupt in the wake itself. The Python twin raised it bare (the caller
    could not count its record, and resumed, sent it twice); the C put the batch on it."""
    from aioproducer._internal.accumulator import take_kept

    acc = _accumulator_parts(impl, asyncio.get_running_loop())

    def wake(batch, opened):
        raise ValueError("the wake's bug")

    def report(exc):
        raise raised("as the wake's failure was reported")

    acc.wake_sender_for = wake
    acc._wake_failed = report
    with pytest.raises(raised) as caught:
        acc.open_new("t", 1, b"key", b"v", 1000, 3)
    [batch] = acc._batches[("t", 1)]
    assert batch in acc.incomplete and batch.writer.count == 1
    assert take_kept(caught.value) == (batch, 0), "the queued batch is not named"


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_an_appender_whose_opening_failed_with_its_batch_queued_takes_the_record_once(
        impl):
    """send() of a record whose partition has no open batch: the Appender's opening queued
    the batch, then its wake and the report of that failure (_wake_failed) raised an
    Exception. The record is buffered: the Appender raises that failure (which names the
    batch) and does not take the record again by its Python path. Both took it again (the
    error was taken for one raised having queued nothing): the record in two batches."""
    loop = asyncio.get_running_loop()
    acc = _accumulator_parts(impl, loop)
    acc.open_batches("t", 3)
    parts = _Started(impl, loop)
    taken_again: list = []

    def later(topic, value, key, *, partition):
        taken_again.append(value)

    def wake(batch, opened):
        raise ValueError("the wake's bug")

    def report(exc):
        raise RuntimeError("as the wake's failure was reported")

    acc.wake_sender_for, acc._wake_failed = wake, report
    appender = impl.Appender(later, _future_class(impl), False, parts, "started",
                             lambda: 0.005, False, False)
    appender.attach(parts, acc, None, lambda topic, leaders: 2, acc.open_new)
    with pytest.raises(RuntimeError, match="reported"):
        appender("t", b"v" * 100, b"key", partition=1)
    assert taken_again == []
    assert [batch.writer.count for batch in acc._batches[("t", 1)]] == [1]


class _Once:
    """Raises `exc` the first time it is called, and nothing after (a passing failure)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc: BaseException | None = exc

    def __call__(self) -> None:
        exc, self.exc = self.exc, None
        if exc is not None:
            raise exc


class _RaisingQueue(collections.deque):
    def __init__(self, boom, batches) -> None:
        super().__init__(batches)
        self.boom = boom

    def append(self, batch) -> None:
        self.boom()
        super().append(batch)


class _RaisingSet:
    """The incomplete set, whose add() may fail (not a set: the opening calls its add())."""

    def __init__(self, boom) -> None:
        self.boom, self.batches = boom, set()

    def add(self, batch) -> None:
        self.boom()
        self.batches.add(batch)

    def discard(self, batch) -> None:
        self.batches.discard(batch)

    def __contains__(self, batch) -> bool:
        return batch in self.batches

    def __iter__(self):
        return iter(self.batches)


class _RaisingTxn:
    def __init__(self, boom) -> None:
        self.boom = boom

    @property
    def is_transactional(self) -> bool:
        self.boom()
        return False


def _make_step_raise(step: str, acc, parts, boom) -> None:
    """Make one step of the opening of a batch for partition 1 of "t" call `boom`."""
    if step == "lone record count":
        acc._lone_acked_at = 99.0

        def count(now):
            boom()
            acc._lone_acked_at = None
        acc._count_linger_bound = count
    elif step == "batch future":
        make = acc._loop.create_future
        acc._loop.create_future = lambda: (boom(), make())[1]
    elif step == "open lists":  # the topic grew: its lists grow
        parts.topics["t"] = types.SimpleNamespace(leaders=(1, 1, 1, 1))
        grow = acc.open_batches
        acc.open_batches = lambda topic, count: (boom(), grow(topic, count))[1]
    elif step == "transaction check":
        acc._txn = _RaisingTxn(boom)
    elif step == "transaction partition":
        acc._txn = types.SimpleNamespace(is_transactional=True,
                                         add_partition=lambda *tp: (boom(), True)[1])
    elif step == "incomplete set":
        acc.incomplete = _RaisingSet(boom)
    elif step == "partition queue":  # a batch before it, closed for appends
        acc._pool.available -= 1024
        acc._open("t", 1, 5, b"key", b"v" * 100, None, 1024, 3, 100.0)
        acc.appendable["t"][0][1] = acc.appendable["t"][1][1] = None
        acc._batches[("t", 1)] = _RaisingQueue(boom, acc._batches[("t", 1)])
    elif step == "wake":
        acc.wake_sender_for = lambda batch, opened: boom()
    else:
        assert step == "transaction wake"
        acc._txn = types.SimpleNamespace(is_transactional=True,
                                         add_partition=lambda *tp: True)
        acc.wake_sender = boom


_OPENING_STEPS = ["lone record count", "batch future", "open lists", "transaction check",
                  "transaction partition", "incomplete set", "partition queue", "wake",
                  "transaction wake"]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
@pytest.mark.parametrize("step", _OPENING_STEPS)
async def test_a_record_is_buffered_once_whichever_step_of_its_batch_s_opening_fails(impl, step):
    """send() of a placed record whose partition has no open batch: the Appender opens one
    (open_new), and where that raises, its Python path (`later`) takes the record again. So
    an opening that raises has queued nothing and given its memory back: each of its steps
    made to fail once (an Exception), the record is in a batch exactly once and the free
    memory is buffer_memory less what the queued batches hold. Failing after the batch was
    queued, the Appender took the record twice (stop 49: on uvloop, the wake); before, the
    memory stayed taken. Only the wake comes after queueing (at linger_ms=0 it may write
    the batch): what it raises goes to _wake_failed. A KeyboardInterrupt-like failure is
    raised, the record then in no batch, or (from the wake) in its queued batch, which
    holds its memory."""
    loop = asyncio.get_running_loop()
    for exc in (RuntimeError("a passing failure"), _Interrupted()):
        acc = _accumulator_parts(impl, loop)
        acc.open_batches("t", 3)
        parts = _Started(impl, loop)
        _make_step_raise(step, acc, parts, _Once(exc))
        taken_again: list = []

        def later(topic, value, key, *, partition):  # the Python path: reserve, open
            taken_again.append(value)
            acc._pool.available -= 1024
            count = len(parts.topics[topic].leaders)
            return acc._open(topic, partition, 5, key, value, None, 1024, count, 100.0)

        appender = impl.Appender(later, _future_class(impl), False, parts, "started",
                                 lambda: 0.005, False, False)
        appender.attach(parts, acc, None, lambda topic, leaders: 2, acc.open_new)
        before = sum(len(queue) for queue in acc._batches.values())
        try:
            appender("t", b"v" * 100, b"key", partition=1)
        except _Interrupted:
            raised = True
        else:
            raised = False
        queued = [batch for queue in acc._batches.values() for batch in queue]
        new = queued[before:]
        kept = step.endswith("wake")
        assert raised == isinstance(exc, _Interrupted), (step, exc)
        assert len(new) == (0 if raised and not kept else 1), (step, exc, len(taken_again))
        assert all(batch.writer.count == 1 for batch in new)
        assert acc._pool.available == 4096 - sum(b.writer.reserved for b in queued), (step, exc)
        assert all(batch in acc.incomplete for batch in queued)
        assert acc.appendable["t"][0][1] is (new[0] if new else None)
        if not raised and not kept:
            assert taken_again == [b"v" * 100]  # refused by open_new, taken by `later`
        if kept and not raised:
            assert acc.calls[-1] == ("wake_failed", repr(exc))


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_batch_completes_alike_in_both(impl):
    """complete(): its future resolved (unless it failed already), its records' callbacks
    run in one loop callback, each enqueue_many future counted down (resolved at none
    pending), a piece's batch told; its payload let go."""
    loop = asyncio.get_running_loop()
    told: list = []

    class Batch(impl.BatchFields):
        __slots__ = ()

        def _run_watchers(self):
            told.append(("run_watchers", self.number))

        def _piece_done(self):
            told.append(("piece_done", self.number))

    class Bulk:
        def __init__(self, pending: int, done: bool = False) -> None:
            self._pending, self._done = pending, done

        def done(self) -> bool:
            return self._done

        def _resolve(self) -> None:
            told.append(("resolve", self._pending))

    def batch(number):
        writer = impl.RecordWriter(0, 100)
        writer.payload = b"records"
        return Batch((number,), "t", 0, writer, loop.create_future(), 0.0, 60.0, 0)

    watched, parent, failed = batch(1), batch(2), batch(3)
    watched.watch(_future_class(impl)(watched, 0, 0))
    last, more, resolved = Bulk(1), Bulk(2), Bulk(1, done=True)
    watched._bulks = [last, more, resolved]
    watched.complete(5, -1)
    assert watched.done and watched.future.result() == (5, -1)
    assert watched._untracked is None and watched._bulks is None
    assert watched.writer.payload is None
    assert (last._pending, more._pending, resolved._pending) == (0, 1, 0)
    assert told == [("resolve", 0)]  # (the one resolved already is not again)
    await asyncio.sleep(0)
    assert told[1:] == [("run_watchers", (1,))]
    piece = batch(4)
    piece.parent = parent
    piece.complete(7, 10)
    assert told[2:] == [("piece_done", (2,))] and piece.future.result() == (7, 10)
    failed.future.set_exception(RuntimeError("expired in flight"))
    failed.complete(8, -1)  # (an answer after it expired: it stays failed)
    assert failed.done and isinstance(failed.future.exception(), RuntimeError)
    with pytest.raises(TypeError):
        watched.complete(5)



def _request_of(impl, loop, sequenced: bool = False, transactional: bool = False) -> list:
    """produce_parts over batches of `impl` for two topics (one batch compressed, one with a
    payload of 16 KiB or more), numbered by an idempotent producer: the request frame written
    from what it returns, against the one written from each batch's own header and payload
    (with the batch's producer id, epoch and sequence if `sequenced`; the transactional bit
    if `transactional`), and what else it returns."""
    def batch(number, topic, partition, records, created, codec=0):
        writer = impl.RecordWriter(1000 + number, 1 << 20)
        for i in range(records):
            assert writer.try_append(1000 + number + i, b"k%d" % i, b"v" * (40 + number),
                                     None)
        writer.payload, writer.codec = writer.seal(), codec
        if codec:
            writer.payload = b"pretend-compressed:" + bytes(writer.payload)
        return impl.BatchFields((number,), topic, partition, writer, loop.create_future(),
                                created, created + 120.0, 0)
    batches = [batch(1, "a", 3, 2, 99.0), batch(2, "b", 0, 1, 99.5, codec=1),
               batch(3, "a", 1, 400, 98.0), batch(4, "a", 7, 1, 99.9)]
    for number, b in enumerate(batches):
        b.producer_id, b.producer_epoch, b.base_sequence = 1 << 40, 7, (1 << 31) - 4 + number
    by_hand: dict = {}
    for b in batches:
        producer = (b.producer_id, b.producer_epoch, b.base_sequence) if sequenced else \
            (-1, -1, -1)
        attributes = b.writer.codec | (0x10 if transactional else 0)
        by_hand.setdefault(b.topic, []).append({"index": b.partition, "records": (
            b.writer.header(b.writer.payload, attributes, *producer), b.writer.payload)})

    def frame(topic_data):
        body = {"transactional_id": None, "acks": 1, "timeout_ms": 30000,
                "topic_data": topic_data}
        written = messages.encode_request(ApiKey.PRODUCE, 9, 7, "c", body)
        return b"".join(map(bytes, written)) if isinstance(written, list) else written

    in_flight = {"already": None}
    topic_data, size, earliest, waited, most = impl.produce_parts(batches, in_flight, 100.0,
                                                                  sequenced, transactional)
    return [frame(topic_data), frame([{"name": t, "partition_data": p}
                                      for t, p in by_hand.items()]),
            size, sum(61 + len(b.writer.payload) for b in batches), earliest,
            round(waited, 9), round(most, 9), [getattr(b, "number", b) for b in in_flight],
            [t["name"] for t in topic_data],
            [gc.is_tracked(p) for t in topic_data for p in t["partition_data"]]]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_request_s_partitions_are_built_from_its_batches(impl):
    """produce_parts(): each batch's records as the header its writer gives and its sealed
    payload, grouped by topic in order of first appearance; the batches put in flight; the
    request's record bytes, earliest deadline, and the batches' times queued (summed and
    longest). In C the per-partition dicts stay out of the garbage collector's way: at
    10,000 partitions a request has ~490, and they were promoted mid-round."""
    loop = asyncio.get_running_loop()
    frame, by_hand, size, sizes, earliest, waited, most, in_flight, topics, tracked = \
        _request_of(impl, loop)
    assert frame == by_hand and len(frame) > 16384
    assert size == sizes and topics == ["a", "b"]
    assert in_flight == ["already", (1,), (2,), (3,), (4,)]
    assert (earliest, waited, most) == (98.0 + 120.0, 3.6, 2.0)
    assert tracked == [impl is _py] * 4
    with pytest.raises(ValueError, match="sealed"):
        impl.produce_parts([impl.BatchFields((9,), "a", 0, impl.RecordWriter(0, 100),
                                             loop.create_future(), 0.0, 1.0, 0)], {}, 1.0,
                           False, False)
    with pytest.raises(TypeError):
        impl.produce_parts(["not a batch"], {}, 1.0, False, False)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
@pytest.mark.parametrize("transactional", [False, True])
async def test_an_idempotent_request_s_headers_carry_each_batch_s_sequence(impl,
                                                                           transactional):
    """produce_parts(sequenced=True): each batch's header carries its producer id, epoch and
    base sequence (up to the last before the wrap), and the transactional bit when asked:
    what a broker checks to write each batch once and in order. The header's CRC covers
    them: a frame built by hand from the same numbers is the same bytes."""
    loop = asyncio.get_running_loop()
    frame, by_hand, *_ = _request_of(impl, loop, sequenced=True, transactional=transactional)
    assert frame == by_hand
    plain, *_ = _request_of(impl, loop)
    assert frame != plain
    [read] = read_batches(_first_batch_of(impl, loop, transactional))
    assert (read.producer_id, read.producer_epoch, read.base_sequence) == \
        (1 << 40, 7, (1 << 31) - 4)
    assert read.is_transactional is transactional and [r.value for r in read.records] == [b"v"]
    b = impl.BatchFields((9,), "a", 0, impl.RecordWriter(0, 100), loop.create_future(), 0.0,
                         1.0, 0)
    b.writer.payload = b""
    b.producer_id, b.producer_epoch, b.base_sequence = 1, 1 << 15, 0
    with pytest.raises((OverflowError, struct.error)):  # (the twin's header: struct's)
        impl.produce_parts([b], {}, 1.0, True, transactional)


def _first_batch_of(impl, loop, transactional: bool) -> bytes:
    """The first record batch of a sequenced request of `impl`, as one bytes."""
    writer = impl.RecordWriter(1000, 1 << 20)
    assert writer.try_append(1000, b"k", b"v", None)
    writer.payload, writer.codec = writer.seal(), 0
    b = impl.BatchFields((1,), "a", 0, writer, loop.create_future(), 99.0, 120.0, 0)
    b.producer_id, b.producer_epoch, b.base_sequence = 1 << 40, 7, (1 << 31) - 4
    topic_data, *_ = impl.produce_parts([b], {}, 100.0, True, transactional)
    header, payload = topic_data[0]["partition_data"][0]["records"]
    return bytes(header) + bytes(payload)


@needs_c
async def test_a_request_s_partitions_alike_in_both():
    loop = asyncio.get_running_loop()
    for sequenced, transactional in ((False, False), (True, False), (True, True)):
        assert _request_of(_c, loop, sequenced, transactional)[:-1] == \
            _request_of(_py, loop, sequenced, transactional)[:-1]


def _settled(impl, loop, all_or_none: bool) -> tuple[list, list]:
    """settle_produce over four batches of `impl` (one answered with an error, one left out,
    one with a record's callback waiting): what each batch came to, and the loop callbacks
    it asked for."""
    ran: list = []

    class Batch(impl.BatchFields):
        __slots__ = ()

        def _run_watchers(self):
            ran.append(("own", self.number))

    def batch(number, topic, partition):
        writer = impl.RecordWriter(0, 100)
        writer.payload = b"records"
        return Batch((number,), topic, partition, writer, loop.create_future(), 0.0, 60.0, 0)
    a0, a1, a2, b0 = batch(1, "a", 0), batch(2, "a", 1), batch(3, "a", 2), batch(4, "b", 0)
    b0.watch(_future_class(impl)(b0, 0, 0))
    answer = {"index": 0, "error_code": 0, "base_offset": 40, "log_append_time_ms": -1}
    refused = {"index": 1, "error_code": 6, "base_offset": -1, "log_append_time_ms": -1}
    responses = [{"name": "b", "partition_responses": [answer | {"base_offset": 7}]},
                 {"name": "a", "partition_responses": [refused, answer]}]
    in_flight = dict.fromkeys([a0, a1, a2, b0])
    acked, rest = impl.settle_produce([a0, a1, a2, b0], responses, in_flight,
                                      lambda woken: ran.append([b.number for b in woken]),
                                      all_or_none)
    outcome = [[b.number for b in acked],
               [(b.number, p and p["error_code"]) for b, p in rest],
               [b.number for b in in_flight],
               [b.future.result() if b.future.done() else None for b in (a0, a1, a2, b0)],
               [b.writer.payload for b in (a0, b0)]]
    return outcome, ran


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_response_s_answers_settle_their_batches(impl):
    """settle_produce(): each batch answered without an error leaves in_flight and is
    completed with its offset; their records' callbacks run in one loop callback for them
    all (run_watchers), not a loop handle each; a batch refused, or left out of the
    response, is handed back with its answer (or None) for the sender, in order."""
    loop = asyncio.get_running_loop()
    outcome, ran = _settled(impl, loop, all_or_none=False)
    assert outcome == [[(1,), (4,)], [((2,), 6), ((3,), None)], [(2,), (3,)],
                       [(40, -1), None, None, (7, -1)], [None, None]]
    assert ran == []
    await asyncio.sleep(0)
    assert ran == [[(4,)]]  # one callback, with the batch whose record waits
    with pytest.raises(TypeError):
        impl.settle_produce(["not a batch"], [], {}, print, False)


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_an_idempotent_response_settles_only_when_every_batch_is_acknowledged(impl):
    """settle_produce(all_or_none=True), an idempotent producer's: a response with one
    batch refused or left out completes none (the sender handles every answer in order, as
    the sequencer needs); one that acknowledges every batch completes them all in one
    call."""
    loop = asyncio.get_running_loop()
    outcome, ran = _settled(impl, loop, all_or_none=True)
    assert outcome == [[], [((1,), 0), ((2,), 6), ((3,), None), ((4,), 0)],
                       [(1,), (2,), (3,), (4,)], [None] * 4, [b"records"] * 2]
    await asyncio.sleep(0)
    assert ran == []
    outcome, ran = _three_acknowledged(impl, loop)
    assert outcome == [[(1,), (2,), (3,)], [], [], [(40, -1), (41, 5), (7, -1)]]
    await asyncio.sleep(0)
    assert ran == [[(3,)]]


def _three_acknowledged(impl, loop) -> tuple[list, list]:
    """settle_produce(all_or_none=True) over three batches of `impl`, every one answered
    without an error."""
    ran: list = []

    def batch(number, topic, partition):
        writer = impl.RecordWriter(0, 100)
        writer.payload = b"records"
        return impl.BatchFields((number,), topic, partition, writer, loop.create_future(),
                                0.0, 60.0, 0)
    a0, a1, b0 = batch(1, "a", 0), batch(2, "a", 1), batch(3, "b", 0)
    b0.watch(_future_class(impl)(b0, 0, 0))
    answer = {"index": 0, "error_code": 0, "base_offset": 40, "log_append_time_ms": -1}
    responses = [{"name": "b", "partition_responses": [answer | {"base_offset": 7}]},
                 {"name": "a", "partition_responses": [
                     answer | {"index": 1, "base_offset": 41, "log_append_time_ms": 5},
                     answer]}]
    in_flight = dict.fromkeys([a0, a1, b0])
    acked, rest = impl.settle_produce([a0, a1, b0], responses, in_flight,
                                      lambda woken: ran.append([b.number for b in woken]),
                                      True)
    return [[b.number for b in acked], rest, list(in_flight),
            [b.future.result() for b in (a0, a1, b0)]], ran


@needs_c
async def test_a_response_s_answers_settle_alike_in_both():
    loop = asyncio.get_running_loop()
    for all_or_none in (False, True):
        assert _settled(_c, loop, all_or_none) == _settled(_py, loop, all_or_none)
    assert _three_acknowledged(_c, loop)[0] == _three_acknowledged(_py, loop)[0]


def _drained(impl, loop) -> list:
    """_drain over an accumulator of `impl`: partitions of two topics led by brokers 1 and 2
    (one unknown), a batch in retry backoff, a request limit that a third batch would pass;
    what it took per broker, and what it left queued."""
    acc = _accumulator_parts(impl, loop)
    acc._max_request_size = acc.buffer_memory = 100_000
    acc._pool = impl.MemoryPool(100_000)
    for topic, partition, size in [("t", 0, 900), ("t", 1, 900), ("t", 2, 900), ("u", 0, 10),
                                   ("t", 0, 10), ("u", 1, 10), ("t", 1, 10)]:
        assert acc.open_new(topic, partition, b"k", b"v" * size, 1000, 3) is not None
    acc._batches[("u", 1)][0].retry_at = 100.5  # in backoff until then
    topics = {"t": types.SimpleNamespace(leaders=(1, 2, 1)),
              "u": types.SimpleNamespace(leaders=(1, -1))}
    one = acc._batches[("t", 0)][0].writer.size
    drained = acc._drain(topics, {1: None, 2: None}, 2 * one + 5, 100.0)
    return [{node: [(b.topic, b.partition, b.number) for b in taken]
             for node, taken in drained.items()},
            _accumulator_state(acc)["order"],
            [len(queue) for queue in acc._batches.values()]]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_drain_takes_a_request_s_worth_per_broker(impl):
    """_drain(): per broker asked for, the first batch of each partition it leads, least
    recently drained first, up to max_request_size (a request's first batch whatever its
    size); none in retry backoff, none for a partition whose leader is unknown or not
    asked for; each taken (sealed, its queue to the back of the line)."""
    taken, order, left = _drained(impl, asyncio.get_running_loop())
    assert taken == {1: [("t", 0, (1,)), ("t", 2, (3,))], 2: [("t", 1, (2,))]}
    assert order == [("u", 0), ("u", 1), ("t", 0), ("t", 1)]  # (u-0's leader is unknown)
    assert left == [1, 1, 1, 1]


@needs_c
async def test_a_drain_alike_in_both():
    loop = asyncio.get_running_loop()
    assert _drained(_c, loop) == _drained(_py, loop)


def _transaction_manager(**settings) -> TransactionManager:
    """A producer's TransactionManager, for its decisions and its sequencer (no broker)."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9", **settings)
    tasks = TaskSet()
    return TransactionManager(config, Cluster(config, tasks), tasks)


def _sequenced_drains(impl, loop, transactional: bool) -> tuple[list, list, list]:
    """Rounds of _drain of an idempotent (or transactional) producer of `impl`, its sequencer
    told what the sender would tell it between them, max_in_flight 2. Partitions 0-6 of "t",
    batches of partition+1 records: p0, p1 and p4 acknowledge their first batch, so a second
    may join one in flight; p2 acknowledges nothing (one at a time); p3's first batch is
    retried with nothing of its partition in flight, later after a new epoch (numbered again);
    p4's second batch is retried while its third is in flight; p5 is in retry backoff; p6 is
    not in the transaction. Per round: each batch taken (partition, epoch, base sequence,
    attempts) and the sequencer's next sequences, unacknowledged and in-flight batches
    after it; and the partitions whose batches the drain asked the transaction manager's
    may_send about, and those it asked the sequencer to number, round by round."""
    acc = _accumulator_parts(impl, loop)
    acc._max_request_size = acc.buffer_memory = 100_000
    acc._pool = impl.MemoryPool(100_000)
    txn = acc._txn = _transaction_manager(
        max_in_flight_requests_per_connection=2,
        **({"transactional_id": "t-id"} if transactional else {}))
    seq = txn.sequencer
    if transactional:
        txn._partitions.update(("t", p) for p in range(6))
    asked: list[list[int]] = []
    assigned: list[list[int]] = []
    may_send, assign = txn.may_send, seq.assign
    txn.may_send = lambda batch: asked[-1].append(batch.partition) or may_send(batch)
    seq.assign = lambda batch: assigned[-1].append(batch.partition) or assign(batch)
    topics = {"t": types.SimpleNamespace(leaders=(1,) * 7)}
    rounds = []

    def queue(*partitions):
        for p in partitions:
            batch = acc.open_new("t", p, b"k", b"v", 1000, 7)
            for _ in range(p):
                assert batch.writer.try_append(1000, b"k", b"v", None)

    def drain():
        asked.append([])
        assigned.append([])
        taken = acc._drain(topics, [1], 100_000, 100.0).get(1, [])
        rounds.append([
            sorted((b.partition, b.producer_id, b.producer_epoch, b.base_sequence, b.attempts)
                   for b in taken),
            dict(seq._next_sequence),
            {tp: [b.number for b in batches] for tp, batches in seq._unacked.items()},
            {tp: [b.number for b in batches] for tp, batches in seq._in_flight.items()}])
        asked[-1].sort()
        seq.sent_all(taken)
        return {b.partition: b for b in taken}

    def retry(batch):  # refused retriably: resolved, first in its queue again
        seq.resolved(batch)
        seq.renumber_on_reset(batch)
        batch.attempts += 1
        acc._batches.setdefault(("t", batch.partition), collections.deque()).appendleft(batch)

    queue(0, 1, 2, 3, 4, 5, 6)
    acc._batches[("t", 5)][0].retry_at = 100.5  # in backoff after the drains' 100.0
    drain()  # no producer id yet: nothing goes
    seq.start(1000, 2)
    first = drain()
    txn.acked_all([first[0], first[1], first[4]])
    retry(first[3])
    queue(0, 1, 1, 2, 4, 4)
    second = drain()
    drain()
    retry(second[4])
    queue(0)
    drain()
    seq.start(1000, 3)  # a new epoch (KIP-360): every partition numbered from 0 again
    retry(second[3])
    queue(1)
    drain()
    return rounds, asked, assigned


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
async def test_a_sequenced_drain_keeps_each_partition_s_order(impl, transactional):
    """An idempotent producer's drain takes a batch only as Sequencer.may_send allows, and
    numbers it as Sequencer.assign would (_c.c does both itself when nothing of the
    partition is in flight): contiguous sequences per partition, a retry keeping its numbers
    unless a new epoch came, nothing taken without a producer id, behind an unacknowledged
    first batch, behind batches of an older epoch, or (a retry) behind others in flight."""
    rounds, _, _ = _sequenced_drains(impl, asyncio.get_running_loop(), transactional)
    p6 = [] if transactional else [(6, 1000, 2, 0, 0)]
    assert [r[0] for r in rounds] == [
        [],  # no producer id
        [(p, 1000, 2, 0, 0) for p in range(5)] + p6,
        # p2: its first unacknowledged; p3 retried with its numbers; p0/p1/p4 nothing in flight
        [(0, 1000, 2, 1, 0), (1, 1000, 2, 2, 0), (3, 1000, 2, 0, 1), (4, 1000, 2, 5, 0)],
        # p1, p4: one in flight, acknowledged before: a second joins it
        [(1, 1000, 2, 4, 0), (4, 1000, 2, 10, 0)],
        [(0, 1000, 2, 2, 0)],  # p4's retry waits behind its third in flight
        # the new epoch: p3's retry numbered again from 0; p1 and p2 wait for their old
        # epoch's batches in flight, p4's retry for its third
        [(3, 1000, 3, 0, 2)]]
    next_sequences = rounds[-2][1]
    assert next_sequences == {("t", 0): 3, ("t", 1): 6, ("t", 2): 3, ("t", 3): 4,
                              ("t", 4): 15} | ({} if transactional else {("t", 6): 7})
    assert rounds[-1][1] == {("t", 3): 4}


@needs_c
@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
async def test_a_sequenced_drain_alike_in_both(transactional):
    loop = asyncio.get_running_loop()
    assert _sequenced_drains(_c, loop, transactional)[0] == \
        _sequenced_drains(_py, loop, transactional)[0]


def _random_sequenced_drains(impl, loop, seed: int, transactional: bool) -> list:
    """300 random steps of an idempotent (or transactional) producer of `impl`, as the
    sender would tell its sequencer: batches of 1-3 records queued on 6 partitions, drains,
    batches in flight acknowledged, retried (a new epoch renumbers them) or failed for good
    (acknowledging after a failure starts a new session, KIP-360), new epochs, producer id
    resets and new ids, partitions added to the transaction. What each drain took (number,
    partition, producer id, epoch, base sequence, attempts) and the next sequences after it."""
    rng = random.Random(seed)
    acc = _accumulator_parts(impl, loop)
    acc._max_request_size = acc.buffer_memory = 10_000_000
    acc._pool = impl.MemoryPool(10_000_000)
    txn = acc._txn = _transaction_manager(
        max_in_flight_requests_per_connection=rng.choice([1, 2, 5]),
        **({"transactional_id": "t-id"} if transactional else {}))
    seq = txn.sequencer
    seq._clock = lambda: 0.0  # (no partition goes quiet: QUIET_S)
    topics = {"t": types.SimpleNamespace(leaders=(1,) * 6)}
    in_flight: list = []
    trace: list = []
    producer_id, epoch = 1000, 0
    for _ in range(300):
        step = rng.random()
        if step < 0.35:
            batch = acc.open_new("t", rng.randrange(6), b"k", b"v", 1000, 6)
            for _ in range(rng.randrange(3)):
                assert batch.writer.try_append(1000, b"k", b"v", None)
        elif step < 0.6:
            taken = acc._drain(topics, [1], 10_000_000, 100.0).get(1, [])
            trace.append(sorted((b.number, b.partition, b.producer_id, b.producer_epoch,
                                 b.base_sequence, b.attempts) for b in taken))
            trace.append(dict(seq._next_sequence))
            seq.sent_all(taken)
            in_flight.extend(taken)
        elif step < 0.85 and in_flight:
            batch = in_flight.pop(rng.randrange(len(in_flight)))
            outcome = rng.random()
            seq.resolved(batch)
            if outcome < 0.6:
                txn.acked(batch)
            elif outcome < 0.9:  # refused retriably: first in its queue again
                seq.renumber_on_reset(batch)
                batch.attempts += 1
                acc._batches.setdefault(("t", batch.partition),
                                        collections.deque()).appendleft(batch)
            else:
                seq.failed(batch)
        elif step < 0.9:
            epoch += 1
            seq.start(producer_id, epoch)
        elif step < 0.93:
            seq.start(-1, -1)
        elif step < 0.96 and seq.producer_id < 0:
            producer_id += 1
            seq.start(producer_id, 0)
        elif transactional:
            txn._partitions.add(("t", rng.randrange(6)))
    return trace


@needs_c
@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
async def test_random_sequenced_drains_alike_in_both(transactional):
    """The compiled drain decides and numbers batches itself where the Python one asks
    may_send and Sequencer.assign: over random runs (epoch bumps, retries, producer id
    resets, partitions outside the transaction) both take the same batches with the same
    numbers, round by round."""
    loop = asyncio.get_running_loop()
    taken = 0
    for seed in range(100):
        trace = _random_sequenced_drains(_c, loop, seed, transactional)
        assert trace == _random_sequenced_drains(_py, loop, seed, transactional), seed
        taken += sum(len(drained) for drained in trace[::2])
    assert taken > 3_000  # (most runs take batches: not a comparison of empty drains)


@needs_c
async def test_the_compiled_drain_decides_and_numbers_the_common_batch_without_python():
    """The compiled drain lets the common batch of an idempotent producer go and numbers it
    itself, with no Python call (at 10,000 partitions ~490 batches a request, two calls each
    cost ~14,000 instructions), and holds every batch without a producer id itself (the
    first drain of 10,000 partitions asked 10,000 times) and every batch of a partition not
    yet in the transaction (asked of each, every drain, till AddPartitionsToTxn answers): it
    asks may_send only for a partition with batches in flight; Sequencer.assign never."""
    for transactional in (False, True):
        _, asked, assigned = _sequenced_drains(_c, asyncio.get_running_loop(), transactional)
        assert asked == [[], [], [2], [1, 2, 4], [0, 2, 4], [1, 2, 4]]
        assert assigned == [[]] * 6


def _lone_takes(impl, loop) -> list:
    """_take_sendable of `impl` on an idempotent producer's partition "t"-0 (max_in_flight
    2): without a producer id, then with one, then behind its first batch in flight and
    unacknowledged, then behind an acknowledged one: per call, what was taken (epoch, base
    sequence) or None, and how many batches stay queued; and the calls of may_send."""
    acc = _accumulator_parts(impl, loop)
    acc._max_request_size = acc.buffer_memory = 100_000
    acc._pool = impl.MemoryPool(100_000)
    txn = acc._txn = _transaction_manager(max_in_flight_requests_per_connection=2)
    asked: list[int] = []
    may_send = txn.may_send
    txn.may_send = lambda batch: asked.append(batch.partition) or may_send(batch)
    takes = []

    def take():
        queue = acc._batches[("t", 0)]
        taken = acc._take_sendable(("t", 0), queue)
        takes.append((None if taken is None else (taken.producer_epoch, taken.base_sequence),
                      len(queue), list(asked)))
        return taken

    acc.open_new("t", 0, b"k", b"v", 1000, 1)
    take()  # no producer id: nothing taken
    txn.sequencer.start(1000, 2)
    first = take()
    txn.sequencer.sent_all([first])
    acc.open_new("t", 0, b"k", b"v", 1000, 1)
    take()  # its first batch unacknowledged: one at a time
    txn.acked_all([first])
    second = take()
    assert second is not None and second.writer.codec == 0  # (sealed: taken as _take takes)
    return takes


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_a_lone_batch_is_taken_only_when_it_may_go(impl):
    """_take_sendable (the lone batch of an idle producer at linger_ms=0) takes a batch as
    the drain would: not without a producer id nor behind an unacknowledged first batch;
    numbered when taken. _c.c asks may_send only where the answer is not plain."""
    takes = _lone_takes(impl, asyncio.get_running_loop())
    assert [(taken, queued) for taken, queued, _ in takes] == [
        (None, 1), ((2, 0), 0), (None, 1), ((2, 1), 0)]
    asked = takes[-1][2]
    assert asked == ([0, 0, 0, 0] if impl is _py else [0])  # (C: behind the unacknowledged)


def _acked_counts(impl, loop) -> list:
    """take_acked and count_acked over four acknowledged batches of `impl` (one no longer
    incomplete: it expired in flight), of two topics, created at different times."""
    def batch(number, topic, records, created):
        writer = impl.RecordWriter(0, 1 << 16)
        for _ in range(records):
            assert writer.try_append(0, b"k", b"v" * 30, None)
        made = impl.BatchFields((number,), topic, 0, writer, loop.create_future(), created,
                                created + 60.0, 1024 * number)
        return made
    batches = [batch(3, "a", 2, 99.9985), batch(1, "b", 1, 99.0), batch(7, "a", 5, 99.997),
               batch(5, "a", 1, 10.0)]
    incomplete = set(batches[:3]) | {"another"}
    counted, freed, records, newest = impl.take_acked(batches, incomplete)
    buckets = [0] * 4
    by_topic, total = impl.count_acked(counted, 100.0, (0.002, 0.005, 0.5), buckets)
    return [[b.number for b in counted], freed, records, newest, incomplete == {"another"},
            by_topic, round(total, 9), buckets,
            [b.writer.size for b in batches]]


@pytest.mark.parametrize("impl", BOTH, ids=["python", "c"])
async def test_acknowledged_batches_are_counted_once(impl):
    """take_acked(): of a response's acknowledged batches, those still incomplete, taken out
    of it, with their memory, records and the newest creation number (flush() counts by
    it); count_acked(): per topic their records, batches and bytes, and each one's time
    since its creation into the latency histogram (bisect_left), with their sum."""
    loop = asyncio.get_running_loop()
    counted, freed, records, newest, left, by_topic, total, buckets, sizes = \
        _acked_counts(impl, loop)
    assert counted == [(3,), (1,), (7,)] and left
    assert (freed, records, newest) == (1024 * 11, 8, 7)
    assert by_topic == {"a": [7, 2, sizes[0] + sizes[2]], "b": [1, 1, sizes[1]]}
    assert buckets == [1, 1, 0, 1] and total == round(0.0015 + 1.0 + 0.003, 9)
    with pytest.raises(TypeError):
        impl.take_acked(["not a batch"], set())
    with pytest.raises(TypeError):
        impl.count_acked([], 1.0, (0.1,), [0])  # one bucket more than bounds


@needs_c
async def test_acknowledged_batches_counted_alike_in_both():
    loop = asyncio.get_running_loop()
    assert _acked_counts(_c, loop) == _acked_counts(_py, loop)
