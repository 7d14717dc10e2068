"""Spark to Kafka, side by side in one run: the aioproducer data source against the same job
written with foreachPartition and confluent-kafka's Producer, and with aiokafka.

    python benchmarks/spark.py                       # 1M rows of 100 B, 5 rounds
    python benchmarks/spark.py --rows 200000 --repeat 2
    python benchmarks/spark.py --headers             # each row with a header: the per-row path
    python benchmarks/spark.py --broker kafka1 --spark-sink   # Apache Kafka, Spark's own sink too

One SparkSession (local[CORES], CORES executor cores, 1 by default so the broker has the other
core), one cached DataFrame of ROWS rows with a 100-byte string value in 2 x CORES Spark
partitions, written to a fresh 6-partition topic per write. Only the write jobs of the
timed rounds count, after --warm-up untimed rounds (1 by default) in which every client
writes the whole DataFrame: the session's first Python data source write starts the workers
that plan it, and the JVM compiles the paths every client's rows go through. Each round runs
every client once, in the reverse order every other round. Every client runs with acks=1,
idempotence off (aiokafka's cannot start against Tansu), linger 5 ms, batch 16 KiB. A
write's records are counted back with librdkafka's consumer; a wrong count fails the run.
Prints rows/s per executor core (median and range over the rounds) and aioproducer's ratio
to each peer, as the median of the per-round ratios; and the CPU seconds each write took in
the Spark JVM (its task threads, where Spark's sink and the Python data source's Arrow
conversion run, and the Kafka producer's sender thread), the Python workers and the broker,
sampled from /proc.

--broker kafka1 writes to a 1-node Apache Kafka (aioproducer.testing.ApacheKafka) instead of
the embedded broker; --spark-sink adds Spark's own `format("kafka")` sink (spark-sql-kafka-0-10,
resolved by Maven for --spark-kafka-version, passed with spark.jars), with the same settings.

With --headers every row also has a headers column, one header ("id": the row's id, as
bytes), which every client sends; the data source then appends rows one by one (its path for
rows with headers, a topic or a partition column) instead of enqueue_many() per Arrow batch.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import threading
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


# -- CPU per process and thread, from /proc --------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _ticks(stat: str) -> tuple[str, int]:
    """(comm, utime + stime) of a /proc stat line."""
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return name, int(fields[11]) + int(fields[12])


def descendants(root: int) -> list[int]:
    """The processes below `root`, from every process's parent in /proc."""
    parents: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_text(f"/proc/{entry}/stat")
            if stat:
                parents[int(stat[stat.rindex(")") + 2:].split()[1])].append(int(entry))
    found, stack = [], list(parents[root])
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += parents[pid]
    return found


class CpuSampler:
    """Each thread's CPU ticks of the watched processes (and the JVM's descendants), the
    last value seen of every (process, thread) since reset()."""

    def __init__(self, jvm: int, broker: int) -> None:
        self.jvm, self.broker = jvm, broker
        self.seen: dict[tuple[str, int, int], tuple[str, int]] = {}
        self.start: dict[tuple[str, int, int], int] = {}
        self._python: list[tuple[str, int]] = []
        self._found_at = -1.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _processes(self) -> list[tuple[str, int]]:
        if time.monotonic() > self._found_at + 0.5:  # (the workers live long: Spark reuses them)
            self._python = [("python", pid) for pid in descendants(self.jvm)]
            self._found_at = time.monotonic()
        return [("jvm", self.jvm), ("broker", self.broker), *self._python]

    def sample(self) -> dict[tuple[str, int, int], tuple[str, int]]:
        now = {}
        for kind, pid in self._processes():
            for task in (os.listdir(f"/proc/{pid}/task")
                         if os.path.exists(f"/proc/{pid}/task") else []):
                stat = read_text(f"/proc/{pid}/task/{task}/stat")
                if stat:
                    now[(kind, pid, int(task))] = _ticks(stat)
        with self._lock:
            self.seen.update(now)
        return now

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def reset(self) -> None:
        self._found_at = -1.0  # find the processes now: any found later is new
        now = self.sample()
        with self._lock:
            self.seen = dict(now)
            self.start = {k: ticks for k, (_, ticks) in now.items()}

    def used(self) -> dict[str, float]:
        """CPU seconds since reset(), by process kind and the JVM's thread names."""
        self.sample()
        out: dict[str, float] = collections.defaultdict(float)
        with self._lock:
            for key, (name, ticks) in self.seen.items():
                kind = key[0]
                spent = (ticks - self.start.get(key, 0)) / TICK
                if not spent:
                    continue
                out[kind] += spent
                if kind == "jvm":
                    out[f"jvm: {_thread_kind(name)}"] += spent
                elif kind == "python":
                    out["python: main thread" if key[1] == key[2]
                        else "python: other threads"] += spent
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _thread_kind(name: str) -> str:
    for prefix, kind in (("Executor task", "task"), ("kafka-producer", "kafka sender"),
                         ("C2 Compiler", "JIT C2"), ("C1 Compiler", "JIT C1"),
                         ("GC Thread", "GC"), ("G1 ", "GC"), ("VM Thread", "VM")):
        if name.startswith(prefix):
            return kind
    return "other"


CLIENTS: dict[str, Callable[[Any, str, str], None]] = {
    "aioproducer (format)": with_data_source,
    "confluent-kafka (foreachPartition)": with_confluent,
    "aiokafka (foreachPartition)": with_aiokafka,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=1,
                        help="untimed rounds first, each client writing the whole DataFrame")
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
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    try:
        with (EmbeddedBroker() if args.broker == "embedded" else ApacheKafka(1)) as broker:
            sampler = CpuSampler(spark.sparkContext._gateway.proc.pid,  # type: ignore[union-attr]
                                 broker.pid if isinstance(broker, EmbeddedBroker)
                                 else broker.pid(0))
            # Untimed, each client writing the whole DataFrame WARM_UP times: a session's first
            # Python data source write starts the Python workers that plan and commit it (~8 s
            # here), and the JVM compiles the paths that read the cached DataFrame and turn its
            # rows into Arrow or Kafka records during the first million rows (a small warm-up
            # left that to the first timed round, which was every client's slowest).
            for round_ in range(args.warm_up):
                for name, write in clients.items():
                    topic = f"bench-spark-warm-up-{uuid.uuid4().hex[:8]}"
                    broker.create_topic(topic, 6)
                    started = time.perf_counter()
                    write(df, broker.bootstrap, topic)
                    print(f"  warm-up {round_ + 1}, {name}: "
                          f"{args.rows / (time.perf_counter() - started):,.0f} rows/s", flush=True)
            for round_ in range(args.repeat):
                # Every other round in the reverse order: no client always runs right after
                # the same other one (and its garbage, its broker log flushes).
                order = list(clients.items())[::-1 if round_ % 2 else 1]
                for name, write in order:
                    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
                    broker.create_topic(topic, 6)
                    sampler.reset()
                    started = time.perf_counter()
                    write(df, broker.bootstrap, topic)
                    seconds = time.perf_counter() - started
                    cpu[name].append(sampler.used())
                    counted = count_back(broker.bootstrap, topic, args.rows)
                    if counted != args.rows:
                        raise SystemExit(f"{name}: {counted} of {args.rows} records counted back")
                    rates[name].append(args.rows / seconds / args.cores)
                    used = cpu[name][-1]
                    print(f"  {name}: {rates[name][-1]:,.0f} rows/s per core; CPU s: "
                          + ", ".join(f"{kind} {used.get(kind, 0.0):.2f}"
                                      for kind in ("jvm", "python", "broker")), flush=True)
            sampler.stop()
    finally:
        spark.stop()

    print(f"\n{args.rows:,} rows of 100 B{' with one header' if args.headers else ''}, "
          f"local[{args.cores}], {args.repeat} round(s) after {args.warm_up} warm-up "
          f"round(s), {args.broker} broker; rows/s per executor core, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, median (range):")
    for name, values in rates.items():
        print(f"  {name:36} {statistics.median(values):>10,.0f}  "
              f"({min(values):,.0f}-{max(values):,.0f})")
    print("CPU seconds per write, median: the Spark JVM (its task threads; the Kafka "
          "producer's sender), the Python workers, the broker:")
    for name, used in cpu.items():
        print(f"  {name:36} " + "  ".join(
            f"{kind} {statistics.median(u.get(kind, 0.0) for u in used):.2f}"
            for kind in ("jvm", "jvm: task", "jvm: kafka sender", "python", "broker")))
    ours = rates["aioproducer (format)"]
    for name, values in rates.items():
        if name != "aioproducer (format)":
            ratios = [a / b for a, b in zip(ours, values)]
            print(f"  aioproducer / {name}: {statistics.median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
