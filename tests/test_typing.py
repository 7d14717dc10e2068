"""The package ships py.typed and type-checks strictly: what users import must type-check,
error classes included, from a project of their own outside this repo (mypy finds the
installed package, as pip installs it and as ./dev's editable install does); and Python run
from the directory holding the clone imports the package, not the clone as a namespace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# mypy over the package takes 30-60 s on a quiet machine and past the suite's 120 s guard
# on a loaded one (four test workers and the real-Kafka tier beside it); each mypy run keeps
# its own 300 s limit.
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent

USER_CODE = """
import asyncio

from aioproducer import BlockingProducer, BulkMetadata, BulkThreadFuture, Histogram, Producer, \
    ProducerMetrics, RecordMetadata, TopicMetrics, accepted
from aioproducer.errors import BrokerError, NotLeaderOrFollowerError, ERROR_CLASSES

async def main() -> None:
    async with Producer("localhost:9092", linger_ms=5,
                        compression_type=None) as producer:  # (aiokafka's spelling)
        md = await producer.send("t", b"v", key=b"k")
        offset: int = md.offset
        bulk = await producer.enqueue_many("t", [(b"k", b"v")])
        first_offset: int = (await bulk)[0].offset
        every: BulkMetadata = await bulk
        metrics: ProducerMetrics = producer.metrics()
        per_topic: TopicMetrics = metrics.topics["t"]
        latency: Histogram = metrics.produce_latency_histogram
        futures = [await producer.enqueue("t", b"v") for _ in range(3)]
        done, pending = await asyncio.wait(futures, timeout=1)
        offsets: list[int] = [f.result().offset for f in done]
        gathered: list[RecordMetadata] = await asyncio.gather(*futures)
        sent: list[RecordMetadata] = await asyncio.gather(*(producer.send("t", b"v")
                                                             for _ in range(3)))
        async with asyncio.TaskGroup() as group:
            task: asyncio.Task[RecordMetadata] = group.create_task(producer.send("t", b"v"))
        shielded: RecordMetadata = await asyncio.wait_for(asyncio.shield(futures[0]), 1)
        bulks_done, _ = await asyncio.wait([bulk], timeout=1)
    code: int = NotLeaderOrFollowerError.error_code
    cls: type[BrokerError] = ERROR_CLASSES[6]

def from_sync_code() -> set[int]:
    with BlockingProducer("localhost:9092", linger_ms=5) as producer:
        metadata: RecordMetadata = producer.produce("t", b"v").result(timeout=10)
        producer.send("t", b"v", key=b"k")
        with producer.transaction():
            producer.produce("t", b"in it")
        bulk: BulkThreadFuture = producer.produce_many("t", [(b"k", b"v"), (None, b"w")])
        offsets: list[int] = [md.offset for md in bulk.result(timeout=10)]
        try:
            producer.produce_many("t", iter([(None, b"v")]), partition=0)
        except Exception as error:
            buffered = accepted(error)
            resume_at: int = 0 if buffered is None else len(buffered)
        return producer.partitions_for("t")
"""


def test_package_and_user_code_type_check(tmp_path):
    sample = tmp_path / "user_code.py"
    sample.write_text(USER_CODE)
    done = subprocess.run(
        # strict, by pyproject.toml's [tool.mypy]
        [sys.executable, "-m", "mypy", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(ROOT / "aioproducer"), str(sample)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    # Users who type-check strictly, in a project of their own: asyncio.wait, gather and
    # TaskGroups over our futures, and the blocking facade.
    strict = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(sample)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert strict.returncode == 0, strict.stdout + strict.stderr


MISTAKES = """
from aioproducer import BlockingProducer, Producer

producer = Producer("localhost:9092", lingr_ms=5)
blocking = BlockingProducer("localhost:9092", linger_ms="5")
"""


def test_a_misspelt_or_mistyped_setting_is_a_type_error(tmp_path):
    sample = tmp_path / "mistakes.py"
    sample.write_text(MISTAKES)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(sample)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert 'mistakes.py:4: error: Unexpected keyword argument "lingr_ms"' in done.stdout, \
        done.stdout
    # (Producer's constructor is overloaded by serializer, so mypy names no argument here)
    assert 'mistakes.py:5: error: No overload variant of "BlockingProducer" matches argument ' \
        'types "str", "str"' in done.stdout, done.stdout


def test_python_run_beside_the_clone_imports_the_package(tmp_path):
    """A clone named aioproducer in the working directory is a directory without
    __init__.py there: it must not shadow the installed package as a namespace package."""
    (tmp_path / "aioproducer").symlink_to(ROOT)
    done = subprocess.run([sys.executable, "-c", "from aioproducer import Producer; "
                           "import aioproducer; print(aioproducer.__file__)"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "aioproducer" / "__init__.py")


TYPED_BY_SERIALIZERS = """
import json
from dataclasses import dataclass
from typing import Any

from aioproducer import BlockingProducer, Producer
from aioproducer.serializers import MutableHeaders, Serializer


@dataclass
class Order:
    id: int


def order_bytes(order: Order) -> bytes:
    return json.dumps({"id": order.id}).encode()


class IntKey(Serializer[int]):
    def serialize(self, topic: str, headers: MutableHeaders, value: int) -> bytes:
        return b"%d" % value


async def main() -> None:
    async with Producer("h:1", key_serializer=IntKey(), value_serializer=order_bytes) as orders:
        await orders.send("t", Order(1), key=7)
        await orders.send("t", None, key=7)
        await orders.enqueue_many("t", [(1, Order(2)), (None, None)])
    async with Producer("h:1", value_serializer=lambda v: json.dumps(v).encode()) as anything:
        await anything.send("t", {"any": ["json"]})
    async with Producer("h:1") as raw:
        await raw.send("t", b"v", key=b"k")
        await raw.enqueue("t", bytearray(b"v"), key=memoryview(b"k"))
    with BlockingProducer("h:1", value_serializer=str.encode) as text:
        text.produce("t", "a str")


# A function typed for the producer it uses: one made without serializers takes bytes (and
# more), so it is such a producer, as one of Orders is a producer of a subclass's.
async def publish(producer: Producer[bytes, bytes]) -> None:
    await producer.send("t", b"v")


def publish_sync(producer: BlockingProducer[bytes, bytes]) -> None:
    producer.produce("t", b"v")


class RushOrder(Order):
    pass


async def publish_rush(producer: Producer[int, RushOrder]) -> None:
    await producer.send("t", RushOrder(1), key=1)


async def passes() -> None:
    async with Producer("h:1") as raw:
        await publish(raw)
    async with Producer("h:1", key_serializer=IntKey(), value_serializer=order_bytes) as orders:
        await publish_rush(orders)
    with BlockingProducer("h:1") as blocking:
        publish_sync(blocking)
"""

WRONG_TYPES = """
from aioproducer import BlockingProducer, Producer


def order_bytes(order: int) -> bytes:
    return b"%d" % order


async def main() -> None:
    async with Producer("h:1") as raw:
        await raw.send("t", "a str")
        await raw.enqueue("t", b"v", key="k")
        await raw.enqueue_many("t", [(None, "v")])
    async with Producer("h:1", value_serializer=order_bytes) as orders:
        await orders.send("t", b"bytes")
    with BlockingProducer("h:1") as blocking:
        blocking.produce("t", "a str")
"""


def _strict(tmp_path, name: str, code: str) -> subprocess.CompletedProcess[str]:
    sample = tmp_path / name
    sample.write_text(code)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(sample)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_keys_and_values_are_typed_by_the_serializers(tmp_path):
    """Without a serializer send() takes bytes (or a bytearray, a memoryview); with one,
    what it takes; with a lambda, anything. Producers are contravariant in what they take:
    a parameter typed Producer[bytes, bytes] takes Producer("host:9092") (it was an error,
    "Producer[bytes | bytearray | memoryview, ...]" expected "Producer[bytes, bytes]")."""
    done = _strict(tmp_path, "typed.py", TYPED_BY_SERIALIZERS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_what_send_would_refuse_is_a_type_error(tmp_path):
    """A str with no serializer (send() raises InvalidRecordError), or bytes to a serializer
    of ints: mypy --strict flags each line, on Producer and BlockingProducer alike."""
    done = _strict(tmp_path, "wrong.py", WRONG_TYPES)
    flagged = sorted({int(line.split(":")[1]) for line in done.stdout.splitlines()
                      if line.startswith("wrong.py:") and ": error:" in line})
    assert flagged == [11, 12, 13, 15, 17], done.stdout
