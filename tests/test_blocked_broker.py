"""A broker that can take no request (its connection paused, or its in-flight limit full)
costs the sender no round per batch filled meanwhile: its unblocking wakes the sender, and
that round takes what queued. Each batch opened or closed used to wake the sender for a round
that wrote nothing (issue 42: 300k records of 1 KB in 16 KiB batches to the embedded
broker, which is slower than the producer at that size, took ~21,500 rounds, ~18,200 of them
empty; now ~3,400). Nor does a batch left lingering after a write: the round after each
write followed at once while anything was queued, and wrote nothing when what was left was
a busy partition's next batch, still lingering; nor does opening that batch, which enqueue()
does a loop turn after closing the full one (it woke the sender for a round that only set
the batch's linger timer). Rounds are counted on the real sender; the
brokers are the embedded one (behind a proxy that stops reading) and the simulated cluster."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest

from aioproducer import Producer
from aioproducer.testing import SimulatedCluster
from tests.support.readback import consume_all

_BATCH = 16 * 1024  # batch_size: 15 records of 1 KB a batch
_RECORDS = 2048  # while blocked: ~137 batches
_FEW_ROUNDS = 8  # a timer set before, say; far from a round per batch


def _count_rounds(producer: Producer) -> list[int]:
    """From now on, count the sender's rounds (its own method, counted as it runs)."""
    sender = producer._sender
    assert sender is not None
    run_once = sender._run_once
    count = [0]

    def counted(now: float) -> float:
        count[0] += 1
        return run_once(now)

    sender._run_once = counted  # type: ignore[method-assign]
    return count


class _Records:
    """Numbered records of 1 KB enqueued for one partition, a loop turn every batch's worth
    (the sender's turn, as a producing service gives it)."""

    def __init__(self, producer: Producer, topic: str, partition: int) -> None:
        self.producer, self.topic, self.partition = producer, topic, partition
        self.values: list[bytes] = []
        self.handles: list[Any] = []

    async def enqueue(self, n: int) -> None:
        for _ in range(n):
            value = b"%08d" % len(self.values) + bytes(992)
            self.handles.append(await self.producer.enqueue(self.topic, value,
                                                            partition=self.partition))
            self.values.append(value)
            if len(self.values) % 16 == 0:
                await asyncio.sleep(0)


async def test_acks_0_a_paused_connection_costs_no_round_per_batch(proxied_broker):
    """At acks=0 a broker that reads nothing gets its connection paused, and the sender
    writes it nothing until it resumes; every batch filled meanwhile still woke the sender,
    for a round that found the connection paused (more than one a batch). Now a few rounds
    for ~137 batches; once the broker reads again every record arrives, in order, once."""
    cluster = proxied_broker
    topic = f"paused-{random.randrange(10**6)}"
    cluster.create_topic(topic, 1)
    producer = Producer(cluster.bootstrap, acks=0, enable_idempotence=False, linger_ms=5,
                        batch_size=_BATCH, buffer_memory=16 * 1024 * 1024,
                        max_request_size=256 * 1024, max_block_ms=10_000)
    await producer.start()
    records = _Records(producer, topic, 0)
    try:
        await records.enqueue(1)
        await asyncio.wait_for(records.handles[0], 10)
        assert producer._cluster is not None
        [conn] = producer._cluster.open_connections()
        cluster.proxy.stop_reading(True)
        for _ in range(4096):  # (64 MB: far beyond what the kernel's socket buffers take)
            await records.enqueue(16)
            if conn.paused:
                break
        assert conn.paused, "the connection never paused while the broker read nothing"
        rounds = _count_rounds(producer)
        await records.enqueue(_RECORDS)
        assert conn.paused  # (the broker still reads nothing)
        assert rounds[0] <= _FEW_ROUNDS, \
            f"{rounds[0]} sender rounds while the connection was paused, for " \
            f"{_RECORDS} records in batches of {_BATCH} bytes"
        cluster.proxy.stop_reading(False)
        await asyncio.wait_for(asyncio.gather(*records.handles), 30)
    finally:
        cluster.proxy.stop_reading(False)
        await asyncio.wait_for(producer.close(), 30)
    got = await asyncio.to_thread(consume_all, cluster.bootstrap, topic, len(records.values), 60)
    assert [r.value for r in got] == records.values


async def test_a_broker_whose_in_flight_limit_is_full_costs_no_round_per_batch(
        cluster: SimulatedCluster) -> None:
    """At acks=1 a slow node's one request in flight (max_in_flight 1) is answered after
    2 s; every batch filled for it meanwhile woke the sender, for a round that found no room.
    Now a few rounds for ~137 batches, while a record for another node still leaves at once
    (answered long before the slow node's response); once the slow node answers, every
    record arrives, in order, once."""
    topic = f"c-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(topic, 3)
    slow = cluster.leader(topic, 0)
    other = next(p for p in (1, 2) if cluster.leader(topic, p) != slow)
    async with Producer(cluster.bootstrap_servers, acks=1, enable_idempotence=False,
                        linger_ms=5, batch_size=_BATCH, buffer_memory=16 * 1024 * 1024,
                        max_in_flight_requests_per_connection=1) as producer:
        await producer.send(topic, b"warm-up", partition=other)
        records = _Records(producer, topic, 0)
        await records.enqueue(1)
        await asyncio.wait_for(records.handles[0], 10)
        assert producer._cluster is not None
        [conn] = [c for c in producer._cluster.open_connections() if c.node_id == slow]
        cluster.slow(slow, 2.0)
        try:
            await records.enqueue(1)
            for _ in range(100):  # (1 s at most: written at its linger's end)
                if conn.in_flight_produce:
                    break
                await asyncio.sleep(0.01)
            assert conn.in_flight_produce == 1
            rounds = _count_rounds(producer)
            await records.enqueue(_RECORDS)
            assert conn.in_flight_produce == 1  # (its answer takes 2 s)
            assert rounds[0] <= _FEW_ROUNDS, \
                f"{rounds[0]} sender rounds while the in-flight limit was full, for " \
                f"{_RECORDS} records in batches of {_BATCH} bytes"
            await asyncio.wait_for(producer.send(topic, b"not held back", partition=other), 1)
        finally:
            cluster.slow(slow, 0)  # (one batch a request to it: 2 s each would be minutes)
        await asyncio.wait_for(asyncio.gather(*records.handles), 30)
    got = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic,
                                  len(records.values) + 2, 60)
    assert [r.value for r in got if r.partition == 0] == records.values
    assert [r.value for r in got if r.partition == other] == [b"warm-up", b"not held back"]


@pytest.mark.parametrize("call", ["send", "enqueue"])
async def test_a_batch_left_lingering_after_a_write_costs_no_round(broker, topic, call):
    """A busy partition at linger_ms > 0: each full batch is closed and the next opened
    lingering. send() does both in one call, and the round it wakes writes the full batch
    and leaves the new one lingering; the next round followed at once because a batch was
    queued, and wrote nothing (499 rounds for 249 requests); now the sender sleeps until
    that batch is sendable. enqueue() opens the next batch a loop turn after closing the
    full one (after the round that wrote it), and that opening woke the sender for a round
    that only set the new batch's linger timer (499 rounds too); now the opening sets the
    timer itself. acks=0, so no response wakes the sender either; a 10 s linger, so none
    ends during the test. Every record arrives, in order, once."""
    producer = Producer(broker.bootstrap, acks=0, enable_idempotence=False, linger_ms=10_000,
                        batch_size=1024)
    await producer.start()
    assert producer._sender is not None
    values = [b"%06d" % i + bytes(94) for i in range(2000)]  # ~9 records of 100 B a batch
    futures: list[Any] = []
    try:
        rounds = _count_rounds(producer)
        requests = producer._sender.requests
        for value in values:
            if call == "send":
                futures.append(producer.send(topic, value, partition=0))
            else:
                futures.append(await producer.enqueue(topic, value, partition=0))
            await asyncio.sleep(0)  # the sender's turn, after every record
        requests = producer._sender.requests - requests
        assert requests >= 150  # (a request for each batch filled)
        assert rounds[0] <= requests + _FEW_ROUNDS, \
            f"{rounds[0]} sender rounds for {requests} requests, one batch each"
        await asyncio.wait_for(producer.flush(), 30)
        await asyncio.wait_for(asyncio.gather(*futures), 30)
    finally:
        await asyncio.wait_for(producer.close(), 30)
    got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, len(values), 60)
    assert [r.value for r in got] == values


_LINGER = 0.2  # linger_ms/1000 of the test below
_LATE = 1.0  # seconds past its linger's end that a record may be acknowledged (a loaded host)


@pytest.mark.parametrize("call", ["send", "enqueue"])
async def test_a_lingering_batch_is_written_when_its_linger_ends(broker, topic, call):
    """A batch opened while the sender sleeps, which only lingers, sets the sender's timer
    for its linger's end rather than waking it: its record is written then, not before and
    not much later. A lone record on an idle producer; then one that opens the next batch
    after a full one (closed by the record before it: the full batch goes at once)."""
    loop = asyncio.get_running_loop()
    async with Producer(broker.bootstrap, linger_ms=round(_LINGER * 1000),
                        batch_size=1024) as producer:
        await producer.send(topic, b"warm-up", partition=0)  # (metadata, producer id)

        async def produce(value: bytes) -> Any:
            if call == "send":
                return asyncio.ensure_future(producer.send(topic, value, partition=0))
            return await producer.enqueue(topic, value, partition=0)

        began = loop.time()
        lone = await produce(b"lone")
        await asyncio.wait_for(lone, _LINGER + _LATE + 5)
        waited = loop.time() - began
        assert _LINGER - 0.002 <= waited < _LINGER + _LATE, f"a lone record waited {waited} s"

        # 8 records of 100 B fill a batch of 1 KiB (61 B of header, 108 a record); the 9th
        # closes it and opens the next.
        values = [b"%06d" % i + bytes(94) for i in range(9)]
        handles = [await produce(value) for value in values[:-1]]
        began = loop.time()
        handles.append(await produce(values[-1]))
        await asyncio.wait_for(asyncio.gather(*handles[:-1]), _LINGER + _LATE + 5)
        assert not handles[-1].done(), "the full batch waited for the next one's linger"
        await asyncio.wait_for(handles[-1], _LINGER + _LATE + 5)
        waited = loop.time() - began
        assert _LINGER - 0.002 <= waited < _LINGER + _LATE, \
            f"the record after a full batch waited {waited} s"
    got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 11, 60)
    assert [r.value for r in got] == [b"warm-up", b"lone", *values]


def test_the_sender_s_timer_may_be_due_at_once_on_uvloop(broker):
    """uvloop's call_at() for a time under half a millisecond away gives a plain Handle (run
    at the next loop turn), which has no when(); the sender read the next wake-up's time
    from it, and a send() that opened a lingering batch before that turn came raised
    AttributeError inside the opening, after its record was in the batch (found as
    duplicated records: see the test below)."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        async with Producer(broker.bootstrap) as producer:
            sender, loop = producer._sender, asyncio.get_running_loop()
            assert sender is not None
            sender._wake_by(loop.time())  # due now: a Handle on uvloop
            sender._wake_by(loop.time() + 1.0)  # (later: kept)
            sender._wake_by(loop.time())
            await asyncio.sleep(0.01)

    uvloop.run(main())


@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_records_sent_from_many_tasks_to_three_nodes_land_once(cluster, use_uvloop):
    """100 tasks sending at 10,000 records/s (run.py's leader-moves-latency shape, without
    the moves) to three nodes at linger 5 ms: every record arrives once. On uvloop a
    send() could open a batch while the sender's timer was a Handle due at once (see the
    test above): the opening raised after the record was in its batch, and the send was
    done again from the start, into the same batch (13-36 records of 50,000 twice at
    consecutive offsets, and the batch's memory given back while it held it)."""
    if use_uvloop:
        uvloop = pytest.importorskip("uvloop")
    topic = f"once-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 6)
    records, tasks, rate = 20_000, 100, 10_000

    async def main() -> None:
        async with Producer(cluster.bootstrap_servers, linger_ms=5, batch_size=16384,
                            enable_idempotence=False) as producer:
            start = asyncio.get_running_loop().time()

            async def worker(index: int) -> None:
                for i in range(records // tasks):
                    n = i * tasks + index
                    delay = start + n / rate - asyncio.get_running_loop().time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await asyncio.wait_for(
                        producer.send(topic, b"%d" % n, key=b"key-%d" % (n % 1000)), 30)

            await asyncio.wait_for(asyncio.gather(*(worker(t) for t in range(tasks))), 60)

    uvloop.run(main()) if use_uvloop else asyncio.run(main())
    got = consume_all(cluster.bootstrap_servers, topic, records, 60)
    values = sorted(int(r.value) for r in got)
    assert values == list(range(records)), \
        f"{len(got)} records read, {len(set(values))} distinct, of {records} sent"


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
async def test_batches_that_only_linger_while_the_sender_sleeps_do_not_wake_it(
        broker, topic_factory, idempotent):
    """A record for each of 300 partitions, each opening a batch that only lingers, while
    the sender sleeps with a round due before their lingers end (the first one's): the
    openings after the first do not call Sender.wake_for, which would only find its timer
    set early enough (~10,000 instructions a batch: at 10,000 partitions a batch opens
    every 17 records). On main each of the 300 called it. Every record arrives once, in its
    partition, when the lingers end; a partition with no leader still wakes the sender
    (test_leaders.py), as does a flush."""
    partitions = 300
    topic = topic_factory(partitions)
    values = [b"%03d" % p for p in range(partitions)]
    async with Producer(broker.bootstrap, linger_ms=2000,
                        enable_idempotence=idempotent) as producer:
        await producer.send(topic, b"warm-up", partition=0)  # (metadata, producer id)
        accumulator = producer._accumulator
        wake_for, woken = accumulator.wake_sender_for, []

        def counted(batch: Any, opened: bool) -> None:
            woken.append(batch.partition)
            wake_for(batch, opened)

        accumulator.wake_sender_for = counted
        handles = [await producer.enqueue(topic, value, partition=p)
                   for p, value in enumerate(values)]
        assert woken == [0], f"{len(woken)} wakes for {partitions} lingering batches"
        assert not any(handle.done() for handle in handles)  # (lingering)
        await asyncio.wait_for(asyncio.gather(*handles), 30)
    got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, partitions + 1, 60)
    assert sorted((r.partition, r.value) for r in got) == \
        sorted([(0, b"warm-up")] + list(enumerate(values)))
