"""Small transactions on one real Apache Kafka node: Transactions V2 against V1, and
confluent-kafka's transactional producer (librdkafka speaks V1 only).

    python benchmarks/transactions.py [--transactions N] [--runs R] [--records 10]
                                      [--broker-config KEY=VALUE ...]

Starts one Kafka 4.4 node (aioproducer.testing.ApacheKafka) formatted with
transaction.version=2; runs aioproducer's V2 transactions, then downgrades the cluster's
transaction.version to 0 (Kafka's FeatureCommand) and runs aioproducer's V1 transactions on
the same node, then confluent-kafka's. Each run is one producer doing N transactions in a
row, each of `--records` 100-byte records (sent without waiting, then the commit, which
waits for them), after 20 warm-up transactions; prints transactions/s and records/s, the
median of the runs, the CPU time per transaction (this process's: librdkafka's threads
too), and how many requests of each kind aioproducer sent per transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aioproducer import Producer  # noqa: E402
from aioproducer.client.connection import BrokerConnection  # noqa: E402
from aioproducer.protocol.messages import ApiKey  # noqa: E402
from aioproducer.testing import ApacheKafka  # noqa: E402

VALUE = bytes(100)
WARMUP = 20


async def aioproducer_run(bootstrap: str, topic: str, transactions: int, records: int,
                          requests: dict[ApiKey, int]) -> tuple[float, float, int]:
    """Seconds and CPU seconds for `transactions` transactions, and the transaction version
    used."""
    async with Producer(bootstrap, transactional_id=f"bench-{uuid.uuid4().hex[:8]}",
                        linger_ms=5) as producer:
        for _ in range(WARMUP):
            async with producer.transaction():
                for _ in range(records):
                    await producer.enqueue(topic, VALUE)
        requests.clear()
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(transactions):
            producer.begin_transaction()
            for _ in range(records):
                await producer.enqueue(topic, VALUE)
            await producer.commit_transaction()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        return elapsed, cpu, producer.metrics().transaction_version


def confluent_run(bootstrap: str, topic: str, transactions: int, records: int
                  ) -> tuple[float, float]:
    """As aioproducer_run; the CPU time counts librdkafka's threads (in this process) too."""
    from confluent_kafka import Producer as Confluent

    producer = Confluent({"bootstrap.servers": bootstrap, "linger.ms": 5,
                          "transactional.id": f"bench-c-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)

    def one() -> None:
        producer.begin_transaction()
        for _ in range(records):
            producer.produce(topic, VALUE)
        producer.commit_transaction(30)

    for _ in range(WARMUP):
        one()
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(transactions):
        one()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    producer.flush(10)
    return elapsed, cpu


def count_requests(requests: dict[ApiKey, int]) -> None:
    """Count what aioproducer's connections write, by kind (a wrapper, not a change)."""
    send = BrokerConnection.send

    def counted(self: BrokerConnection, api_key: ApiKey, *args: Any, **kwargs: Any) -> None:
        requests[api_key] = requests.get(api_key, 0) + 1
        send(self, api_key, *args, **kwargs)

    BrokerConnection.send = counted  # type: ignore[method-assign]


def report(name: str, runs: list[tuple[float, float]], transactions: int, records: int,
           requests: dict[ApiKey, int] | None = None) -> str:
    seconds = [elapsed for elapsed, _ in runs]
    median = statistics.median(seconds)
    cpu = statistics.median(cpu for _, cpu in runs) / transactions * 1000
    line = (f"| {name} | {transactions / median:,.0f} | {transactions * records / median:,.0f}"
            f" | {', '.join(f'{transactions / s:,.0f}' for s in seconds)} | {cpu:.2f} |")
    if requests is not None:
        per = ", ".join(f"{k.name} {v / transactions:.1f}" for k, v in sorted(requests.items()))
        line += f" {per} |"
    else:
        line += " (librdkafka) |"
    print(line, flush=True)
    return line


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting (add.partitions.to.txn.retry.backoff.ms=5, say)")
    args = parser.parse_args()
    broker_config = dict(item.split("=", 1) for item in args.broker_config)
    requests: dict[ApiKey, int] = {}
    count_requests(requests)
    print("| client, protocol | transactions/s (median) | records/s | each run, txn/s | "
          "CPU ms per transaction (median) | requests per transaction (last run) |")
    print("|---|---|---|---|---|---|")
    with ApacheKafka(transaction_version=2, broker_config=broker_config) as kafka:
        topic = "bench-txn"
        kafka.create_topic(topic, 1)
        for label, level in (("aioproducer, Transactions V2", 2),
                             ("aioproducer, Transactions V1", 0)):
            if level == 0:
                kafka.run_tool("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server",
                               kafka.bootstrap, "downgrade", "--feature",
                               "transaction.version=0")
            runs = []
            for _ in range(args.runs):
                elapsed, cpu, version = await aioproducer_run(
                    kafka.bootstrap, topic, args.transactions, args.records, requests)
                assert version == (2 if level else 1), version
                runs.append((elapsed, cpu))
            report(label, runs, args.transactions, args.records, requests)
        runs = [await asyncio.to_thread(confluent_run, kafka.bootstrap, topic,
                                        args.transactions, args.records)
                for _ in range(args.runs)]
        report("confluent-kafka (librdkafka, V1)", runs, args.transactions, args.records)


if __name__ == "__main__":
    asyncio.run(main())
