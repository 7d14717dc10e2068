"""The shape of requests on the wire, and what it costs both ends (issue 42): on one Apache
Kafka node, per run the produce requests and batches written (`Producer.metrics()`), the
client's CPU per record, and the broker JVM's CPU seconds per 1M records over the produce
phase (utime + stime of its /proc/<pid>/stat, read before and after). `--broker embedded`:
the same on the embedded broker (Tansu's CPU in place of the JVM's), for a quick look.

    python benchmarks/request_shape.py [--python PATH ...] [--records N] [--size B]
        [--keyless] [--shape bulk|gather] [--rounds N] [--set name=value ...]
        [--broker kafka|embedded]

Each run is a fresh process (`--python`, default this interpreter: the aioproducer its venv
imports, so `--python /work/main/.venv/bin/python --python .venv/bin/python` is main against
this tree), a fresh topic of 6 partitions, records of --size bytes (keyed by `key-` and a
number below 100,000, or keyless), each setting the default but linger 5 ms and acks=1
(`--set batch_size=16384` to override one). The pythons alternate within a round, the first
going first in odd rounds; an untimed run first warms the broker's JIT. bulk is enqueue_many
of 10,000 records a call then flush(); gather is `[await enqueue() ...]` then
`asyncio.gather`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def child(args: argparse.Namespace) -> None:
    """One run, in this process: say "ready", wait for a line, produce, print a JSON line."""
    import asyncio

    from aioproducer import Producer
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    value = os.urandom(args.size)
    data: list[tuple[bytes | None, bytes]] = (
        [(None, value)] * args.records if args.keyless else
        [(b"key-%012d" % (i % 100_000), value) for i in range(args.records)])

    async def produce() -> dict[str, Any]:
        async with Producer(args.bootstrap, acks=1, linger_ms=5,
                            **settings(args.set)) as producer:
            await producer.partitions_for(args.topic)
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            cpu, start = time.process_time(), time.perf_counter()
            if args.shape == "bulk":
                results = [await producer.enqueue_many(args.topic, data[i:i + 10_000])
                           for i in range(0, len(data), 10_000)]
                await producer.flush()
                for result in results:
                    await result
            else:
                futures = [await producer.enqueue(args.topic, v, k) for k, v in data]
                await asyncio.gather(*futures)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            m = producer.metrics()
        return {"wall": wall, "cpu": cpu, "requests": m.produce_requests,
                "batches": m.batches_sent, "records": m.records_sent}

    print(json.dumps(run(produce())), flush=True)


def settings(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, _, text = item.partition("=")
        out[name] = text == "true" if text in ("true", "false") else int(text)
    return out


def jvm_seconds(pid: int) -> float:
    """The process's user + system CPU seconds (its threads', reaped or not)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(python: str, broker: Any, topic: str, args: argparse.Namespace,
            pid: int) -> dict[str, Any]:
    broker.create_topic(topic, 6)
    command = [python, __file__, "--child", broker.bootstrap, "--topic", topic,
               "--records", str(args.records), "--size", str(args.size), "--shape", args.shape,
               *(["--keyless"] if args.keyless else []), *(f"--set={s}" for s in args.set)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          cwd="/") as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{python}: the client did not start")
            before = jvm_seconds(pid)
            process.stdin.write("go\n")
            process.stdin.flush()
            result = json.loads(process.stdout.readline())
            result["broker_cpu"] = jvm_seconds(pid) - before
        finally:
            process.stdin.close()
            process.wait(60)
    if hasattr(broker, "run_tool"):  # Apache Kafka (disk: 100 MB a run)
        broker.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                        broker.bootstrap, "--delete", "--topic", topic)
    if result["records"] != args.records:
        raise RuntimeError(f"{python}: {result['records']} of {args.records} acknowledged")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", action="append", default=[])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--keyless", action="store_true")
    parser.add_argument("--shape", choices=("bulk", "gather"), default="bulk")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--broker", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--child", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.bootstrap = args.child
        child(args)
        return
    sys.path.insert(0, str(ROOT))
    from aioproducer.testing import ApacheKafka, EmbeddedBroker

    pythons = args.python or [sys.executable]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in pythons}
    print(f"{args.shape}, {args.records:,} {'keyless' if args.keyless else 'keyed'} records "
          f"of {args.size} B, {args.set or 'defaults'} (linger 5 ms, acks=1); "
          f"started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    kafka = args.broker == "kafka"
    with ApacheKafka() if kafka else EmbeddedBroker() as broker:
        pid = broker.pid(0) if kafka else broker.pid
        assert pid is not None
        if kafka:
            one_run(pythons[0], broker, "warm-up", args, pid)
        for round_ in range(args.rounds):
            order = pythons if round_ % 2 == 0 else pythons[::-1]
            for index, python in enumerate(order):
                r = one_run(python, broker, f"shape-{round_}-{index}", args, pid)
                runs[python].append(r)
                n = args.records
                print(f"round {round_ + 1} {python}: {n / r['wall']:,.0f} rec/s, "
                      f"{r['cpu'] / n * 1e6:.2f} us CPU/record, {r['requests']:,} requests "
                      f"for {r['batches']:,} batches ({r['batches'] / r['requests']:.2f} a "
                      f"request), broker {r['broker_cpu'] / n * 1e6:.2f} CPU s per 1M "
                      f"records; load {os.getloadavg()[0]:.1f}", flush=True)
    for python, results in runs.items():
        n = args.records

        def median(f: Any) -> float:
            return statistics.median(f(r) for r in results)

        print(f"median {python}: {median(lambda r: n / r['wall']):,.0f} rec/s, "
              f"{median(lambda r: r['cpu']) / n * 1e6:.2f} us CPU/record, "
              f"{median(lambda r: r['batches'] / r['requests']):.2f} batches a request "
              f"({median(lambda r: r['requests']):,.0f} requests), broker "
              f"{median(lambda r: r['broker_cpu']) / n * 1e6:.2f} CPU s per 1M records")


if __name__ == "__main__":
    main()
