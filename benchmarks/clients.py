"""One benchmark run in this (fresh) process: `python benchmarks/clients.py CLIENT SCENARIO ...`.

Prints one JSON line: wall seconds of the produce phase, the process's CPU seconds, peak RSS,
and latencies for the latency scenario. The runner (run.py) counts the records back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
import time

SETTINGS = {"acks": 1, "linger_ms": 5, "batch_size": 16384}


def records(n: int, value_size: int, keyless: bool = False):
    value = os.urandom(value_size)
    if keyless:
        return [(None, value)] * n
    return [(b"key-%012d" % (i % 100_000), value) for i in range(n)]


def setting(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    return name, int(value)


# -- aioproducer ---------------------------------------------------------------------------------

async def aioproducer_run(args, data):
    from aioproducer import Producer

    settings = dict(SETTINGS, acks=args.acks, enable_idempotence=args.idempotence,
                    compression_type=args.codec)
    if args.defaults:
        del settings["batch_size"]
    if args.batch_size:
        settings["batch_size"] = args.batch_size
    settings.update(args.set)
    if args.idempotence:
        settings["acks"] = "all"  # idempotence needs it
    if args.scenario == "latency":
        settings["linger_ms"] = 0
    if args.observer is not None:
        settings["hooks"] = [args.observer]
    async with Producer(args.bootstrap, **settings) as producer:
        if args.scenario == "bulk":
            start = time.perf_counter()
            results = [await producer.enqueue_many(args.topic, data[i:i + 10_000])
                       for i in range(0, len(data), 10_000)]
            await producer.flush()
            for result in results:
                await result
            return time.perf_counter() - start, []
        return await SHAPES[args.scenario](producer.enqueue, producer.send, producer.flush,
                                           args, data)


def otel_hooks(trace_sends: bool):
    """OpenTelemetry's SDK with no exporter: what the instrumentation itself costs."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from aioproducer.observability.otel import OpenTelemetryHooks
    return OpenTelemetryHooks(tracer_provider=TracerProvider(), meter_provider=MeterProvider(),
                              trace_sends=trace_sends)


def prometheus_hooks():
    from prometheus_client import CollectorRegistry

    from aioproducer.observability.prometheus import PrometheusCollector
    return PrometheusCollector(CollectorRegistry())


HOOKS = {"otel-metrics": lambda: otel_hooks(False), "otel-traced": lambda: otel_hooks(True),
         "prometheus": prometheus_hooks}


def blocking_run(args, data):
    """Sync code: BlockingProducer.produce() per record from one thread, then flush()."""
    from aioproducer import BlockingProducer

    with BlockingProducer(args.bootstrap, **dict(SETTINGS, acks=args.acks),
                          enable_idempotence=False) as producer:
        start = time.perf_counter()
        produce = producer.produce
        for key, value in data:
            produce(args.topic, value, key)
        producer.flush()
        return time.perf_counter() - start, []


def blocking_bulk_run(args, data):
    """Sync code, bulk: BlockingProducer.produce_many() in 10,000-record calls, then flush()."""
    from aioproducer import BlockingProducer

    with BlockingProducer(args.bootstrap, **dict(SETTINGS, acks=args.acks),
                          enable_idempotence=False) as producer:
        start = time.perf_counter()
        results = [producer.produce_many(args.topic, data[i:i + 10_000])
                   for i in range(0, len(data), 10_000)]
        producer.flush()
        for result in results:
            result.result()
        return time.perf_counter() - start, []


# -- aiokafka ------------------------------------------------------------------------------------

async def aiokafka_run(args, data):
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks=args.acks,
                                linger_ms=0 if args.scenario == "latency" else 5,
                                **({} if args.defaults else {"max_batch_size": 16384}),
                                enable_idempotence=False,
                                compression_type=None if args.codec == "none" else args.codec)
    await producer.start()
    try:
        if args.scenario == "bulk":
            return await aiokafka_batches(producer, args, data)

        async def enqueue(topic, value, key):
            return await producer.send(topic, value, key=key)
        return await SHAPES[args.scenario](enqueue, producer.send_and_wait, producer.flush,
                                           args, data)
    finally:
        await producer.stop()


async def aiokafka_batches(producer, args, data):
    """aiokafka's batch API: one open batch per partition, send_batch when it is full, gather
    the futures. Keyed records go where aiokafka's own partitioner puts them (the batch API
    leaves that to the caller; ignoring it would break per-key order); keyless records fill
    one partition's batch after another."""
    from aiokafka.partitioner import murmur2

    partitions = sorted(await producer.partitions_for(args.topic))
    start = time.perf_counter()
    futures = []
    batches = {}
    keyless_partition = 0
    for key, value in data:
        if key is None:
            partition = keyless_partition
        else:
            partition = partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
        batch = batches.get(partition)
        if batch is None:
            batch = batches[partition] = producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None) is None:
            futures.append(await producer.send_batch(batch, args.topic, partition=partition))
            batch = batches[partition] = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)
            if key is None:
                keyless_partition = (keyless_partition + 1) % len(partitions)
    for partition, batch in batches.items():
        futures.append(await producer.send_batch(batch, args.topic, partition=partition))
    await asyncio.gather(*futures)
    return time.perf_counter() - start, []


# -- confluent-kafka -----------------------------------------------------------------------------

def _confluent_config(args):
    config = {"bootstrap.servers": args.bootstrap, "acks": args.acks, "enable.idempotence": False,
              "linger.ms": 0 if args.scenario == "latency" else 5, "batch.size": 16384,
              "compression.type": args.codec}
    if args.defaults:
        del config["batch.size"]
    if args.batch_size:
        config["batch.size"] = args.batch_size
    return config


def confluent_sync_run(args, data):
    from confluent_kafka import Producer

    producer = Producer(_confluent_config(args))
    latencies = []
    start = time.perf_counter()
    if args.scenario == "load-latency":
        # The same arrival rate as the asyncio clients' 100 tasks, from one thread: each
        # record at its slot, its latency taken by its delivery report.
        for i, (key, value) in enumerate(data):
            while (wait := start + i / args.rate - time.perf_counter()) > 0:
                producer.poll(math.ceil(wait * 1000) / 1000)
            sent = time.perf_counter()
            producer.produce(args.topic, value, key, on_delivery=lambda err, msg, sent=sent:
                             latencies.append(time.perf_counter() - sent))
            producer.poll(0)
    elif args.scenario == "latency":
        for i, (key, value) in enumerate(data):
            while (wait := start + i / args.rate - time.perf_counter()) > 0:
                # poll() waits in whole milliseconds: poll(0.0005) would be poll(0), a loop
                # spinning on a core.
                producer.poll(math.ceil(wait * 1000) / 1000)
            acked: list[float] = []
            sent = time.perf_counter()
            producer.produce(args.topic, value, key,
                             on_delivery=lambda err, msg: acked.append(time.perf_counter()))
            while not acked:  # returns as soon as the delivery report is served
                producer.poll(1)
            latencies.append(acked[0] - sent)
    else:
        for key, value in data:
            while True:
                try:
                    producer.produce(args.topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.001)
            producer.poll(0)
    producer.flush(60)
    return time.perf_counter() - start, latencies


def confluent_batch_run(args, data):
    """Sync code, bulk, with confluent-kafka: Producer.produce_batch() in 10,000-message calls
    (its messages are dicts, made before the timed phase as our tuples are), then flush().
    What librdkafka's queue (100,000 messages) cannot take yet comes back marked `_error`:
    sent again after a poll."""
    from confluent_kafka import Producer

    producer = Producer(_confluent_config(args))
    chunks = [[{"key": key, "value": value} for key, value in data[i:i + 10_000]]
              for i in range(0, len(data), 10_000)]
    start = time.perf_counter()
    for chunk in chunks:
        while chunk:
            try:
                queued = producer.produce_batch(args.topic, chunk)
            except BufferError:
                queued = 0
                for message in chunk:
                    message["_error"] = True
            if queued < len(chunk):
                chunk = [m for m in chunk if m.pop("_error", None) is not None]
                producer.poll(0.001)
            else:
                chunk = []
            producer.poll(0)
    producer.flush(60)
    return time.perf_counter() - start, []


def kafka_python_run(args, data):
    """Sync code with kafka-python: send() per record from one thread, then flush()."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=args.bootstrap, acks=args.acks, linger_ms=5,
                             batch_size=16384)
    try:
        start = time.perf_counter()
        for key, value in data:
            producer.send(args.topic, value, key=key)
        producer.flush()
        return time.perf_counter() - start, []
    finally:
        producer.close()


async def confluent_aio_run(args, data):
    from confluent_kafka.aio import AIOProducer

    producer = AIOProducer(_confluent_config(args))
    try:
        async def enqueue(topic, value, key):
            return await producer.produce(topic, value, key)

        async def send(topic, value, key):
            return await (await producer.produce(topic, value, key))
        return await SHAPES[args.scenario](enqueue, send, producer.flush, args, data)
    finally:
        await producer.close()


# -- the shapes of use ---------------------------------------------------------------------------

async def per_record(enqueue, send, flush, args, data):
    """`fut = await enqueue()` per record, every future awaited at the end."""
    start = time.perf_counter()
    futures = [await enqueue(args.topic, value, key) for key, value in data]
    await flush()
    for future in futures:
        await future
    return time.perf_counter() - start, []


async def concurrent(enqueue, send, flush, args, data):
    """1,000 tasks, each awaiting send() in a loop: an async service under load."""
    tasks = 1000
    share = len(data) // tasks

    async def worker(part):
        for key, value in part:
            await send(args.topic, value, key)

    start = time.perf_counter()
    await asyncio.gather(*(worker(data[i * share:(i + 1) * share]) for i in range(tasks)))
    return time.perf_counter() - start, []


async def latency(enqueue, send, flush, args, data):
    """Send -> ack latency at args.rate records a second, one record at a time: each is sent
    at its slot, or when the previous one is acknowledged if that is later. Every client gets
    this same pattern (confluent_sync_run does it with poll()): in an open loop, each
    harness's timer granularity decided how often records queued behind each other."""
    latencies = []
    start = time.perf_counter()
    for i, (key, value) in enumerate(data):
        delay = start + i / args.rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        await send(args.topic, value, key)
        latencies.append(time.perf_counter() - sent)
    return time.perf_counter() - start, latencies


async def enqueue_gather(enqueue, send, flush, args, data):
    """`futs = [await enqueue() ...]; await asyncio.gather(*futs)`."""
    start = time.perf_counter()
    futures = [await enqueue(args.topic, value, key) for key, value in data]
    await asyncio.gather(*futures)
    return time.perf_counter() - start, []


async def enqueue_wait(enqueue, send, flush, args, data):
    """`futs = [await enqueue() ...]; await asyncio.wait(futs)`, then each result read."""
    start = time.perf_counter()
    futures = [await enqueue(args.topic, value, key) for key, value in data]
    done, _ = await asyncio.wait(futures)
    for future in done:
        future.result()
    return time.perf_counter() - start, []


async def enqueue_as_completed(enqueue, send, flush, args, data):
    """`futs = [await enqueue() ...]; for f in asyncio.as_completed(futs): await f`."""
    start = time.perf_counter()
    futures = [await enqueue(args.topic, value, key) for key, value in data]
    for future in asyncio.as_completed(futures):
        await future
    return time.perf_counter() - start, []


async def gather_send(enqueue, send, flush, args, data):
    """`await asyncio.gather(*(send() for ...))`: gather makes a Task per coroutine (peers);
    aioproducer's send() returns a future, in line for memory too, so no Task."""
    start = time.perf_counter()
    await asyncio.gather(*(send(args.topic, value, key) for key, value in data))
    return time.perf_counter() - start, []


async def taskgroup_send(enqueue, send, flush, args, data):
    """`async with asyncio.TaskGroup() as tg: tg.create_task(send()) ...`."""
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for key, value in data:
            group.create_task(send(args.topic, value, key))
    return time.perf_counter() - start, []


async def load_latency(enqueue, send, flush, args, data):
    """Send -> ack latency under load: 100 tasks, each sending one record at a time at
    args.rate / 100 records a second (its slots spread between the others'), at linger 5 ms."""
    tasks = 100
    share = len(data) // tasks
    latencies = []
    start = time.perf_counter()

    async def worker(index, part):
        for i, (key, value) in enumerate(part):
            delay = start + (i * tasks + index) / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter()
            await send(args.topic, value, key)
            latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(worker(t, data[t * share:(t + 1) * share]) for t in range(tasks)))
    return time.perf_counter() - start, latencies


SHAPES = {"per-record": per_record, "bulk": per_record, "concurrent": concurrent,
          "latency": latency, "enqueue-gather": enqueue_gather, "enqueue-wait": enqueue_wait,
          "enqueue-as-completed": enqueue_as_completed, "gather-send": gather_send,
          "taskgroup-send": taskgroup_send, "load-latency": load_latency}
CLIENTS = {"aioproducer": aioproducer_run, "aiokafka": aiokafka_run,
           "confluent-sync": confluent_sync_run, "confluent-aio": confluent_aio_run,
           "kafka-python": kafka_python_run}
# Sync code (no event loop of the caller's): one thread producing record by record.
SYNC = {"aioproducer": blocking_run, "confluent-sync": confluent_sync_run,
        "kafka-python": kafka_python_run}
# Sync code, bulk: one thread handing over 10,000 records a call.
SYNC_BULK = {"aioproducer": blocking_bulk_run, "confluent-sync": confluent_batch_run}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("client", choices=CLIENTS)
    parser.add_argument("scenario", choices=[*SHAPES, "sync", "sync-bulk"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--acks", type=lambda a: a if a == "all" else int(a), default=1,
                        help="1, or all (the 3-node Apache Kafka's rows)")
    parser.add_argument("--idempotence", action="store_true")
    parser.add_argument("--keyless", action="store_true", help="records without keys")
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--hooks", choices=["none", *HOOKS], default="none",
                        help="aioproducer: observe with these hooks (no exporter)")
    parser.add_argument("--preload", action="store_true",
                        help="import the hooks' SDKs first (as an instrumented application "
                             "has): the hooks' cost apart from what the imports cost")
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--defaults", action="store_true",
                        help="each client's own batch size (not 16 KiB for all): the grid")
    parser.add_argument("--batch-size", type=int, default=0, help="this batch size instead")
    parser.add_argument("--set", type=setting, action="append", default=[], metavar="NAME=INT",
                        help="aioproducer: this integer setting (buffer_memory=67108864)")
    args = parser.parse_args()
    data = records(args.records, args.value_size, args.keyless)
    run = SYNC[args.client] if args.scenario == "sync" else \
        SYNC_BULK[args.client] if args.scenario == "sync-bulk" else CLIENTS[args.client]
    # Made before the run, so that cpu_run (the run's CPU: no interpreter start, no import
    # of the hooks' SDK) shows what observing costs.
    if args.preload:
        import opentelemetry.sdk.metrics  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
        import prometheus_client  # noqa: F401
    args.observer = HOOKS[args.hooks]() if args.hooks != "none" else None
    if args.client == "aioproducer":
        import aioproducer  # noqa: F401  (imported by the hooks too: out of cpu_run for both)
    cpu_start = time.process_time()
    if asyncio.iscoroutinefunction(run):
        if args.uvloop:
            import uvloop
            seconds, latencies = uvloop.run(run(args, data))
        else:
            seconds, latencies = asyncio.run(run(args, data))
    else:
        seconds, latencies = run(args, data)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = json.dumps({"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime,
                         "cpu_run": time.process_time() - cpu_start,
                         "rss_mb": peak_rss_mb(usage), "latencies": latencies})
    # Not print(): under PYTHONUNBUFFERED, sys.stdout writes straight to an unbuffered FileIO
    # and drops the rest of a partial write (a signal during a large write to the pipe;
    # CPython gh-86210): a latency run's ~470 kB line came back cut about once in 15 runs.
    # A buffered writer writes until all of it is out.
    with open(sys.stdout.fileno(), "w", closefd=False) as out:
        out.write(result + "\n")


def peak_rss_mb(usage) -> float:
    """This process's peak RSS. Not ru_maxrss on Linux: it survives exec, so it would report
    the runner's peak whenever that is higher."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return usage.ru_maxrss / 1024


if __name__ == "__main__":
    main()
