"""PySpark to Kafka: the `aioproducer` data source (batch and Structured Streaming, exactly
once for streams), and `write_dataframe()`, a call that returns totals.

```py
from aioproducer.integrations.spark import register

register(spark)   # once per SparkSession
(df.write.format("aioproducer")
   .option("kafka.bootstrap.servers", "broker:9092").option("topic", "orders")
   .mode("append").save())
```

Columns and options are Spark's own Kafka sink's: `value` (string or binary, required),
`key`, `headers` (array<struct<key:string,value:binary>>), `topic` (unless the `topic`
option is set: it wins), `partition` (int); `kafka.`-prefixed options are producer settings
in Kafka's dotted names. They are checked on the driver before any task runs
(`InvalidRecordError` for a column, `ConfigError` for an option).

Every Spark task writes its partition through its own Producer on its own event loop (uvloop
when installed). How a streaming query writes each micro-batch exactly once is explained on
`plan_write`'s `exactly_once` and in docs/spark.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..config import ProducerConfig
from ..errors import ConfigError, InvalidRecordError, KafkaError
from ..producer import Producer, accepted
from .._speedups import Columns

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # (no type hints)
    from pyspark.accumulators import Accumulator
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from .._internal.batch import ProducerBatch

FORMAT = "aioproducer"
_HEADERS_TYPE = "array<struct<key:string,value:binary>>"


class SparkWriteError(KafkaError):
    """Some Spark partitions did not deliver all their rows. `rows`: rows in the DataFrame;
    `not_confirmed`: how many of them Kafka did not confirm (in a transaction, a failed
    partition's rows count in full: its transaction was aborted); `failed_partitions`: the
    indexes of the Spark partitions that failed."""

    def __init__(self, message: str, rows: int, not_confirmed: int,
                 failed_partitions: list[int]) -> None:
        super().__init__(message)
        self.rows = rows
        self.not_confirmed = not_confirmed
        self.failed_partitions = failed_partitions


class SparkExecutorSetupError(KafkaError):
    """An executor's Python cannot import aioproducer or one of its dependencies: the
    package was not shipped to the executors (see docs/spark.md)."""


@dataclass(frozen=True)
class WriteTotals:
    """What a write delivered: records and key/value bytes acknowledged (the columns' bytes,
    before a serializer), Spark partitions written. (A write that did not deliver everything
    raises SparkWriteError instead.)"""

    records: int
    bytes: int
    partitions: int


@dataclass(frozen=True)
class WritePlan:
    """What every task of one write needs, checked on the driver (pickled to the tasks).
    `topic`: the topic option, which overrides a topic column; `columns`: which of the
    optional columns (key, headers, topic, partition) the rows carry."""

    config: ProducerConfig
    topic: str | None
    columns: frozenset[str]
    exactly_once: bool = False
    transactional_id_prefix: str | None = None
    headers_name: str = "'headers'"  # as the user knows the column, for errors

    def task_config(self, partition_index: int) -> ProducerConfig:
        """In a transaction, each Spark partition has its own transactional id: a retried
        or speculative attempt of the same task fences the earlier one."""
        if not self.exactly_once:
            return self.config
        return dataclasses.replace(
            self.config, transactional_id=f"{self.transactional_id_prefix}-{partition_index}")


@dataclass(frozen=True)
class TaskReport:
    """One task's outcome: rows in its partition, records and key/value bytes Kafka
    confirmed, the first error (empty if none), and whether a replayed micro-batch found
    this partition already committed (nothing was written again)."""

    partition: int
    rows: int
    records: int
    bytes: int
    error: str = ""
    already_committed: bool = False

    @property
    def failed(self) -> bool:
        return bool(self.error) or self.not_confirmed > 0

    @property
    def not_confirmed(self) -> int:
        """Rows Kafka did not confirm (in a transaction that failed, all of them: it was
        aborted); none of a partition found already committed."""
        return 0 if self.already_committed else self.rows - self.records


# -- on the driver: options and columns ----------------------------------------------------

@dataclass(frozen=True)
class SinkProgress:
    """Counters that the data source's tasks add to (Spark accumulators, read on the driver
    with `.value`, also while a streaming query runs): records and key/value bytes Kafka
    confirmed; `errors`, rows Kafka did not confirm (all of a partition whose transaction
    failed: it was aborted); rows of replayed micro-batches found already committed (not
    written again)."""

    records: Accumulator[int]
    bytes: Accumulator[int]
    errors: Accumulator[int]
    rows_already_committed: Accumulator[int]

    def add(self, report: TaskReport) -> None:
        """Count a task's report (on the executor)."""
        self.records.add(report.records)
        self.bytes.add(report.bytes)
        if report.failed:
            self.errors.add(report.not_confirmed)
        if report.already_committed:
            self.rows_already_committed.add(report.rows)


def register(spark: SparkSession, *, check_executors: bool = True) -> SinkProgress:
    """Make `format("aioproducer")` known to this SparkSession (Spark has no entry point
    discovery for Python data sources: each session registers them); return the counters
    its writes add to.

    `check_executors`: first run one small job that imports, on the executors, what the
    writing tasks import. An executor whose Python lacks aioproducer or a dependency then
    fails here with one SparkExecutorSetupError naming the fix, not with a
    ModuleNotFoundError in every task of the first write."""
    from .spark_source import KafkaSink

    if check_executors:
        check_executor_imports(spark)
    context = spark.sparkContext
    progress = SinkProgress(records=context.accumulator(0), bytes=context.accumulator(0),
                            errors=context.accumulator(0),
                            rows_already_committed=context.accumulator(0))
    # A subclass per registration carries the counters to the tasks (pickled by value).
    spark.dataSource.register(type("KafkaSink", (KafkaSink,), {"progress": progress}))
    return progress


_SHIPPING_HELP = (
    "The aioproducer data source's tasks run there: give the executors a Python that has "
    "aioproducer[spark] installed (the same path on every node, set with "
    "spark.pyspark.python or PYSPARK_PYTHON), or ship a packed virtualenv: "
    "`venv-pack -o env.tar.gz`, then spark.archives=env.tar.gz#environment and "
    "spark.pyspark.python=./environment/bin/python (docs/spark.md)")

# Run on the executors, so defined from source here: a function of this module would be
# pickled by reference, and unpickling it needs the very import being checked.
_PROBE_SOURCE = """
def probe(_):
    import importlib, socket, sys
    missing = []
    for name in NAMES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    yield socket.gethostname(), sys.executable, missing
"""


_checked_applications: set[str] = set()  # Spark applications whose executors passed


def check_executor_imports(spark: SparkSession) -> None:
    """Import the writing tasks' modules in a task on each executor slot; raise
    SparkExecutorSetupError naming what is missing where, and how to ship it. Once per
    Spark application that passes."""
    application = spark.sparkContext.applicationId
    if application in _checked_applications:
        return
    namespace: dict[str, Any] = {"__name__": "aioproducer_executor_probe",
                                 "NAMES": ("pyarrow", "aioproducer.integrations.spark_source")}
    exec(_PROBE_SOURCE, namespace)
    context = spark.sparkContext
    slots = max(context.defaultParallelism, 1)
    try:
        found = context.parallelize(range(slots), slots).mapPartitions(namespace["probe"]).collect()
    except Exception as exc:
        cause = next((line for line in str(exc).splitlines() if line.strip()), repr(exc))
        raise SparkExecutorSetupError(
            f"the executors could not run a Python task: {cause[:500]}. {_SHIPPING_HELP}") from exc
    broken = sorted({(host, executable, tuple(missing))
                     for host, executable, missing in found if missing})
    if broken:
        where = "; ".join(f"{executable} on {host} cannot import {', '.join(missing)}"
                          for host, executable, missing in broken)
        raise SparkExecutorSetupError(f"the executors' Python is missing packages: {where}. "
                                      f"{_SHIPPING_HELP}")
    _checked_applications.add(application)


_AS_BYTES = ("the key and value columns are sent as their bytes (a string's as UTF-8), as "
             "Spark's Kafka sink sends them, which refuses this option too; drop it (or convert "
             "the column in Spark: CAST, to_json)")
# Settings Spark's Kafka sink hands to its Java producer as class names.
_JAVA_CODE = {
    "key.serializer": _AS_BYTES,
    "value.serializer": _AS_BYTES,
    "partitioner.class": ("a row goes to its partition column's partition, else to its key's "
                          "murmur2 partition (the Java client's default); set a partition "
                          "column, or give write_dataframe() a partitioner= (a Python callable)"),
}


def plan_from_options(options: Mapping[str, str], schema: StructType, *,
                      streaming: bool) -> WritePlan:
    """The data source's options, as Spark's Kafka sink takes them, checked with the
    DataFrame's schema. Spark hands options over with lower-cased names."""
    options = {name.lower(): value for name, value in options.items()}
    properties = {name[len("kafka."):]: value for name, value in options.items()
                  if name.startswith("kafka.")}
    for name in properties:
        if name.strip() in _JAVA_CODE:
            raise ConfigError(f"kafka.{name.strip()} names Java code, which the data source "
                              f"cannot run: {_JAVA_CODE[name.strip()]}")
    if "bootstrap.servers" not in properties:
        raise ConfigError('the aioproducer data source needs .option("kafka.bootstrap.servers", '
                          '"host:9092"), as Spark\'s Kafka sink does')
    config = ProducerConfig.from_properties(properties)
    if config.transactional_id is not None:  # (kafka.transactional.id, however spelt)
        raise ConfigError("each Spark partition gets its own transactional id: set "
                          '.option("transactionalIdPrefix", ...) instead of kafka.transactional.id')
    exactly_once_option = options.get("exactlyonce", "true" if streaming else "false").lower()
    if exactly_once_option not in ("true", "false"):
        raise ConfigError(f'exactlyOnce must be "true" or "false", not {exactly_once_option!r}')
    exactly_once = exactly_once_option == "true"
    prefix = options.get("transactionalidprefix")
    if exactly_once and not streaming and not prefix:
        raise ConfigError('a batch write with exactlyOnce needs .option("transactionalIdPrefix", '
                          "...), stable across re-runs of the job")
    if exactly_once:
        said_off = any(name.strip().replace(".", "_").replace("-", "_") == "enable_idempotence"
                       and value.strip().lower() == "false" for name, value in properties.items())
        _check_idempotent(config, said_off, "exactlyOnce", lambda name, value: (
            f"kafka.{name.replace('_', '.')}={str(value).lower()}"),
            'or set .option("exactlyOnce", "false") to write at least once')
    topic = options.get("topic")
    return WritePlan(config, topic, check_columns(schema, topic), exactly_once, prefix)


def _check_idempotent(config: ProducerConfig, said_off: bool, asked: str,
                      spell: Callable[[str, Any], str], instead: str) -> None:
    """Exactly-once tasks write in transactions: each task's producer gets a transactional
    id, which needs an idempotent producer. `config` (validated, without that id) has
    idempotence off, as told (`said_off`) or turned off by a clashing setting: say which
    settings did, as the user spelt them, here on the driver (each task's Producer would
    refuse them)."""
    if config.enable_idempotence:
        return
    clashes = [spell(name, value) for name, value, bad in (
        ("enable_idempotence", False, said_off),
        ("acks", config.acks, config.acks != -1),
        ("retries", config.retries, config.retries == 0),
        ("max_in_flight_requests_per_connection", config.max_in_flight_requests_per_connection,
         config.max_in_flight_requests_per_connection > 5)) if bad] or [
        spell("enable_idempotence", False)]
    raise ConfigError(
        f"{asked} writes each Spark partition in a Kafka transaction, which needs an idempotent "
        f"producer (acks=all, retries > 0, at most 5 requests in flight); "
        f"{' and '.join([', '.join(clashes[:-1]), clashes[-1]] if clashes[:-1] else clashes)} "
        f"rule{'s' if len(clashes) == 1 else ''} that out: drop "
        f"{'it' if len(clashes) == 1 else 'them'}, {instead}")


def check_columns(schema: StructType, topic: str | None,
                  names: Mapping[str, str] | None = None) -> frozenset[str]:
    """Spark's Kafka sink's columns: `value` string or binary (required), `key` the same,
    `headers` array<struct<key:string,value:binary>> (string values too), `topic` string
    (required without the topic option), `partition` int. Others are ignored, as there.
    `names`: how to name a column in an error (write_dataframe's argument), by role."""
    from pyspark.sql.types import BinaryType, IntegerType, StringType

    names = names or {}
    types = {field.name: field.dataType for field in schema.fields}

    def describe(role: str) -> str:
        return names.get(role, repr(role))

    if "value" not in types:
        raise InvalidRecordError(
            f"no 'value' column: the columns are {', '.join(types) or 'none'}; select or alias "
            "one as value (string or binary), as for Spark's Kafka sink")
    for role in ("key", "value"):
        if role in types and not isinstance(types[role], (StringType, BinaryType)):
            json_hint = (", or for a struct, map or array send JSON (F.to_json, or "
                         "write_dataframe's value_format='json')" if role == "value" else "")
            raise InvalidRecordError(
                f"{role} column {describe(role)} is {types[role].simpleString()}: it must be "
                f"string or binary; cast it (F.col(...).cast('string')){json_hint}")
    if "headers" in types and not _is_headers_type(types["headers"]):
        raise InvalidRecordError(
            f"headers column {describe('headers')} is {types['headers'].simpleString()}: it must "
            f"be {_HEADERS_TYPE} as for Spark's Kafka sink (value may also be string), e.g. "
            "F.array(F.struct(F.lit('trace').alias('key'), "
            "F.col('id').cast('binary').alias('value')))")
    if topic is None:
        if "topic" not in types:
            raise ConfigError('no topic: set .option("topic", ...) or give the rows a topic '
                              "column (string), as for Spark's Kafka sink")
        if not isinstance(types["topic"], StringType):
            raise InvalidRecordError(
                f"topic column is {types['topic'].simpleString()}: it must be string")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise InvalidRecordError(
            f"partition column is {types['partition'].simpleString()}: it must be int; cast it "
            "(F.col('partition').cast('int'))")
    optional = {"key", "headers", "partition"} | ({"topic"} if topic is None else set())
    return frozenset(optional & types.keys())


def _is_headers_type(data_type: DataType) -> bool:
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (fields.keys() == {"key", "value"} and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], (StringType, BinaryType)))


# -- in the tasks ---------------------------------------------------------------------------

def write_partition(batches: Iterable[pa.RecordBatch], plan: WritePlan, partition_index: int,
                    batch_id: int | None = None) -> TaskReport:
    """Produce one Spark partition (Arrow record batches) and report. `batch_id`: the
    streaming micro-batch, for exactly once."""
    report: TaskReport = _run(_write_partition(iter(batches), plan, partition_index, batch_id))
    return report


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


async def _write_partition(batches: Iterator[pa.RecordBatch], plan: WritePlan, index: int,
                           batch_id: int | None) -> TaskReport:
    """A failure aborts the partition's transaction: left open, it would hold back every
    read_committed consumer of its Kafka partitions.

    Exactly once for a micro-batch: the transaction that writes (batch, Spark partition)
    also commits offset batch + 1 for the marker partition (the first row's topic,
    partition 0) in the group named like the transactional id. A replay (after a restart
    from the checkpoint, or a retried task) first starts the producer, which fences any
    older attempt and aborts its open transaction, then reads that offset: past this batch
    means its rows are in Kafka already, so nothing is written again.

    Spark's next Arrow batch is read in a worker thread while the event loop sends the
    records of this one (see _ReadAhead)."""
    spark_alive = _spark_watch()
    first = next((b for b in batches if b.num_rows), None)
    if first is None:
        return TaskReport(index, 0, 0, 0)
    rows = first.num_rows
    ahead = _ReadAhead(batches)
    sent: list[_Sent] = []
    error = ""
    transactional = plan.exactly_once
    try:
        async with Producer(config=plan.task_config(index)) as producer:
            marker = None
            if transactional and batch_id is not None:
                marker_topic = plan.topic or _cells(first, "topic")[0]
                marker = (marker_topic, 0)
                group = producer.config.transactional_id
                assert group is not None
                committed = await producer.committed_offsets(group, [marker])
                if committed[marker] > batch_id:
                    rows += await ahead.rows_left()
                    return TaskReport(index, rows, 0, 0, already_committed=True)
            if transactional:
                producer.begin_transaction()
            try:
                batch = first
                while batch is not None:
                    ahead.read_next()
                    await _send(producer, batch, plan, sent)
                    batch = await ahead.next()
                    rows += batch.num_rows if batch is not None else 0
                if transactional and not spark_alive():
                    raise RuntimeError(
                        "the Spark JVM feeding this task is gone: its input may have ended "
                        "early, so its transaction is aborted, not committed")
                if marker is not None:
                    assert producer.config.transactional_id is not None and batch_id is not None
                    await producer.send_offsets_to_transaction(
                        {marker: batch_id + 1}, producer.config.transactional_id)
                if transactional:
                    await producer.commit_transaction()
                else:
                    await producer.flush()
            except BaseException:
                if transactional:
                    sent.clear()  # none of them will be visible to read_committed consumers
                    with contextlib.suppress(KafkaError):  # e.g. fenced: the first error says more
                        await producer.abort_transaction()
                raise
    except Exception as exc:  # reported to the driver
        error = repr(exc)
        rows += await ahead.rows_left()  # the rest of the partition was not written
    records = size = 0
    for part in sent:
        confirmed, confirmed_size, failed = part.outcome()
        records += confirmed
        size += confirmed_size
        if failed is not None and not error:
            error = repr(failed)
    return TaskReport(index, rows, records, size, error)


def _spark_watch() -> Callable[[], bool]:
    """Whether the JVM that feeds this Python worker is still there, as at the call. Killed
    between two Arrow batches, it leaves an input stream that ends cleanly (Arrow's stream
    format allows an end without its end marker): the task would commit a transaction of
    the rows before the kill, and the replay would find the micro-batch committed and skip
    the rest (seen once in CI, a killed driver). The worker's parent is PySpark's daemon
    (or the JVM), the daemon's the JVM: a parent gone gives its child a new parent, but only
    at the end of its exit, after it closed its sockets (the input's end): in between it is
    exiting (seen once more in CI, the same test), which /proc says too. Without /proc, only
    the worker's own parent is watched."""
    parent = os.getppid()
    grandparent = _parent_of(parent)

    def alive() -> bool:
        return os.getppid() == parent and (grandparent is None or (
            _parent_of(parent) == grandparent
            and not _exiting(parent) and not _exiting(grandparent)))
    return alive


def _stat(pid: int) -> list[bytes]:
    """/proc/<pid>/stat's fields after the command (state, ppid, ..., flags); [] if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            return stat.read().rpartition(b")")[2].split()
    except OSError:
        return []


def _parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else None


_PF_EXITING = 0x4  # (the kernel's task flag, set as a process's exit begins)


def _exiting(pid: int) -> bool:
    """Whether the process is gone, a zombie, or on its way out (its main thread's exit
    begun: set before its other threads close the sockets they share)."""
    fields = _stat(pid)
    return len(fields) < 7 or fields[0] in (b"Z", b"X", b"x") \
        or bool(int(fields[6]) & _PF_EXITING)


class _ReadAhead:
    """A partition's Arrow batches, each read in a worker thread (at most one at a time,
    one batch ahead of the one being sent): reading one makes Spark compute it, upstream of
    the sink, and on the event loop's thread that wait would hold up the sending of the
    records already buffered."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._reading: asyncio.Future[pa.RecordBatch | None] | None = None

    def read_next(self) -> None:
        assert self._reading is None, "one batch at a time: Spark's iterator is not shared"
        self._reading = asyncio.get_running_loop().run_in_executor(
            None, next, self._batches, None)

    async def next(self) -> pa.RecordBatch | None:
        """The batch read_next() started to read (None after the last)."""
        reading, self._reading = self._reading, None
        assert reading is not None
        return await reading

    async def rows_left(self) -> int:
        """Rows of the batches not read yet, the one being read included (once it is: the
        iterator is read by one thread at a time)."""
        rows = 0
        if self._reading is not None:
            with contextlib.suppress(Exception):  # the failure reported is the first one
                batch = await self.next()
                rows += batch.num_rows if batch is not None else 0
        left: int = sum(b.num_rows for b in self._batches)
        return rows + left


class _Sent:
    """Records a task gave its producer, counted once they are all done: `outcome()` is
    (records confirmed, their key and value bytes, the first failure or None)."""

    __slots__ = ()

    def outcome(self) -> tuple[int, int, BaseException | None]:
        raise NotImplementedError


class _Handed(_Sent):
    """Records followed by one future (enqueue_many's BulkFuture, all or nothing, or
    enqueue()'s for one record)."""

    __slots__ = ("future", "count", "size")

    def __init__(self, future: Any, count: int, size: int) -> None:
        self.future, self.count, self.size = future, count, size

    def outcome(self) -> tuple[int, int, BaseException | None]:
        failed = self.future.exception()
        return (0, 0, failed) if failed is not None else (self.count, self.size, None)


class _Appended(_Sent):
    """Rows appended one by one with no future each (the producer's future per record and
    the coroutine of enqueue() were about a third of a row's cost): each row's batch and
    offset delta, and its key and value bytes. A row is confirmed if its batch (or the piece
    of a split batch that holds it) was."""

    __slots__ = ("batches", "deltas", "sizes")

    def __init__(self, sizes: list[int]) -> None:
        self.batches: list[ProducerBatch] = []
        self.deltas: list[int] = []
        self.sizes = sizes  # of every row of the Arrow batch, appended or not

    def outcome(self) -> tuple[int, int, BaseException | None]:
        count = len(self.batches)
        failed = {b for b in set(self.batches) if b.future.exception() is not None}
        if not failed:
            return count, sum(self.sizes[:count]), None
        records = size = 0
        first = None
        for batch, delta, row_size in zip(self.batches, self.deltas, self.sizes):
            failure = batch.exception_for(delta) if batch in failed else None
            if failure is None:
                records += 1
                size += row_size
            elif first is None:
                first = failure
        return records, size, first


async def _send(producer: Producer[Any, Any], batch: pa.RecordBatch, plan: WritePlan,
                sent: list[_Sent]) -> None:
    """Enqueue a record batch's rows. Rows with only a key and a value go in one
    enqueue_many() call, as columns that its compiled loop reads in Arrow's buffers; then its
    one future says whether all of them were confirmed, and a failure counts them all as not
    confirmed. Rows with headers, a topic or a partition are appended one by one, as
    enqueue() does it, but with no coroutine or future per row: each is awaited only when
    it must wait (for a new batch, buffer memory or a topic's metadata)."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    if not batch.num_rows:
        return
    if plan.columns <= {"key"}:
        assert plan.topic is not None
        size = sum(pc.sum(pc.binary_length(batch.column(name))).as_py() or 0
                   for name in ("key", "value") if name == "value" or name in plan.columns)
        try:
            bulk = await producer.enqueue_many(plan.topic, _key_value_columns(batch, plan))
        except Exception as exc:
            buffered = accepted(exc)
            if buffered is not None:  # sent: their outcome counts (not their bytes: this fails)
                sent.append(_Handed(buffered, len(buffered), 0))
            raise
        sent.append(_Handed(bulk, batch.num_rows, size))
        return
    sizes = pc.fill_null(pc.binary_length(batch.column("value")), 0)
    if "key" in plan.columns:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(batch.column("key")), 0))
    rows, refused = _records(batch, plan)
    intake = producer._intake  # (the producer's own append, as enqueue() calls it)
    if intake.on_send_hooks:  # hooks that see each record: enqueue() tells them
        for (topic, key, value, headers, partition), size in zip(rows, sizes.to_pylist()):
            handle = await producer.enqueue(topic, value, key, partition=partition,
                                            headers=headers)
            sent.append(_Handed(handle, 1, size))
    else:
        appended = _Appended(sizes.to_pylist())
        sent.append(appended)
        append, add_batch, add_delta = intake.append, appended.batches.append, \
            appended.deltas.append
        for topic, key, value, headers, partition in rows:
            done = append(topic, value, key, partition, None, headers, False)
            if not isinstance(done, tuple):  # it must wait: a coroutine
                done = await done
            add_batch(done[0])  # type: ignore[arg-type]  # (enqueue()'s are never in line)
            add_delta(done[1])
    if refused is not None:
        raise refused


def _key_value_columns(batch: pa.RecordBatch, plan: WritePlan) -> Columns:
    """The rows' keys and values as the producer's Columns: enqueue_many's compiled loop
    reads them in Arrow's own buffers, with no bytes object or tuple per row (those were
    about a fifth of the task's CPU). Strings are read as their UTF-8 bytes, as sent."""
    keys = _column_buffers(batch.column("key")) if "key" in plan.columns else None
    return Columns(batch.num_rows, keys, _column_buffers(batch.column("value")))


def _column_buffers(column: pa.Array) -> tuple[Any, Any, Any, int, int]:
    """A string or binary Arrow array as Columns takes a column (string and binary share a
    layout; the large types have 8-byte offsets). Without nulls, no validity bitmap to read."""
    import pyarrow as pa

    kind = column.type
    if not (pa.types.is_binary(kind) or pa.types.is_string(kind) or
            pa.types.is_large_binary(kind) or pa.types.is_large_string(kind)):
        column = column.cast(pa.large_binary())  # (a view type, say)
    validity, offsets, data = column.buffers()
    large = pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)
    return (validity if column.null_count else None, offsets,
            data if data is not None else b"", column.offset, 8 if large else 4)


_Record = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int | None]


def _records(batch: pa.RecordBatch, plan: WritePlan
             ) -> tuple[Iterator[_Record], InvalidRecordError | None]:
    """A record batch's rows as (topic, key, value, headers, partition), each column
    converted to Python objects at once; and the error to raise after them if a row holds a
    null header or a null topic (the rows are those before it)."""
    n = batch.num_rows
    columns = plan.columns
    topics = _cells(batch, "topic") if "topic" in columns else repeat(plan.topic, n)
    keys = _cells(batch, "key") if "key" in columns else repeat(None, n)
    refused = None
    headers: Iterable[list[tuple[str, bytes | None]] | None]
    if "headers" in columns:
        headers, bad = _header_cells(batch.column("headers"))
        if bad is not None:
            n = bad
            refused = InvalidRecordError(f"headers column {plan.headers_name} holds a null "
                                         "header: each header must be a struct with a key")
    else:
        headers = repeat(None, n)
    if "topic" in columns and batch.column("topic").null_count:
        null_topic = batch.column("topic").is_null().to_pylist().index(True)
        if null_topic < n:  # (the first bad row, if a header is null too)
            n = null_topic
            refused = InvalidRecordError(
                "the topic column holds a null: each row needs a topic (or set "
                '.option("topic", ...), which wins over the column), as for Spark\'s Kafka sink')
    partitions = (batch.column("partition").to_pylist() if "partition" in columns
                  else repeat(None, n))
    rows = zip(topics, keys, _cells(batch, "value"), headers, partitions)
    return (rows if refused is None else itertools.islice(rows, n)), refused


def _cells(batch: pa.RecordBatch, name: str) -> list[Any]:
    """A string or binary column's cells as bytes (strings as UTF-8, converted by Arrow);
    the topic column's as str."""
    column = batch.column(name)
    cells: list[Any] = (column if name == "topic" else _as_binary(column)).to_pylist()
    return cells


def _as_binary(column: pa.Array) -> pa.Array:
    import pyarrow as pa

    if pa.types.is_string(column.type):
        return column.cast(pa.binary())
    if pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary())
    return column


def _header_cells(column: pa.Array) -> tuple[list[list[tuple[str, bytes | None]] | None],
                                             int | None]:
    """A headers column (a list of structs per row) as a list of (name, value) pairs per row
    (None for a null cell), converted for the whole column at once rather than cell by cell;
    and the first row holding a null header (Spark's types allow one), or None."""
    structs = column.values  # every row's structs, one after the other (offsets say whose)
    names = structs.field("key").to_pylist()
    values = _as_binary(structs.field("value")).to_pylist()
    pairs = list(zip(names, values))
    offsets = column.offsets.to_pylist()
    cells: list[Any] = [pairs[start:end] for start, end in zip(offsets, offsets[1:])]
    if column.null_count:
        cells = [cell if valid else None
                 for cell, valid in zip(cells, column.is_valid().to_pylist())]
    bad = None
    if structs.null_count:
        null_at = structs.is_null().to_pylist()
        bad = next((row for row, (start, end) in enumerate(zip(offsets, offsets[1:]))
                    if cells[row] is not None and any(null_at[start:end])), None)
    return cells, bad


def failure(reports: Sequence[TaskReport], topic: str) -> SparkWriteError | None:
    """What the driver raises when a task did not deliver all its rows."""
    failed = [r for r in reports if r.failed]
    if not failed:
        return None
    rows = sum(r.rows for r in reports)
    not_confirmed = sum(r.not_confirmed for r in failed)
    first_error = next((r.error for r in failed if r.error), "unknown")
    return SparkWriteError(
        f"{not_confirmed} of {rows} row(s) not confirmed by Kafka for topic {topic}; "
        f"failed Spark partition(s): {', '.join(str(r.partition) for r in failed)}; "
        f"first error: {first_error}", rows, not_confirmed, [r.partition for r in failed])


# -- write_dataframe: the same plan and tasks, with totals returned ------------------------

def write_dataframe(
    df: DataFrame,
    topic: str,
    bootstrap_servers: str | Sequence[str],
    *,
    key: str | Column | None = None,
    value: str | Column | None = None,
    headers: str | Column | None = None,
    value_format: str = "raw",
    exactly_once: bool = False,
    transactional_id_prefix: str | None = None,
    **settings: Any,
) -> WriteTotals:
    """Write every row of `df` to `topic` and return the totals; raise SparkWriteError
    saying how many rows were not confirmed and which Spark partitions failed. The data
    source's checks and tasks, run as one Spark job whose tasks report back (no task is
    retried: a failure is the caller's to handle).

    `key`, `value`, `headers`: a column name or a Spark expression, typed as the data
    source's columns. With `value_format="json"`, `value` (a struct, map or array column)
    is sent as JSON, and with `value=None` each row as a JSON object of all its columns; by
    default `value` is the column named "value". Other keyword arguments are producer
    settings. `exactly_once=True`: each Spark partition in one transaction, its id
    `f"{transactional_id_prefix}-{partition_index}"` (stable across re-runs, unique among
    jobs running at once); a task that fails aborts its transaction. The first call in a
    Spark application checks the executors' imports, as register() does.
    """
    from pyspark.sql import functions as F

    if value_format not in ("raw", "json"):
        raise ConfigError(f"value_format must be 'raw' or 'json', not {value_format!r}")
    if exactly_once and not transactional_id_prefix:
        raise ConfigError("exactly_once=True needs transactional_id_prefix (stable across re-runs)")
    if "transactional_id" in settings:
        raise ConfigError("write_dataframe gives each Spark partition its own transactional_id: "
                          "pass exactly_once=True and transactional_id_prefix=... instead")
    config = ProducerConfig.from_kwargs(**settings, bootstrap_servers=bootstrap_servers)
    if exactly_once:
        _check_idempotent(config, settings.get("enable_idempotence") is False,
                          "exactly_once=True", lambda name, value: f"{name}={value!r}",
                          "or pass exactly_once=False")

    def column(spec: str | Column) -> Column:
        return F.col(spec) if isinstance(spec, str) else spec

    if value is None:
        value_column = (F.to_json(F.struct(*[F.col(c) for c in df.columns]))
                        if value_format == "json" else F.col("value"))
    else:
        value_column = F.to_json(column(value)) if value_format == "json" else column(value)
    chosen = [value_column.alias("value")]
    names = {"value": _name("value" if value is None else value)}
    for role, spec in (("key", key), ("headers", headers)):
        if spec is not None:
            chosen.append(column(spec).alias(role))
            names[role] = _name(spec)
    selected = df.select(*chosen)
    plan = WritePlan(config, topic, check_columns(selected.schema, topic, names), exactly_once,
                     transactional_id_prefix, names.get("headers", "'headers'"))
    check_executor_imports(selected.sparkSession)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        report = write_partition(batches, plan, context.partitionId())
        yield pa.RecordBatch.from_pylist([dataclasses.asdict(report)])

    reports = [TaskReport(**row.asDict()) for row in selected.mapInArrow(
        write, "partition long, rows long, records long, bytes long, error string, "
               "already_committed boolean").collect()]
    error = failure(reports, repr(topic))
    if error is not None:
        raise error
    return WriteTotals(sum(r.records for r in reports), sum(r.bytes for r in reports),
                       len(reports))


def _name(spec: str | Column) -> str:
    return repr(spec) if isinstance(spec, str) else str(spec)
