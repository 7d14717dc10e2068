"""The `aioproducer` command: `broker` (embedded dev broker) and `perf` (a producer load test
in the spirit of Kafka's kafka-producer-perf-test)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import AsyncIterator, Sequence

from .config import ProducerConfig
from .errors import KafkaError
from .producer import Producer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aioproducer", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="run the embedded dev broker until Ctrl-C")
    broker.add_argument("--port", type=int, default=9092)

    perf = commands.add_parser("perf", help="produce records as fast as asked and report speed")
    perf.add_argument("--bootstrap-servers", help="default: start an embedded broker")
    perf.add_argument("--topic", default="perf-test")
    perf.add_argument("--partitions", type=int, default=6,
                      help="partitions of the topic when this command creates it")
    perf.add_argument("--num-records", type=int, default=1_000_000)
    perf.add_argument("--record-size", type=int, default=100)
    perf.add_argument("--throughput", type=float, default=-1,
                      help="records per second at most (-1: no limit)")
    perf.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE",
                      help="producer settings, Kafka names (linger.ms=5) or ours (linger_ms=5)")
    perf.add_argument("--json", action="store_true", help="print the result as JSON")

    args = parser.parse_args(argv)
    try:
        if args.command == "broker":
            return _run_broker(args.port)
        return asyncio.run(_perf(args))
    except (KafkaError, ValueError) as exc:
        print(f"aioproducer {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run_broker(port: int) -> int:
    from .testing import EmbeddedBroker

    with EmbeddedBroker(port=port) as broker:
        print(f"embedded Kafka broker (Tansu) at {broker.bootstrap}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


@contextlib.asynccontextmanager
async def _bootstrap(args: argparse.Namespace) -> AsyncIterator[str]:
    if args.bootstrap_servers:
        yield args.bootstrap_servers
        return
    from .testing import EmbeddedBroker

    async with EmbeddedBroker() as broker:
        broker.create_topic(args.topic, args.partitions)
        if not args.json:
            print(f"started an embedded broker at {broker.bootstrap}", flush=True)
        yield broker.bootstrap


def _config(bootstrap: str, props: Sequence[str]) -> ProducerConfig:
    """Settings as Kafka's tools take them: KEY=VALUE strings, Kafka's dotted names or ours."""
    raw = {"bootstrap.servers": bootstrap}
    for prop in props:
        name, sep, value = prop.partition("=")
        if not sep:
            raise ValueError(f"--producer-props takes KEY=VALUE, not {prop!r}")
        raw[name.replace("_", ".")] = value
    return ProducerConfig.from_properties(raw)


async def _perf(args: argparse.Namespace) -> int:
    payload = os.urandom(args.record_size)
    sample_every = max(1, args.num_records // 20_000)
    latencies: list[float] = []
    failures = 0
    async with _bootstrap(args) as bootstrap:
        async with Producer(config=_config(bootstrap, args.producer_props)) as producer:
            start = time.perf_counter()
            handles = []
            for i in range(args.num_records):
                if args.throughput > 0:
                    ahead = i / args.throughput - (time.perf_counter() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                handle = await producer.enqueue(args.topic, payload)
                if i % sample_every == 0:
                    handles.append((time.perf_counter(), handle))
                    handle.add_done_callback(
                        lambda h, t0=handles[-1][0]: latencies.append(time.perf_counter() - t0))
            await producer.flush()
            elapsed = time.perf_counter() - start
            failures = sum(1 for _, h in handles if h.exception() is not None)
    latencies.sort()
    result = {
        "records": args.num_records,
        "seconds": round(elapsed, 3),
        "records_per_s": round(args.num_records / elapsed),
        "mb_per_s": round(args.num_records * args.record_size / elapsed / 1e6, 2),
        **{f"latency_ms_{name}": round(_percentile(latencies, q) * 1000, 2)
           for name, q in (("p50", .5), ("p95", .95), ("p99", .99), ("p99.9", .999), ("max", 1))},
        "sampled_failures": failures,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['records']} records sent, {result['records_per_s']:,} records/s "
              f"({result['mb_per_s']} MB/s), latency ms p50 {result['latency_ms_p50']} "
              f"p95 {result['latency_ms_p95']} p99 {result['latency_ms_p99']} "
              f"p99.9 {result['latency_ms_p99.9']} max {result['latency_ms_max']}")
    return 1 if failures else 0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


if __name__ == "__main__":
    sys.exit(main())
