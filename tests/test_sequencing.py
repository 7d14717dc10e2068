"""Sequence numbers, broker-free: contiguous per partition, in order on the wire, a retry
alone in flight, split pieces in their batch's place, and the gaps that need a new epoch."""

from __future__ import annotations

import asyncio

from aioproducer._internal.batch import ProducerBatch
from aioproducer._internal.sequencing import QUIET_S, Sequencer
from aioproducer.protocol.records import BatchWriter


def _batch(records: int, partition: int = 0) -> ProducerBatch:
    writer = BatchWriter(0, 1 << 20)
    for i in range(records):
        assert writer.try_append(0, None, b"%d" % i, None)
    future = asyncio.get_running_loop().create_future()
    return ProducerBatch((0,), "t", partition, writer, future, 0.0, 60.0, 0)


def _numbered(*records: int) -> tuple[Sequencer, list[ProducerBatch]]:
    """A sequencer under producer id 1, epoch 0, and batches of these sizes numbered in turn."""
    seq = Sequencer(max_in_flight=5)
    seq.start(1, 0)
    batches = [_batch(n) for n in records]
    for batch in batches:
        seq.assign(batch)
    return seq, batches


async def test_batches_are_numbered_contiguously_per_partition():
    seq = Sequencer(max_in_flight=5)
    seq.start(7, 0)
    a, b, other = _batch(3), _batch(2), _batch(4, partition=1)
    for batch in (a, b, other):
        seq.assign(batch)
    assert [(x.producer_id, x.base_sequence) for x in (a, b, other)] == [(7, 0), (7, 3), (7, 0)]
    seq.assign(a)  # a retry keeps its numbers
    assert a.base_sequence == 0


async def test_sequence_numbers_wrap_at_int32():
    seq = Sequencer(max_in_flight=5)
    seq.start(1, 0)
    seq._next_sequence[("t", 0)] = (1 << 31) - 2  # (no seam: 2**31 records would take hours)
    first, second = _batch(3), _batch(1)
    seq.assign(first)
    seq.assign(second)
    assert (first.base_sequence, second.base_sequence) == ((1 << 31) - 2, 1)


async def test_nothing_goes_without_a_producer_id_and_a_retry_goes_alone():
    seq = Sequencer(max_in_flight=2)
    first, a, b, c = _batch(1), _batch(1), _batch(1), _batch(1)
    assert not seq.may_send(a)  # no producer id yet
    seq.start(1, 0)
    seq.assign(first)
    seq.sent_all([first])
    seq.resolved(first)
    seq.acked(first)  # (before any acknowledgement, one at a time: the test below)
    for batch in (a, b):
        seq.assign(batch)
        assert seq.may_send(batch)
        seq.sent_all([batch])
    seq.assign(c)
    assert not seq.may_send(c)  # two in flight: the limit
    seq.resolved(a)
    seq.resolved(b)  # b failed and is to be retried
    b.attempts = 1
    seq.sent_all([c])
    assert not seq.may_send(b)  # c is in flight: the retry waits
    seq.resolved(c)
    assert seq.may_send(b)


async def test_one_batch_at_a_time_until_the_partition_acknowledges_one_under_the_id():
    """Apache Kafka writes any sequence from a producer it has no state for on a partition:
    a second batch sent beside the first could be written while the first is refused (a
    topic just created), and the first, retried, would land after it. Found on Kafka 4.4
    (tests/real_kafka/test_conformance.py: records reordered with 5 in flight)."""
    seq = Sequencer(max_in_flight=5)
    seq.start(1, 0)
    first, second, other = _batch(1), _batch(1), _batch(1, partition=1)
    for batch in (first, second, other):
        seq.assign(batch)
    assert seq.may_send(first)
    seq.sent_all([first])
    assert not seq.may_send(second)  # nothing acknowledged on partition 0 yet
    assert seq.may_send(other)  # partition 1 has nothing in flight
    seq.resolved(first)
    seq.acked(first)
    assert seq.may_send(second)
    seq.start(2, 0)  # a new producer id: the broker knows nothing of it again
    for batch in (second, other):
        seq.renumber_on_reset(batch)
        seq.assign(batch)
    seq.sent_all([second])
    third = _batch(1)
    seq.assign(third)
    assert not seq.may_send(third)


async def test_a_partition_quiet_for_a_while_sends_one_batch_until_it_is_acknowledged():
    """Kafka drops a producer's state on a partition once its last batch is
    producer.id.expiration.ms old, and then takes any sequence: after QUIET_S without an
    acknowledgement the next batch goes alone again (on Kafka 4.4, a first batch refused
    unwritten after the state was dropped was overtaken by the next ones:
    tests/real_kafka/test_recovery.py)."""
    now = [0.0]
    seq = Sequencer(max_in_flight=5, clock=lambda: now[0])
    seq.start(1, 0)
    batches = [_batch(1) for _ in range(6)]
    for batch in batches:
        seq.assign(batch)
    a, b, c, d, e, f = batches
    seq.sent_all([a])
    seq.resolved(a)
    seq.acked(a)
    now[0] += QUIET_S / 2
    seq.sent_all([b])
    assert seq.may_send(c)  # a pause shorter than QUIET_S: pipelined at once
    seq.resolved(b)
    seq.acked(b)
    now[0] += QUIET_S * 2
    seq.sent_all([c])
    assert not seq.may_send(d)  # quiet for longer: alone until acknowledged
    seq.resolved(c)
    seq.acked(c)
    seq.sent_all([d])
    assert seq.may_send(e)
    seq.sent_all([e])
    assert seq.may_send(f)


async def test_split_pieces_take_their_batch_numbers_and_place():
    seq, (big, after) = _numbered(4, 1)
    pieces = [_batch(2), _batch(2)]
    seq.split(big, pieces)
    assert [p.base_sequence for p in pieces] == [0, 2] and after.base_sequence == 4
    assert seq.is_expected_next(pieces[0]) and not seq.is_expected_next(after)


async def test_a_younger_batch_that_failed_unacknowledged_leaves_a_gap():
    seq, (older, younger) = _numbered(1, 1)
    assert seq.failed(younger)  # its numbers are used up
    assert not seq.gap_left(younger)  # the older one, still pending, will show it
    assert seq.acked(older)  # now nothing pending, and sequence 1 was never acknowledged
    assert not seq.failed(_batch(1))  # never numbered: nothing used up


async def test_a_new_epoch_numbers_old_batches_afresh():
    seq = Sequencer(max_in_flight=5)
    seq.start(1, 0)
    old = _batch(2)
    seq.assign(old)
    seq.start(1, 1)  # the epoch was bumped
    assert not seq.is_current(old)
    seq.renumber_on_reset(old)
    seq.assign(old)
    assert (old.producer_epoch, old.base_sequence) == (1, 0)
    assert not seq.acked(old) and seq.is_current(old)


async def test_a_response_told_in_one_call_leaves_the_state_told_one_batch_at_a_time():
    """acked_all (a response with every batch written, one call) against resolved + acked
    batch by batch: the same acknowledgements, in-flight lists and unconfirmed partitions,
    and the first batch that leaves a gap behind reported (a younger batch of its partition
    failed unacknowledged), while a batch numbered under an older epoch only leaves flight."""
    def scenario() -> tuple[Sequencer, list[ProducerBatch]]:
        seq = Sequencer(max_in_flight=5, clock=lambda: 10.0)
        seq.start(1, 0)
        stale = _batch(1, partition=2)
        seq.assign(stale)
        seq.sent_all([stale])
        seq.start(1, 1)  # a new epoch: `stale` is no longer current
        older, younger, plain, later = _batch(2), _batch(1), _batch(3, 1), _batch(1, 1)
        for batch in (older, younger, plain, later):
            seq.assign(batch)
        seq.sent_all([older, plain])
        assert seq.failed(younger)  # its numbers are used up: a gap once `older` is acked
        return seq, [older, plain, stale]

    def state(seq: Sequencer) -> list:
        return [seq._acked_up_to, {tp: [b.base_sequence for b in u]
                                   for tp, u in seq._unacked.items()},
                {tp: [b.base_sequence for b in f] for tp, f in seq._in_flight.items()},
                seq._unconfirmed, seq._acked_at]

    one_by_one, told = scenario()
    gaps = []
    for batch in told:
        one_by_one.resolved(batch)
        if one_by_one.acked(batch):
            gaps.append(batch)
    assert gaps == [told[0]]
    at_once, batches = scenario()
    assert at_once.acked_all(batches) is batches[0]
    assert state(at_once) == state(one_by_one)
    assert at_once._acked_up_to == {("t", 0): 2, ("t", 1): 3}
    assert at_once._in_flight == {("t", 0): [], ("t", 1): [], ("t", 2): []}
