"""The accumulator's drain order: when a request has room for fewer batches than are ready,
partitions are taken in turn, so none waits behind busier ones. And a BulkFuture over its
batches reports the first failure in input order."""

from __future__ import annotations

import pytest

from aioproducer._internal.batch import BulkFuture
from aioproducer.config import ProducerConfig
from aioproducer.protocol.compression import Codec
from aioproducer._internal.accumulator import RecordAccumulator
from aioproducer.protocol.records import record_size_upper_bound


class OneBroker:
    """All drain() asks of the cluster: which broker leads a partition."""

    def leader_for(self, topic: str, partition: int) -> int:
        return 0


async def test_partitions_are_drained_in_turn_and_none_starves():
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", batch_size=100,
                                        linger_ms=0, enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None)
    partitions = 4
    size = record_size_upper_bound(None, b"v" * 90, None)
    for partition in range(partitions):  # three full batches queued for each partition
        for _ in range(3):
            assert accumulator.reserve_now(size)
            accumulator.open_batch("t", partition, 0, None, b"v" * 90, None, size, partitions)
            accumulator.close_for_appends("t", partition)

    order, numbers = [], []
    for _ in range(3 * partitions):  # room for one batch per request
        [batch] = accumulator.drain(OneBroker(), [0], max_request_size=1, now=0.0)[0]
        order.append(batch.partition)
        numbers.append(batch.number)
    assert not accumulator.has_queued()
    for turn in range(3):
        taken = order[turn * partitions:(turn + 1) * partitions]
        assert sorted(taken) == list(range(partitions)), f"drain order {order}"
    # Within each partition, batches left in the order they were made.
    for partition in range(partitions):
        made = [n for p, n in zip(order, numbers) if p == partition]
        assert made == sorted(made)


async def test_a_bulk_future_raises_the_first_failure_in_input_order():
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", linger_ms=0,
                                        enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None)
    partitions = 20
    size = record_size_upper_bound(None, b"v", None)
    batches = [accumulator.open_batch("t", p, 0, None, b"v", None, size, partitions)
               for p in range(partitions)]
    bulk = BulkFuture(batches, bytearray(4 * partitions), 0)
    for batch in reversed(batches):  # the last record's batch fails first
        batch.fail(RuntimeError(f"record {batch.partition}"))
    assert str(bulk.exception()) == "record 0"
    with pytest.raises(RuntimeError, match="^record 0$"):
        await bulk
