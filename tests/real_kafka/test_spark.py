"""The Spark data source's batch path on Apache Kafka: an exactly-once write (each Spark
partition in a Kafka transaction) read back read_committed by librdkafka."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.support.readback import consume_all

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="PySpark needs a Java runtime (17) on PATH")


@pytest.fixture(scope="module")
def spark():
    pyspark = pytest.importorskip("pyspark", reason="install the spark extra: aioproducer[spark]")
    from aioproducer.integrations.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers import this checkout
    session = (pyspark.sql.SparkSession.builder.master("local[2]")
               .appName("aioproducer-real-kafka").config("spark.ui.enabled", "false")
               .getOrCreate())
    register(session)
    yield session
    session.stop()


@pytest.mark.timeout(300)  # a Spark session starts in ~15 s, minutes on a loaded machine
def test_an_exactly_once_batch_write_is_read_back_read_committed(spark, apache_kafka,
                                                                  make_topic):
    from pyspark.sql import functions as F

    topic = make_topic(partitions=3)
    rows = 3000
    df = spark.range(rows, numPartitions=3).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.col("id").cast("string").cast("binary").alias("value"))
    (df.write.format("aioproducer").option("kafka.bootstrap.servers", apache_kafka.bootstrap)
     .option("topic", topic).option("exactlyOnce", "true")
     .option("transactionalIdPrefix", f"spark-{topic}").mode("append").save())
    got = consume_all(apache_kafka.bootstrap, topic, expected=rows, timeout=60,
                      isolation_level="read_committed")
    assert sorted(int(r.value) for r in got) == list(range(rows))
    assert all(r.key == b"k" + r.value for r in got)
