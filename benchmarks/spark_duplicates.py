"""The duplicates a killed Spark driver leaves: Spark's own `format("kafka")` sink beside the
aioproducer data source, on a 1-node Apache Kafka (issue 39 item 4).

    python benchmarks/spark_duplicates.py                 # 3 kills per run, lines of 1 kB
    python benchmarks/spark_duplicates.py --kills 1 --rounds 2 --pad 0

Each sink gets the same run (tests/support/spark_killed_driver.py, on a fresh 2-partition
topic): a streaming query writing 4 x KILLS + 4 files of 400 lines, two files per
micro-batch, whose driver is SIGKILLed KILLS times in the middle of a micro-batch (one Spark
partition of it written, the other's task held after the lines before line 200 of its file
went to the sink) and restarted from its checkpoint each time, then run to the end. Every
line is then read back by librdkafka's read_committed consumer; a line read more than once
is a duplicate, a line not read is missing. The data source writes each micro-batch's
partitions in transactions (its streaming default); Spark's sink writes plain records (it is
at least once). Spark's sink is spark-sql-kafka-0-10 (--spark-kafka-version, 4.2.0 by
default: PySpark 4.3.0's is not on Maven Central) resolved by Maven (benchmarks/java.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioproducer.testing import ApacheKafka  # noqa: E402
from benchmarks.java import spark_kafka_jars  # noqa: E402
from tests.support import spark_killed_driver  # noqa: E402

SINKS = {"kafka": "Spark's sink, format(\"kafka\")",
         "aioproducer": "aioproducer, format(\"aioproducer\")"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="per run")
    parser.add_argument("--rounds", type=int, default=1, help="runs per sink")
    parser.add_argument("--pad", type=int, default=1000,
                        help="bytes added to each line (of a few kB, lines reach the sink "
                        "before the hold; of a few bytes, they wait in Spark's buffers)")
    parser.add_argument("--sinks", default="kafka,aioproducer")
    parser.add_argument("--spark-kafka-version", default="4.2.0")
    args = parser.parse_args()

    sinks = args.sinks.split(",")
    jars = spark_kafka_jars(args.spark_kafka_version) if "kafka" in sinks else None
    rows = []
    with ApacheKafka(1) as kafka, tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for sink in sinks:
                topic = f"dup-{sink}-{uuid.uuid4().hex[:8]}"
                kafka.create_topic(topic, spark_killed_driver.PARTITIONS)
                workdir = Path(scratch) / topic
                workdir.mkdir()
                run = spark_killed_driver.run(
                    kafka.bootstrap, topic, workdir, kills=args.kills, pad=args.pad, sink=sink,
                    jars=jars if sink == "kafka" else None,
                    wait_for_held_lines=args.pad > 0,
                    timeout=300 * (args.kills + 1))
                held = [kill.held_lines_sent for kill in run.kills]
                rows.append((SINKS[sink], round_ + 1, len(run.expected),
                             sum(run.read_committed.values()), run.duplicates, run.missing,
                             run.duplicated_by_file(), held))
                print(f"  {SINKS[sink]}, round {round_ + 1}: {run.duplicates} duplicates, "
                      f"{run.missing} missing, by file {run.duplicated_by_file()}; held "
                      f"lines at the broker at each kill {held}; {run.seconds:.0f} s",
                      flush=True)

    print(f"\n{args.kills} kill(s) per run, lines of {8 + args.pad} B, 1-node Apache Kafka "
          f"{kafka.version}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}:")
    print("| sink | round | lines | read_committed records | duplicates | missing | "
          "duplicated, by file | held file's lines sent at each kill |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for name, round_, lines, read, duplicates, missing, by_file, held in rows:
        print(f"| {name} | {round_} | {lines:,} | {read:,} | {duplicates:,} | {missing} | "
              f"{', '.join(f'{f}: {n}' for f, n in by_file.items()) or '-'} | {held} |")


if __name__ == "__main__":
    main()
