"""Where a produce run's wall time goes when the client is not busy (issue 42): the requests
(batches and bytes each, how many were in flight when each was written, their latency), the
waits of enqueue() (for its turn after closing a full batch, or in line for memory), the
sender's rounds (and how many wrote nothing), and the
producing thread's time on the CPU against its time runnable but not running (the run queue:
another process, the broker's threads say, had the core), the bytes each request left in the
transport's buffer (not yet taken by the kernel: the loop must turn to write them), the
broker process's CPU seconds and its threads' run-queue time, how long k requests were
written and unanswered (0: the broker had nothing of ours to do), and the time from the last
answer to the run's end (gather's own tail).

    python benchmarks/where_it_waits.py [--broker embedded|kafka] [--records N] [--size B]
        [--shape gather|bulk] [--set name=value ...] [--client confluent]

A fresh broker (the embedded one, or one Apache Kafka node, warmed up by an untimed write of
the same records), a topic of 6 partitions, keyed
records of --size bytes, each client default but linger 5 ms and acks=1, uvloop. `--set`
overrides a setting (`--set batch_size=1048576 --set enable_idempotence=false`; `--set acks=0
--set enable_idempotence=false` for acks=0). Counts come
from wrapping the sender's and the intake's methods: a diagnosis, not a timing to compare.
`--client confluent`: confluent-kafka's produce() and poll(0) per record (as grid.py runs it,
its defaults but linger 5 ms, acks=1, idempotence off) with the same broker and records, and
its requests as librdkafka's statistics (every 20 ms) tell them: how many, KB each, how many
awaited a response (median and largest of the samples), round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop  # noqa: E402

from aioproducer import Producer  # noqa: E402
from aioproducer._internal import accumulator, intake, sender  # noqa: E402
from aioproducer.client import connection  # noqa: E402
from aioproducer.protocol.messages import ApiKey  # noqa: E402
from aioproducer.testing import ApacheKafka, EmbeddedBroker  # noqa: E402

requests: list[tuple[int, int, int]] = []  # (batches, bytes, in flight when written)
backlog: list[int] = []  # bytes the transport still held (not in the kernel) after each write
latencies: list[float] = []
answered: list[tuple[float, float]] = []  # each request's (written, answered), perf_counter
waits: list[tuple[float, bool]] = []  # (seconds, after closing a full batch: else in line)
rounds = [0, 0]  # the sender's rounds, and those that prepared no request


def instrument() -> None:
    prepare = sender.Sender._prepare_produce
    send = connection.BrokerConnection.send
    responded = sender.Sender._on_produce_response
    append_in_turn = intake.RecordIntake._append_in_turn
    run_once = sender.Sender._run_once

    def counted_round(self: Any, now: float) -> float:
        delay = run_once(self, now)
        rounds[0] += 1
        rounds[1] += not self._unwritten
        return delay

    def prepare_produce(self: Any, conn: Any, batches: list[Any]) -> None:
        requests.append((len(batches), sum(b.writer.size for b in batches),
                         conn.in_flight_produce))
        prepare(self, conn, batches)

    def send_request(self: Any, api_key: Any, *args: Any, **kwargs: Any) -> None:
        send(self, api_key, *args, **kwargs)
        if api_key == ApiKey.PRODUCE and self._transport is not None:
            backlog.append(self._transport.get_write_buffer_size())

    def on_response(self: Any, conn: Any, batches: Any, written: float, *rest: Any) -> None:
        latencies.append(time.perf_counter() - written)
        answered.append((written, time.perf_counter()))
        responded(self, conn, batches, written, *rest)

    async def in_turn(self: Any, waiting: Any) -> Any:
        start, granted = time.perf_counter(), waiting.granted
        try:
            return await append_in_turn(self, waiting)
        finally:
            waits.append((time.perf_counter() - start, granted))

    sender.Sender._prepare_produce = prepare_produce  # type: ignore[method-assign]
    sender.Sender._on_produce_response = on_response  # type: ignore[method-assign]
    connection.BrokerConnection.send = send_request  # type: ignore[method-assign]
    intake.RecordIntake._append_in_turn = in_turn  # type: ignore[method-assign]
    sender.Sender._run_once = counted_round  # type: ignore[method-assign]
    assert accumulator  # (the line is the accumulator's: waits in it show up in in_turn)


def scheduled() -> tuple[float, float]:
    """This thread's seconds on the CPU and runnable but waiting (/proc schedstat)."""
    ran, waited, _ = open(f"/proc/self/task/{threading.get_native_id()}/schedstat").read().split()
    return int(ran) / 1e9, int(waited) / 1e9


def process_seconds(pid: int) -> float:
    """A process's user + system CPU seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runnable_seconds(pid: int) -> float:
    """Seconds a process's live threads have waited runnable, for a core (/proc schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except FileNotFoundError:  # (a thread that ended meanwhile)
            pass
    return total / 1e9


async def run(bootstrap: str, topic: str, args: argparse.Namespace,
              settings: dict[str, Any], broker_pid: int | None) -> None:
    value = os.urandom(args.size)
    data = [(b"key-%012d" % (i % 100_000), value) for i in range(args.records)]
    async with Producer(bootstrap, **{"acks": 1, "linger_ms": 5, **settings}) as producer:
        if args.broker == "kafka":  # warmed up as grid.py does it: an untimed bulk write
            await (await producer.enqueue_many("warm-up", data))
            requests.clear(), latencies.clear(), waits.clear(), backlog.clear()
            answered.clear()
            rounds[:] = [0, 0]
        await producer.partitions_for(topic)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        broker_start = process_seconds(broker_pid) if broker_pid else 0.0
        broker_waited = runnable_seconds(broker_pid) if broker_pid else 0.0
        sched, cpu, start = scheduled(), time.process_time(), time.perf_counter()
        if args.shape == "gather":
            futures = [await producer.enqueue(topic, v, k) for k, v in data]
            appended = scheduled(), time.perf_counter() - start
            broker_appending = process_seconds(broker_pid) if broker_pid else 0.0
            await asyncio.gather(*futures)
        else:
            results = [await producer.enqueue_many(topic, data[i:i + 10_000])
                       for i in range(0, len(data), 10_000)]
            appended = scheduled(), time.perf_counter() - start
            broker_appending = process_seconds(broker_pid) if broker_pid else 0.0
            await producer.flush()
            for result in results:
                await result
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        answered[:] = [(w, a) for w, a in answered if w >= start]  # (not the untimed ones)
        broker_cpu = (broker_appending - broker_start,
                      process_seconds(broker_pid) - broker_start) if broker_pid else None
        if broker_pid:
            broker_waited = runnable_seconds(broker_pid) - broker_waited
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    n = args.records
    print(f"{args.shape}, {n} records of {args.size} B, {settings or 'defaults'}: "
          f"{n / wall:,.0f} rec/s, {n * args.size / wall / 1e6:.0f} MB/s, "
          f"{cpu / n * 1e6:.2f} us CPU/record, busy {cpu / wall:.0%}, "
          f"{faults / n:.1f} page faults/record, load {os.getloadavg()[0]:.1f}")
    (ran, runnable), appended_wall = appended
    print(f"  appending: {appended_wall * 1e3:.0f} ms wall; the thread ran "
          f"{(ran - sched[0]) * 1e3:.0f} ms, waited runnable {(runnable - sched[1]) * 1e3:.0f} ms")
    turns = [w for w, granted in waits if granted]
    line = [w for w, granted in waits if not granted]
    print(f"  waits: {len(turns)} turns after a full batch ({sum(turns) * 1e3:.0f} ms), "
          f"{len(line)} in line for memory ({sum(line) * 1e3:.0f} ms)")
    print(f"  {rounds[0]} sender rounds, {rounds[1]} of them wrote nothing")
    print(f"  {len(requests)} requests: {statistics.mean(r[0] for r in requests):.2f} batches, "
          f"{statistics.mean(r[1] for r in requests) / 1e3:.0f} KB each; in flight when "
          f"written: {sorted(collections.Counter(r[2] for r in requests).items())}")
    backlog.sort()
    print(f"  left in the transport (not yet in the kernel) after each write: p50 "
          f"{backlog[len(backlog) // 2] / 1e3:.0f} KB, p90 "
          f"{backlog[len(backlog) * 9 // 10] / 1e3:.0f} KB, max {backlog[-1] / 1e3:.0f} KB")
    if broker_cpu is not None:
        print(f"  the broker's CPU: {broker_cpu[0]:.2f} s appending, {broker_cpu[1]:.2f} s in "
              f"all ({broker_cpu[1] / wall:.0%} of a core, {broker_cpu[1] / n * 1e6:.2f} us a "
              f"record); its threads waited runnable {broker_waited * 1e3:.0f} ms")
    latencies.sort()
    if latencies:  # (none at acks=0)
        print(f"  latency (write to response) ms: p50 {latencies[len(latencies) // 2] * 1e3:.2f}, "
              f"p90 {latencies[len(latencies) * 9 // 10] * 1e3:.2f}, max {latencies[-1] * 1e3:.2f}")
        outstanding(start, start + wall)


def outstanding(start: float, end: float) -> None:
    """How long the run had k requests written and not yet answered (0: the broker had
    nothing of ours to do), and the time from the last answer to the run's end."""
    changes = sorted([(w, 1) for w, _ in answered] + [(a, -1) for _, a in answered])
    spent: collections.Counter[int] = collections.Counter()
    k, since = 0, start
    for when, step in changes:
        spent[k] += when - since
        k, since = k + step, when
    print("  ms with k requests unanswered: " + ", ".join(
        f"{k}: {seconds * 1e3:.0f}" for k, seconds in sorted(spent.items()))
        + f"; from the last answer to the end: {(end - since) * 1e3:.0f} ms")


def run_confluent(bootstrap: str, topic: str, args: argparse.Namespace,
                  broker_pid: int | None) -> None:
    import json

    from confluent_kafka import Producer as ConfluentProducer

    value = os.urandom(args.size)
    data = [(b"key-%012d" % (i % 100_000), value) for i in range(args.records)]
    stats: list[str] = []
    producer = ConfluentProducer({
        "bootstrap.servers": bootstrap, "acks": 1, "enable.idempotence": False, "linger.ms": 5,
        "statistics.interval.ms": 20, "stats_cb": stats.append})

    def produce(into: str) -> None:
        for key, record in data:
            while True:
                try:
                    producer.produce(into, record, key)
                    break
                except BufferError:
                    producer.poll(0.001)
            producer.poll(0)
        producer.flush(60)

    if args.broker == "kafka":
        produce("warm-up")
    producer.list_topics(topic)
    producer.poll(0.05)  # (statistics every 20 ms: the last one before is the baseline)
    del stats[:-1]
    broker_start = process_seconds(broker_pid) if broker_pid else 0.0
    broker_waited = runnable_seconds(broker_pid) if broker_pid else 0.0
    cpu, start = time.process_time(), time.perf_counter()
    produce(topic)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    broker_cpu = process_seconds(broker_pid) - broker_start if broker_pid else None
    broker_waited = runnable_seconds(broker_pid) - broker_waited if broker_pid else 0.0
    producer.poll(0.05)  # (the last statistics)
    n = args.records
    print(f"confluent, {n} records of {args.size} B: {n / wall:,.0f} rec/s, "
          f"{n * args.size / wall / 1e6:.0f} MB/s, {cpu / n * 1e6:.2f} us CPU/record, "
          f"busy {cpu / wall:.0%} (two threads), load {os.getloadavg()[0]:.1f}")
    samples = [json.loads(s)["brokers"] for s in stats]  # (the first: before the run)
    for name, last in samples[-1].items():
        before = samples[0].get(name, {"req": {}, "txbytes": 0})  # (not connected yet)
        sent = last["req"].get("Produce", 0) - before["req"].get("Produce", 0)
        if last["nodeid"] < 0 or not sent:
            continue
        awaited = sorted(s[name]["waitresp_cnt"] for s in samples[1:] if name in s)
        tx_bytes = last["txbytes"] - before["txbytes"]
        print(f"  {sent} produce requests, {tx_bytes / sent / 1e3:.0f} KB each; awaiting a "
              f"response (samples every 20 ms): median {awaited[len(awaited) // 2]}, "
              f"max {awaited[-1]}; round trip ms: p50 {last['rtt']['p50'] / 1e3:.2f}, "
              f"p99 {last['rtt']['p99'] / 1e3:.2f} (the last window)")
    if broker_cpu is not None:
        print(f"  the broker's CPU: {broker_cpu:.2f} s ({broker_cpu / wall:.0%} of a core, "
              f"{broker_cpu / n * 1e6:.2f} us a record); its threads waited runnable "
              f"{broker_waited * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    parser.add_argument("--records", type=int, default=150_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--shape", choices=("gather", "bulk"), default="gather")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--client", choices=("aioproducer", "confluent"), default="aioproducer")
    args = parser.parse_args()
    settings: dict[str, Any] = {}
    for item in args.set:
        name, _, text = item.partition("=")
        settings[name] = text == "true" if text in ("true", "false") else int(text)
    instrument()
    broker: Any = ApacheKafka() if args.broker == "kafka" else EmbeddedBroker()
    with broker:
        broker.create_topic("waits", 6)
        if args.broker == "kafka":
            broker.create_topic("warm-up", 6)
        pid = broker.pid(0) if args.broker == "kafka" else broker.pid
        if args.client == "confluent":
            run_confluent(broker.bootstrap, "waits", args, pid)
        else:
            uvloop.run(run(broker.bootstrap, "waits", args, settings, pid))


if __name__ == "__main__":
    main()
