"""Transactions the real-Kafka tests run the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from aioproducer import Producer

T = TypeVar("T")

# What read_committed must see after `commit_abort_commit`: the third transaction aborted.
COMMITTED_VALUES = sorted(b"t%d-p%d" % (i, p) for i in (0, 1, 3) for p in range(2))


async def commit_abort_commit(producer: Producer, topic: str,
                              after_each: Callable[[], T]) -> list[T]:
    """Four transactions of one record to each of `topic`'s partitions 0 and 1, the third
    aborted, the others committed; `after_each()`'s value after each."""
    seen = []
    for i in range(4):
        producer.begin_transaction()
        for p in range(2):
            await producer.send(topic, b"t%d-p%d" % (i, p), partition=p)
        if i == 2:
            await producer.abort_transaction()
        else:
            await producer.commit_transaction()
        seen.append(after_each())
    return seen
