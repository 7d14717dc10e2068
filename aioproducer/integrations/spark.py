"""Write a PySpark DataFrame to Kafka: one producer per Spark partition, in the executors.

::

    from aioproducer.integrations.spark import write_dataframe

    totals = write_dataframe(df, "orders", "broker:9092", key="user_id", value="payload")
    print(totals.records, totals.bytes)

Each Spark task runs its partition through its own Producer on its own event loop (uvloop
when installed) and returns its counts; the driver adds them up and raises
`SparkWriteError` if any task failed to deliver a record.

Exactly once (`exactly_once=True`): each Spark partition writes inside one Kafka transaction
whose transactional id is `f"{transactional_id_prefix}-{partition_index}"`. A retried or
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
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..errors import KafkaError
from ..producer import Producer

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


class SparkWriteError(KafkaError):
    """Some Spark partitions did not deliver all their records."""


@dataclass(frozen=True)
class WriteTotals:
    """What a write delivered: records and value/key bytes acknowledged, records failed."""

    records: int
    bytes: int
    failures: int
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

    `key`, `value`, `headers`: a column name or a Spark expression. Keys and values may be
    string (sent as UTF-8) or binary columns; `headers` an array of (str, binary) structs,
    as Spark's own Kafka sink takes. With `value_format="json"` and `value=None`, each row
    is sent as a JSON object of all its columns; by default `value` defaults to the column
    named "value". Other keyword arguments are producer settings.
    """
    from pyspark.sql import functions as F

    if value_format not in ("raw", "json"):
        raise ValueError(f"value_format must be 'raw' or 'json', not {value_format!r}")
    if exactly_once and not transactional_id_prefix:
        raise ValueError("exactly_once=True needs transactional_id_prefix (stable across re-runs)")

    def column(spec: str | Column | None) -> Column | None:
        return F.col(spec) if isinstance(spec, str) else spec

    if value is None:
        value_column = (F.to_json(F.struct(*[F.col(c) for c in df.columns]))
                        if value_format == "json" else F.col("value"))
    else:
        value_column = F.col(value) if isinstance(value, str) else value
        if value_format == "json":
            value_column = F.to_json(value_column)
    key_column = column(key)
    header_column = column(headers)
    selected = df.select(
        (key_column if key_column is not None else F.lit(None)).alias("k"),
        value_column.alias("v"),
        (header_column if header_column is not None else F.lit(None)).alias("h"),
    )
    options = dict(settings, bootstrap_servers=bootstrap_servers)
    if exactly_once:
        options["transactional_id"] = transactional_id_prefix

    def write_partition(index: int, rows: Iterable[Any]) -> Iterable[tuple[int, int, int, str]]:
        yield _run(_write_partition(index, rows, topic, options, exactly_once))

    results = selected.rdd.mapPartitionsWithIndex(write_partition).collect()
    records = sum(r[0] for r in results)
    size = sum(r[1] for r in results)
    failures = sum(r[2] for r in results)
    errors = [r[3] for r in results if r[3]]
    if errors or failures:
        raise SparkWriteError(
            f"{failures} record(s) not delivered to {topic!r} from {len(errors) or failures} "
            f"Spark partition(s); first error: {errors[0] if errors else 'unknown'}")
    return WriteTotals(records, size, failures, len(results))


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _as_bytes(obj: Any) -> bytes | None:
    if obj is None:
        return None
    if isinstance(obj, str):
        return obj.encode()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    return json.dumps(obj).encode()


async def _write_partition(index: int, rows: Iterable[Any], topic: str,
                           options: dict[str, Any], exactly_once: bool) -> tuple[int, int, int, str]:
    """Produce one Spark partition; return (records, bytes, failures, first error)."""
    if exactly_once:
        options = dict(options, transactional_id=f"{options['transactional_id']}-{index}")
    records = size = failures = 0
    error = ""
    try:
        async with Producer(**options) as producer:
            if exactly_once:
                producer.begin_transaction()
            handles = []
            for row in rows:
                key, value = _as_bytes(row["k"]), _as_bytes(row["v"])
                headers = [(h[0], _as_bytes(h[1])) for h in row["h"]] if row["h"] else None
                handles.append(await producer.enqueue(topic, value, key, headers=headers))
                size += len(value or b"") + len(key or b"")
            if exactly_once:
                await producer.commit_transaction()
            else:
                await producer.flush()
            for handle in handles:
                if handle.exception() is not None:
                    failures += 1
                    error = error or repr(handle.exception())
            records = len(handles) - failures
    except Exception as exc:  # reported to the driver, which raises SparkWriteError
        error = repr(exc)
        failures = max(failures, 1)
    return records, size, failures, error
