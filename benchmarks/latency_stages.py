"""Where send-to-ack latency goes: the load-latency shape, each record's time split in stages.

    python benchmarks/latency_stages.py [--records 30000] [--rate 10000] [--asyncio]

A diagnostic, not a comparison: it wraps four of the sender's private methods to stamp each
batch (opened, drained into a request, written, response read), so it breaks when they are
renamed. Broker pinned to core 0 and this process to core 1, as run.py pins latency rows.
Per record: linger wait (send() called -> batch drained), encode and write, broker round trip
(written -> response read), resume (response read -> send() returned); then the same for the
slowest 1% alone, how late the sender's timer fired, and how long the oldest batch of each
request lingered past linger_ms.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from aioproducer import Producer  # noqa: E402
from aioproducer._internal.accumulator import RecordAccumulator  # noqa: E402
from aioproducer._internal.sender import Sender  # noqa: E402
from aioproducer.testing import EmbeddedBroker  # noqa: E402

from clients import SETTINGS, records  # noqa: E402
from run import BROKER_CORE, CLIENT_CORE  # noqa: E402

LINGER = SETTINGS["linger_ms"] / 1000
stamps: dict[int, dict[str, float]] = {}  # id(batch) -> stage -> perf_counter
batches: dict[int, object] = {}
timer_late: list[float] = []
request_oldest: list[float] = []


def _stamp(batch: object, stage: str) -> None:
    stamps.setdefault(id(batch), {})[stage] = time.perf_counter()
    batches[id(batch)] = batch


def _wrap() -> None:
    open_batch, prepare = RecordAccumulator.open_batch, Sender._prepare_produce
    write, respond, on_timer = Sender._write_requests, Sender._on_produce_response, Sender._on_timer

    def open_batch_(self, *args, **kwargs):
        batch = open_batch(self, *args, **kwargs)
        _stamp(batch, "opened")
        return batch

    def prepare_(self, conn, drained):
        for batch in drained:
            _stamp(batch, "drained")
        now = time.perf_counter()
        request_oldest.append(now - min(stamps[id(b)]["opened"] for b in drained) - LINGER)
        return prepare(self, conn, drained)

    def write_(self):
        for _, _, written, _ in self._unwritten:
            for batch in written:
                _stamp(batch, "written")
        return write(self)

    def respond_(self, conn, answered, *args):
        for batch in answered:
            _stamp(batch, "response")
        return respond(self, conn, answered, *args)

    def on_timer_(self):
        # time.monotonic(): both loops' clock, to the microsecond (uvloop's own is in ms)
        timer_late.append(time.monotonic() - self._timer.when())
        return on_timer(self)

    RecordAccumulator.open_batch = open_batch_
    Sender._prepare_produce, Sender._write_requests = prepare_, write_
    Sender._on_produce_response, Sender._on_timer = respond_, on_timer_


async def load(bootstrap: str, topic: str, count: int, rate: float) -> list[tuple]:
    """benchmarks/clients.py's load-latency shape: 100 tasks, one record at a time each."""
    tasks, data, sent = 100, records(count, 100), []
    share = count // tasks
    async with Producer(bootstrap, **SETTINGS, enable_idempotence=False) as producer:
        start = time.perf_counter()

        async def worker(index: int, part: list) -> None:
            for i, (key, value) in enumerate(part):
                delay = start + (i * tasks + index) / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                began = time.perf_counter()
                metadata = await producer.send(topic, value, key)
                sent.append((began, time.perf_counter(), metadata.partition, metadata.offset))

        await asyncio.gather(*(worker(t, data[t * share:(t + 1) * share])
                               for t in range(tasks)))
    return sent


def report(sent: list[tuple]) -> None:
    by_partition: dict[int, list[tuple[int, dict[str, float]]]] = {}
    for key, batch in batches.items():
        if batch.future.done() and batch.future.exception() is None:
            by_partition.setdefault(batch.partition, []).append(
                (batch.future.result()[0], stamps[key]))
    for entries in by_partition.values():
        entries.sort(key=lambda entry: entry[0])
    stages: dict[str, list[float]] = {
        "linger wait": [], "encode, write": [], "broker round trip": [], "resume": [],
        "total": []}
    for began, returned, partition, offset in sent:
        entries = by_partition[partition]
        at = bisect.bisect_right([base for base, _ in entries], offset) - 1
        s = entries[at][1]
        stages["linger wait"].append(s["drained"] - began)
        stages["encode, write"].append(s["written"] - s["drained"])
        stages["broker round trip"].append(s["response"] - s["written"])
        stages["resume"].append(returned - s["response"])
        stages["total"].append(returned - began)

    def q(values: list[float], f: float) -> float:
        return sorted(values)[int(len(values) * f)] * 1000

    print(f"{len(sent):,} records, ms:            p50     p90     p99")
    for name, values in stages.items():
        print(f"  {name:28} {q(values, .5):7.2f} {q(values, .9):7.2f} {q(values, .99):7.2f}")
    cut = sorted(stages["total"])[int(len(sent) * .99)]
    slowest = [i for i, total in enumerate(stages["total"]) if total >= cut]
    print(f"the slowest 1% ({len(slowest)} records, from {cut * 1000:.2f} ms), mean ms:")
    for name, values in stages.items():
        print(f"  {name:28} {sum(values[i] for i in slowest) / len(slowest) * 1000:7.2f}")
    print(f"sender's timer fired late by   {q(timer_late, .5):7.2f} {q(timer_late, .9):7.2f} "
          f"{q(timer_late, .99):7.2f}  ({len(timer_late)} timers)")
    print(f"oldest batch past linger_ms    {q(request_oldest, .5):7.2f} "
          f"{q(request_oldest, .9):7.2f} {q(request_oldest, .99):7.2f}  "
          f"({len(request_oldest)} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--asyncio", action="store_true", help="asyncio's own loop, not uvloop")
    args = parser.parse_args()
    _wrap()
    with EmbeddedBroker() as broker:
        broker.create_topic("stages", 6)
        subprocess.run(["taskset", "-a", "-p", "-c", BROKER_CORE, str(broker.pid)],
                       check=True, capture_output=True)
        os.sched_setaffinity(0, {int(CLIENT_CORE)})
        coro = load(broker.bootstrap, "stages", args.records, args.rate)
        if args.asyncio:
            sent = asyncio.run(coro)
        else:
            import uvloop
            sent = uvloop.run(coro)
    report(sent)


if __name__ == "__main__":
    main()
