"""Python calls per record in the shapes users write, counted by cProfile: a figure that does
not move with the machine's load, for a change to the hot path that timings cannot resolve.

    python benchmarks/calls.py [RECORDS] [--hooks otel-metrics|otel-traced|prometheus]

Starts the embedded broker, then for each shape produces RECORDS keyed 100-byte records
(after a warm-up that fetches the topic's metadata) under cProfile, and prints the calls per
record: Python functions and the C functions they call, as cProfile counts them. With
`--hooks`, the producer is observed by those hooks (no exporter), as in clients.py.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aioproducer import Producer  # noqa: E402
from aioproducer.testing import EmbeddedBroker  # noqa: E402

VALUE = bytes(100)


async def enqueue_gather(producer: Producer, topic: str, n: int) -> None:
    futures = [await producer.enqueue(topic, VALUE, key=b"k%d" % i) for i in range(n)]
    await asyncio.gather(*futures)


async def gather_send(producer: Producer, topic: str, n: int) -> None:
    await asyncio.gather(*(producer.send(topic, VALUE, key=b"k%d" % i) for i in range(n)))


async def tasks_send(producer: Producer, topic: str, n: int) -> None:
    async def one_task(first: int) -> None:
        for i in range(first, n, 100):
            await producer.send(topic, VALUE, key=b"k%d" % i)
    async with asyncio.TaskGroup() as group:
        for first in range(100):
            group.create_task(one_task(first))


async def enqueue_many(producer: Producer, topic: str, n: int) -> None:
    await (await producer.enqueue_many(topic, ((b"k%d" % i, VALUE) for i in range(n))))


SHAPES: dict[str, Callable[[Producer, str, int], Awaitable[None]]] = {
    "enqueue+gather": enqueue_gather,
    "gather of send()": gather_send,
    "100 tasks awaiting send()": tasks_send,
    "enqueue_many": enqueue_many,
}


async def count(bootstrap: str, topic: str, shape: Callable[..., Awaitable[None]],
                n: int, hooks: list[Any]) -> float:
    async with Producer(bootstrap, acks=1, linger_ms=5, hooks=hooks) as producer:
        await producer.send(topic, b"warm-up")
        profile = cProfile.Profile()
        profile.enable()
        await shape(producer, topic, n)
        profile.disable()
    stats: Any = pstats.Stats(profile)
    return float(stats.total_calls) / n


def main() -> None:
    args = sys.argv[1:]
    hooks = []
    if "--hooks" in args:
        from clients import HOOKS
        at = args.index("--hooks")
        hooks = [HOOKS[args[at + 1]]()]
        del args[at:at + 2]
    n = int(args[0]) if args else 20_000
    with EmbeddedBroker() as broker:
        for name, shape in SHAPES.items():
            topic = "calls-" + name.replace(" ", "-").replace("(", "").replace(")", "")
            topic = topic.replace("+", "-")
            broker.create_topic(topic, 6)
            per_record = asyncio.run(count(broker.bootstrap, topic, shape, n, hooks))
            print(f"{name}: {per_record:.1f} calls per record ({n:,} records)")


if __name__ == "__main__":
    main()
