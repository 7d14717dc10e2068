"""CPU a record of Produce v13 (topics named by their 16-byte id, KIP-516) against v12 (by
name), on Apache Kafka 4.4 (aioproducer.testing.ApacheKafka, which speaks v13): a producer
writes RECORDS 100-byte records round-robin over TOPICS topics of one partition each (every
request then carries every topic: the per-topic cost of the request encoder, the answer
decoder and the sender's naming of topics by id is paid on each), and over 1 topic. v12 is
forced by capping CLIENT_VERSIONS for that producer's run. Rounds alternate the four cases;
prints each case's CPU a record (time.process_time over the produce phase: enqueue of every
record, then flush), its medians and the requests a run wrote.

    python benchmarks/topic_ids.py [TOPICS] [RECORDS] [--rounds N] [--acks 1|all]
        [--flush-every N]
"""

import argparse
import asyncio
import os
import statistics
import time

from confluent_kafka.admin import AdminClient, NewTopic

from aioproducer import Producer
from aioproducer.protocol import messages
from aioproducer.protocol.messages import ApiKey
from aioproducer.testing import ApacheKafka

p = argparse.ArgumentParser()
p.add_argument("topics", type=int, nargs="?", default=500)
p.add_argument("records", type=int, nargs="?", default=100_000)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--acks", default="all", choices=("1", "all"))
p.add_argument("--flush-every", type=int, default=0,
               help="flush after this many records (0: only at the end): at TOPICS, every "
                    "request carries one record a topic, the per-topic cost's worst case")
args = p.parse_args()
value = os.urandom(100)
HIGHEST = messages.CLIENT_VERSIONS[ApiKey.PRODUCE]


async def produce(bootstrap: str, topics: list[str], version: int) -> tuple[float, int]:
    """CPU seconds a record over the produce phase, and the requests written."""
    messages.CLIENT_VERSIONS[ApiKey.PRODUCE] = (HIGHEST[0], version)
    try:
        async with Producer(bootstrap, acks=1 if args.acks == "1" else "all",
                            linger_ms=5) as producer:
            for topic in topics:
                await producer.partitions_for(topic)
            before, requests = time.process_time(), producer.metrics().produce_requests
            count = len(topics)
            for i in range(args.records):
                await producer.enqueue(topics[i % count], value)
                if args.flush_every and i % args.flush_every == args.flush_every - 1:
                    await producer.flush()
            await producer.flush()
            cpu = time.process_time() - before
            metrics = producer.metrics()
            assert metrics.records_sent == args.records, metrics
            return cpu / args.records, metrics.produce_requests - requests
    finally:
        messages.CLIENT_VERSIONS[ApiKey.PRODUCE] = HIGHEST


def main() -> None:
    with ApacheKafka() as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        many = [f"t{i:04d}" for i in range(args.topics)]
        for future in admin.create_topics([NewTopic(t, 1, 1) for t in many + ["one"]]).values():
            future.result(timeout=120)
        cases = {(len(many), v): many for v in (12, 13)} | {(1, v): ["one"] for v in (12, 13)}
        cpu: dict[tuple[int, int], list[float]] = {case: [] for case in cases}
        for r in range(args.rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for case in order:
                per_record, requests = asyncio.run(produce(kafka.bootstrap, cases[case],
                                                           case[1]))
                cpu[case].append(per_record)
                print(f"round {r}: {case[0]} topic(s) v{case[1]}: "
                      f"{per_record * 1e6:.2f} us a record, {requests} requests", flush=True)
        for (topics, version), runs in cpu.items():
            print(f"{topics} topic(s) v{version}: median {statistics.median(runs) * 1e6:.2f} "
                  f"us a record ({', '.join(f'{x * 1e6:.2f}' for x in runs)})")


main()
