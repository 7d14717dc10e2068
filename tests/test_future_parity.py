"""Our futures under every asyncio function, side by side with a plain asyncio.Future: the
same call, made on a record future and on a plain future resolved at the same moment, must
end the same way (results, exceptions and their messages, which futures end cancelled, what
callbacks see), on every Python version CI runs. The record future's record is sent whatever
happened to the future (cancelling it only stops following the record)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from aioproducer import Producer, RecordMetadata

RESULT = object()  # the plain future's result: "the record's metadata"


class Subject:
    """A pending future and the way to resolve it: `resolve()` starts it, `settled()` waits
    until it is resolved (starting it if need be) and its callbacks have run."""

    def __init__(self, future: Any, resolve: Callable[[], None],
                 settled: Callable[[], Awaitable[None]]) -> None:
        self.future = future
        self.resolve = resolve
        self.settled = settled


def plain_subject() -> Subject:
    future = asyncio.get_running_loop().create_future()

    def resolve() -> None:
        if not future.done():
            future.set_result(RESULT)

    async def settled() -> None:
        resolve()
        for _ in range(3):
            await asyncio.sleep(0)

    return Subject(future, resolve, settled)


async def record_subject(producer: Producer, topic: str, send: bool) -> Subject:
    """enqueue()'s RecordFuture, or the one send() returns (a Sending, once the topic's
    metadata is known): pending until flushed, as linger_ms is long."""
    await producer.partitions_for(topic)
    future = producer.send(topic, b"v") if send else await producer.enqueue(topic, b"v")
    flushing: list[asyncio.Task[None]] = []

    def resolve() -> None:
        flushing.append(asyncio.get_running_loop().create_task(producer.flush()))

    async def settled() -> None:
        if not flushing:
            resolve()
        await flushing[-1]
        for _ in range(3):
            await asyncio.sleep(0)

    return Subject(future, resolve, settled)


def described(value: Any) -> Any:
    """A result, an exception or a future's state as the comparison sees them."""
    if isinstance(value, RecordMetadata) or value is RESULT:
        return "result"
    if isinstance(value, BaseExceptionGroup):
        return (type(value).__name__, [described(e) for e in value.exceptions])
    if isinstance(value, BaseException):
        return (type(value).__name__, value.args)
    if isinstance(value, (list, tuple)):
        return [described(v) for v in value]
    if isinstance(value, asyncio.Future) or asyncio.isfuture(value):
        if value.cancelled():
            return "cancelled"
        return "done" if value.done() else "pending"
    return value


async def outcome(awaitable: Awaitable[Any]) -> Any:
    try:
        return described(await awaitable)
    except BaseException as exc:  # (CancelledError too: it is what is compared)
        return described(exc)


async def follow(future: Any) -> Any:
    return await future


# Each scenario does the same thing to either future and returns what a user would see.

async def awaited(s: Subject) -> Any:
    s.resolve()
    return [await outcome(s.future), described(s.future)]


async def gathered(s: Subject) -> Any:
    s.resolve()
    return [await outcome(asyncio.gather(s.future)), described(s.future)]


async def gather_cancelled(s: Subject) -> Any:
    gathering = asyncio.gather(s.future)
    await asyncio.sleep(0)
    gathering.cancel("enough")
    return [await outcome(gathering), described(s.future)]


async def gather_of_a_cancelled_future(s: Subject) -> Any:
    gathering = asyncio.gather(s.future)
    s.future.cancel("not needed")
    return [await outcome(gathering), described(s.future)]


async def gather_returning_a_cancelled_future(s: Subject) -> Any:
    gathering = asyncio.gather(s.future, return_exceptions=True)
    s.future.cancel("not needed")
    return [await outcome(gathering), described(s.future)]


async def wait_all(s: Subject) -> Any:
    s.resolve()
    done, pending = await asyncio.wait([s.future])
    return [len(done), len(pending), described(s.future)]


async def wait_timing_out(s: Subject) -> Any:
    done, pending = await asyncio.wait([s.future], timeout=0.01)
    seen = [len(done), len(pending), described(s.future)]
    await s.settled()
    return seen + [described(s.future)]


async def wait_for_in_time(s: Subject) -> Any:
    s.resolve()
    return [await outcome(asyncio.wait_for(s.future, 30)), described(s.future)]


async def wait_for_timing_out(s: Subject) -> Any:
    return [await outcome(asyncio.wait_for(s.future, 0.01)), described(s.future)]


async def shield_timing_out(s: Subject) -> Any:
    seen = [await outcome(asyncio.wait_for(asyncio.shield(s.future), 0.01)),
            described(s.future)]
    await s.settled()
    return seen + [described(s.future)]


async def timeout_in_time(s: Subject) -> Any:
    async def within() -> Any:
        async with asyncio.timeout(30):
            return await s.future

    s.resolve()
    return [await outcome(within()), described(s.future)]


async def timeout_expiring(s: Subject) -> Any:
    async def within() -> Any:
        async with asyncio.timeout(0.01):
            return await s.future

    return [await outcome(within()), described(s.future)]


async def as_completed_all(s: Subject) -> Any:
    s.resolve()
    return [[await outcome(f) for f in asyncio.as_completed([s.future])], described(s.future)]


async def as_completed_timing_out(s: Subject) -> Any:
    async def first() -> Any:
        for next_done in asyncio.as_completed([s.future], timeout=0.01):
            return await next_done

    seen = [await outcome(first()), described(s.future)]
    await s.settled()
    return seen + [described(s.future)]


async def task_group_in_time(s: Subject) -> Any:
    s.resolve()
    async with asyncio.TaskGroup() as group:
        task = group.create_task(follow(s.future))
    return [await outcome(task), described(s.future)]


async def task_group_cancelling(s: Subject) -> Any:
    async def fail() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("a sibling failed")

    async def run() -> None:
        async with asyncio.TaskGroup() as group:
            tasks.append(group.create_task(follow(s.future)))
            group.create_task(fail())

    tasks: list[asyncio.Task[Any]] = []
    return [await outcome(run()), await outcome(tasks[0]), described(s.future)]


async def task_cancelled_while_awaiting(s: Subject) -> Any:
    task = asyncio.get_running_loop().create_task(follow(s.future))
    await asyncio.sleep(0.01)
    task.cancel("client gone")
    return [await outcome(task), described(s.future)]


async def future_cancelled_while_awaited(s: Subject) -> Any:
    task = asyncio.get_running_loop().create_task(follow(s.future))
    await asyncio.sleep(0.01)
    s.future.cancel("not needed")
    return [await outcome(task), described(s.future)]


async def one_of_two_waits_cancelled(s: Subject) -> Any:
    loop = asyncio.get_running_loop()
    first, second = loop.create_task(follow(s.future)), loop.create_task(follow(s.future))
    await asyncio.sleep(0.01)
    first.cancel()
    return [await outcome(first), await outcome(second), described(s.future)]


async def callbacks(s: Subject) -> Any:
    seen: list[Any] = []
    s.future.add_done_callback(lambda f: seen.append(("first", described(f))))
    s.future.add_done_callback(lambda f: seen.append(("second", described(f))))
    s.resolve()
    seen.append("resolving")
    await s.settled()
    s.future.add_done_callback(lambda f: seen.append(("added when done", described(f))))
    seen.append("added")
    await asyncio.sleep(0)
    return seen


async def callbacks_of_a_cancelled_future(s: Subject) -> Any:
    seen: list[Any] = []
    s.future.add_done_callback(lambda f: seen.append(described(f)))
    cancelled = s.future.cancel("not needed")
    seen.append("cancelled")
    await asyncio.sleep(0)
    return [cancelled, seen, s.future.cancel(), await outcome(s.future)]


SCENARIOS = [awaited, gathered, gather_cancelled, gather_of_a_cancelled_future,
             gather_returning_a_cancelled_future, wait_all, wait_timing_out, wait_for_in_time,
             wait_for_timing_out, shield_timing_out, timeout_in_time, timeout_expiring,
             as_completed_all, as_completed_timing_out, task_group_in_time,
             task_group_cancelling, task_cancelled_while_awaiting,
             future_cancelled_while_awaited, one_of_two_waits_cancelled, callbacks,
             callbacks_of_a_cancelled_future]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
@pytest.mark.parametrize("send", [False, True], ids=["enqueue", "send"])
async def test_a_record_future_ends_as_a_plain_future_does(broker, topic, scenario, send):
    expected = await scenario(plain_subject())
    if send and scenario in (wait_all, wait_timing_out):
        # send()'s future is a coroutine too, which asyncio.wait refuses, as any `async def`.
        expected = ("TypeError", ("Passing coroutines is forbidden, use tasks explicitly.",))
    async with Producer(broker.bootstrap, linger_ms=60_000) as producer:
        subject = await record_subject(producer, topic, send)
        try:
            got = await scenario(subject)
        except TypeError as exc:
            got = described(exc)
        after = await producer.enqueue(topic, b"after")
        await producer.flush()
    assert got == expected
    assert after.result().offset == 1  # the record was sent, whatever became of its future


def run_until_complete(loop: asyncio.AbstractEventLoop, future: Any) -> Any:
    try:
        return described(loop.run_until_complete(future))
    except BaseException as exc:
        return described(exc)


def test_run_until_complete_ends_as_with_a_plain_future(broker, topic):
    loop = asyncio.new_event_loop()
    try:
        plain = loop.create_future()
        loop.call_later(0.01, plain.set_result, RESULT)
        expected = run_until_complete(loop, plain)
        cancelled = loop.create_future()
        loop.call_later(0.01, cancelled.cancel, "not needed")
        expected_cancel = run_until_complete(loop, cancelled)

        producer = Producer(broker.bootstrap, linger_ms=60_000)
        loop.run_until_complete(producer.start())
        record = loop.run_until_complete(producer.enqueue(topic, b"v"))
        loop.call_later(0.01, lambda: loop.create_task(producer.flush()))
        got = run_until_complete(loop, record)
        record = loop.run_until_complete(producer.enqueue(topic, b"v"))
        loop.call_later(0.01, record.cancel, "not needed")
        got_cancel = run_until_complete(loop, record)
        after = loop.run_until_complete(producer.enqueue(topic, b"after"))
        loop.run_until_complete(producer.close())
    finally:
        loop.close()
    assert (got, got_cancel) == (expected, expected_cancel)
    assert after.result().offset == 2
