"""The `aioproducer` Spark data source: df.write / df.writeStream .format("aioproducer"),
read back with librdkafka's consumer and kafka-python's batch reader; the streaming
query's exactly-once writes across a killed driver."""

from __future__ import annotations

import pickle
import shutil
import time
from collections import Counter

import pytest

from tests.support import spark_killed_driver
from tests.support.readback import consume_all, fetch_raw_batches, transaction_outcomes

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="PySpark needs a Java runtime (17) on PATH")


@pytest.fixture(scope="module")
def progress(spark):
    """format("aioproducer") registered; the counters its tasks add to. (Only the tests that
    write through Spark ask for it: the others run without the session's worker.)"""
    from aioproducer.integrations.spark import register

    return register(spark)


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


def _write(df, bootstrap: str, **options: str):
    writer = df.write.format("aioproducer").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save()


def test_columns_as_for_sparks_kafka_sink(spark, progress, broker, topic_factory):
    """key, value, headers and partition columns, kafka.-prefixed settings: each row arrives
    as the row said, read back by librdkafka; the counters add up what was written."""
    from pyspark.sql import functions as F

    topic = topic_factory(3)
    rows = 3000
    records_before, bytes_before = progress.records.value, progress.bytes.value
    errors_before = progress.errors.value
    df = spark.range(rows, numPartitions=3).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.col("id").cast("string").cast("binary").alias("value"),
        F.array(F.struct(F.lit("n").alias("key"), F.col("id").cast("string").alias("value")))
         .alias("headers"),
        (F.col("id") % 3).cast("int").alias("partition"),
        F.lit("ignored, as by Spark's Kafka sink").alias("other"))
    _write(df, broker.bootstrap, topic=topic, **{"kafka.linger.ms": "20",
                                                 "kafka.compression.type": "lz4"})
    got = consume_all(broker.bootstrap, topic, expected=rows, timeout=60)
    assert sorted(int(r.value) for r in got) == list(range(rows))
    for r in got:
        n = int(r.value)
        assert (r.key, r.headers, r.partition) == (b"k%d" % n, [("n", r.value)], n % 3)
    assert progress.records.value - records_before == rows
    assert progress.bytes.value - bytes_before == sum(len(r.key) + len(r.value) for r in got)
    assert progress.errors.value == errors_before


@pytest.mark.usefixtures("progress")
def test_topic_column_routes_rows_and_the_topic_option_wins(spark, broker, topic_factory):
    from pyspark.sql import functions as F

    first, second, override = topic_factory(1), topic_factory(1), topic_factory(1)
    df = spark.range(10, numPartitions=2).select(
        F.when(F.col("id") < 4, F.lit(first)).otherwise(F.lit(second)).alias("topic"),
        F.col("id").cast("string").alias("value"))
    _write(df, broker.bootstrap)
    assert sorted(int(r.value) for r in consume_all(broker.bootstrap, first, 4)) == [0, 1, 2, 3]
    assert sorted(int(r.value) for r in consume_all(broker.bootstrap, second, 6)) == \
        list(range(4, 10))
    _write(df, broker.bootstrap, topic=override)
    assert len(consume_all(broker.bootstrap, override, 10)) == 10


# Settings that rule out the transactions of exactlyOnce: idempotence turned off.
_CLASH = (r"ConfigError: exactlyOnce writes each Spark partition in a Kafka transaction, which "
          r"needs an idempotent producer \(acks=all, retries > 0, at most 5 requests in "
          r"flight\); ")


@pytest.mark.usefixtures("progress")
@pytest.mark.parametrize("columns, options, message", [
    (["CAST(id AS STRING) AS v"], {}, r"InvalidRecordError: no 'value' column: the columns are v"),
    (["id AS value"], {}, r"InvalidRecordError: value column 'value' is bigint: it must be "
                          r"string or binary"),
    (["id AS key", "'x' AS value"], {}, r"InvalidRecordError: key column 'key' is bigint"),
    (["'x' AS value", "map('a', 'b') AS headers"], {},
     r"InvalidRecordError: headers column 'headers' is map<string,string>: it must be "
     r"array<struct<key:string,value:binary>>"),
    (["'x' AS value", "id AS partition"], {}, r"partition column is bigint: it must be int"),
    (["'x' AS value"], {"topic": None}, r"ConfigError: no topic: set .option\(\"topic\""),
    (["'x' AS value"], {"kafka.lingr.ms": "5"},
     r"ConfigError: unknown setting 'lingr.ms'; did you mean 'linger\.ms'"),
    (["'x' AS value"], {"kafka.bootstrap.servers": None},
     r"ConfigError: the aioproducer data source needs .option\(\"kafka.bootstrap.servers\""),
    (["'x' AS value"], {"exactlyOnce": "true"}, r"needs .option\(\"transactionalIdPrefix\""),
    (["'x' AS value"], {"kafka.value.serializer": ("org.apache.kafka.common.serialization."
                                                  "StringSerializer")},
     r"ConfigError: kafka\.value\.serializer names Java code, which the data source cannot "
     r"run: the key and value columns are sent as their bytes \(a string's as UTF-8\), as "
     r"Spark's Kafka sink sends them, which refuses this option too; drop it"),
    (["'x' AS value"], {"kafka.partitioner.class": ("org.apache.kafka.clients.producer."
                                                   "RoundRobinPartitioner")},
     r"ConfigError: kafka\.partitioner\.class names Java code, which the data source cannot "
     r"run: .* set a partition column, or give write_dataframe\(\) a partitioner="),
    (["'x' AS value"], {"kafka.transactional.id": "mine"},
     r"ConfigError: each Spark partition gets its own transactional id: set "
     r"\.option\(\"transactionalIdPrefix\", \.\.\.\) instead of kafka\.transactional\.id"),
    (["'x' AS value"], {"exactlyOnce": "true", "transactionalIdPrefix": "p", "kafka.acks": "1"},
     _CLASH + r"kafka\.acks=1 rules that out: drop it, or set \.option\(\"exactlyOnce\", "
              r"\"false\"\) to write at least once"),
    (["'x' AS value"], {"exactlyOnce": "true", "transactionalIdPrefix": "p",
                        "kafka.enable.idempotence": "false"},
     _CLASH + r"kafka\.enable\.idempotence=false rules that out"),
])
def test_bad_columns_and_options_fail_before_any_task(spark, broker, topic, columns, options,
                                                      message):
    """Raised while Spark plans the write, on the driver: no job runs, nothing is sent. (Spark
    wraps the data source's exception in its own AnalysisException, whose message holds ours.)"""
    from pyspark.errors import AnalysisException

    settings = {"kafka.bootstrap.servers": broker.bootstrap, "topic": topic, **options}
    writer = spark.range(3).selectExpr(*columns).write.format("aioproducer")
    for name, value in settings.items():
        if value is not None:
            writer = writer.option(name, value)
    jobs = _jobs_run(spark)
    with pytest.raises(AnalysisException, match=message):
        writer.mode("append").save()
    assert _jobs_run(spark) == jobs


@pytest.mark.usefixtures("progress")
def test_overwrite_is_refused_as_by_sparks_kafka_sink(spark, broker, topic):
    """Records are appended to a topic: .mode("overwrite") wrote them as append does,
    leaving the topic's earlier records, where Spark's Kafka sink refuses it."""
    from pyspark.errors import AnalysisException

    jobs = _jobs_run(spark)
    writer = (spark.range(3).selectExpr("CAST(id AS STRING) AS value").write.format("aioproducer")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic))
    with pytest.raises(AnalysisException, match=r"ConfigError: \.mode\(\"overwrite\"\) cannot "
                       r"replace a topic's records: Kafka topics are appended to; use "
                       r"\.mode\(\"append\"\)"):
        writer.mode("overwrite").save()
    assert _jobs_run(spark) == jobs


@pytest.mark.usefixtures("progress")
@pytest.mark.parametrize("columns, options, message", [
    (["id AS value"], {}, r"InvalidRecordError: value column 'value' is bigint"),
    (["CAST(id AS STRING) AS value"], {"topic": None}, r"ConfigError: no topic"),
    (["CAST(id AS STRING) AS value"], {"kafka.lingr.ms": "5"},
     r"ConfigError: unknown setting 'lingr.ms'"),
    (["CAST(id AS STRING) AS value"], {"exactlyOnce": "maybe"},
     r"ConfigError: exactlyOnce must be \"true\" or \"false\", not 'maybe'"),
    (["CAST(id AS STRING) AS value"], {"kafka.transactional.id": "mine"},
     r"instead of kafka\.transactional\.id"),
    # Streams are exactly once by default: these clash with their transactions.
    (["CAST(id AS STRING) AS value"], {"kafka.acks": "1"}, _CLASH + r"kafka\.acks=1 rules"),
    (["CAST(id AS STRING) AS value"], {"kafka.enable.idempotence": "false", "kafka.acks": "0"},
     _CLASH + r"kafka\.enable\.idempotence=false and kafka\.acks=0 rule that out: drop them"),
])
def test_bad_columns_and_options_fail_a_stream_before_any_task(spark, broker, topic, tmp_path,
                                                              columns, options, message):
    """writeStream: start() returns (Spark plans a stream's write in the query's own thread,
    when its first micro-batch is planned), then the query stops on the driver with the data
    source's error before that micro-batch runs a task; awaitTermination() raises it."""
    from pyspark.errors import StreamingQueryException

    settings = {"kafka.bootstrap.servers": broker.bootstrap, "topic": topic, **options}
    rows = (spark.readStream.format("rate").option("rowsPerSecond", 100).load()
            .selectExpr("value AS id").selectExpr(*columns))
    writer = rows.writeStream.format("aioproducer").option("checkpointLocation",
                                                            str(tmp_path / "checkpoint"))
    for name, value in settings.items():
        if value is not None:
            writer = writer.option(name, value)
    query = writer.start()
    try:
        with pytest.raises(StreamingQueryException, match=message):
            query.awaitTermination(60)
        # A stream's jobs run in a job group named by its run id.
        assert spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId)) == []
        assert query.recentProgress == []  # no micro-batch finished
    finally:
        query.stop()

def test_a_blocking_producer_made_on_the_driver_is_refused_saying_where_to_make_one(
        spark, broker, topic):
    """foreachPartition over a BlockingProducer the driver made: Spark pickles the function,
    the producer with it, to ship it to the executors. The error was pickle's own ("cannot
    pickle '_asyncio.Future' object"), which names neither the producer nor the remedy."""
    from aioproducer import BlockingProducer

    with BlockingProducer(broker.bootstrap) as producer:
        def send_rows(rows):
            for row in rows:
                producer.produce(topic, b"%d" % row.id)

        with pytest.raises(pickle.PicklingError, match=r"a BlockingProducer cannot be "
                           r"pickled: create it in the process that uses it \(for Spark: in "
                           r"the function foreachPartition runs, or write the DataFrame with "
                           r"format\(\"aioproducer\"\)"):
            spark.range(3).foreachPartition(send_rows)
        producer.send(topic, b"from the driver", timeout=30)  # the driver's goes on
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == \
        [b"from the driver"]


def test_a_failed_delivery_fails_the_write_saying_why(spark, progress, broker, topic):
    """Rows Kafka did not confirm fail the write once every task has reported, with one
    SparkWriteError for all of them, and count in the errors accumulator (a task that
    failed could not add to it: Spark drops a failed task's accumulator updates)."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    before = progress.records.value, progress.errors.value
    df = spark.range(20, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(PySparkException, match=r"SparkWriteError: 20 of 20 row\(s\) not "
                       r"confirmed by Kafka for topic 'bad topic!'; failed Spark partition\(s\): "
                       r"0, 1; first error: InvalidTopicError"):
        _write(df, broker.bootstrap, topic="bad topic!")
    assert (progress.records.value - before[0], progress.errors.value - before[1]) == (0, 20)

    # Partition 0 (ids 0-4) goes to a topic, partition 1 (ids 5-9) to one that cannot be.
    before = progress.records.value, progress.errors.value
    df = spark.range(10, numPartitions=2).select(
        F.when(F.col("id") < 5, F.lit(topic)).otherwise(F.lit("bad topic!")).alias("topic"),
        F.col("id").cast("string").alias("value"))
    with pytest.raises(PySparkException, match=r"SparkWriteError: 5 of 10 row\(s\) not "
                       r"confirmed by Kafka for topic \(the topic column\); failed Spark "
                       r"partition\(s\): 1; first error: InvalidTopicError"):
        _write(df, broker.bootstrap)
    assert (progress.records.value - before[0], progress.errors.value - before[1]) == (5, 5)
    assert sorted(int(r.value) for r in consume_all(broker.bootstrap, topic, 5)) == [0, 1, 2, 3, 4]


def test_a_failed_micro_batch_stops_the_query_before_it_is_recorded(spark, progress, broker,
                                                                    tmp_path):
    """A stream whose rows Kafka refuses: the query stops with the SparkWriteError, its
    micro-batch is not recorded as done in the checkpoint (a restart replays it), and the
    errors accumulator counts its rows."""
    from pyspark.errors import StreamingQueryException

    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    (source / "lines.txt").write_text("".join(f"{i}\n" for i in range(50)))
    before = progress.records.value, progress.errors.value
    query = (spark.readStream.text(str(source)).writeStream.format("aioproducer")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "bad topic!")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        with pytest.raises(StreamingQueryException, match=r"SparkWriteError: 50 of 50 row\(s\) "
                           r"not confirmed by Kafka for topic 'bad topic!'"):
            query.awaitTermination(90)
    finally:
        query.stop()
    assert (spark_killed_driver.batch_ids(checkpoint, "offsets"),
            spark_killed_driver.batch_ids(checkpoint, "commits")) == ([0], [])
    assert (progress.records.value - before[0], progress.errors.value - before[1]) == (0, 50)


def test_batch_write_in_transactions(spark, progress, broker, topic_factory):
    """exactlyOnce with a transactionalIdPrefix: each Spark partition's records are followed
    by its COMMIT marker. (Key and value only: the bulk path, whose counts are per call.)"""
    topic = topic_factory(1)
    records_before, bytes_before = progress.records.value, progress.bytes.value
    df = spark.range(500, numPartitions=2).selectExpr("CAST(id AS STRING) AS key",
                                                      "CAST(id AS STRING) AS value")
    _write(df, broker.bootstrap, topic=topic, exactlyOnce="true",
           transactionalIdPrefix=f"{topic}-batch")
    committed, aborted, open_ = _transaction_outcomes(broker.bootstrap, topic, 1)
    assert sorted(int(v) for v in committed) == list(range(500))
    assert (aborted, open_) == ([], [])
    assert progress.records.value - records_before == 500
    assert progress.bytes.value - bytes_before == 2 * sum(len(str(i)) for i in range(500))


@pytest.mark.usefixtures("progress")
@pytest.mark.parametrize("large", [False, True], ids=["string", "large string"])
def test_keys_and_values_arrive_as_the_rows_held_them(spark, broker, topic_factory, large):
    """The key and value path (Spark's Arrow columns read by the producer where they lie):
    null keys, keys placed by murmur2 as the Java client places them, null values (tombstones), empty ones, UTF-8 strings, binary values; with
    Spark's Arrow strings and, with spark.sql.execution.arrow.useLargeVarTypes, its large
    strings (8-byte offsets)."""
    from pyspark.sql import functions as F

    from aioproducer._speedups import partition_for_key

    topic, rows = topic_factory(3), 2000
    df = spark.range(rows, numPartitions=2).select(
        F.when(F.col("id") % 4 == 0, F.lit(None))
         .otherwise(F.concat(F.lit("ключ-"), F.col("id").cast("string"))).alias("key"),
        F.when(F.col("id") % 5 == 0, F.lit(None)).when(F.col("id") % 5 == 1, F.lit(""))
         .otherwise(F.concat(F.lit("v"), F.col("id").cast("string"))).cast("binary")
         .alias("value"))
    setting = "spark.sql.execution.arrow.useLargeVarTypes"
    before = spark.conf.get(setting, None)
    spark.conf.set(setting, str(large).lower())
    try:
        _write(df, broker.bootstrap, topic=topic)
    finally:
        if before is None:
            spark.conf.unset(setting)
        else:
            spark.conf.set(setting, before)
    got = consume_all(broker.bootstrap, topic, expected=rows, timeout=60)
    assert len(got) == rows
    by_id = {}
    for r in got:
        if r.key is not None:
            n = int(r.key.decode().removeprefix("ключ-"))
            assert r.partition == partition_for_key(r.key, 3)
        else:
            n = None
        by_id.setdefault(n, []).append(r)
    assert sorted(n for n in by_id if n is not None) == [i for i in range(rows) if i % 4]
    for n, [r] in ((n, rs) for n, rs in by_id.items() if n is not None):
        assert r.value == (None if n % 5 == 0 else b"" if n % 5 == 1 else b"v%d" % n)
    keyless = by_id[None]
    assert len(keyless) == rows // 4
    assert sum(r.value is None for r in keyless) == rows // 20  # ids 0, 20, 40, ...


def test_key_and_value_columns_are_read_in_arrow_layout():
    """Spark's Arrow key and value columns as the producer reads them: string (as UTF-8) and
    binary, their large types, a slice of a batch, nulls; other Arrow types (a view) cast."""
    import pyarrow as pa

    from aioproducer.config import ProducerConfig
    from aioproducer.integrations.spark import WritePlan, _key_value_columns

    keys = ["é", None, "", "k3", None, "k5"]
    values = [b"v0", b"", None, b"v3", b"v4", None]
    expected = [(None if k is None else k.encode(), v) for k, v in zip(keys, values)]
    plan = WritePlan(ProducerConfig.from_properties({"bootstrap.servers": "127.0.0.1:9"}), "t",
                     frozenset({"key"}))
    types = [(pa.string(), pa.binary()), (pa.large_string(), pa.large_binary()),
             (pa.binary(), pa.string())]
    for key_type, value_type in types:
        value_cells = [None if v is None else v.decode() for v in values] \
            if pa.types.is_string(value_type) else values
        batch = pa.record_batch([pa.array(keys, key_type), pa.array(value_cells, value_type)],
                                names=["key", "value"])
        assert list(_key_value_columns(batch, plan)) == expected
        assert list(_key_value_columns(batch.slice(2, 3), plan)) == expected[2:5]
    view = pa.record_batch([pa.array(keys).cast(pa.string_view()),
                            pa.array(values).cast(pa.binary_view())], names=["key", "value"])
    assert list(_key_value_columns(view, plan)) == expected
    no_nulls = pa.record_batch([pa.array(["a", "b"]), pa.array([b"x", b"y"])],
                               names=["key", "value"])
    assert list(_key_value_columns(no_nulls, WritePlan(plan.config, "t", frozenset()))) == \
        [(None, b"x"), (None, b"y")]


@pytest.mark.parametrize("columns, exactly_once", [((), False), (("partition",), True)],
                         ids=["key and value", "per row, in a transaction"])
def test_records_are_sent_while_spark_computes_the_next_batch(broker, topic, columns,
                                                             exactly_once):
    """A task reads Spark's next Arrow batch in a worker thread: while Spark computes it
    (here, the iterator waits until the broker holds the first batch's records), the task's
    event loop sends what is buffered. Read on the loop's thread, as before, the wait would
    hold up the sending it waits for (nothing would arrive in its 10 s)."""
    import pyarrow as pa

    from aioproducer.config import ProducerConfig
    from aioproducer.integrations.spark import WritePlan, write_partition

    stored: list[bytes] = []

    def spark_batches():
        values = [b"a", b"b", b"c"]
        yield pa.RecordBatch.from_pydict({"value": values, "partition": [0] * 3})
        deadline = time.monotonic() + 10
        while len(stored) < len(values) and time.monotonic() < deadline:
            time.sleep(0.05)
            stored[:] = [r[2] for b in fetch_raw_batches(broker.bootstrap, topic, 0)
                         if not b.is_control for r in b.records]
        yield pa.RecordBatch.from_pydict({"value": [b"d"], "partition": [0]})

    config = ProducerConfig.from_properties({"bootstrap.servers": broker.bootstrap})
    plan = WritePlan(config, topic, frozenset(columns), exactly_once,
                     f"{topic}-task" if exactly_once else None)
    report = write_partition(spark_batches(), plan, 0)
    assert (report.rows, report.records, report.error) == (4, 4, "")
    assert stored == [b"a", b"b", b"c"], "sent while the next batch was being read"
    if exactly_once:  # sent in the transaction, committed after the last batch
        assert _transaction_outcomes(broker.bootstrap, topic, 1) == \
            ([b"a", b"b", b"c", b"d"], [], [])


def test_rows_appended_one_by_one_count_by_their_own_batch():
    """The per-row path keeps no future per row: a row counts as confirmed if its batch (or
    the piece of a split batch that holds it) was, with its own key and value bytes; the
    first failure in row order is the one reported."""
    import asyncio

    from aioproducer.integrations.spark import _Appended

    loop = asyncio.new_event_loop()
    try:
        class Batch:
            def __init__(self, failure=None, failed_from=None):
                self.future = loop.create_future()
                self.failure, self.failed_from = failure, failed_from
                if failure is None:
                    self.future.set_result((0, -1))
                else:
                    self.future.set_exception(failure)

            def exception_for(self, delta):
                if self.failed_from is None or delta >= self.failed_from:
                    return self.future.exception()
                return None

        ok, refused = Batch(), Batch(RuntimeError("refused"))
        split = Batch(RuntimeError("a piece"), failed_from=2)  # deltas 0 and 1 acknowledged
        rows = _Appended([1, 2, 3, 4, 5, 6, 7])  # the last row was not appended
        for batch, delta in [(ok, 0), (refused, 0), (ok, 1), (split, 0), (split, 1), (split, 2)]:
            rows.batches.append(batch)
            rows.deltas.append(delta)
        records, size, first = rows.outcome()
        assert (records, size, first) == (4, 1 + 3 + 4 + 5, refused.failure)
        rows.batches[1] = ok
        rows.batches[5] = ok
        assert rows.outcome() == (6, 21, None)
    finally:
        loop.close()


def test_header_cells_are_converted_per_column():
    """A headers column's cells as (name, value) lists, read by Arrow for the whole column:
    null cells as None, string values as UTF-8, a slice's own rows; the first row holding a
    null header is told apart (the rows before it are sent, then it fails)."""
    import pyarrow as pa

    from aioproducer.integrations.spark import _header_cells

    binary = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    column = pa.array([[{"key": "a", "value": b"x"}], None, [],
                       [{"key": "b", "value": None}, {"key": "c", "value": b""}]], binary)
    assert _header_cells(column) == ([[("a", b"x")], None, [], [("b", None), ("c", b"")]],
                                     None)
    assert _header_cells(column.slice(1, 3)) == ([None, [], [("b", None), ("c", b"")]], None)
    text = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
    assert _header_cells(pa.array([[{"key": "t", "value": "é"}]], text)) == \
        ([[("t", "é".encode())]], None)
    with_null = pa.array([[{"key": "a", "value": b"x"}], None, [{"key": "b", "value": b"y"}, None],
                          [None]], binary)
    cells, bad = _header_cells(with_null)
    assert (cells[:2], bad) == ([[("a", b"x")], None], 2)


def test_a_null_topic_is_refused_saying_so_after_the_rows_before_it():
    """A row whose topic column is null: refused as "topic must be a str, not NoneType"
    (the producer's words for a wrong argument); now the column and the fix are named, as
    Spark's Kafka sink names them, and the rows before it are still sent."""
    import pyarrow as pa

    from aioproducer import ProducerConfig
    from aioproducer.errors import InvalidRecordError
    from aioproducer.integrations.spark import WritePlan, _records

    batch = pa.RecordBatch.from_pydict({"value": ["a", "b", "c"], "topic": ["t1", None, "t2"]})
    plan = WritePlan(ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092"), None,
                     frozenset({"topic"}))
    rows, refused = _records(batch, plan)
    assert [(topic, value) for topic, _, value, _, _ in rows] == [("t1", b"a")]
    assert isinstance(refused, InvalidRecordError)
    assert "topic column holds a null" in str(refused) and '.option("topic"' in str(refused)


def _transaction_outcomes(bootstrap: str, topic: str, partitions: int
                          ) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Values of the topic's transactional records, by what became of their transaction:
    committed, aborted, still open."""
    outcomes = transaction_outcomes(bootstrap, topic, partitions)
    assert outcomes.plain == [], "every record is written in a transaction"
    return outcomes.committed, outcomes.aborted, outcomes.open


# -- streaming: exactly once across a killed driver -------------------------------------------

@pytest.mark.timeout(360)  # two Spark drivers, each 20-40 s to start, minutes when loaded
def test_stream_is_exactly_once_across_a_killed_driver(broker, topic_factory, tmp_path):
    """A streaming query, two files of 400 lines per micro-batch, is killed (SIGKILL to the
    driver's process group: Python and its JVM) in the middle of micro-batch 2:
    one of its Spark partitions has committed its transaction, the other's task is held
    mid-partition (tests/support/spark_killed_driver.py holds its rows at line 200 of f05, in
    a step upstream of the sink). The kill waits for that state, so what the restart finds
    does not depend on when the kill lands. Restarted from its checkpoint, the query replays
    micro-batch 2: the committed partition is skipped (its 400 rows counted in
    rows_already_committed); the other's task, with the same transactional id, fences the
    killed attempt, if it got as far as starting its producer, and writes all of f05. (With
    lines of a few bytes it did not: the rows before the held one wait in the buffers
    between the hold's Python worker and the sink's, so the sink's task is still waiting for
    its first Arrow batch when the driver is killed; tests/real_kafka/test_spark.py runs the
    same with lines of 1 kB, which reach the sink's task before the kill.) Every line arrives
    exactly once in a committed transaction; read_committed consumers see each line once."""
    topic = topic_factory(spark_killed_driver.PARTITIONS)
    run = spark_killed_driver.run(broker.bootstrap, topic, tmp_path,
                                  aborted_visible=broker.is_embedded)
    # Killed mid-stream: micro-batch 2 planned, not done; only f00 to f04 committed.
    [kill] = run.kills
    assert (kill.planned, kill.done) == ([0, 1, 2], [0, 1])
    assert kill.files_written == ["f00", "f01", "f02", "f03", "f04"]
    assert run.report["errors"] == 0 and run.report["rows_already_committed"] == 400, \
        "the replayed micro-batch 2 found f04's partition committed, and skipped it"
    assert spark_killed_driver.batch_ids(tmp_path / "checkpoint", "commits") == [0, 1, 2, 3]
    assert run.raw is not None and run.raw.open == [], \
        "the restart fenced and aborted the killed driver's transactions"
    # What the held task had sent (if its producer sent any before the kill) was aborted.
    assert {v[:3] for v in run.raw.aborted} <= {b"f05"}
    counts = Counter(spark_killed_driver.line_id(v) for v in run.raw.committed)
    assert set(counts) == run.expected and set(counts.values()) == {1}, \
        f"{len(counts)} distinct of {len(run.expected)}; duplicated: {run.duplicates}"
    # Tansu's read_committed consumers also see aborted records; Kafka's do not.
    wanted = counts + Counter(run.raw.aborted) if broker.is_embedded else counts
    assert run.read_committed == wanted, _where_reading_stopped(broker.bootstrap, topic,
                                                                run.read_committed)


def _where_reading_stopped(bootstrap: str, topic: str, read: Counter[bytes]) -> str:
    """For a failed read-back: what was read, and per partition the raw batches (producer
    id, epoch, control type or record count), to tell a stuck last stable offset from a
    lost read."""
    lines = [f"read {sum(read.values())} records, {len(read)} distinct"]
    for partition in range(spark_killed_driver.PARTITIONS):
        batches = [(b.base_offset, b.producer_id, b.producer_epoch,
                    b.control_type or len(b.records))
                   for b in fetch_raw_batches(bootstrap, topic, partition)]
        lines.append(f"partition {partition}: {batches[:40]}")
    return "\n".join(lines)


def _wait_written(path, seconds: float) -> None:
    """Wait (bounded: `seconds`) until the script has written `path`."""
    for _ in range(int(seconds * 10)):
        if path.exists() and path.read_text():
            return
        time.sleep(0.1)


def _watching_worker(ready, verdict) -> str:
    """A script playing the Python worker: its watch's answer at the start written to
    `ready`, then (within 5 s) its answer once it says gone, written to `verdict`."""
    return ("import pathlib, time\n"
            "from aioproducer.integrations.spark import _spark_watch\n"
            "alive = _spark_watch()\n"
            f"pathlib.Path({str(ready)!r}).write_text(str(alive()))\n"
            "for _ in range(100):\n"
            "    time.sleep(0.05)\n"
            "    if not alive(): break\n"
            f"pathlib.Path({str(verdict)!r}).write_text(str(alive()))\n")


def test_a_task_sees_the_jvm_that_fed_it_die(tmp_path):
    """A task's transaction is committed only while the JVM that feeds its Python worker is
    there: killed between two Arrow batches, the JVM leaves an input that ends cleanly, and
    a commit then made the rows before the kill look like the whole partition. Here a
    process plays the JVM, its child PySpark's daemon, and the daemon's child the worker;
    the worker's watch says whether its JVM is alive before and after the JVM is killed."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    ready, verdict = tmp_path / "ready", tmp_path / "verdict"
    worker = _watching_worker(ready, verdict)
    spawn = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])"
    # (the "daemon" waits for its worker; the "JVM" for its daemon)
    jvm = subprocess.Popen([sys.executable, "-c", spawn,
                            f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
                            f"{worker!r}])"], start_new_session=True)
    try:
        _wait_written(ready, 20)
        assert ready.read_text() == "True", "alive while its JVM runs"
        os.kill(jvm.pid, signal.SIGKILL)
        _wait_written(verdict, 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(jvm.pid, signal.SIGKILL)  # the "daemon" and the worker too
        jvm.wait(10)
    assert verdict.read_text() == "False", "the worker did not see its JVM die"


def test_a_task_sees_the_jvm_that_fed_it_exiting(tmp_path):
    """The JVM's children get a new parent only at the very end of its exit, after its
    threads closed the sockets they share (the worker's input ends there): a commit in
    between found the parent chain as before (CI once more: the killed-driver test on
    Kafka, rows_already_committed 800, not 400). Here the process playing the JVM ends its
    main thread (the kernel's exit begun, flagged in /proc) while another of its threads
    keeps it, and its child, there: the worker's watch says it is gone."""
    import contextlib
    import os
    import platform
    import signal
    import subprocess
    import sys

    sys_exit = {"x86_64": 60, "aarch64": 93}.get(platform.machine())
    if sys_exit is None or not os.path.exists("/proc/self/stat"):
        # (the watch reads /proc, Linux's; the "JVM" ends its main thread by number)
        pytest.skip("needs Linux's /proc and an exit system call number known for this CPU")
    ready, verdict = tmp_path / "ready", tmp_path / "verdict"
    worker = _watching_worker(ready, verdict)
    daemon = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}])"
    # The "JVM": its daemon run from another thread; its main thread ends once the worker
    # is under way (the system call, not Python's exit, which would end every thread).
    jvm_script = (
        "import ctypes, pathlib, subprocess, sys, threading, time\n"
        f"threading.Thread(target=subprocess.run, args=([sys.executable, '-c', {daemon!r}],))"
        ".start()\n"
        "for _ in range(200):\n"
        f"    if pathlib.Path({str(ready)!r}).exists(): break\n"
        "    time.sleep(0.1)\n"
        f"ctypes.CDLL(None).syscall({sys_exit}, 0)\n")
    jvm = subprocess.Popen([sys.executable, "-c", jvm_script], start_new_session=True)
    try:
        _wait_written(verdict, 20)
        assert ready.read_text() == "True", "alive while its JVM runs"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(jvm.pid, signal.SIGKILL)  # the "daemon" and the worker too
        jvm.wait(10)
    assert verdict.read_text() == "False", "the worker did not see its JVM exiting"
