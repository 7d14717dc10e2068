"""The `aioproducer` command.

- `aioproducer broker`: the embedded dev broker in the foreground.
- `aioproducer produce TOPIC`: records from stdin or a file, like `kcat -P`.
- `aioproducer perf`: a load test in the spirit of Kafka's kafka-producer-perf-test.

Producer settings come from `--producer-props KEY=VALUE ...` and/or `--producer.config FILE`
(a Java properties file), with Kafka's dotted names or ours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any, AsyncIterator, Iterable, Sequence

from .config import ProducerConfig
from .errors import KafkaError
from .producer import Producer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aioproducer", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="run the embedded dev broker until Ctrl-C")
    broker.add_argument("--port", type=int, default=9092)

    produce = commands.add_parser("produce", help="produce records read from stdin or a file")
    produce.add_argument("topic")
    produce.add_argument("--file", help="read from this file instead of stdin")
    produce.add_argument("--format", choices=("lines", "json"), default="lines",
                         help="lines: one value per line; json: one object per line with "
                              "value, and optionally key, headers, partition")
    produce.add_argument("--key-separator",
                         help="with lines: split each line into KEY<sep>VALUE at the first sep")
    _add_connection_options(produce, required=True)

    perf = commands.add_parser("perf", help="produce records as fast as asked; report speed")
    perf.add_argument("--topic", default="perf-test")
    perf.add_argument("--partitions", type=int, default=6,
                      help="partitions of the topic when this command starts its own broker")
    perf.add_argument("--num-records", type=int, default=1_000_000)
    perf.add_argument("--record-size", type=int, default=100)
    perf.add_argument("--throughput", type=float, default=-1,
                      help="records per second at most (-1: no limit)")
    perf.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_connection_options(perf, required=False)

    args = parser.parse_args(argv)
    try:
        if args.command == "broker":
            return _run_broker(args.port)
        return asyncio.run(_produce(args) if args.command == "produce" else _perf(args))
    except (KafkaError, ValueError, OSError) as exc:
        print(f"aioproducer {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _add_connection_options(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--bootstrap-servers", required=required,
                        help=None if required else "default: start an embedded broker")
    parser.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE",
                        help="producer settings: Kafka names (linger.ms=5) or ours (linger_ms=5)")
    parser.add_argument("--producer.config", dest="producer_config", metavar="FILE",
                        help="a properties file of producer settings")


def _config(args: argparse.Namespace, bootstrap: str) -> ProducerConfig:
    raw: dict[str, str] = {}
    if args.producer_config:
        with open(args.producer_config) as f:
            raw.update(_read_properties(f))
    for prop in args.producer_props:
        name, sep, value = prop.partition("=")
        if not sep:
            raise ValueError(f"--producer-props takes KEY=VALUE, not {prop!r}")
        raw[name.strip()] = value
    raw = {name.replace("_", "."): value for name, value in raw.items()}
    raw["bootstrap.servers"] = bootstrap
    return ProducerConfig.from_properties(raw)


def _read_properties(lines: Iterable[str]) -> dict[str, str]:
    """A Java properties file's `key=value` (or `key: value`) lines; # and ! start comments."""
    properties = {}
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        for separator in ("=", ":"):
            if separator in line:
                name, _, value = line.partition(separator)
                properties[name.strip()] = value.strip()
                break
        else:
            raise ValueError(f"not a property line: {line!r}")
    return properties


def _run_broker(port: int) -> int:
    from .testing import EmbeddedBroker

    with EmbeddedBroker(port=port) as broker:
        print(f"embedded Kafka broker (Tansu) at {broker.bootstrap}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


# -- produce ------------------------------------------------------------------------------------


def _records(lines: Iterable[str], fmt: str, separator: str | None) -> Iterable[dict[str, Any]]:
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        if fmt == "json":
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number} is not JSON: {exc}") from None
            if not isinstance(item, dict) or "value" not in item:
                raise ValueError(f"line {number}: expected an object with a \"value\"")
            headers = item.get("headers") or []
            if isinstance(headers, dict):
                headers = list(headers.items())
            yield {"value": _encode(item["value"]), "key": _encode(item.get("key")),
                   "partition": item.get("partition"),
                   "headers": [(str(k), _encode(v)) for k, v in headers]}
        elif separator is not None:
            key, found, value = line.partition(separator)
            if not found:
                raise ValueError(f"line {number} has no key separator {separator!r}")
            yield {"value": value.encode(), "key": key.encode()}
        else:
            yield {"value": line.encode()}


def _encode(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else json.dumps(value).encode()


async def _produce(args: argparse.Namespace) -> int:
    source = open(args.file) if args.file else sys.stdin
    started = time.perf_counter()
    handles = []
    try:
        async with Producer(config=_config(args, args.bootstrap_servers)) as producer:
            for record in _records(source, args.format, args.key_separator):
                value = record.pop("value")
                handles.append(await producer.enqueue(args.topic, value, **record))
            await producer.flush()
    finally:
        if args.file:
            source.close()
    failed = [h.exception() for h in handles if h.exception() is not None]
    seconds = time.perf_counter() - started
    print(f"{len(handles) - len(failed)} of {len(handles)} records produced to {args.topic} "
          f"in {seconds:.2f} s", file=sys.stderr)
    if failed:
        print(f"aioproducer produce: {len(failed)} failed; first: {failed[0]}", file=sys.stderr)
        return 1
    return 0


# -- perf ---------------------------------------------------------------------------------------


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


async def _perf(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    payload = os.urandom(args.record_size)
    sample_every = max(1, args.num_records // 20_000)
    latencies: list[float] = []
    sampled = []
    async with _bootstrap(args) as bootstrap:
        async with Producer(config=_config(args, bootstrap)) as producer:
            progress = tqdm(total=args.num_records, unit="rec", unit_scale=True,
                            disable=args.json, file=sys.stderr, mininterval=0.25)
            start = time.perf_counter()
            for i in range(args.num_records):
                if args.throughput > 0:
                    ahead = i / args.throughput - (time.perf_counter() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                handle = await producer.enqueue(args.topic, payload)
                if i % sample_every == 0:
                    sent = time.perf_counter()
                    sampled.append(handle)
                    def done(_: object, t0: float = sent) -> None:
                        latencies.append(time.perf_counter() - t0)
                    handle.add_done_callback(done)
                if i % 1000 == 999:
                    progress.update(1000)
            await producer.flush()
            elapsed = time.perf_counter() - start
            progress.update(args.num_records - progress.n)
            progress.close()
    failures = sum(1 for h in sampled if h.exception() is not None)
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
