"""BufferPool: the memory bound, FIFO waiters, and max_block_ms."""

from __future__ import annotations

import asyncio

import pytest

from aioproducer._internal.buffer_pool import BufferPool
from aioproducer.errors import BufferExhaustedError


async def test_memory_returns_to_the_pool():
    pool = BufferPool(100)
    assert pool.try_reserve(60)
    assert not pool.try_reserve(50)
    pool.release(60)
    assert pool.available == 100
    await pool.reserve(100, timeout=0.1)
    assert pool.available == 0


async def test_waiters_are_served_in_arrival_order():
    pool = BufferPool(100)
    assert pool.try_reserve(100)
    served: list[str] = []

    async def wait(name: str, size: int) -> None:
        await pool.reserve(size, timeout=5)
        served.append(name)

    # A big request first, then small ones: the small ones must not overtake it.
    tasks = [asyncio.create_task(wait("big", 80))]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(wait(f"small{i}", 10)) for i in range(3)]
    await asyncio.sleep(0.01)
    assert pool.queued == 4
    for _ in range(10):  # memory comes back in small pieces
        pool.release(10)
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks[:2]), 1)
    assert served[:2] == ["big", "small0"]
    pool.release(30)
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert served == ["big", "small0", "small1", "small2"]


async def test_exhaustion_raises_after_max_block_and_keeps_the_accounting():
    pool = BufferPool(100)
    assert pool.try_reserve(90)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(BufferExhaustedError, match="max_block_ms"):
        await pool.reserve(50, timeout=0.2)
    assert loop.time() - started >= 0.19
    assert pool.available == 10 and pool.queued == 0  # what the waiter gathered came back
    pool.release(90)
    await pool.reserve(100, timeout=0.1)


async def test_cancelled_waiter_leaves_no_trace():
    pool = BufferPool(100)
    assert pool.try_reserve(100)
    first = asyncio.create_task(pool.reserve(60, timeout=5))
    second = asyncio.create_task(pool.reserve(30, timeout=5))
    await asyncio.sleep(0)
    pool.release(40)  # the head gathers 40 of its 60
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the gathered 40 went back: enough for the next waiter
    assert pool.available == 10 and pool.queued == 0


async def test_a_request_larger_than_the_pool_fails_at_once():
    with pytest.raises(BufferExhaustedError, match="buffer_memory"):
        await BufferPool(100).reserve(101, timeout=10)


async def test_sends_waiting_for_memory_are_served_in_arrival_order(broker, topic):
    """Each record needs a batch of its own and memory holds three: the tasks queue for it.
    A task that closes a full batch keeps its place in line (it used to yield first and join
    the back of the queue: task 2 was served 36 places late, and with a short max_block_ms,
    early tasks failed while later ones succeeded). Only the one yield that lets the sender
    ship the closed batch may let the next task's record in first."""
    from aioproducer import Producer

    async with Producer(broker.bootstrap, batch_size=1024, buffer_memory=3 * 1024,
                        linger_ms=0) as producer:
        served: list[int] = []

        async def send(i: int) -> None:
            await producer.enqueue(topic, b"%03d" % i + b"v" * 600, partition=0)
            served.append(i)

        await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(40))), 30)
        await producer.flush()
    assert sorted(served) == list(range(40))
    lateness = {i: position - i for position, i in enumerate(served)}
    assert max(lateness.values()) <= 1, f"served in the order {served}"


async def test_close_fails_sends_waiting_for_memory_at_once(proxied_broker):
    """With the broker stalled, memory never comes back: a send waiting for it must fail as
    soon as close() begins, not when close(timeout=5) gives up on the batches in flight."""
    from aioproducer import Producer
    from aioproducer.errors import ProducerClosedError

    cluster = proxied_broker
    cluster.create_topic("stalled", 1)
    producer = Producer(cluster.bootstrap, batch_size=1024, buffer_memory=1024,
                        max_block_ms=30_000, linger_ms=0)
    await producer.start()
    await producer.send("stalled", b"warm")
    cluster.proxy.stall(True)
    first = await producer.enqueue("stalled", b"v" * 600)  # holds all the memory
    waiting = asyncio.create_task(producer.enqueue("stalled", b"w" * 600))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    loop = asyncio.get_running_loop()
    closing = asyncio.create_task(producer.close(timeout=5))
    began = loop.time()
    with pytest.raises(ProducerClosedError):
        await asyncio.wait_for(waiting, 10)
    assert loop.time() - began < 2.5, "the waiting send failed only when close() gave up"
    cluster.proxy.stall(False)
    await asyncio.wait_for(closing, 10)
    assert first.done()


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
async def test_buffer_memory_bounds_what_waits_for_a_stalled_broker(proxied_broker, call):
    """Each new batch holds batch_size of buffer_memory, whichever call opened it: with the
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
