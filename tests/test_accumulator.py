"""The accumulator's drain order: when a request has room for fewer batches than are ready,
partitions are taken in turn, so none waits behind busier ones. And a BulkFuture over its
batches reports the first failure in input order."""

from __future__ import annotations

import asyncio

import pytest

from aioproducer._internal.batch import BulkFuture, ProducerBatch
from aioproducer.config import ProducerConfig
from aioproducer.client.cluster import TopicInfo
from aioproducer.protocol.compression import Codec
from aioproducer._internal.accumulator import RecordAccumulator
from aioproducer._internal.observer import Observer
from aioproducer.protocol.records import record_size_upper_bound


class OneBroker:
    """All ready() and drain() ask of the cluster: which broker leads each partition of
    topic "t", and which brokers there are."""

    topics = {"t": TopicInfo("t", (0,) * 4)}
    brokers = {0: None}


async def test_partitions_are_drained_in_turn_and_none_starves():
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", batch_size=100,
                                        linger_ms=0, enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
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
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
    partitions = 20
    size = record_size_upper_bound(None, b"v", None)
    batches = [accumulator.open_batch("t", p, 0, None, b"v", None, size, partitions)
               for p in range(partitions)]
    bulk = BulkFuture(batches, bytearray(4 * partitions), 0, ProducerBatch.failures)
    for batch in reversed(batches):  # the last record's batch fails first
        batch.fail(RuntimeError(f"record {batch.partition}"))
    assert str(bulk.exception()) == "record 0"
    with pytest.raises(RuntimeError, match="^record 0$"):
        await bulk


async def test_a_batch_is_ready_when_its_linger_ends_on_a_whole_millisecond_clock():
    """uvloop's loop time is whole milliseconds: at the reading where a batch's linger ends,
    created + linger - now can come out a hair above zero in floats. The batch is ready then,
    not at the next tick (which cost every lingered batch a millisecond, spinning)."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", linger_ms=5,
                                        enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
    size = record_size_upper_bound(None, b"v", None)
    batch = accumulator.open_batch("t", 0, 0, None, b"v", None, size, 1)
    late = []
    for ms in range(1_469_000, 1_471_000):  # clock readings as uvloop gives them (seconds)
        batch.created = ms / 1000
        ready, next_check, _ = accumulator.ready(OneBroker(), (ms + 5) / 1000)
        if ready != {0}:
            late.append((ms, next_check))
        assert accumulator.ready(OneBroker(), (ms + 4) / 1000)[0] == set()  # not before
    assert not late, f"{len(late)} of 2,000 lingers not over when they ended: {late[:3]}"


async def test_a_turn_in_line_with_memory_free_does_not_send_lingering_batches():
    """enqueue() that closed a full batch holds the line's head for one loop turn
    (turn_soon), and concurrent enqueues queue behind it. Memory is free, so that is no
    shortage: a lingering batch stays until its linger ends. (It was sent at once: under
    load the sender ran in that turn again and again, and 800 concurrent enqueues made 30
    batches of one record.) Short of memory, every batch goes at once, as before."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", batch_size=1024,
                                        linger_ms=1000, enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
    size = 1024
    assert accumulator.reserve_now(size)
    batch = accumulator.open_batch("t", 0, 0, None, b"v", None, size, 4)
    soon = batch.created + 0.001
    assert accumulator.ready(OneBroker(), soon)[0] == set()
    accumulator.memory_available -= size
    accumulator.turn_soon("t", 1, 0, None, b"v", None, size, 4)
    accumulator.join_line("t", 1, 0, None, b"w", None, size, 4, for_send=False)
    assert accumulator.ready(OneBroker(), soon)[0] == set()

    accumulator.memory_available = 0  # the record behind the turn cannot have its batch
    assert accumulator.ready(OneBroker(), soon)[0] == {0}


async def test_ready_sees_what_changed_since_it_found_every_batch_lingering():
    """ready() remembers when nothing can be sendable before the earliest linger end, and
    skips its walk of the queues until then: unless a batch is closed, queued behind
    another or put back for a retry, or a new batch lingers less long than that."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", batch_size=1024,
                                        linger_ms=1000, enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
    size = record_size_upper_bound(None, b"v", None)
    cluster = OneBroker()
    assert accumulator.ready(cluster, 0.0) == (set(), float("inf"), set())  # nothing queued
    first = accumulator.open_batch("t", 0, 0, None, b"v", None, size, 4)
    t0 = first.created
    assert accumulator.ready(cluster, t0 + 0.5)[0] == set()  # lingering
    assert accumulator.ready(cluster, t0 + 1.0)[0] == {0}  # its linger is over
    assert accumulator.ready(cluster, t0 + 0.6)[0] == set()
    accumulator.close_for_appends("t", 0)
    assert accumulator.ready(cluster, t0 + 0.6)[0] == {0}  # closed: sendable at once

    [[taken]] = accumulator.drain(cluster, [0], 1 << 20, t0 + 0.6).values()
    assert accumulator.ready(cluster, t0 + 0.6) == (set(), float("inf"), set())
    second = accumulator.open_batch("t", 1, 0, None, b"v", None, size, 4)
    ready, next_check, _ = accumulator.ready(cluster, second.created)
    assert ready == set() and next_check == pytest.approx(1.0)  # a new batch's linger end
    accumulator.open_batch("t", 1, 0, None, b"w", None, size, 4)  # queued behind it
    assert accumulator.ready(cluster, second.created)[0] == {0}

    [[second_taken]] = accumulator.drain(cluster, [0], 1 << 20, second.created).values()
    assert accumulator.ready(cluster, second.created)[0] == set()
    accumulator.reenqueue(taken, retry_at=second.created + 0.1)  # back for a retry
    ready, next_check, _ = accumulator.ready(cluster, second.created)
    assert ready == set() and next_check == pytest.approx(0.1)
    assert accumulator.ready(cluster, second.created + 0.1)[0] == {0}


async def test_ready_stops_early_only_when_no_queued_partition_can_lack_a_leader():
    """Once every broker is ready, ready() stops walking the queues: but not while a topic
    appended to has a partition without a leader, which it must report (the sender then
    asks for metadata)."""

    class TwoTopics:
        topics = {"t": TopicInfo("t", (0,) * 4), "u": TopicInfo("u", (0, -1))}
        brokers = {0: None}

    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", linger_ms=1000,
                                        enable_idempotence=False)
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
    size = record_size_upper_bound(None, b"v", None)
    batch = accumulator.open_batch("t", 0, 0, None, b"v", None, size, 4)
    accumulator.close_for_appends("t", 0)  # sendable
    accumulator.open_batch("u", 1, 0, None, b"v", None, size, 2)  # no leader
    ready, _, unknown = accumulator.ready(TwoTopics(), batch.created)
    assert ready == {0} and unknown == {"u"}


class _Interrupted(BaseException):
    """What may strike any Python line the opening runs (KeyboardInterrupt, say)."""


def _interrupt_the_wake_for_partition_2(accumulator) -> None:
    """The sender's wake for a batch opened in partition 2 raises _Interrupted, once."""
    wake = accumulator.wake_sender_for

    def interrupted_at_partition_2(batch, opened):
        if batch.partition == 2:
            accumulator.wake_sender_for = wake
            raise _Interrupted

    accumulator.wake_sender_for = interrupted_at_partition_2


async def test_a_turn_in_line_whose_batch_opening_fails_holds_no_memory_twice():
    """enqueue()'s turn came (it holds its memory) and its record needs a new batch: an
    opening that fails before its batch is queued gives the memory back once and buffers
    nothing (the record is refused with the error); one that fails after (a
    KeyboardInterrupt in the sender's wake) leaves the batch queued, holding its memory.
    append_granted gave the memory back around the opening either way: counted free while
    a queued batch held it (or twice)."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", linger_ms=1000,
                                        enable_idempotence=False, buffer_memory=1 << 20)
    size = record_size_upper_bound(None, b"v", None)

    def grows_lists_but_fails(topic, partitions):
        raise RuntimeError("the topic's lists could not grow")

    def wake_interrupted(batch, opened):
        raise _Interrupted

    for failing, value in (("open_batches", grows_lists_but_fails),
                           ("wake_sender_for", wake_interrupted)):
        accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
        memory = accumulator.batch_memory(size)
        setattr(accumulator, failing, value)
        assert accumulator.reserve_now(memory)
        waiting = accumulator.turn_soon("t", 1, 0, None, b"v", None, memory, 4)
        await waiting.turn
        with pytest.raises((RuntimeError, _Interrupted)):
            accumulator.append_granted(waiting)
        queued = [batch for queue in accumulator._batches.values() for batch in queue]
        assert len(queued) == (1 if failing == "wake_sender_for" else 0), failing
        assert set(queued) == accumulator.incomplete
        held = sum(batch.writer.reserved for batch in queued)
        assert accumulator.memory_available + held == 1 << 20, failing
        assert not accumulator.line


def _memory_all_taken(buffer_memory: int, value: bytes, batch_size: int = 1024
                      ) -> tuple[RecordAccumulator, int]:
    """An accumulator (batch_size 1 KiB unless given, linger 1 s) whose `buffer_memory` is
    all reserved, as full batches would hold it, and the memory a record of `value` needs to
    open a batch."""
    config = ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9092", linger_ms=1000,
                                        enable_idempotence=False, batch_size=batch_size,
                                        buffer_memory=buffer_memory)
    accumulator = RecordAccumulator(config, Codec.NONE, None, Observer(()))
    memory = accumulator.batch_memory(record_size_upper_bound(None, value, None))
    assert accumulator.reserve_now(buffer_memory)
    return accumulator, memory


async def test_a_send_in_line_whose_batch_opening_fails_is_refused_and_the_line_goes_on():
    """send()'s records wait in line for memory; freed memory serves them, each opening its
    batch. One whose opening fails is refused with the error (its future says so), in no
    batch, its memory free again, and the records behind it are served. The failure went up
    through release() to whoever freed the memory, the record left at the head of the line,
    its batch queued (the failure came after queueing), to be appended again at the next
    release."""
    from aioproducer._internal.batch import RecordFuture

    accumulator, memory = _memory_all_taken(2048, b"v")
    waiting = [accumulator.join_line("t", partition, 0, None, b"%d" % partition, None,
                                     memory, 4, for_send=True) for partition in (1, 2)]
    futures = []
    for entry in waiting:
        entry.record = RecordFuture(entry, 0, 0)
        futures.append(entry.record)
    grow = accumulator.open_batches
    failures = [RuntimeError("the topic's lists could not grow")]

    def fails_once(topic, partitions):
        if failures:
            raise failures.pop()
        return grow(topic, partitions)

    accumulator.open_batches = fails_once  # type: ignore[method-assign]
    accumulator.release(2048)  # (a finished batch's memory)
    assert not accumulator.line
    with pytest.raises(RuntimeError, match="could not grow"):
        futures[0].result()
    queued = [batch for queue in accumulator._batches.values() for batch in queue]
    assert [(b.partition, b.writer.count) for b in queued] == [(2, 1)]
    assert futures[1]._batch is queued[0]
    assert accumulator.memory_available + queued[0].writer.reserved == 2048


async def test_a_turn_whose_record_is_placed_before_the_line_s_service_is_interrupted_says_so():
    """enqueue()'s turn came, a send() waiting behind it: append_granted places the turn's
    record (opening its batch), then serves the line, where the send's opening is struck by
    a KeyboardInterrupt-like exception in the sender's wake. The turn's record is buffered:
    the exception names its batch and offset delta for the call to count (take_kept; the
    send's record follows its own kept batch). It named nothing: enqueue_many's
    `accepted` left out a record that was sent, and resuming from it sent that one twice."""
    from aioproducer._internal.accumulator import take_kept
    from aioproducer._internal.batch import RecordFuture

    accumulator, memory = _memory_all_taken(2048, b"v")
    mine = accumulator.join_line("t", 1, 0, None, b"mine", None, memory, 4, for_send=False)
    behind = accumulator.join_line("t", 2, 0, None, b"behind", None, memory, 4,
                                   for_send=True)
    future = behind.record = RecordFuture(behind, 0, 0)
    _interrupt_the_wake_for_partition_2(accumulator)
    accumulator.release(2048)  # (two finished batches' memory): the turn comes
    await asyncio.wait_for(mine.turn, 5)
    with pytest.raises(_Interrupted) as caught:
        accumulator.append_granted(mine)
    queued = {batch.partition: batch for queue in accumulator._batches.values()
              for batch in queue}
    assert [(b.partition, b.writer.count) for b in queued.values()] == [(1, 1), (2, 1)]
    assert take_kept(caught.value) == (queued[1], 0), "the placed record is not named"
    assert future._batch is queued[2] and not accumulator.line


async def test_a_send_in_line_whose_batch_s_wake_is_interrupted_is_told_its_record_s_outcome():
    """send()'s record waits in line; freed memory opens its batch, and the sender's wake,
    after the batch is queued, raises a KeyboardInterrupt-like exception. That goes up
    through release() (Ctrl-C must not be swallowed), but the record is in the queued batch
    and will be written: its future follows it and resolves with its metadata when the
    batch is acknowledged. The future was failed with the interrupt though the record was
    kept and sent."""
    from aioproducer._internal.batch import RecordFuture

    accumulator, memory = _memory_all_taken(1024, b"kept")
    waiting = accumulator.join_line("t", 1, 0, None, b"kept", None, memory, 4, for_send=True)
    future = waiting.record = RecordFuture(waiting, 0, 0)
    wake = accumulator.wake_sender_for

    def interrupted_once(batch, opened):
        accumulator.wake_sender_for = wake  # type: ignore[method-assign]
        raise _Interrupted

    accumulator.wake_sender_for = interrupted_once  # type: ignore[method-assign]
    with pytest.raises(_Interrupted):
        accumulator.release(1024)  # (a finished batch's memory)
    assert not accumulator.line
    [batch] = [batch for queue in accumulator._batches.values() for batch in queue]
    assert (batch.partition, batch.writer.count) == (1, 1)
    assert not future.done(), "the record is buffered: its future waits for its outcome"
    batch.complete(41, -1)
    metadata = await asyncio.wait_for(future, 5)
    assert (metadata.topic, metadata.partition, metadata.offset) == ("t", 1, 41)


async def test_the_line_s_service_interrupted_still_holds_its_memory_for_the_records_in_line():
    """enqueue()'s turn came, two send()s waiting behind it: append_granted places the
    turn's record, then serves the line, where the first send's opening is struck by a
    KeyboardInterrupt-like exception in the sender's wake. The second send still waits in
    line (its batch needs more memory than is free), so batches must not grow into the free
    memory meanwhile: the records in line go first. The service's clean-up was skipped by
    the interrupt: the pool stayed unpaused, and a batch grew into the memory (True)."""
    accumulator, memory = _memory_all_taken(8192, b"v", batch_size=4096)  # (batches grow)
    big = b"b" * 2000
    mine = accumulator.join_line("t", 1, 0, None, b"mine", None, memory, 4, for_send=False)
    behind = accumulator.join_line("t", 2, 0, None, b"behind", None, memory, 4,
                                   for_send=True)
    last = accumulator.join_line("t", 3, 0, None, big, None,
                                 accumulator.batch_memory(record_size_upper_bound(None, big,
                                                                                  None)),
                                 4, for_send=True)
    from aioproducer._internal.batch import RecordFuture

    behind.record, last.record = RecordFuture(behind, 0, 0), RecordFuture(last, 0, 0)
    _interrupt_the_wake_for_partition_2(accumulator)
    accumulator.release(2 * memory + 512)  # (finished batches' memory): the turn comes
    await asyncio.wait_for(mine.turn, 5)
    with pytest.raises(_Interrupted):
        accumulator.append_granted(mine)
    assert list(accumulator.line) == [last]
    assert accumulator.memory_available > 0
    mine_batch = accumulator.appendable["t"][0][1]
    assert not mine_batch.writer.try_append(0, None, b"g" * 1000, None), \
        "a batch grew into the memory the record in line waits for"
