"""Instructions per record of the produce phase, counted by valgrind's callgrind: a figure
that does not move with the machine's load, for comparing two trees' hot paths where CPU
time cannot (on the shared 2-core machine it moved by a third from run to run at load 5-10).

    python benchmarks/instructions.py PARTITIONS [RECORDS] [--shape flushed|bulk|gather]
        [--limit SECONDS] [--out FILE] [--acks all] [--timeouts-ms MS]

Runs itself again under `valgrind --tool=callgrind` (the embedded broker, a child process,
is not counted), which zeroes its counters as the produce phase begins (its one call of
os.getppid()) and dumps them as it ends (os.getpgrp()); prints the instructions per record
and per batch acknowledged. The shapes are cpu_per_record.py's: flushed (enqueue() per
record keeping the futures, then flush()), bulk (enqueue_many of 10,000 records a call, then
flush()), gather (enqueue() per record, then asyncio.gather: its count moves with the
sender's timing, which shapes the batches, 20,000-22,100 a record at 10,000 partitions in
three runs of one tree). Keyed 100-byte records, acks=1 (--acks all: an idempotent
producer, the default setting, which acks=1 turns off), linger 5 ms, uvloop; ~50x slower
than a plain run (gather at 10,000 partitions: 54-108 s, at load 1-11). The produce phase is given --limit seconds (default 1,200; once reported as
never finishing, not seen again in 4 runs under valgrind and 15 without): past it, the run
fails saying what the producer held then. --out keeps callgrind's dump there, for
`callgrind_annotate FILE` (the instructions per function). Needs valgrind, and CPython's symbols for
os_getppid and os_getpgrp (pyenv's builds have them).

With callgrind's cache simulation (`VALGRIND_OPTS="--cache-sim=yes --D1=49152,12,64
--LL=1048576,8,64"`, this host's caches) gather at 10,000 partitions runs ~100x slower than
plainly, and its enqueue loop, which never yields, outlasted the default delivery_timeout_ms
(every record expired, and some requests went unanswered within request_timeout_ms: two
runs of two trees at load 13-29): --timeouts-ms 3600000 (delivery_timeout_ms, and
half of it request_timeout_ms) gives it the time. It then prints the last-level data
misses a record too. Its caches have no prefetcher: a buffer read from start to end counts a
miss a line, which the hardware mostly hides. At 10,000 partitions a CRC-32C kept as records
were appended (so that a batch's header need not read its records again) cut 2.0 simulated
misses a record (flushed) and cost 10-12% more CPU a record (gather and flushed, medians of 5
alternated runs of cpu_per_record.py); the misses that cost are of scattered objects (a
record's batch read by its future, the collector's walk), not of buffers read in order.
"""

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("partitions", type=int)
p.add_argument("records", type=int, nargs="?", default=200_000)
p.add_argument("--shape", default="flushed", choices=("flushed", "bulk", "gather"))
p.add_argument("--limit", type=float, default=1200.0, help="seconds for the produce phase")
p.add_argument("--acks", default="1", choices=("1", "all"),
               help="all: idempotent, as by default (acks=1 turns idempotence off)")
p.add_argument("--out", default=None, help="keep callgrind's dump in this file")
p.add_argument("--timeouts-ms", type=int, default=None,
               help="delivery_timeout_ms, and half of it request_timeout_ms "
                    "(default: the producer's)")
p.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # (under valgrind)
args = p.parse_args()


async def produce(bootstrap: str, topic: str, data: list[tuple[bytes, bytes]]) -> int:
    from aioproducer import Producer
    from aioproducer.errors import DeliveryTimeoutError
    extra = {} if args.timeouts_ms is None else {
        "delivery_timeout_ms": args.timeouts_ms, "request_timeout_ms": args.timeouts_ms // 2}
    async with Producer(bootstrap, acks=1 if args.acks == "1" else "all",
                        linger_ms=5, **extra) as producer:
        await producer.partitions_for(topic)
        os.getppid()  # callgrind zeroes its counters here ...
        try:
            await asyncio.wait_for(shape(producer, topic, data), args.limit)
        except DeliveryTimeoutError as expired:  # (a TimeoutError too: said apart)
            sys.exit(f"records expired (delivery_timeout_ms; under valgrind, give "
                     f"--timeouts-ms): {expired}")
        except TimeoutError:
            metrics = producer.metrics()
            await producer.close(timeout=10)  # (not waiting for what is stuck)
            sys.exit(f"the produce phase took more than --limit {args.limit:g} s: "
                     f"{metrics.records_pending} record(s) pending (the oldest "
                     f"{metrics.oldest_pending_s:.0f} s), {metrics.records_sent} sent, "
                     f"{metrics.records_failed} failed, {metrics.requests_in_flight} "
                     f"request(s) in flight, {metrics.waiting_for_memory} waiting for memory")
        os.getpgrp()  # ... and dumps them here
        return producer.metrics().batches_sent


async def shape(producer, topic: str, data: list[tuple[bytes, bytes]]) -> None:
    if args.shape == "bulk":
        results = [await producer.enqueue_many(topic, data[i:i + 10_000])
                   for i in range(0, len(data), 10_000)]
        await producer.flush()
        for result in results:
            await result
    else:
        futures = [await producer.enqueue(topic, v, k) for k, v in data]
        if args.shape == "gather":
            await asyncio.gather(*futures)
        else:
            await producer.flush()


if args.counted:
    import uvloop
    from aioproducer.testing import EmbeddedBroker
    value = bytes(range(100))
    data = [(b"key-%012d" % (i % 100_000), value) for i in range(args.records)]
    with EmbeddedBroker() as broker:
        broker.create_topic("t", args.partitions)
        print("batches", uvloop.run(produce(broker.bootstrap, "t", data)), flush=True)
    sys.exit(0)

with tempfile.TemporaryDirectory() as out:
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/counts",
         "--zero-before=os_getppid", "--dump-before=os_getpgrp", sys.executable,
         str(Path(__file__).resolve()), str(args.partitions), str(args.records),
         "--shape", args.shape, "--acks", args.acks, "--limit", str(args.limit), "--counted",
         *([] if args.timeouts_ms is None else ["--timeouts-ms", str(args.timeouts_ms)])],
        capture_output=True, text=True, timeout=args.limit + 900)  # (+ start and close)
    batches = re.search(r"^batches (\d+)", run.stdout, re.M)
    dumps = sorted(Path(out).glob("counts.*"))
    if run.returncode or batches is None or not dumps:
        sys.exit(f"the counted run failed ({run.returncode}):\n{run.stdout}{run.stderr[-3000:]}")
    if args.out:
        shutil.copyfile(dumps[-1], args.out)
    dump = dumps[-1].read_text(errors="replace")
    totals = re.search(r"^totals: ([\d ]+)", dump, re.MULTILINE)
    events = re.search(r"^events: (.+)", dump, re.MULTILINE)
    assert totals is not None and events is not None, "no totals in callgrind's dump"
    counts = dict(zip(events.group(1).split(), map(int, totals.group(1).split())))
    instructions, batch_count = counts["Ir"], int(batches.group(1))
    acks = " acks=all" if args.acks == "all" else ""
    # (with the cache simulation: last-level misses, reads and writes)
    misses = f", {(counts['DLmr'] + counts['DLmw']) / args.records:.1f} LL misses a record" \
        if "DLmr" in counts else ""
    print(f"p{args.partitions} {args.shape}{acks}: {instructions / args.records:,.0f} instructions "
          f"a record{misses}, {instructions / max(batch_count, 1):,.0f} a batch ({batch_count} "
          f"batches, {instructions:,} in all)")
