"""RecordFuture, BulkFuture and send() with every asyncio combinator, against a real broker:
results in input order, each record's own exception, cancellation that stops the wait but
never the record, timeouts, callbacks in their own context. What landed is read back with
librdkafka's consumer."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import logging
import os
import sys
import uuid
import warnings
import weakref

import pytest

from aioproducer import BulkFuture, Producer, RecordFuture
from aioproducer.errors import DeliveryTimeoutError, MessageTooLargeError
from tests.support.readback import consume_all

# Long enough that a record is still pending when the test acts on it, short enough to wait.
SLOW = {"linger_ms": 300}


def _values(got: list) -> list[bytes]:
    return [r.value for r in sorted(got, key=lambda r: (r.partition, r.offset))]


def _assert_landed(metadata: list, consumed: list) -> None:
    """Every metadata points at the record read back at that partition and offset."""
    at = {(r.partition, r.offset): r.value for r in consumed}
    assert len(at) == len(consumed), "a record was read twice"
    for md, value in metadata:
        assert at[(md.partition, md.offset)] == value


async def test_a_record_future_is_an_asyncio_future(broker, topic):
    async with Producer(broker.bootstrap) as producer:
        future = await producer.enqueue(topic, b"v")
        assert asyncio.isfuture(future)
        assert asyncio.ensure_future(future) is future
        assert future.get_loop() is asyncio.get_running_loop()
        with pytest.raises(asyncio.InvalidStateError):
            future.result()
        with pytest.raises(RuntimeError, match="resolved by the producer"):
            future.set_result(None)
        md = await future
        assert future.done() and not future.cancelled() and future.exception() is None
        assert future.result() == md and md.offset == 0


async def test_gather_returns_every_records_metadata_in_order(broker, topic_factory):
    topic = topic_factory(3)
    values = [b"%05d" % i for i in range(3000)]
    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        futures = [await producer.enqueue(topic, v, key=v[-1:]) for v in values]
        metadata = await asyncio.gather(*futures)
    assert all(md.topic == topic for md in metadata)
    _assert_landed(list(zip(metadata, values)), consume_all(broker.bootstrap, topic, 3000))


async def test_gather_of_send_buffers_each_record_once_in_call_order(broker, topic_factory):
    topic = topic_factory(3)
    values = [b"%05d" % i for i in range(3000)]
    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        metadata = await asyncio.gather(*(producer.send(topic, v, key=v[-1:]) for v in values))
    consumed = consume_all(broker.bootstrap, topic, 3000)
    _assert_landed(list(zip(metadata, values)), consumed)
    for key in b"0123456789":  # per key, in the order of the calls
        assert [r.value for r in sorted(consumed, key=lambda r: r.offset)
                if r.key == bytes([key])] == [v for v in values if v[-1] == key]


async def test_send_runs_as_a_task_and_under_asyncio_run(broker, topic):
    async with Producer(broker.bootstrap) as producer:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(producer.send(topic, b"%d" % i)) for i in range(50)]
        task_offsets = [t.result().offset for t in tasks]
        direct = await producer.send(topic, b"direct")
    assert sorted(task_offsets) == list(range(50)) and direct.offset == 50


async def test_enqueue_buffers_at_the_call_and_runs_as_a_task(broker, topic):
    """In the producer's loop, enqueue() buffers a record that fits its open batch at the
    call, as send() does: records keep the order of the calls, whenever each is awaited; and
    what it returns is a coroutine to create_task(), TaskGroups and gather()."""
    async with Producer(broker.bootstrap, **SLOW) as producer:
        first = await producer.enqueue(topic, b"0", partition=0)  # (opens the batch)
        called_first = producer.enqueue(topic, b"1", partition=0)
        awaited_first = await producer.enqueue(topic, b"2", partition=0)
        futures = [first, await called_first, awaited_first]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(producer.enqueue(topic, b"%d" % i, partition=0))
                     for i in (3, 4)]
        futures += [task.result() for task in tasks]
        futures += await asyncio.gather(producer.enqueue(topic, b"5", partition=0),
                                        asyncio.create_task(producer.enqueue(topic, b"6",
                                                                             partition=0)))
        assert all(type(future) is RecordFuture for future in futures)
        metadata = await asyncio.gather(*futures)
    assert [md.offset for md in metadata] == list(range(7))
    assert _values(consume_all(broker.bootstrap, topic, 7)) == [b"%d" % i for i in range(7)]


async def test_a_keyless_enqueue_never_awaited_opens_its_batch_at_the_call(broker,
                                                                          topic_factory):
    """A loop of enqueue() calls whose await was forgotten (Python warns, once: a coroutine
    never awaited). Keyless records, which open their batch themselves, were appended only
    when awaited: no batch opened and all 1,000 were lost, where keyed ones all arrived. The
    call opens the batch, as send()'s does; only a record that has to wait (for the topic's
    metadata, or for memory) is lost without its await."""
    topic = topic_factory(3)
    async with Producer(broker.bootstrap) as producer:
        await producer.partitions_for(topic)  # (the metadata: no record waits for it)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (there, a coroutine's)
            for i in range(1000):
                producer.enqueue(topic, b"%d" % i)  # the await forgotten
                producer.enqueue(topic, b"k%d" % i, key=b"k")
    got = consume_all(broker.bootstrap, topic, expected=2000)
    assert sorted(r.value for r in got if r.key is None) == sorted(b"%d" % i for i in range(1000))
    assert [r.value for r in got if r.key == b"k"] == [b"k%d" % i for i in range(1000)]


async def test_a_send_never_awaited_that_had_to_wait_is_reported_with_its_line(broker, caplog):
    """send() and enqueue() before the topic's metadata is known return a coroutine that
    buffers the record when awaited: dropped unawaited, the record is lost. Said at ERROR
    through the loop's exception handler, with the topic, the caller's line and what to do
    (Python's RuntimeWarning named an internal coroutine, and is shown once per place)."""
    topic = f"unseen-{uuid.uuid4().hex[:10]}"  # (created by the first metadata request)
    caplog.set_level(logging.ERROR, "asyncio")
    async with Producer(broker.bootstrap) as producer:
        producer.send(topic, b"lost")  # the await forgotten, the topic not known yet
        line = sys._getframe().f_lineno - 1
        producer.enqueue(topic, b"lost too")
        await asyncio.sleep(0)  # (the report is a loop callback)
        reports = [r.getMessage() for r in caplog.records if "never awaited" in r.getMessage()]
        assert len(reports) == 2, reports
        assert f"producer.send({topic!r}, ...) at {__file__}:{line} was never awaited" in \
            reports[0] and "the record was not sent" in reports[0]
        assert f"producer.enqueue({topic!r}" in reports[1]
        assert (await producer.send(topic, b"kept")).offset == 0


async def test_an_enqueue_many_never_awaited_is_reported_with_its_line(broker, topic, caplog):
    """enqueue_many() buffers nothing until awaited: a call whose await was forgotten lost
    every record with only Python's RuntimeWarning, "coroutine 'Producer.enqueue_many' was
    never awaited" (shown once per place, and not at all where warnings are filtered). Said
    at ERROR through the loop's exception handler, as for send(), with the topic and the
    caller's line, and Python's warning is not given too."""
    caplog.set_level(logging.ERROR, "asyncio")
    async with Producer(broker.bootstrap) as producer:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            producer.enqueue_many(topic, [(None, b"lost")] * 3)  # the await forgotten
            line = sys._getframe().f_lineno - 1
            await asyncio.sleep(0)  # (the report is a loop callback)
        assert [str(w.message) for w in warned] == []
        reports = [r.getMessage() for r in caplog.records if "never awaited" in r.getMessage()]
        assert len(reports) == 1, reports
        assert f"producer.enqueue_many({topic!r}, ...) at {__file__}:{line} was never " \
            "awaited: its records were not sent" in reports[0]
        await (await producer.enqueue_many(topic, [(None, b"kept")]))
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"kept"]


@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "on_send-hook"])
async def test_starlette_background_tasks_await_the_producers_calls(broker, topic, hooked):
    """Starlette's BackgroundTask(func, ...) awaits func's call on the loop if func is a
    coroutine function (asyncio's test on 3.11, inspect's from 3.13), else runs it in a
    worker thread: there send() returned a coroutine nobody awaited, and the record was lost.
    send, enqueue and enqueue_many (compiled or not, with on_send hooks or not, started or
    not) are coroutine functions to both: each record is sent, in order."""
    starlette = pytest.importorskip("starlette.background")
    from aioproducer.hooks import ProducerHooks

    class Seen(ProducerHooks):
        def on_send(self, topic, key, value, headers):
            headers.append(("seen", b"1"))

    # (inspect's test knows markcoroutinefunction's mark from 3.12; asyncio's, its own)
    tests = [asyncio.iscoroutinefunction] + \
        [inspect.iscoroutinefunction] * (sys.version_info >= (3, 12))
    producer = Producer(broker.bootstrap, hooks=[Seen()] if hooked else [])
    assert all(test(producer.send) and test(producer.enqueue) and test(producer.enqueue_many)
               for test in tests)
    async with producer:
        assert all(test(producer.send) and test(producer.enqueue) for test in tests)
        await starlette.BackgroundTask(producer.send, topic, b"send")()
        await starlette.BackgroundTask(producer.enqueue, topic, b"enqueue")()
        await starlette.BackgroundTask(producer.enqueue_many, topic, [(None, b"many")])()
    got = consume_all(broker.bootstrap, topic, expected=3)
    assert [r.value for r in got] == [b"send", b"enqueue", b"many"]
    assert all(r.headers == ([("seen", b"1")] if hooked else []) for r in got)


def test_a_send_from_another_thread_runs_on_the_producers_loop_unreported(broker, topic,
                                                                          caplog):
    """asyncio.run_coroutine_threadsafe(producer.send(...), loop): the call is made in the
    other thread, and what it returns runs on the producer's loop: sent, nothing reported.
    The same call whose result is dropped is reported as made outside the loop's thread."""
    caplog.set_level(logging.ERROR, "asyncio")

    async def main() -> None:
        async with Producer(broker.bootstrap) as producer:
            loop = asyncio.get_running_loop()

            def from_thread() -> int:
                producer.send(topic, b"dropped")
                return asyncio.run_coroutine_threadsafe(
                    producer.send(topic, b"sent"), loop).result(10).offset

            assert await asyncio.to_thread(from_thread) == 0

    asyncio.run(main())
    reports = [r.getMessage() for r in caplog.records if "never awaited" in r.getMessage()]
    assert len(reports) == 1 and "outside the producer's event loop thread" in reports[0]
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"sent"]


def test_run_until_complete_takes_a_record_future(broker, topic):
    loop = asyncio.new_event_loop()
    try:
        producer = Producer(broker.bootstrap)
        loop.run_until_complete(producer.start())
        future = loop.run_until_complete(producer.enqueue(topic, b"v"))
        assert loop.run_until_complete(future).offset == 0
        loop.run_until_complete(producer.close())
    finally:
        loop.close()


@pytest.mark.parametrize("return_when", [asyncio.ALL_COMPLETED, asyncio.FIRST_COMPLETED,
                                         asyncio.FIRST_EXCEPTION])
async def test_wait_returns_done_and_pending_futures(broker, topic, return_when):
    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(500)]
        done, pending = await asyncio.wait(futures, timeout=30, return_when=return_when)
        assert done and done | pending == set(futures) and not done & pending
        if return_when == asyncio.ALL_COMPLETED:
            assert not pending
        if pending:
            await asyncio.wait(pending)
        assert sorted(f.result().offset for f in futures) == list(range(500))


async def test_wait_refuses_what_send_returns_after_buffering_as_the_docs_say(broker,
                                                                               topic):
    """What send() returns is a coroutine (for create_task and TaskGroups), so asyncio.wait
    refuses it as it refuses every coroutine, once the calls buffered their records: those
    are sent, once (a user who sends them again writes them twice: docs/guides/async.md says
    so). The ways the docs give instead take them."""
    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        await producer.send(topic, b"known")  # (the topic's metadata: buffered at the call)
        with pytest.raises(TypeError, match="Passing coroutines is forbidden"):
            await asyncio.wait([producer.send(topic, b"refused-%d" % i) for i in range(3)])
        done, _ = await asyncio.wait([asyncio.create_task(producer.send(topic, b"task"))])
        enqueued = [await producer.enqueue(topic, b"enqueued")]
        done |= (await asyncio.wait(enqueued))[0]
        assert all(future.result().offset > 0 for future in done)
    got = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 6)
    assert sorted(r.value for r in got) == [b"enqueued", b"known", b"refused-0", b"refused-1",
                                            b"refused-2", b"task"]


async def test_wait_with_a_timeout_leaves_pending_records_alone(broker, topic):
    async with Producer(broker.bootstrap, **SLOW) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(10)]
        done, pending = await asyncio.wait(futures, timeout=0.01)
        assert not done and pending == set(futures)
        assert not any(f.cancelled() for f in futures)
        assert [(await f).offset for f in futures] == list(range(10))


async def test_as_completed_yields_every_record(broker, topic):
    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(500)]
        offsets = [(await next_done).offset for next_done in asyncio.as_completed(futures)]
    assert sorted(offsets) == list(range(500))


@pytest.mark.parametrize("how", ["wait_for", "cancel"])
async def test_a_cancelled_future_stops_following_but_its_record_is_sent(broker, topic, how):
    async with Producer(broker.bootstrap, **SLOW) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(3)]  # one batch
        if how == "wait_for":
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(futures[1], 0.01)
        else:
            assert futures[1].cancel("not needed")
        assert futures[1].cancelled() and futures[1].done()
        with pytest.raises(asyncio.CancelledError):
            futures[1].result()
        assert not futures[1].cancel()  # done already
        # The batch the three records share is not harmed.
        assert [(await futures[i]).offset for i in (0, 2)] == [0, 2]
    assert _values(consume_all(broker.bootstrap, topic, 3)) == [b"0", b"1", b"2"]


async def test_a_cancelled_wait_cancels_the_future_but_its_record_is_sent(broker, topic):
    """A task cancelled while awaiting a record future (asyncio.timeout, a client gone)
    cancels it, as it would an asyncio future, so every wait for it ends; the record is
    still sent. (asyncio.shield() keeps a future following: see the next test.)"""
    async with Producer(broker.bootstrap, **SLOW) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(2)]
        other = asyncio.create_task(futures[0].wait())
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await futures[0]
        assert futures[0].cancelled()
        with pytest.raises(asyncio.CancelledError):
            await other
        waiting = asyncio.create_task(futures[1].wait())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert futures[1].cancelled()
        after = await producer.send(topic, b"after")
    assert after.offset == 2
    assert _values(consume_all(broker.bootstrap, topic, 3)) == [b"0", b"1", b"after"]


async def test_shield_keeps_following_a_record_past_a_timeout(broker, topic):
    async with Producer(broker.bootstrap, **SLOW) as producer:
        future = await producer.enqueue(topic, b"v")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), 0.01)
        assert not future.cancelled()
        assert (await future).offset == 0


async def test_gather_cancelled_cancels_its_futures_not_their_records(broker, topic):
    async with Producer(broker.bootstrap, **SLOW) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(5)]
        gathering = asyncio.gather(*futures)
        await asyncio.sleep(0)
        gathering.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gathering
        assert all(f.cancelled() for f in futures)
        await producer.flush()
    assert _values(consume_all(broker.bootstrap, topic, 5)) == [b"%d" % i for i in range(5)]


async def test_a_task_group_of_tasks_awaiting_futures(broker, topic):
    async def follow(future: RecordFuture) -> int:
        return (await future).offset

    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        futures = [await producer.enqueue(topic, b"%d" % i) for i in range(200)]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(follow(f)) for f in futures]
    assert [t.result() for t in tasks] == list(range(200))


async def test_each_record_gets_its_own_exception(proxied_broker):
    """A record too large for the broker fails alone, in the middle of others that land."""
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("own-errors", 1)
    async with Producer(cluster.bootstrap, batch_size=65536, linger_ms=100) as producer:
        futures = [await producer.enqueue("own-errors", b"%03d" % i + b"v" * 100)
                   for i in range(10)]
        big = await producer.enqueue("own-errors", os.urandom(5000))
        futures += [await producer.enqueue("own-errors", b"%03d" % i + b"v" * 100)
                    for i in range(10, 20)]
        results = await asyncio.gather(*futures[:10], big, *futures[10:],
                                       return_exceptions=True)
        assert isinstance(results[10], MessageTooLargeError)
        assert [r.offset for r in results[:10] + results[11:]] == list(range(20))
        with pytest.raises(MessageTooLargeError):
            await asyncio.gather(*futures, big)
        done, _ = await asyncio.wait([big, *futures], return_when=asyncio.FIRST_EXCEPTION)
        assert big in done


async def test_callbacks_run_in_their_own_context_and_errors_reach_the_loop(broker, topic):
    request = contextvars.ContextVar("request", default="none")
    seen: list[tuple[str, bool]] = []
    errors: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    async with Producer(broker.bootstrap, **SLOW) as producer:
        future = await producer.enqueue(topic, b"v")

        def record(f: RecordFuture) -> None:
            seen.append((request.get(), f is future))

        def broken(f: RecordFuture) -> None:
            raise ValueError("from a callback")

        request.set("first")
        future.add_done_callback(record)
        future.add_done_callback(broken)
        request.set("second")
        future.add_done_callback(record)
        future.add_done_callback(record)
        assert future.remove_done_callback(record) == 3
        future.add_done_callback(record)
        request.set("third")
        await future
        future.add_done_callback(record)  # added once done: still soon, not at once
        assert len(seen) == 1
        await asyncio.sleep(0)
    assert seen == [("second", True), ("third", True)]
    assert [type(e["exception"]) for e in errors] == [ValueError]
    assert errors[0]["future"] is future


async def test_a_callback_runs_in_a_copy_of_its_context_or_in_the_one_given(broker, topic):
    """As with asyncio's futures: without `context`, each callback runs in a copy of the
    context it was added in (what it sets, no other callback sees); with one, in that one."""
    var = contextvars.ContextVar("var", default=0)
    seen: list[int] = []
    given = contextvars.copy_context()

    def bump(f: RecordFuture) -> None:
        seen.append(var.get())
        var.set(var.get() + 1)

    async with Producer(broker.bootstrap, **SLOW) as producer:
        futures = [await producer.enqueue(topic, b"v") for _ in range(3)]
        var.set(10)
        for future in futures:
            future.add_done_callback(bump)
        futures[0].add_done_callback(bump, context=given)
        futures[1].add_done_callback(bump, context=given)
        await asyncio.gather(*futures)
        await asyncio.sleep(0)
    assert seen == [10, 0, 10, 1, 10]
    assert given[var] == 2 and var.get() == 10


async def test_a_callback_sees_the_very_objects_its_context_held(broker, topic):
    """Callbacks added in one context share a snapshot of it, but only while it holds the
    same objects: one added after the variable was set to an equal object sees that one."""
    request = contextvars.ContextVar("request")
    seen: list[object] = []
    first, second = {"id": 1}, {"id": 1}
    async with Producer(broker.bootstrap, **SLOW) as producer:
        futures = [await producer.enqueue(topic, b"v") for _ in range(2)]
        request.set(first)
        futures[0].add_done_callback(lambda f: seen.append(request.get()))
        request.set(second)
        futures[1].add_done_callback(lambda f: seen.append(request.get()))
        await asyncio.gather(*futures)
        await asyncio.sleep(0)
    assert seen[0] is first and seen[1] is second


async def test_a_kept_future_keeps_no_other_future_of_its_batch(broker, topic):
    """A user who keeps the last record's future (awaiting it) keeps that future only: in C
    it held every future made before it in its batch (a chain through them), 6 MB for
    50,000 small records in a 1 MiB batch."""
    import tracemalloc
    records = 20_000
    async with Producer(broker.bootstrap, linger_ms=50, batch_size=1 << 20) as producer:
        await producer.partitions_for(topic)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(records):
                last = await producer.enqueue(topic, b"v")
            metadata = await last
            await producer.flush()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert metadata.offset == records - 1
    # (Before: ~120 bytes a record, the futures of the batch; now what the producer keeps.)
    assert held < records * 10, f"{held / records:.0f} bytes a record still held"


async def test_failed_records_awaited_leave_no_garbage_behind(proxied_broker):
    """A failure raised in a coroutine that holds its batch's futures ties them into a cycle
    (the exception's traceback holds the frame, which holds the futures, which lead to the
    exception): once the coroutine is gone, the garbage collector frees all of it."""
    cluster = proxied_broker
    cluster.create_topic("doomed", 1)

    class Canary:
        pass

    async def user(producer: Producer) -> weakref.ref[Canary]:
        canary = Canary()
        futures = [await producer.enqueue("doomed", b"%d" % i) for i in range(10)]
        try:
            await futures[0]
        except DeliveryTimeoutError:
            pass
        return weakref.ref(canary)

    failed: list[int] = []  # (a handler, not the warning: pytest keeps logged errors)
    async with Producer(cluster.bootstrap, request_timeout_ms=300, delivery_timeout_ms=600,
                        linger_ms=0, retry_backoff_ms=20,
                        on_delivery_error=lambda *failure: failed.append(failure[3])) as producer:
        await producer.partitions_for("doomed")
        cluster.proxy.stall(True)
        canary = await asyncio.wait_for(user(producer), 10)
        cluster.proxy.stall(False)
    gc.collect()
    assert failed == [10] and canary() is None


async def test_a_bulk_future_is_an_asyncio_future(broker, topic_factory):
    topic = topic_factory(3)
    records = [(b"%d" % (i % 7), b"%05d" % i) for i in range(2000)]
    async with Producer(broker.bootstrap, linger_ms=5) as producer:
        bulks = [await producer.enqueue_many(topic, records[i:i + 500])
                 for i in range(0, 2000, 500)]
        assert all(isinstance(b, asyncio.Future) and isinstance(b, BulkFuture) for b in bulks)
        single = await producer.enqueue(topic, b"single")
        done, pending = await asyncio.wait([*bulks, single], timeout=30)
        assert not pending
        results = await asyncio.gather(*bulks)
        empty = await producer.enqueue_many(topic, [])
        assert empty.done() and list(await empty) == []
    metadata = [md for result in results for md in result]
    _assert_landed(list(zip(metadata, [v for _, v in records])),
                   consume_all(broker.bootstrap, topic, 2001))


async def test_iterating_a_bulk_future_instead_of_its_result_says_to_await_it(broker, topic):
    """`for md in await producer.enqueue_many(...)`, one await short: asyncio's Future
    iterates as its own await, so the loop got the BulkFuture itself as `md` ("'BulkFuture'
    object has no attribute 'offset'"). Iterating one raises a TypeError saying to await it;
    awaiting it (and gather, wait_for) is unchanged, and the records are sent."""
    async with Producer(broker.bootstrap) as producer:
        bulk = await producer.enqueue_many(topic, [(None, b"%d" % i) for i in range(3)])
        with pytest.raises(TypeError, match=r"await it: `for md in await bulk`"):
            for md in bulk:
                md.offset  # noqa: B018 (what the loop was for)
        assert [md.offset for md in await bulk] == [0, 1, 2]
        again = await producer.enqueue_many(topic, [(None, b"3")])
        assert [md.offset for md in await asyncio.wait_for(again, 10)] == [3]
        assert len(await asyncio.gather(bulk, again)) == 2
    assert _values(consume_all(broker.bootstrap, topic, 4)) == [b"0", b"1", b"2", b"3"]


async def test_a_cancelled_bulk_future_leaves_its_records_to_be_sent(broker, topic):
    async with Producer(broker.bootstrap, **SLOW) as producer:
        bulk = await producer.enqueue_many(topic, [(None, b"%d" % i) for i in range(5)])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(bulk, 0.01)
        assert bulk.cancelled()
        after = await producer.send(topic, b"after")
    assert after.offset == 5
    assert _values(consume_all(broker.bootstrap, topic, 6)) == \
        [b"%d" % i for i in range(5)] + [b"after"]
