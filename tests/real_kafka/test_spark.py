"""The Spark data source on Apache Kafka: an exactly-once batch write (each Spark partition in
a Kafka transaction) and a streaming query's exactly-once writes across a killed driver,
read back read_committed by librdkafka."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from tests.support import spark_killed_driver
from tests.support.readback import consume_all

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="PySpark needs a Java runtime (17) on PATH")


@pytest.fixture(scope="module")
def registered(spark):
    """The worker's one Spark session (tests/conftest.py's: a second session in a process
    after stop() breaks py4j, so a module must not start and stop one of its own) with
    format("aioproducer") registered."""
    from aioproducer.integrations.spark import register

    register(spark)
    return spark


@pytest.mark.timeout(300)  # a Spark session starts in ~15 s, minutes on a loaded machine
def test_an_exactly_once_batch_write_is_read_back_read_committed(registered, apache_kafka,
                                                                  make_topic):
    from pyspark.sql import functions as F

    topic = make_topic(partitions=3)
    rows = 3000
    df = registered.range(rows, numPartitions=3).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.col("id").cast("string").cast("binary").alias("value"))
    (df.write.format("aioproducer").option("kafka.bootstrap.servers", apache_kafka.bootstrap)
     .option("topic", topic).option("exactlyOnce", "true")
     .option("transactionalIdPrefix", f"spark-{topic}").mode("append").save())
    got = consume_all(apache_kafka.bootstrap, topic, expected=rows, timeout=60,
                      isolation_level="read_committed")
    assert sorted(int(r.value) for r in got) == list(range(rows))
    assert all(r.key == b"k" + r.value for r in got)


@pytest.mark.timeout(400)  # two Spark drivers, each 20-40 s to start, minutes when loaded
def test_stream_is_exactly_once_across_a_killed_driver(apache_kafka, make_topic, tmp_path):
    """tests/test_spark.py's killed-driver run on Apache Kafka, with lines of 1 kB: the held
    task of micro-batch 2 (file f05) has sent the lines before the hold in a transaction
    still open when its driver is SIGKILLed; f04's task has committed. Restarted from its
    checkpoint, the query replays micro-batch 2: f04's partition is skipped (found committed
    through the offset its transaction committed), f05's task fences the killed attempt
    (InitProducerId with the same transactional id: Kafka aborts its open transaction,
    writing ABORT markers, unless transaction.timeout.ms ran out first and it did so
    already) and writes all of f05 again in a new transaction. librdkafka's
    read_committed consumer reads every line exactly once."""
    topic = make_topic(partitions=spark_killed_driver.PARTITIONS)
    run = spark_killed_driver.run(apache_kafka.bootstrap, topic, tmp_path, pad=1000,
                                  wait_for_held_lines=True)
    print(f"\nkilled at {run.phases[0]:.0f} s, done at {run.phases[1]:.0f} s")
    [kill] = run.kills
    assert (kill.planned, kill.done) == ([0, 1, 2], [0, 1])
    assert kill.files_written == ["f00", "f01", "f02", "f03", "f04"]
    assert kill.held_lines_sent > 0, "the held task had sent lines in an open transaction"
    assert run.report["errors"] == 0 and run.report["rows_already_committed"] == 400, \
        "the replayed micro-batch 2 found f04's partition committed, and skipped it"
    assert run.raw is not None and run.raw.open == [] and run.raw.plain == []
    aborted = {spark_killed_driver.line_id(v)[:3] for v in run.raw.aborted}
    assert aborted == {b"f05"} and len(run.raw.aborted) >= kill.held_lines_sent, \
        "what the killed attempt had sent was aborted"
    assert run.read_committed == Counter(dict.fromkeys(run.expected, 1)), \
        f"{run.duplicates} duplicated, {run.missing} missing: {run.duplicated_by_file()}"
