"""CPU a record of Produce v13 (topics named by their 16-byte id, KIP-516) against v12 (by
name), on Apache Kafka 4.4 (aioproducer.testing.ApacheKafka, which speaks v13): a producer
writes RECORDS 100-byte records round-robin over TOPICS topics of one partition each (every
request then carries every topic: the per-topic cost of the request encoder, the answer
decoder and the sender's naming of topics by id is paid on each), and over 1 topic. v12 is
forced by capping CLIENT_VERSIONS for that producer's run. Rounds alternate the four cases;
prints each case's CPU a record (time.process_time over the produce phase: enqueue of every
record, then flush), its medians and the requests a run wrote.

    python benchmarks/topic_ids.py [TOPICS] [RECORDS] [--rounds N] [--acks 1|all]
        [--flush-every N] [--instructions]

--flush-every TOPICS makes every request carry one record a topic: the per-topic cost's
worst case. --instructions counts instructions a record instead, by valgrind's callgrind
(as benchmarks/instructions.py: zeroed as each produce phase begins, os.getppid(), dumped as
it ends, os.getpgrp(); Kafka, a child process, is not counted), a figure the machine's load
does not move; ~50x slower (give fewer RECORDS: 20,000 and --rounds 3 take ~5 minutes).
"""

import argparse
import asyncio
import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("topics", type=int, nargs="?", default=500)
p.add_argument("records", type=int, nargs="?", default=100_000)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--acks", default="all", choices=("1", "all"))
p.add_argument("--flush-every", type=int, default=0,
               help="flush after this many records (0: only at the end)")
p.add_argument("--instructions", action="store_true", help="count them by callgrind")
p.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # (under valgrind)
args = p.parse_args()
value = os.urandom(100)


async def produce(bootstrap: str, topics: list[str], version: int) -> tuple[float, int]:
    """CPU seconds a record over the produce phase, and the requests written."""
    from aioproducer import Producer
    from aioproducer.protocol import messages
    from aioproducer.protocol.messages import ApiKey

    highest = messages.CLIENT_VERSIONS[ApiKey.PRODUCE]
    messages.CLIENT_VERSIONS[ApiKey.PRODUCE] = (highest[0], version)
    try:
        async with Producer(bootstrap, acks=1 if args.acks == "1" else "all",
                            linger_ms=5) as producer:
            for topic in topics:
                await producer.partitions_for(topic)
            os.getppid()  # callgrind zeroes its counters here ...
            before, requests = time.process_time(), producer.metrics().produce_requests
            count = len(topics)
            for i in range(args.records):
                await producer.enqueue(topics[i % count], value)
                if args.flush_every and i % args.flush_every == args.flush_every - 1:
                    await producer.flush()
            await producer.flush()
            cpu = time.process_time() - before
            os.getpgrp()  # ... and dumps them here
            metrics = producer.metrics()
            assert metrics.records_sent == args.records, metrics
            return cpu / args.records, metrics.produce_requests - requests
    finally:
        messages.CLIENT_VERSIONS[ApiKey.PRODUCE] = highest


def create_topics(bootstrap: str, names: list[str]) -> None:
    """One partition each, by librdkafka's admin client, destroyed before the runs (its
    threads would run, and be counted, through every one)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in names]).values():
        future.result(timeout=120)
    del admin, future
    gc.collect()


def run_cases() -> None:
    """Each round's cases, alternated; prints one line a run, then (unless counted) the
    medians."""
    from aioproducer.testing import ApacheKafka

    with ApacheKafka() as kafka:
        many = [f"t{i:04d}" for i in range(args.topics)]
        create_topics(kafka.bootstrap, many + ["one"])
        cases = {(len(many), v): many for v in (12, 13)} | {(1, v): ["one"] for v in (12, 13)}
        cpu: dict[tuple[int, int], list[float]] = {case: [] for case in cases}
        for r in range(args.rounds):
            for case in list(cases) if r % 2 == 0 else list(reversed(cases)):
                per_record, requests = asyncio.run(produce(kafka.bootstrap, cases[case],
                                                           case[1]))
                cpu[case].append(per_record)
                print(f"round {r}: {case[0]} topic(s) v{case[1]}: "
                      f"{per_record * 1e6:.2f} us a record, {requests} requests", flush=True)
        if not args.counted:
            for (topics, version), runs in cpu.items():
                print(f"{topics} topic(s) v{version}: median "
                      f"{statistics.median(runs) * 1e6:.2f} us a record "
                      f"({', '.join(f'{x * 1e6:.2f}' for x in runs)})")


def count_instructions() -> None:
    """Run the cases under callgrind, one dump a run, in the order the runs printed."""
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/counts",
             "--zero-before=os_getppid", "--dump-before=os_getpgrp", sys.executable,
             str(Path(__file__).resolve()), str(args.topics), str(args.records),
             "--rounds", str(args.rounds), "--acks", args.acks,
             "--flush-every", str(args.flush_every), "--counted"],
            capture_output=True, text=True, timeout=7200, check=False)
        runs = re.findall(r"^round \d+: (\d+) topic\(s\) v(\d+): .*, (\d+) requests$",
                          run.stdout, re.MULTILINE)
        dumps = sorted(Path(out).glob("counts.*"), key=lambda f: int(f.suffix[1:]))
        if run.returncode or not runs or len(dumps) < len(runs):
            sys.exit(f"the counted run failed ({run.returncode}):\n{run.stdout}"
                     f"{run.stderr[-3000:]}")
        counts: dict[tuple[str, str], list[float]] = {}
        for (topics, version, requests), dump in zip(runs, dumps):
            total = re.search(r"^totals: (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
            assert total is not None, f"no totals in {dump}"
            counts.setdefault((topics, version), []).append(int(total.group(1)) / args.records)
            print(f"{topics} topic(s) v{version}: {counts[topics, version][-1]:,.0f} "
                  f"instructions a record, {requests} requests")
        for (topics, version), runs_ in counts.items():
            print(f"{topics} topic(s) v{version}: median {statistics.median(runs_):,.0f} "
                  f"instructions a record ({', '.join(f'{x:,.0f}' for x in runs_)})")


if args.instructions and not args.counted:
    count_instructions()
else:
    run_cases()
