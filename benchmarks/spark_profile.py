"""Where a Spark write's time goes, for the aioproducer data source and Spark's own Kafka sink.

    python benchmarks/spark_profile.py --rounds 4                  # 1M rows, both sinks
    python benchmarks/spark_profile.py --sinks aioproducer,baseline --baseline main --rounds 6
    python benchmarks/spark_profile.py --rounds 2 --jfr /tmp/spark.jfr --py-spy /tmp/worker.txt

One SparkSession (local[1]) and a cached DataFrame as benchmarks/spark.py makes them, a 1-node
Apache Kafka; each round writes the DataFrame once with each sink (the order alternates from
round to round), after one untimed write of the whole DataFrame by each (the JIT's warm-up).
For every write it prints:
- the wall time of `save()`, and for the data source, its tasks' phases: from `save()` to the
  first task, then in each task the producer's start, the time spent waiting for Spark's next
  Arrow batch, enqueueing, the final flush and the close, and from the last task to the end
  of `save()` (Spark's commit);
- CPU seconds per process over the write: the Spark JVM by thread (the task thread, which
  also turns rows into Arrow for the Python worker; the Kafka producer's sender; the JIT
  compilers; GC), the Python workers, the broker. Sampled from /proc every 100 ms (threads
  that end between two samples lose their last 100 ms; the tasks' own CPU is measured whole).
--jfr FILE records the Spark JVM with Java Flight Recorder (`jfr print --events
jdk.ExecutionSample FILE` for the stacks); --py-spy FILE samples the Python workers with
py-spy (must be installed) over the timed rounds, writing collapsed stacks.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioproducer.testing import ApacheKafka  # noqa: E402
from benchmarks.java import spark_kafka_jars  # noqa: E402
from benchmarks.run import count_back  # noqa: E402
from benchmarks.spark import SETTINGS, CpuSampler, descendants, read_text  # noqa: E402

PHASES_ENV = "AIOPRODUCER_SPARK_PHASES"  # the file the tasks append their phases to


# -- in the Python worker: the data source's task, timed by phase -----------------------------

def _timed_task_module(package: str) -> dict[str, float]:
    """Wrap, in this worker, the steps of the data source's task (of `package`'s spark.py)
    with timers, once; return the totals they add to."""
    import importlib

    spark = importlib.import_module(f"{package}.spark")
    if hasattr(spark, "_phase_totals"):
        return spark._phase_totals  # type: ignore[no-any-return]
    clock = time.perf_counter
    totals: dict[str, float] = collections.defaultdict(float)
    spark._phase_totals = totals

    def timed(name: str, function: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return await function(*args, **kwargs)
            finally:
                totals[name] += clock() - started
        return wrapper

    class Producer(spark.Producer):  # type: ignore[misc, name-defined]
        __aenter__ = timed("start", spark.Producer.__aenter__)
        __aexit__ = timed("close", spark.Producer.__aexit__)
        flush = timed("flush", spark.Producer.flush)
        enqueue_many = timed("enqueue_many", spark.Producer.enqueue_many)

    spark.Producer = Producer
    spark._send = timed("send", spark._send)
    collecting: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:  # the collector's CPU time, by generation
        if phase == "start":
            collecting[:] = [time.thread_time()]
        elif collecting:
            totals[f"gc{info['generation']}"] += time.thread_time() - collecting.pop()

    gc.callbacks.append(on_gc)
    if hasattr(spark, "_ReadAhead"):
        spark._ReadAhead.next = timed("wait_arrow", spark._ReadAhead.next)
    return totals


def _make_profiled_sink(package: str, name: str) -> type:
    """A data source named `name` that is `package`'s (aioproducer.integrations, or a
    baseline's copy), its tasks timed by phase into the file PHASES_ENV names."""
    import importlib

    source = importlib.import_module(f"{package}.spark_source")
    spark = importlib.import_module(f"{package}.spark")

    class ProfiledWriter(source.BatchWriter):  # type: ignore[misc, name-defined]
        def write(self, iterator: Iterator[Any]) -> Any:
            totals = _timed_task_module(package)
            totals.clear()
            totals["heap objects"] = len(gc.get_objects())
            entered, cpu = time.time(), time.process_time()
            first_batch: list[float] = []

            def batches() -> Iterator[Any]:
                for batch in iterator:
                    if not first_batch:
                        first_batch.append(time.time())
                    yield batch

            commit = super().write(batches())
            record = {"entered": entered, "left": time.time(),
                      "first_batch": first_batch[0] if first_batch else None,
                      "cpu": time.process_time() - cpu, "pid": os.getpid(),
                      "rows": commit.report.rows, **totals}
            with open(os.environ[PHASES_ENV], "a") as out:
                out.write(json.dumps(record) + "\n")
            return commit

    class ProfiledSink(source.KafkaSink):  # type: ignore[misc, name-defined]
        @classmethod
        def name(cls) -> str:
            return name

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return ProfiledWriter(spark.plan_from_options(self.options, schema, streaming=False),
                                  None)

    return ProfiledSink


def _baseline_package(revision: str, directory: str) -> str:
    """The data source of git `revision` as package aioproducer_baseline in `directory`
    (its relative imports of the rest of aioproducer made absolute: that is this tree's)."""
    package = Path(directory) / "aioproducer_baseline"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module in ("spark.py", "spark_source.py"):
        text = subprocess.run(["git", "-C", str(ROOT), "show",
                               f"{revision}:aioproducer/integrations/{module}"],
                              check=True, capture_output=True, text=True).stdout
        (package / module).write_text(text.replace("from ..", "from aioproducer."))
    return "aioproducer_baseline"


# -- on the driver: CPU per process and thread, sampled from /proc ---------------------------

# -- the run ------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--spark-kafka-version", default="4.2.0")
    parser.add_argument("--sinks", default="aioproducer,kafka",
                        help="which to write with, in this order in odd rounds: aioproducer, "
                             "kafka (Spark's sink), baseline (needs --baseline)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also the data source as git REV has it (paired with this tree's)")
    parser.add_argument("--jfr", default=None, help="record the Spark JVM to this file")
    parser.add_argument("--py-spy", default=None, help="sample the Python workers to this file")
    parser.add_argument("--keep-phases", default=None,
                        help="append every write's timestamps and task phases to this file")
    parser.add_argument("--conf", action="append", default=[],
                        help="NAME=VALUE, a Spark setting (e.g. maxRecordsPerBatch)")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    phases_file = tempfile.NamedTemporaryFile(prefix="spark-phases-", suffix=".jsonl",
                                              delete=False).name
    os.environ[PHASES_ENV] = phases_file  # the workers inherit it
    if args.baseline:
        baseline_dir = tempfile.mkdtemp(prefix="spark-baseline-")
        baseline = _baseline_package(args.baseline, baseline_dir)
        sys.path.insert(0, baseline_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [baseline_dir, str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from aioproducer.integrations.spark import register

    builder = (SparkSession.builder.master("local[1]").appName("aioproducer-profile")
               .config("spark.ui.enabled", "false")
               .config("spark.executorEnv." + PHASES_ENV, phases_file)
               .config("spark.jars", spark_kafka_jars(args.spark_kafka_version)))
    if args.jfr:
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-XX:StartFlightRecording=filename={args.jfr},settings=profile")
    for setting in args.conf:
        name, _, value = setting.partition("=")
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(_make_profiled_sink("aioproducer.integrations", "aioproducer"))
    if args.baseline:
        spark.dataSource.register(_make_profiled_sink(baseline, "aioproducer_baseline"))
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    df = spark.range(args.rows, numPartitions=2).select(
        F.lpad(F.col("id").cast("string"), 100, "x").alias("value")).cache()
    df.count()
    formats = {"aioproducer": "aioproducer", "kafka": "kafka", "baseline": "aioproducer_baseline"}
    sinks = {name: formats[name] for name in args.sinks.split(",")}

    def save(fmt: str, bootstrap: str, topic: str) -> None:
        writer = df.write.format(fmt).option("kafka.bootstrap.servers", bootstrap) \
            .option("topic", topic)
        for name, value in SETTINGS.items():
            writer = writer.option(f"kafka.{name}", value)
        writer.mode("append").save()

    results: dict[str, list[dict[str, float]]] = {name: [] for name in sinks}
    spies: list[subprocess.Popen[bytes]] = []
    try:
        with ApacheKafka(1) as broker:
            sampler = CpuSampler(jvm_pid, broker.pid(0) or 0)
            for fmt in sinks.values():  # untimed: the whole DataFrame once (JIT warm-up)
                topic = f"warm-{uuid.uuid4().hex[:8]}"
                broker.create_topic(topic, 6)
                save(fmt, broker.bootstrap, topic)
            if args.py_spy:  # one py-spy per Python daemon, following the workers it forks
                for pid in descendants(jvm_pid):
                    command = (read_text(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
                    if "daemon" in command:
                        print(f"py-spy on {pid}: {command}", flush=True)
                        spies.append(subprocess.Popen(
                            [shutil.which("py-spy", path=os.path.dirname(sys.executable))
                             or "py-spy", "record", "-r", "250", "-f", "raw", "-s",
                             "-o", f"{args.py_spy}.{pid}", "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                time.sleep(1)
            for round_ in range(args.rounds):
                order = list(sinks.items())
                if round_ % 2:
                    order.reverse()
                for name, fmt in order:
                    topic = f"bench-{uuid.uuid4().hex[:8]}"
                    broker.create_topic(topic, 6)
                    open(phases_file, "w").close()
                    sampler.reset()
                    started = time.time()
                    save(fmt, broker.bootstrap, topic)
                    ended = time.time()
                    used = sampler.used()
                    if count_back(broker.bootstrap, topic, args.rows) != args.rows:
                        raise SystemExit(f"{name}: rows missing")
                    result = {"wall": ended - started, **used}
                    with open(phases_file) as phases:
                        tasks = [json.loads(line) for line in phases]
                    if args.keep_phases:
                        with open(args.keep_phases, "a") as kept:
                            kept.write(json.dumps({"sink": name, "round": round_, "started": started,
                                                   "ended": ended, "tasks": tasks}) + "\n")
                    if tasks:
                        tasks.sort(key=lambda t: t["entered"])
                        result["to first task"] = tasks[0]["entered"] - started
                        result["after last task"] = ended - tasks[-1]["left"]
                        result["between tasks"] = sum(
                            b["entered"] - a["left"] for a, b in zip(tasks, tasks[1:]))
                        result["to first batch"] = sum(
                            t["first_batch"] - t["entered"] for t in tasks if t["first_batch"])
                        for phase in ("start", "wait_arrow", "send", "enqueue_many", "flush",
                                      "close", "cpu", "gc0", "gc1", "gc2", "heap objects"):
                            result[f"task {phase}"] = sum(t.get(phase, 0.0) for t in tasks)
                        result["task wall"] = sum(t["left"] - t["entered"] for t in tasks)
                    results[name].append(result)
                    print(f"round {round_ + 1} {name}: {args.rows / result['wall']:,.0f} rows/s, "
                          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(result.items())),
                          flush=True)
            sampler.stop()
    finally:
        for spy in spies:
            spy.send_signal(2)  # (py-spy writes its file on SIGINT)
            spy.wait(30)
        spark.stop()
    print(f"\n{args.rows:,} rows of 100 B, local[1], {args.rounds} rounds; medians, seconds "
          f"(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}):")
    keys = sorted({k for rows in results.values() for r in rows for k in r})
    print(f"{'':28}" + "".join(f"{name:>14}" for name in results))
    for key in keys:
        cells = [statistics.median(r.get(key, 0.0) for r in rows) for rows in results.values()]
        print(f"{key:28}" + "".join(f"{c:14.3f}" for c in cells))


if __name__ == "__main__":
    main()
