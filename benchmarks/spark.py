"""Spark to Kafka, side by side in one run: the aioproducer data source against the same job
written with foreachPartition and confluent-kafka's Producer, and with aiokafka.

    python benchmarks/spark.py                       # 1M rows of 100 B, 3 rounds
    python benchmarks/spark.py --rows 200000 --repeat 2
    python benchmarks/spark.py --headers             # each row with a header: the per-row path
    python benchmarks/spark.py --broker kafka1 --spark-sink   # Apache Kafka, Spark's own sink too

One SparkSession (local[CORES], CORES executor cores, 1 by default so the broker has the other
core), one cached DataFrame of ROWS rows with a 100-byte string value in 2 x CORES Spark
partitions, written to a fresh 6-partition topic per run of the embedded broker; only the
write job is timed, after one untimed small write by each client (the session's first Python
data source write starts the workers that plan it, once per session). Every client runs with acks=1, idempotence off (aiokafka's cannot start
against Tansu), linger 5 ms, batch 16 KiB. A run's records are counted back with librdkafka's
consumer; a wrong count fails the run. Prints rows/s per executor core (median and range over
the rounds, each round runs every client once) and aioproducer's ratio to each peer, as the
median of the per-round ratios.

--broker kafka1 writes to a 1-node Apache Kafka (aioproducer.testing.ApacheKafka) instead of
the embedded broker; --spark-sink adds Spark's own `format("kafka")` sink (spark-sql-kafka-0-10,
resolved by Maven for --spark-kafka-version, passed with spark.jars), with the same settings.

With --headers every row also has a headers column, one header ("id": the row's id, as
bytes), which every client sends; the data source then appends rows one by one (its path for
rows with headers, a topic or a partition column) instead of enqueue_many() per Arrow batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioproducer.testing import ApacheKafka, EmbeddedBroker  # noqa: E402
from benchmarks.java import spark_kafka_jars  # noqa: E402
from benchmarks.run import count_back  # noqa: E402

SETTINGS = {"acks": "1", "enable.idempotence": "false", "linger.ms": "5",
            "batch.size": "16384"}


def with_data_source(df: Any, bootstrap: str, topic: str) -> None:
    writer = (df.write.format("aioproducer").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", topic))
    for name, value in SETTINGS.items():
        writer = writer.option(f"kafka.{name}", value)
    writer.mode("append").save()


def with_spark_sink(df: Any, bootstrap: str, topic: str) -> None:
    """Spark's own Kafka sink: one cached KafkaProducer per executor, send() per row with a
    callback, flush at the task's end (at-least-once)."""
    writer = (df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", topic))
    for name, value in SETTINGS.items():
        writer = writer.option(f"kafka.{name}", value)
    writer.mode("append").save()


def with_confluent(df: Any, bootstrap: str, topic: str) -> None:
    with_headers = "headers" in df.columns

    def write(rows: Iterable[Any]) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, **SETTINGS})
        for row in rows:
            while True:
                try:
                    if with_headers:  # (Spark gives binary values as bytearray)
                        producer.produce(topic, row.value, headers=[
                            (h.key, bytes(h.value)) for h in row.headers])
                    else:
                        producer.produce(topic, row.value)
                    break
                except BufferError:  # its queue is full: serve callbacks, then again
                    producer.poll(0.005)
            producer.poll(0)
        if producer.flush(120):
            raise RuntimeError("confluent-kafka: records left unflushed")

    df.foreachPartition(write)


def with_aiokafka(df: Any, bootstrap: str, topic: str) -> None:
    with_headers = "headers" in df.columns

    def write(rows: Iterable[Any]) -> None:
        import asyncio

        from aiokafka import AIOKafkaProducer

        async def produce() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5,
                                        max_batch_size=16384, enable_idempotence=False)
            await producer.start()
            try:
                if with_headers:
                    futures = [await producer.send(topic, row.value.encode(), headers=[
                        (h.key, bytes(h.value)) for h in row.headers]) for row in rows]
                else:
                    futures = [await producer.send(topic, row.value.encode()) for row in rows]
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        asyncio.run(produce())

    df.foreachPartition(write)


CLIENTS: dict[str, Callable[[Any, str, str], None]] = {
    "aioproducer (format)": with_data_source,
    "confluent-kafka (foreachPartition)": with_confluent,
    "aiokafka (foreachPartition)": with_aiokafka,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker", choices=["embedded", "kafka1"], default="embedded")
    parser.add_argument("--spark-sink", action="store_true",
                        help="also Spark's own format(\"kafka\") sink")
    parser.add_argument("--spark-kafka-version", default=None,
                        help="spark-sql-kafka-0-10's version (default: PySpark's)")
    parser.add_argument("--skip", default="", help="comma-separated clients to leave out "
                        "(their names' first word: aiokafka, confluent-kafka)")
    parser.add_argument("--headers", action="store_true",
                        help="one header per row (the data source's per-row path)")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from aioproducer.integrations.spark import register

    skip = set(filter(None, args.skip.split(",")))
    clients = {name: write for name, write in CLIENTS.items() if name.split()[0] not in skip}
    builder = (SparkSession.builder.master(f"local[{args.cores}]").appName("aioproducer-bench")
               .config("spark.ui.enabled", "false"))
    if args.spark_sink:
        clients["Spark's sink (format kafka)"] = with_spark_sink
        builder = builder.config("spark.jars", spark_kafka_jars(
            args.spark_kafka_version or pyspark.__version__))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    header = F.array(F.struct(F.lit("id").alias("key"),
                              F.col("id").cast("string").cast("binary").alias("value")))
    columns = [F.lpad(F.col("id").cast("string"), 100, "x").alias("value")]
    if args.headers:
        columns.append(header.alias("headers"))
    df = spark.range(args.rows, numPartitions=2 * args.cores).select(*columns).cache()
    df.count()
    rates: dict[str, list[float]] = {name: [] for name in clients}
    try:
        with (EmbeddedBroker() if args.broker == "embedded" else ApacheKafka(1)) as broker:
            # Untimed, each client once: a session's first Python data source write starts
            # the Python workers that plan and commit it (~8 s here), paid once per session.
            warm_up = spark.range(1000, numPartitions=2 * args.cores).select(
                F.col("id").cast("string").alias("value"),
                *([header.alias("headers")] if args.headers else []))
            broker.create_topic("bench-spark-warm-up", 6)
            for write in clients.values():
                write(warm_up, broker.bootstrap, "bench-spark-warm-up")
            for _ in range(args.repeat):
                for name, write in clients.items():
                    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
                    broker.create_topic(topic, 6)
                    started = time.perf_counter()
                    write(df, broker.bootstrap, topic)
                    seconds = time.perf_counter() - started
                    counted = count_back(broker.bootstrap, topic, args.rows)
                    if counted != args.rows:
                        raise SystemExit(f"{name}: {counted} of {args.rows} records counted back")
                    rates[name].append(args.rows / seconds / args.cores)
                    print(f"  {name}: {rates[name][-1]:,.0f} rows/s per core", flush=True)
    finally:
        spark.stop()

    print(f"\n{args.rows:,} rows of 100 B{' with one header' if args.headers else ''}, "
          f"local[{args.cores}], {args.repeat} round(s), {args.broker} broker; rows/s per "
          f"executor core, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
          "median (range):")
    for name, values in rates.items():
        print(f"  {name:36} {statistics.median(values):>10,.0f}  "
              f"({min(values):,.0f}-{max(values):,.0f})")
    ours = rates["aioproducer (format)"]
    for name, values in rates.items():
        if name != "aioproducer (format)":
            ratios = [a / b for a, b in zip(ours, values)]
            print(f"  aioproducer / {name}: {statistics.median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
