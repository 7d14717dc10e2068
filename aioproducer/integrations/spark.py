"""Write a PySpark DataFrame to Kafka: one producer per Spark partition, in the executors.

::

    from aioproducer.integrations.spark import write_dataframe

    totals = write_dataframe(df, "orders", "broker:9092", key="user_id", value="payload")
    print(totals.records, totals.bytes)

Each Spark task runs its partition through its own Producer on its own event loop (uvloop
when installed) and returns its counts; the driver adds them up and raises
`SparkWriteError` if any row was not confirmed, saying how many and which Spark partitions
failed. Column types and producer settings are checked on the driver, before the job runs.

Exactly once (`exactly_once=True`): each Spark partition writes inside one Kafka transaction
whose transactional id is `f"{transactional_id_prefix}-{partition_index}"`; a task that
fails aborts its transaction (none of its rows count as confirmed). A retried or
speculative attempt of the same task uses the same id, so starting it fences the earlier
attempt (whose open transaction is aborted by the coordinator) and only one attempt's
records become visible to `read_committed` consumers. The limits: Spark has no two-phase
commit for tasks, so a task that fails *after* its commit succeeded (say, its executor dies
while reporting) is re-run and commits its records again; and the prefix must be stable
across re-runs of the job but unique among jobs running at the same time. Consumers that do
not read with `isolation_level=read_committed` also see aborted attempts' records.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..config import ProducerConfig
from ..errors import ConfigError, InvalidRecordError, KafkaError
from ..producer import Producer

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType


class SparkWriteError(KafkaError):
    """Some Spark partitions did not deliver all their rows. `rows`: rows in the DataFrame;
    `not_confirmed`: how many of them Kafka did not confirm (with exactly_once, a failed
    partition's rows count in full: its transaction was aborted); `failed_partitions`: the
    indexes of the Spark partitions that failed."""

    def __init__(self, message: str, rows: int, not_confirmed: int,
                 failed_partitions: list[int]) -> None:
        super().__init__(message)
        self.rows = rows
        self.not_confirmed = not_confirmed
        self.failed_partitions = failed_partitions


@dataclass(frozen=True)
class WriteTotals:
    """What a write delivered: records and key/value bytes acknowledged, Spark partitions
    written. (A write that did not deliver everything raises SparkWriteError instead.)"""

    records: int
    bytes: int
    partitions: int


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
    """Write every row of `df` to `topic` and return the totals.

    `key`, `value`, `headers`: a column name or a Spark expression. As for Spark's own Kafka
    sink, keys and values must be string (sent as UTF-8) or binary columns, and `headers` an
    array<struct<key: string, value: binary>> column (string values are sent as UTF-8). With
    `value_format="json"`, `value` (a struct, map or array column) is sent as JSON, and with
    `value=None` each row as a JSON object of all its columns; by default `value` is the
    column named "value". Other keyword arguments are producer settings.

    The column types and the settings are checked here, before any Spark job runs: a wrong
    type raises InvalidRecordError, a wrong setting ConfigError.
    """
    from pyspark.sql import functions as F

    if value_format not in ("raw", "json"):
        raise ConfigError(f"value_format must be 'raw' or 'json', not {value_format!r}")
    if exactly_once and not transactional_id_prefix:
        raise ConfigError("exactly_once=True needs transactional_id_prefix (stable across re-runs)")
    if "transactional_id" in settings:
        raise ConfigError("write_dataframe gives each Spark partition its own transactional_id: "
                          "pass exactly_once=True and transactional_id_prefix=... instead")
    options = dict(settings, bootstrap_servers=bootstrap_servers)
    prefix = transactional_id_prefix if exactly_once else None
    # What every task will build, checked once here rather than failing in each task.
    ProducerConfig.from_kwargs(**_task_settings(options, prefix, 0))

    def column(spec: str | Column) -> Column:
        return F.col(spec) if isinstance(spec, str) else spec

    if value is None:
        value_column = (F.to_json(F.struct(*[F.col(c) for c in df.columns]))
                        if value_format == "json" else F.col("value"))
    else:
        value_column = F.to_json(column(value)) if value_format == "json" else column(value)
    selected = df.select(
        (column(key) if key is not None else F.lit(None)).alias("k"),
        value_column.alias("v"),
        (column(headers) if headers is not None else F.lit(None)).alias("h"),
    )
    schema = selected.schema
    if key is not None:
        _check_bytes_column("key", key, schema["k"].dataType)
    _check_bytes_column("value", "value" if value is None else value, schema["v"].dataType)
    if headers is not None and not _is_headers_type(schema["h"].dataType):
        raise InvalidRecordError(
            f"headers column {_name(headers)} is {schema['h'].dataType.simpleString()}: it must "
            "be array<struct<key:string,value:binary>> as for Spark's Kafka sink (value may also "
            "be string), e.g. F.array(F.struct(F.lit('trace').alias('key'), "
            "F.col('id').cast('binary').alias('value')))")

    def write_partition(index: int,
                        rows: Iterable[Any]) -> Iterable[tuple[int, int, int, int, str]]:
        yield _run(_write_partition(index, rows, topic, _task_settings(options, prefix, index),
                                    _name(headers) if headers is not None else ""))

    results = selected.rdd.mapPartitionsWithIndex(write_partition).collect()
    rows = sum(r[1] for r in results)
    records = sum(r[2] for r in results)
    size = sum(r[3] for r in results)
    failed = [r for r in results if r[2] < r[1] or r[4]]
    if failed:
        first_error = next((r[4] for r in failed if r[4]), "unknown")
        raise SparkWriteError(
            f"{rows - records} of {rows} row(s) not confirmed by Kafka for topic {topic!r}; "
            f"failed Spark partition(s): {', '.join(str(r[0]) for r in failed)}; "
            f"first error: {first_error}",
            rows, rows - records, [r[0] for r in failed])
    return WriteTotals(records, size, len(results))


def _name(spec: str | Column) -> str:
    return repr(spec) if isinstance(spec, str) else str(spec)


def _check_bytes_column(role: str, spec: str | Column, data_type: DataType) -> None:
    """Key and value columns must be string or binary: anything else has no one obvious
    encoding (Spark's Kafka sink refuses it too)."""
    from pyspark.sql.types import BinaryType, StringType

    if not isinstance(data_type, (StringType, BinaryType)):
        json_hint = (", or for a struct, map or array pass value_format='json'"
                     if role == "value" else "")
        raise InvalidRecordError(
            f"{role} column {_name(spec)} is {data_type.simpleString()}: it must be string or "
            f"binary; cast it (F.col(...).cast('string')){json_hint}")


def _is_headers_type(data_type: DataType) -> bool:
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (fields.keys() == {"key", "value"} and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], (StringType, BinaryType)))


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _as_bytes(obj: str | bytes | bytearray | None) -> bytes | None:
    """A string or binary cell (the driver checked the column types) as bytes."""
    if obj is None:
        return None
    return obj.encode() if isinstance(obj, str) else bytes(obj)


def _headers(cells: Iterable[Any], column: str) -> list[tuple[str, bytes | None]]:
    """A headers cell's structs as (name, value) pairs; a null one (Spark's types allow it)
    refused by name."""
    headers = []
    for header in cells:
        if header is None:
            raise InvalidRecordError(f"headers column {column} holds a null header: each "
                                     "header must be a struct with a key")
        headers.append((header["key"], _as_bytes(header["value"])))
    return headers


def _task_settings(options: dict[str, Any], transactional_id_prefix: str | None,
                   index: int) -> dict[str, Any]:
    """A task's producer settings: with exactly_once, its partition's own transactional id."""
    if transactional_id_prefix is None:
        return options
    return dict(options, transactional_id=f"{transactional_id_prefix}-{index}")


async def _write_partition(index: int, rows: Iterable[Any], topic: str, settings: dict[str, Any],
                           headers_column: str) -> tuple[int, int, int, int, str]:
    """Produce one Spark partition; return (index, rows, rows confirmed, bytes confirmed,
    first error). A failure aborts the partition's transaction: left open, it would hold
    back every read_committed consumer of its Kafka partitions."""
    exactly_once = "transactional_id" in settings
    rows = iter(rows)
    read = 0
    sent: list[tuple[Any, int]] = []  # (record future, key and value bytes)
    error = ""
    try:
        async with Producer(**settings) as producer:
            if exactly_once:
                producer.begin_transaction()
            try:
                for row in rows:
                    read += 1
                    key, value = _as_bytes(row["k"]), _as_bytes(row["v"])
                    headers = None if row["h"] is None else _headers(row["h"], headers_column)
                    handle = await producer.enqueue(topic, value, key, headers=headers)
                    sent.append((handle, len(value or b"") + len(key or b"")))
                if exactly_once:
                    await producer.commit_transaction()
                else:
                    await producer.flush()
            except BaseException:
                if exactly_once:
                    sent.clear()  # none of them will be visible to read_committed consumers
                    with contextlib.suppress(KafkaError):  # e.g. fenced: the first error says more
                        await producer.abort_transaction()
                raise
    except Exception as exc:  # reported to the driver, which raises SparkWriteError
        error = repr(exc)
        read += sum(1 for _ in rows)  # the rest of the partition was not written either
    confirmed = [size for handle, size in sent if handle.exception() is None]
    if not error:
        error = next((repr(h.exception()) for h, _ in sent if h.exception() is not None), "")
    return index, read, len(confirmed), sum(confirmed), error
