"""A Structured Streaming driver for the exactly-once test, run as its own process so that
the test can kill it: every text file under SOURCE becomes records of TOPIC, two files per
micro-batch, through the aioproducer data source, until the files are all written
(availableNow); then prints the sink's counters as JSON.

    python -m tests.support.spark_stream_job BOOTSTRAP TOPIC SOURCE CHECKPOINT
"""

import json
import os
import sys

from pyspark.sql import SparkSession

from aioproducer.integrations.spark import register


def main(bootstrap: str, topic: str, source: str, checkpoint: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("aioproducer-exactly-once")
             .config("spark.ui.enabled", "false").getOrCreate())
    progress = register(spark)
    lines = spark.readStream.option("maxFilesPerTrigger", 2).text(source)
    query = (lines.selectExpr("value AS key", "value")
             .writeStream.format("aioproducer")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("topic", topic)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    print(json.dumps({"records": progress.records.value,
                      "rows_already_committed": progress.rows_already_committed.value}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
