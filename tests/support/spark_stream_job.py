"""A Structured Streaming driver for the killed-driver runs (tests/support/spark_killed_driver.py),
run as its own process so that it can be killed: every text file under SOURCE becomes
records of TOPIC (the line as key and value), two files per micro-batch (oldest first),
through the aioproducer data source or Spark's own Kafka sink, until the files are all
written (availableNow); then prints the data source's counters as JSON.

    python -m tests.support.spark_stream_job BOOTSTRAP TOPIC SOURCE CHECKPOINT
        [--hold PREFIX --signal PATH] [--sink aioproducer|kafka] [--jars JARS]

With --hold, the task whose partition holds a line starting with PREFIX stops before it: at
the Arrow batch (100 rows) that holds it, it creates the file SIGNAL and waits (600 s at
most) for the driver to be killed. The batches before it go on to the sink's task only as
far as the buffers between this step's Python worker and the sink let them: lines of a few
bytes wait there (the sink's task has no rows yet when the driver is killed), lines of a few
kB fill the buffers and reach the sink (its task has sent them, in an open transaction).
`--sink kafka` writes with Spark's `format("kafka")` (its jars given with --jars, as
spark.jars takes them).
"""

import argparse
import json
import os
import sys
from typing import Callable, Iterator

from pyspark.sql import SparkSession

from aioproducer.integrations.spark import register


def hold_at(prefix: str | None, signal: str | None) -> Callable[[Iterator], Iterator]:
    def step(batches: Iterator) -> Iterator:
        import pathlib
        import time

        import pyarrow.compute as pc

        for batch in batches:
            if prefix is not None and pc.any(pc.starts_with(batch.column("value"),
                                                            pattern=prefix)).as_py():
                # Held until the run kills the driver. This Python worker is in a process
                # group of its own and outlives the driver: had it slept on, it would wake
                # and commit the held rows while the restarted driver replays them (a race
                # the restart wins or loses with the machine's load). So it dies with its
                # daemon, which ends when the killed JVM closes its stdin.
                import os

                daemon = os.getppid()
                pathlib.Path(signal).touch()
                deadline = time.monotonic() + 600  # (longer than a run waits for it)
                while os.getppid() == daemon and time.monotonic() < deadline:
                    time.sleep(0.1)
                os._exit(1)
            yield batch
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "source", "checkpoint"):
        parser.add_argument(name)
    parser.add_argument("--hold")
    parser.add_argument("--signal")
    parser.add_argument("--sink", choices=["aioproducer", "kafka"], default="aioproducer")
    parser.add_argument("--jars")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master("local[2]").appName("aioproducer-killed-driver")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100"))
    if args.jars:
        builder = builder.config("spark.jars", args.jars)
    spark = builder.getOrCreate()
    progress = register(spark)
    lines = spark.readStream.option("maxFilesPerTrigger", 2).text(args.source)
    # The same plan with or without a hold (a replay must split its rows as before).
    query = (lines.selectExpr("value AS key", "value")
             .mapInArrow(hold_at(args.hold, args.signal), "key string, value string")
             .writeStream.format(args.sink)
             .option("kafka.bootstrap.servers", args.bootstrap)
             .option("topic", args.topic)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    print(json.dumps({"records": progress.records.value, "errors": progress.errors.value,
                      "rows_already_committed": progress.rows_already_committed.value}))
    spark.stop()


if __name__ == "__main__":
    main()
