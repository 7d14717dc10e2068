"""The chaos soak on three real Apache Kafka nodes (issue 36 item 4), and the full rolling
restart (issue 37 item 3): the long forms of the tests in tests/real_kafka/test_kafka_chaos.py,
with the same streams, faults and read-back checks (tests/support/kafka_chaos.py).

    python benchmarks/kafka_soak.py --duration 600          # chaos rounds for 10 minutes
    python benchmarks/kafka_soak.py --rolling               # every node SIGTERM, then SIGKILL
    python benchmarks/kafka_soak.py --duration 600 --rolling --separate

Chaos: an idempotent producer and a transactional one (each its own topic of 6 partitions,
replication factor 3, min.insync.replicas=2, acks=all, unclean election off) stream keyed,
numbered records while rounds of faults repeat until --duration seconds have passed: SIGKILL
a partition leader and start it again, cut the connections to a leader (ss -K), SIGTERM
another and, while it is down, a producer_byte_rate quota for a few seconds and another cut,
then start it again; SIGSTOP a leader longer than request_timeout_ms, a preferred leader
election. Every restarted node is waited for until it is back in every ISR. --separate runs the two streams one after the other
(each for the whole duration) instead of side by side. Rolling: each node in turn SIGTERM and
back, then each SIGKILL and back, under both streams, transactions never aborted on purpose.

Prints one line of figures per stream and the fault log; exits 1 if anything acknowledged
was lost, written twice or reordered, a committed transaction was torn or an aborted one
seen, a future outlived delivery_timeout_ms, or (rolling) any error reached the application.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aioproducer.testing import ApacheKafka  # noqa: E402
from tests.support.kafka_chaos import (SETTINGS, FaultPlan, Run, run_streams,  # noqa: E402
                                       summary)


def problems(run: Run, rolling: bool) -> list[str]:
    result, found = run.result, run.found
    out = []
    if found.lost or found.duplicates or found.reordered or found.unexpected:
        out.append(f"{len(found.lost)} lost, {found.duplicates} duplicates, {found.reordered} "
                   f"reordered, {len(found.unexpected)} unexpected")
    if found.torn_transactions or found.aborted_seen:
        out.append(f"torn {found.torn_transactions[:5]}, aborted seen {found.aborted_seen[:5]}")
    if result.longest_future > SETTINGS["delivery_timeout_ms"] / 1000:
        out.append(f"a future took {result.longest_future:.1f} s")
    failed = [f for f in result.failed if result.txn_of[f[0]] not in result.aborted]
    if run.name == "idempotent" and failed:
        out.append(f"{len(failed)} records failed: {failed[0][1]!r}")
    if rolling and (result.app_errors or failed):
        out.append(f"errors reached the application: {result.app_errors[:3]!r} {failed[:3]!r}")
    return out


async def soak(kafka: ApacheKafka, args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    bad = 0
    if args.rolling:
        def roll(plan: FaultPlan) -> list:
            return plan.rolling("stop") + plan.rolling("kill")
        runs, faults = await run_streams(kafka, roll, abort_every=None)
        for run in runs:
            print(summary(f"{run.name} rolling restart", run.result, faults, run.found))
            for problem in problems(run, True):
                print(f"  FAILED: {problem}")
                bad += 1
        print("\n".join(faults.log), flush=True)
    if args.duration:
        groups = [("idempotent",), ("transactional",)] if args.separate else \
            [("idempotent", "transactional")]
        for kinds in groups:
            started = time.monotonic()
            runs, faults = await run_streams(kafka, FaultPlan.chaos_round, kinds=kinds,
                                             repeat_until=loop.time() + args.duration)
            took = time.monotonic() - started
            for run in runs:
                print(summary(f"{run.name} chaos soak, {took:.0f} s", run.result, faults,
                              run.found))
                for problem in problems(run, False):
                    print(f"  FAILED: {problem}")
                    bad += 1
            print("\n".join(faults.log), flush=True)
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=0,
                        help="seconds of chaos rounds (0: none); the issue asks for >= 600")
    parser.add_argument("--rolling", action="store_true",
                        help="a full rolling restart first: every node SIGTERM, then SIGKILL")
    parser.add_argument("--separate", action="store_true",
                        help="the idempotent and transactional chaos runs one after the other")
    parser.add_argument("--version", default=None, help="Kafka version (default: the pinned one)")
    args = parser.parse_args()
    if not args.duration and not args.rolling:
        parser.error("give --duration SECONDS, --rolling, or both")
    with ApacheKafka(3, version=args.version) as kafka:
        print(f"Apache Kafka {kafka.version}, 3 nodes; producer settings {SETTINGS}", flush=True)
        return asyncio.run(soak(kafka, args))


if __name__ == "__main__":
    sys.exit(main())
