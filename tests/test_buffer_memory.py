"""buffer_memory: the bound on what waits for the broker, the line of records waiting for
memory (first come, first served, up to max_block_ms), and what a record in line may become:
appended in order, failed, or (cancelled) never sent."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aioproducer import Producer
from aioproducer.errors import BufferExhaustedError, ProducerClosedError, RecordTooLargeError
from tests.support.readback import consume_all

# Each record needs most of a batch: memory for three batches holds three records.
_LINE = dict(batch_size=1024, buffer_memory=3 * 1024, linger_ms=0, request_timeout_ms=30_000)


async def _stalled_and_full(cluster, topic: str, **config) -> tuple[Producer, list]:
    """A started producer whose buffer memory is all held by records the stalled broker does
    not acknowledge."""
    cluster.create_topic(topic, 1)
    producer = Producer(cluster.bootstrap, **{**_LINE, **config})
    await producer.start()
    await producer.send(topic, b"warm-up")
    cluster.proxy.stall(True)
    held = [await producer.enqueue(topic, b"held%d" % i + b"h" * 600) for i in range(3)]
    assert producer.metrics().buffer_memory_available < 1024
    return producer, held


async def _values(cluster, topic: str, expected: int) -> list[bytes]:
    records = await asyncio.to_thread(consume_all, cluster.bootstrap, topic, expected)
    return [r.value for r in sorted(records, key=lambda r: r.offset)]


async def test_gather_of_sends_past_buffer_memory_arrives_whole_and_in_order(proxied_broker):
    """send() calls that outrun buffer_memory wait in line as futures (gather makes no Task
    of them), and arrive in the order they were called: a large record among them is not
    overtaken by the small ones behind it."""
    cluster = proxied_broker
    producer, held = await _stalled_and_full(cluster, "line-order")
    try:
        values = [b"%03d" % i + b"v" * 500 for i in range(30)]
        values[5] = b"005" + b"L" * 2500  # a batch of its own, larger than batch_size
        sends = [producer.send("line-order", value) for value in values]
        assert all(asyncio.isfuture(s) for s in sends)
        await asyncio.sleep(0.2)
        assert producer.metrics().waiting_for_memory == 30
        assert not any(s.done() for s in sends)
        cluster.proxy.stall(False)
        metadata = await asyncio.wait_for(asyncio.gather(*sends), 30)
    finally:
        cluster.proxy.stall(False)
        await producer.close()
    offsets = [m.offset for m in metadata]
    assert offsets == sorted(offsets) and len(set(offsets)) == 30
    assert all(h.result().offset < offsets[0] for h in held)
    got = await _values(cluster, "line-order", 34)
    assert got == [b"warm-up", *(b"held%d" % i + b"h" * 600 for i in range(3)), *values]
    assert producer.metrics().buffer_memory_available == producer.config.buffer_memory


async def test_records_served_from_the_line_fill_whole_batches(broker, topic):
    """Sends gathered past buffer_memory wait in line, and the batches the line's records go
    into grow to batch_size as memory allows: they stayed at a new batch's first 1 KiB while
    anyone waited (nine records of 100 B a batch, a request and a response each), and 500k
    sends gathered at once went at 0.6x the speed (35k batches, not 5k)."""
    records, batch_size = 6000, 16384
    async with Producer(broker.bootstrap, batch_size=batch_size, buffer_memory=8 * batch_size,
                        linger_ms=5) as producer:
        sends = [producer.send(topic, b"%05d" % i + b"v" * 95, partition=0)
                 for i in range(records)]
        assert producer.metrics().waiting_for_memory > 0, "no record waited: proves nothing"
        metadata = await asyncio.wait_for(asyncio.gather(*sends), 60)
        batches = producer.metrics().batches_sent
    assert [m.offset for m in metadata] == list(range(records))
    per_batch = records / batches
    # A full batch holds ~150 of these records; the line's first 1 KiB, 9.
    assert per_batch >= 50, f"{batches} batches for {records} records: {per_batch:.0f} each"


async def test_a_send_cancelled_in_line_is_not_sent_and_the_rest_are(proxied_broker):
    """Cancelled while it waits for memory (its future, or every task awaiting it), a send()
    buffered nothing: it is not sent, like a coroutine cancelled before it buffered. The
    records around it are sent, in order, and all the memory comes back."""
    cluster = proxied_broker
    producer, _ = await _stalled_and_full(cluster, "line-cancel")
    try:
        first = producer.send("line-cancel", b"first" + b"v" * 600)
        cancelled = producer.send("line-cancel", b"cancelled" + b"v" * 600)
        awaited = asyncio.create_task(producer.send("line-cancel", b"timed-out" + b"v" * 600))
        last = producer.send("line-cancel", b"last" + b"v" * 600)
        await asyncio.sleep(0.1)
        assert cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        awaited.cancel()
        with pytest.raises(asyncio.CancelledError):
            await awaited
        assert producer.metrics().waiting_for_memory == 4  # (dropped when their turn comes)
        cluster.proxy.stall(False)
        await asyncio.wait_for(asyncio.gather(first, last), 30)
        await asyncio.wait_for(producer.flush(), 30)
        assert producer.metrics().waiting_for_memory == 0
        assert producer.metrics().buffer_memory_available == producer.config.buffer_memory
    finally:
        cluster.proxy.stall(False)
        await producer.close()
    got = [v.rstrip(b"v") for v in await _values(cluster, "line-cancel", 6)]
    assert len(got) == 6 and got[4:] == [b"first", b"last"]


async def test_an_enqueue_in_line_never_awaited_gives_its_place_up(proxied_broker, caplog):
    """An enqueue() waiting for memory joins the line at the call, and its coroutine
    appends it when its turn comes: one never awaited (the await forgotten) took its turn
    and held the head of the line for ever, every record behind it failing after
    max_block_ms, the producer wedged. Dropped, it leaves the line, reported as lost."""
    cluster = proxied_broker
    caplog.set_level(logging.ERROR, "asyncio")
    producer, held = await _stalled_and_full(cluster, "line-forgotten", max_block_ms=3_000)
    try:
        first = producer.send("line-forgotten", b"first" + b"v" * 600)  # (in line at the call)
        producer.enqueue("line-forgotten", b"forgotten" + b"v" * 600)  # the await forgotten
        behind = asyncio.ensure_future(producer.enqueue("line-forgotten", b"behind" + b"v" * 600))
        await asyncio.sleep(0.1)
        assert producer.metrics().waiting_for_memory == 3  # (the forgotten one until its turn)
        cluster.proxy.stall(False)
        record = await asyncio.wait_for(behind, 10)
        await asyncio.wait_for(asyncio.gather(first, record), 30)
        await asyncio.wait_for(producer.flush(), 30)
        assert producer.metrics().waiting_for_memory == 0
        assert producer.metrics().buffer_memory_available == producer.config.buffer_memory
    finally:
        cluster.proxy.stall(False)
        await producer.close()
    got = [v.rstrip(b"vh") for v in await _values(cluster, "line-forgotten", 6)]
    assert got == [b"warm-up", b"held0", b"held1", b"held2", b"first", b"behind"]
    assert any("'line-forgotten'" in r.getMessage() and "never awaited" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("call", ["send", "enqueue"])
async def test_records_in_line_fail_after_max_block_and_free_their_place(proxied_broker, call):
    """A record that waited max_block_ms for memory fails with BufferExhaustedError, having
    buffered nothing; the producer goes on once the broker answers again."""
    cluster = proxied_broker
    producer, held = await _stalled_and_full(cluster, f"line-expire-{call}", max_block_ms=300)
    topic = f"line-expire-{call}"
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        if call == "send":
            outcomes = await asyncio.wait_for(asyncio.gather(
                *(producer.send(topic, b"late%d" % i + b"v" * 600) for i in range(3)),
                return_exceptions=True), 10)
        else:
            outcomes = await asyncio.wait_for(asyncio.gather(
                *(producer.enqueue(topic, b"late%d" % i + b"v" * 600) for i in range(3)),
                return_exceptions=True), 10)
        assert all(isinstance(o, BufferExhaustedError) for o in outcomes), outcomes
        assert "max_block_ms" in str(outcomes[0])
        assert loop.time() - began >= 0.29
        cluster.proxy.stall(False)
        assert (await asyncio.wait_for(producer.send(topic, b"after"), 30)).offset == 4
        assert all(h.result().offset > 0 for h in held)
        assert producer.metrics().buffer_memory_available == producer.config.buffer_memory
    finally:
        cluster.proxy.stall(False)
        await producer.close()


@pytest.mark.parametrize("call", ["send", "enqueue"])
async def test_close_fails_records_waiting_for_memory_at_once(proxied_broker, call):
    """With the broker stalled, memory never comes back: a record waiting for it must fail as
    soon as close() begins, not when close(timeout=5) gives up on the batches in flight."""
    cluster = proxied_broker
    producer, held = await _stalled_and_full(cluster, "line-close", max_block_ms=30_000)
    waiting = asyncio.ensure_future(getattr(producer, call)("line-close", b"w" * 600))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    loop = asyncio.get_running_loop()
    closing = asyncio.create_task(producer.close(timeout=5))
    began = loop.time()
    with pytest.raises(ProducerClosedError):
        await asyncio.wait_for(waiting, 10)
    assert loop.time() - began < 2.5, "the waiting record failed only when close() gave up"
    cluster.proxy.stall(False)
    await asyncio.wait_for(closing, 10)
    assert all(h.done() for h in held)


async def test_a_record_larger_than_buffer_memory_fails_at_once(broker, topic):
    async with Producer(broker.bootstrap, batch_size=1024, buffer_memory=2048) as producer:
        with pytest.raises(RecordTooLargeError, match="buffer_memory"):
            await asyncio.wait_for(producer.send(topic, b"v" * 3000), 5)
        assert (await producer.send(topic, b"small")).offset == 0


async def test_sends_waiting_for_memory_are_served_in_arrival_order(broker, topic):
    """Each record needs a batch of its own and memory holds three: 400 tasks queue for it,
    and their records take offsets in the order the tasks called enqueue(). The order is
    read from the offsets the broker gave, not from when each call returned. A task that
    closed a full batch used to yield with its memory reserved but no batch opened, and the
    next task opened one first: record 2 took the offset before record 1's, in every run."""
    async with Producer(broker.bootstrap, batch_size=1024, buffer_memory=3 * 1024,
                        linger_ms=0) as producer:
        futures: dict[int, object] = {}

        async def send(i: int) -> None:
            futures[i] = await producer.enqueue(topic, b"%03d" % i + b"v" * 600, partition=0)

        await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(400))), 60)
        offsets = {i: (await asyncio.wait_for(f, 30)).offset for i, f in futures.items()}
    by_offset = sorted(offsets, key=offsets.__getitem__)
    overtaken = [(a, b) for a, b in zip(by_offset, by_offset[1:]) if b < a]
    assert not overtaken, f"(record, the earlier record it overtook): {overtaken}"


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
async def test_buffer_memory_bounds_what_waits_for_a_stalled_broker(proxied_broker, call):
    """The batches' bytes stay within buffer_memory, whichever call opened them: with the
    broker stalled, the calls wait once 4 batches' worth is buffered and fail after
    max_block_ms, having buffered no more."""
    from aioproducer import Producer, accepted
    from aioproducer.errors import BufferExhaustedError

    cluster = proxied_broker
    cluster.create_topic("bounded", 1)
    records = [(None, b"%05d" % i + b"v" * 95) for i in range(2000)]
    async with Producer(cluster.bootstrap, batch_size=4096, buffer_memory=4 * 4096,
                        max_block_ms=300, linger_ms=0, request_timeout_ms=30_000) as producer:
        await producer.send("bounded", b"first")
        cluster.proxy.stall(True)
        buffered = 0
        with pytest.raises(BufferExhaustedError):
            if call == "enqueue_many":
                try:
                    await asyncio.wait_for(producer.enqueue_many("bounded", records), 10)
                except BufferExhaustedError as exc:
                    buffered = len(accepted(exc) or ())
                    raise
            for _, value in records:
                await asyncio.wait_for(producer.enqueue("bounded", value), 10)
                buffered += 1
        assert 0 < buffered <= 4 * (4096 // 100), f"{buffered} records in 16 KiB"
        cluster.proxy.stall(False)
        await asyncio.wait_for(producer.flush(), 30)


@pytest.mark.timeout(600)  # 36-63 s here at a load of 15-20; over 300 s at 30 on 2 cores
async def test_ten_thousand_partitions_with_default_settings(proxied_broker):
    """Default settings (but request_timeout_ms, longer than the stall: a request retried
    after its timeout is stored twice by Tansu, which answers the duplicate without its
    offset), a topic of 10,000 partitions and a broker that does not answer:
    a record for every partition is buffered at once (each open batch used to reserve
    batch_size, 16 KiB, of the 32 MiB: the 2,049th record waited for memory until
    max_block_ms), then 40 MB more fill buffer_memory and wait in line. Meanwhile the
    producer holds at most buffer_memory and a stated overhead (below); once the broker
    answers, every record is delivered, each partition's offsets 0 to n-1."""
    import tracemalloc

    from aioproducer.config import ProducerConfig
    from aioproducer.tools.reader import TopicReader

    cluster, partitions, value = proxied_broker, 10_000, b"v" * 1000
    cluster.create_topic("wide", partitions)
    buffer_memory = ProducerConfig.from_kwargs(bootstrap_servers="-:1").buffer_memory
    async with Producer(cluster.bootstrap, request_timeout_ms=110_000) as producer:
        await producer.send("wide", b"metadata first", partition=0)
        cluster.proxy.stall(True)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            # (Before: BufferExhaustedError after max_block_ms, at the 2,049th.)
            first = [await producer.enqueue("wide", value, partition=p)
                     for p in range(partitions)]
            # Four more rounds, 40 MB of records, past buffer_memory: the last wait in line
            # (send(): a future each, no Task).
            later = [producer.send("wide", value, partition=p)
                     for _ in range(4) for p in range(partitions)]
            await asyncio.sleep(0.5)
            held = tracemalloc.get_traced_memory()[0] - before
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        waiting = producer._accumulator.waiting
        batches = len(producer._accumulator.incomplete)
        cluster.proxy.stall(False)
        metadata = await asyncio.wait_for(asyncio.gather(*first, *later), 120)
    assert waiting > 0, "the records did not outrun buffer_memory: the test proves nothing"
    # The stated overhead: per open batch its objects (ProducerBatch, writer, futures,
    # its partition's queue: about 1.5 KiB), per record its future (the test holds them)
    # and, while it waits in line, its place (~300 B together), and the requests in
    # flight, up to 5 of 1 MiB. (Unbounded, the 50 MB of records would be held besides.)
    overhead = batches * 1536 + (len(first) + len(later)) * 300 + 5 * (1 << 20)
    assert peak <= buffer_memory + overhead, \
        f"{peak / 2**20:.1f} MiB traced at the peak ({held / 2**20:.1f} at the end), " \
        f"{batches} batches, {waiting} records in line"
    offsets: dict[int, list[int]] = {}
    for record in metadata:
        offsets.setdefault(record.partition, []).append(record.offset)
    assert {p: sorted(o) for p, o in offsets.items()} == \
        {p: list(range(1, 6)) if p == 0 else list(range(5)) for p in range(partitions)}
    config = ProducerConfig.from_kwargs(bootstrap_servers=cluster.bootstrap)
    stored = 0
    async with TopicReader(config, "wide", from_beginning=True) as reader:
        for _ in range(100):  # (bounded: 50 s)
            stored += len(await reader.fetch(max_wait=0.5))
            if stored >= len(metadata) + 1:
                break
    assert stored == len(metadata) + 1
