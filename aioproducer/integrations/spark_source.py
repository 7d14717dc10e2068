"""The `aioproducer` Spark data source: `register(spark)` (in spark.py), then
`df.write.format("aioproducer")` or `df.writeStream.format("aioproducer")`.

Spark builds the writers below in a Python worker on the driver (so a bad option or column
fails the write before any task runs) and pickles them to the executors' tasks. Needs
pyspark 4.1 or later (Arrow writers for streams) and pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..errors import ConfigError
from .spark import (
    FORMAT,
    SinkProgress,
    TaskReport,
    WritePlan,
    failure,
    plan_from_options,
    write_partition,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # (no type hints)
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class TaskCommit(WriterCommitMessage):
    """A task's report, for the driver's commit()."""

    report: TaskReport


class KafkaSink(DataSource):
    """Writes to Kafka with Spark's Kafka sink's columns and options (see spark.py).
    register() registers a subclass whose `progress` its tasks add to."""

    progress: SinkProgress | None = None

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        if overwrite:  # (it wrote as append does; Spark's Kafka sink refuses it too)
            raise ConfigError('.mode("overwrite") cannot replace a topic\'s records: Kafka '
                              'topics are appended to; use .mode("append")')
        return BatchWriter(plan_from_options(self.options, schema, streaming=False),
                           self.progress)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        return StreamWriter(plan_from_options(self.options, schema, streaming=True),
                            self.progress)


def _task_context_property(name: str) -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    return context.getLocalProperty(name)


def _write(batches: Iterator[pa.RecordBatch], plan: WritePlan, batch_id: int | None,
           progress: SinkProgress | None) -> TaskCommit:
    """One task. A delivery failure does not fail it: its report goes to the driver, whose
    commit() fails the write (Spark sends a task's accumulator updates only when it
    succeeds, so a failing task could not count its errors)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    report = write_partition(batches, plan, context.partitionId(), batch_id)
    if progress is not None:
        progress.add(report)
    return TaskCommit(report)


def _raise_failure(messages: list[WriterCommitMessage | None], plan: WritePlan) -> None:
    """On the driver, once every task reported: one SparkWriteError for the write (or the
    micro-batch), with the rows not confirmed and the failed partitions."""
    reports = [m.report for m in messages if isinstance(m, TaskCommit)]
    topic = repr(plan.topic) if plan.topic is not None else "(the topic column)"
    error = failure(reports, topic)
    if error is not None:
        raise error


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan, progress: SinkProgress | None) -> None:
        self.plan = plan
        self.progress = progress

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        return _write(iterator, self.plan, None, self.progress)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Raise if a task did not deliver all its rows (each task committed or aborted its
        own transaction, if any)."""
        _raise_failure(messages, self.plan)


class StreamWriter(DataSourceStreamArrowWriter):
    """Exactly once by default: each micro-batch's tasks write in transactions whose ids
    come from the query id (stable across restarts from the same checkpoint) unless
    transactionalIdPrefix is set; see spark.py's _write_partition."""

    def __init__(self, plan: WritePlan, progress: SinkProgress | None) -> None:
        self.plan = plan
        self.progress = progress

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        plan = self.plan
        batch_id = _task_context_property("streaming.sql.batchId")
        if plan.exactly_once and plan.transactional_id_prefix is None:
            query_id = _task_context_property("sql.streaming.queryId")
            if query_id is None:  # (Spark sets it on every streaming query's jobs)
                raise ConfigError('no streaming query id in the task: set .option('
                                  '"transactionalIdPrefix", ...), unique to this query')
            plan = WritePlan(plan.config, plan.topic, plan.columns, True,
                             f"{FORMAT}-{query_id}", plan.headers_name)
        return _write(iterator, plan, None if batch_id is None else int(batch_id),
                      self.progress)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Raise if a task did not deliver all its rows: the query stops before Spark records
        the micro-batch as done, so a restart replays it (each task committed or aborted its
        own transaction; the replay skips what was committed)."""
        _raise_failure(messages, self.plan)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: a failed task aborted its transaction; a replay skips what the
        others committed."""
