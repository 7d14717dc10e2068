"""Structured Streaming to Kafka with foreachBatch: each micro-batch is written by one
producer per Spark partition; with exactly_once, in one transaction per partition whose id
includes the batch id, so a replayed micro-batch fences its earlier attempt.

    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 python examples/spark_streaming.py
(needs the spark extra and Java 17; without AIOPRODUCER_BOOTSTRAP it starts an embedded broker)
"""

import contextlib
import os
import sys

from pyspark.sql import SparkSession

from aioproducer.integrations.spark import write_dataframe
from aioproducer.testing import EmbeddedBroker


def run(bootstrap: str, seconds: int = 10) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("aioproducer-streaming")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        stream = spark.readStream.format("rate").option("rowsPerSecond", 1000).load()

        def write_batch(df, batch_id: int) -> None:
            totals = write_dataframe(
                df.selectExpr("CAST(value AS STRING) AS key", "CAST(timestamp AS STRING) AS value"),
                "ticks", bootstrap, key="key", value="value",
                exactly_once=True, transactional_id_prefix=f"ticks-{batch_id}")
            print(f"micro-batch {batch_id}: {totals.records} records")

        query = stream.writeStream.foreachBatch(write_batch).start()
        query.awaitTermination(seconds)
        query.stop()
    finally:
        spark.stop()


if __name__ == "__main__":
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("AIOPRODUCER_BOOTSTRAP")
        if not bootstrap:
            broker = stack.enter_context(EmbeddedBroker())
            broker.create_topic("ticks", 2)
            bootstrap = broker.bootstrap
        run(bootstrap, seconds=int(os.environ.get("EXAMPLE_SECONDS", "10")))
