"""A Structured Streaming driver for the exactly-once test, run as its own process so that
the test can kill it: every text file under SOURCE becomes records of TOPIC (the line as key
and value), two files per micro-batch (oldest first), through the aioproducer data source,
until the files are all written (availableNow); then prints the sink's counters as JSON.

    python -m tests.support.spark_stream_job BOOTSTRAP TOPIC SOURCE CHECKPOINT [HOLD_AT SIGNAL]

With HOLD_AT (a line of the input), the task whose partition holds that line stops before
it: at the Arrow batch (100 rows) that holds it, it creates the file SIGNAL and waits (150 s
at most) for the test to kill the driver. The rows before that batch do not reach the sink's
task meanwhile (they wait in the buffers between this step's Python worker and the sink's):
it is still waiting for its first Arrow batch.
"""

import json
import os
import sys
from typing import Callable, Iterator

from pyspark.sql import SparkSession

from aioproducer.integrations.spark import register


def hold_at(line: str | None, signal: str | None) -> Callable[[Iterator], Iterator]:
    def step(batches: Iterator) -> Iterator:
        import pathlib
        import time

        import pyarrow.compute as pc

        for batch in batches:
            if line is not None and pc.any(pc.equal(batch.column("value"), line)).as_py():
                pathlib.Path(signal).touch()
                time.sleep(150)  # killed long before (the test gives up after 90 s)
            yield batch
    return step


def main(bootstrap: str, topic: str, source: str, checkpoint: str, hold: str | None = None,
         signal: str | None = None) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("aioproducer-exactly-once")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
             .getOrCreate())
    progress = register(spark)
    lines = spark.readStream.option("maxFilesPerTrigger", 2).text(source)
    # The same plan with or without a hold (a replay must split its rows as before).
    query = (lines.selectExpr("value AS key", "value")
             .mapInArrow(hold_at(hold, signal), "key string, value string")
             .writeStream.format("aioproducer")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("topic", topic)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    print(json.dumps({"records": progress.records.value, "errors": progress.errors.value,
                      "rows_already_committed": progress.rows_already_committed.value}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
