"""What one huge Metadata response from a broken or hostile broker costs the client: memory
and the longest stall of its event loop.

    python benchmarks/hostile_metadata.py [--size MIB] [--topics N] [--replicas N] [--tree DIR]

A fake broker (tests/support/hostile.py) answers a Metadata request with a response body of
about --size MiB: --topics topics of as many partitions as fill it, --replicas replicas each
(--topics 1 --replicas 0: a single topic of ~900,000 partitions per 16 MiB). The client, a
BrokerConnection in a fresh process, requests it while a task ticks the loop; printed: the
outcome, the seconds until the answer, the longest gap between ticks, and the growth of the
process's peak RSS (VmHWM) over the request. --tree runs another checkout's aioproducer (say
an export of main) against the same fake broker, to compare before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


async def _client(port: int) -> dict[str, object]:
    from aioproducer.client.connection import BrokerConnection
    from aioproducer.protocol.messages import ApiKey

    conn = await BrokerConnection.connect(1, "127.0.0.1", port, client_id="bench",
                                          request_timeout=300, connect_timeout=10)
    longest = 0.0
    stop = False

    async def tick() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    before = _peak_rss()
    ticker = asyncio.create_task(tick())
    started = time.perf_counter()
    try:
        response = await conn.request(ApiKey.METADATA, {"topics": [{"name": "t0"}]})
        outcome = f"{sum(len(t['partitions']) for t in response['topics'])} partitions"
    except Exception as exc:  # the refusal is the outcome
        outcome = f"{type(exc).__name__}: {exc}"[:120]
    elapsed = time.perf_counter() - started
    stop = True
    await ticker
    conn.close()
    return {"outcome": outcome, "seconds": round(elapsed, 3),
            "longest_loop_gap_s": round(longest, 3),
            "peak_rss_growth_mib": round((_peak_rss() - before) / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=16, help="MiB of response body")
    parser.add_argument("--topics", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=0)
    parser.add_argument("--tree", help="the checkout whose aioproducer to run (default: this)")
    parser.add_argument("--client-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_port:  # the client process
        print(json.dumps(asyncio.run(_client(args.client_port))))
        return
    sys.path.insert(0, str(ROOT))
    from tests.support.hostile import HostileBroker, metadata_body_of_size

    body = metadata_body_of_size(int(args.size * 2**20), args.topics, args.replicas)
    tree = Path(args.tree).resolve() if args.tree else ROOT
    with HostileBroker(body) as broker:
        done = subprocess.run(
            [sys.executable, __file__, "--client-port", str(broker.port)],
            env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
            timeout=600, cwd=tree)
    if done.returncode:
        sys.exit(done.stderr)
    result = json.loads(done.stdout)
    print(json.dumps({"tree": str(tree), "body_mib": round(len(body) / 2**20, 1),
                      "topics": args.topics, "replicas": args.replicas, **result}))


if __name__ == "__main__":
    main()
