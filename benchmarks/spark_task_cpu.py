"""The data source's task code outside Spark: what its per-row Python objects cost.

    python benchmarks/spark_task_cpu.py --pairs 8

Against one 1-node Apache Kafka, in one process, in pairs (the order alternating): the task's
code, `write_partition()` over 50 Arrow batches of 10,000 rows of 100 B (Arrow's key and value
buffers handed to `enqueue_many()` as the speed-up's Columns, read where they lie; before,
a bytes object per cell and a (None, value) tuple per row), and the same producer fed
(None, value) tuples built before the clock starts (the per-row objects' cost left out).
Prints the process's CPU time per row of each, and their ratio per pair. Settings as
benchmarks/spark.py's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from itertools import repeat
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # type: ignore[import-untyped]  # noqa: E402

from aioproducer import Producer  # noqa: E402
from aioproducer.config import ProducerConfig  # noqa: E402
from aioproducer.integrations.spark import WritePlan, _run, write_partition  # noqa: E402
from aioproducer.testing import ApacheKafka  # noqa: E402
from benchmarks.spark import SETTINGS  # noqa: E402

ROWS, BATCHES = 10_000, 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    values = pa.array([str(i).rjust(100, "x") for i in range(ROWS)], pa.string())
    batch = pa.record_batch([values], names=["value"])
    total = ROWS * BATCHES
    cpu: dict[str, list[float]] = {"task": [], "prebuilt": []}
    with ApacheKafka(1) as broker:
        def config() -> ProducerConfig:
            return ProducerConfig.from_properties({**SETTINGS,
                                                   "bootstrap.servers": broker.bootstrap})

        def task(topic: str) -> float:
            started = time.process_time()
            report = write_partition(iter([batch] * BATCHES), WritePlan(config(), topic,
                                                                        frozenset()), 0)
            spent = time.process_time() - started
            assert report.records == total, report
            return spent

        def prebuilt(topic: str) -> float:
            cells = batch.column(0).cast(pa.binary()).to_pylist()
            chunks = [list(zip(repeat(None), cells)) for _ in range(BATCHES)]

            async def send() -> None:
                async with Producer(config=config()) as producer:
                    bulks = [await producer.enqueue_many(topic, chunk) for chunk in chunks]
                    await producer.flush()
                    assert sum(len(bulk.result()) for bulk in bulks) == total

            started = time.process_time()
            _run(send())
            return time.process_time() - started

        for pair in range(args.pairs):
            for name in ("task", "prebuilt")[::-1 if pair % 2 else 1]:
                topic = f"bench-task-cpu-{uuid.uuid4().hex[:8]}"
                broker.create_topic(topic, 6)
                cpu[name].append((task if name == "task" else prebuilt)(topic))
                print(f"  {name}: {1e9 * cpu[name][-1] / total:,.0f} ns of CPU a row", flush=True)
    ratios = [b / a for a, b in zip(cpu["task"], cpu["prebuilt"])]
    print(f"{total:,} rows of 100 B a run, {args.pairs} pairs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; CPU ns a row, median:")
    for name, spent in cpu.items():
        print(f"  {name:10} {1e9 * statistics.median(spent) / total:,.0f}")
    print(f"  prebuilt / task: {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
