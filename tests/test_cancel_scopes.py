"""Cleanup under the cancellations services use: asyncio.timeout (cancels once) and anyio's
cancel scopes, which FastAPI and Starlette run handlers in (they cancel every await inside
again and again, so an asyncio.shield inside does not protect cleanup): the ways of the
`cut` fixture. anyio's pytest plugin runs each test on the asyncio loop and on uvloop.
Whatever the caller's cancellation, a commit or abort, a close, a start's teardown end, each
in a task of the producer's, and the producer goes on or ends clean; records are read back with librdkafka's consumer or as raw batches by kafka-python."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import AsyncIterator

import anyio
import pytest

from aioproducer import Producer
from aioproducer.errors import ProducerClosedError
from aioproducer.hooks import ProducerHooks
from tests.support.cancel import producer_tasks
from tests.support.interrupting import InterruptAt
from tests.support.readback import consume_all, fetch_raw_batches

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def cut_after(how: str, seconds: float) -> AsyncIterator[None]:
    """A deadline on the block, raising TimeoutError, the asyncio or the anyio way."""
    if how == "asyncio.timeout":
        async with asyncio.timeout(seconds):
            yield
    else:
        with anyio.fail_after(seconds):
            yield


async def test_each_test_here_runs_on_the_loop_its_backend_names(anyio_backend):
    """anyio's plugin, not pytest-asyncio's auto mode, runs these tests (conftest.py): once
    per backend, on uvloop when the backend says so."""
    on_uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    assert on_uvloop == anyio_backend[1]["use_uvloop"]


async def _no_producer_tasks_within(seconds: float) -> list[str]:
    deadline = asyncio.get_running_loop().time() + seconds
    while producer_tasks() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    return producer_tasks()


async def _stalled_record(cluster, topic: str) -> tuple[Producer, asyncio.Future]:
    """A started producer, one record acknowledged, then one the stalled broker holds."""
    cluster.create_topic(topic, 1)
    producer = Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=30_000)
    await producer.start()
    await producer.send(topic, b"first")
    cluster.proxy.stall(True)
    return producer, await producer.enqueue(topic, b"pending")


def _markers(bootstrap: str, topic: str) -> list[str]:
    return [b.control_type if b.is_control else "data"
            for b in fetch_raw_batches(bootstrap, topic, 0)]


async def test_a_cancelled_transaction_block_aborts_and_the_next_one_commits(broker, cut):
    """The block is cut off (a handler's deadline): its abort goes on in the producer's own
    task, and the next transaction() waits for it instead of refusing (under anyio the
    block's abort was cancelled at once, leaving the transaction 'aborting', and the next
    transaction() raised "an abort is under way")."""
    topic = f"scope-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    async with Producer(broker.bootstrap, transactional_id=f"t-{uuid.uuid4().hex[:8]}",
                        linger_ms=0) as producer:
        await producer.partitions_for(topic)  # (the send in the block is quick)
        async with cut(0.3):
            async with producer.transaction():
                await producer.send(topic, b"cut-off")
                await asyncio.sleep(10)  # the handler's slow work
        async with asyncio.timeout(20):
            async with producer.transaction():
                await producer.send(topic, b"next")
    assert _markers(broker.bootstrap, topic) == ["data", "ABORT", "data", "COMMIT"]


async def test_a_cancelled_send_still_delivers_its_record_once(proxied_broker, cut):
    cluster = proxied_broker
    cluster.create_topic("scope-send", 1)
    async with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=5000) as producer:
        await producer.send("scope-send", b"first")
        cluster.proxy.stall(True)
        async with cut(0.2):
            await producer.send("scope-send", b"cut-off")
        cluster.proxy.stall(False)
        last = await asyncio.wait_for(producer.send("scope-send", b"last"), 10)
    assert last.offset == 2
    got = consume_all(cluster.broker.bootstrap, "scope-send", expected=3)
    assert [r.value for r in got] == [b"first", b"cut-off", b"last"]


async def test_close_cut_off_by_its_caller_still_closes(proxied_broker, cut):
    """close() under a deadline that fires while a record waits for the stalled broker: the
    caller gets its TimeoutError, the closing goes on in the producer's task and ends, leaving
    nothing running; a bounded close() later returns at once."""
    producer, pending = await _stalled_record(proxied_broker, "scope-close")
    cluster = proxied_broker
    async with cut(0.2):
        await producer.close()
    cluster.proxy.stall(False)
    assert (await asyncio.wait_for(pending, 10)).offset == 1
    await asyncio.wait_for(producer.close(timeout=5), 10)
    assert await _no_producer_tasks_within(2) == []


async def test_a_start_cut_off_leaves_the_producer_new(proxied_broker, cut):
    """start() under a deadline that fires while the broker does not answer: torn down, the
    producer is new, and starts once the broker answers."""
    cluster = proxied_broker
    cluster.create_topic("scope-start", 1)
    producer = Producer(cluster.bootstrap, linger_ms=0)
    cluster.proxy.stall(True)
    async with cut(0.3):
        await producer.start()
    assert await _no_producer_tasks_within(2) == []
    cluster.proxy.stall(False)
    async with asyncio.timeout(20):
        await producer.start()
        md = await producer.send("scope-start", b"v")
        await producer.close()
    assert md.offset == 0


async def test_a_shorter_close_timeout_bounds_a_close_under_way(proxied_broker):
    """A plain close() waits for a record the stalled broker never acknowledges; a second
    close(timeout=0.5) ends both within about half a second (it used to wait for the first,
    9.8 s in an outage), and the record fails saying so."""
    producer, pending = await _stalled_record(proxied_broker, "scope-twice")
    cluster = proxied_broker
    first = asyncio.create_task(producer.close())
    await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.wait_for(producer.close(timeout=0.5), 10)
    assert loop.time() - began < 3, "the shorter timeout did not bound the closing"
    await asyncio.wait_for(first, 1)
    with pytest.raises(ProducerClosedError, match=r"close\(timeout=0.5\)"):
        pending.result()
    cluster.proxy.stall(False)


async def test_close_at_once_leaves_no_commit_running(proxied_broker):
    """close(timeout=0) while another task commits: close() returns with no task of the
    producer left (the commit used to run on, to fail later with TransactionStateError), and
    the committing caller gets the reason."""
    cluster = proxied_broker
    cluster.create_topic("scope-commit", 1)
    producer = Producer(cluster.bootstrap, transactional_id=f"t-{uuid.uuid4().hex[:8]}",
                        linger_ms=0, request_timeout_ms=10_000)
    await producer.start()
    producer.begin_transaction()
    await producer.send("scope-commit", b"a")
    cluster.proxy.stall(True)
    await producer.enqueue("scope-commit", b"b")
    committing = asyncio.create_task(producer.commit_transaction())
    await asyncio.sleep(0.2)
    await asyncio.wait_for(producer.close(timeout=0), 10)
    assert producer_tasks() == [], "a task of the producer outlived close()"
    with pytest.raises(Exception) as caught:
        await asyncio.wait_for(committing, 5)
    assert not isinstance(caught.value, asyncio.CancelledError)
    cluster.proxy.stall(False)


@pytest.mark.parametrize("how", ["asyncio.timeout", "asyncio.wait_for", "anyio.fail_after"])
async def test_accepted_says_what_an_enqueue_many_cut_off_by_a_timeout_buffered(
        proxied_broker, how):
    """enqueue_many() waits for buffer memory behind a stalled broker and a timeout ends it:
    the TimeoutError caught has no `accepted` of its own (it sat on the chained
    CancelledError); aioproducer.accepted() finds it, and those records, only those, land."""
    from aioproducer import accepted

    cluster = proxied_broker
    cluster.create_topic("scope-bulk", 1)
    records = [(None, b"%05d" % i + b"v" * 95) for i in range(2000)]
    async with Producer(cluster.bootstrap, batch_size=4096, buffer_memory=16384,
                        linger_ms=0, max_block_ms=30_000) as producer:
        await producer.send("scope-bulk", b"first")
        cluster.proxy.stall(True)
        call = producer.enqueue_many("scope-bulk", records)
        with pytest.raises(TimeoutError) as caught:
            if how == "asyncio.wait_for":
                await asyncio.wait_for(call, 0.3)
            else:
                async with cut_after(how, 0.3):
                    await call
        bulk = accepted(caught.value)
        assert bulk is not None and 0 < len(bulk) < len(records)
        cluster.proxy.stall(False)
        metadata = await asyncio.wait_for(bulk, 20)
    got = consume_all(cluster.broker.bootstrap, "scope-bulk", expected=1 + len(bulk))
    assert [r.value for r in got[1:]] == [value for _, value in records[:len(bulk)]]
    assert [md.offset for md in metadata] == [r.offset for r in got[1:]]


class _Told(ProducerHooks):
    """An on_send hook told each record's outcome: how many were written, and the errors."""

    def __init__(self) -> None:
        self.written, self.errors = 0, []

    def on_send(self, topic, key, value, headers):
        return self.tell

    def tell(self, metadata, error) -> None:
        if error is None:
            self.written += 1
        else:
            self.errors.append(error)


@pytest.mark.parametrize("records", ["placed", "keyed", "sticky", "sticky, hooked"])
async def test_a_ctrl_c_in_enqueue_many_says_what_it_buffered(broker, topic_factory, records):
    """A Ctrl-C (KeyboardInterrupt) strikes the sender's wake as enqueue_many() opens a
    batch (the wake is Python code, the rest of the compiled loop is not): the record is in
    that batch, queued, and is sent. The interrupt carries `accepted`, exactly the records
    buffered, that one included: resuming from len(accepted), every record lands once, in
    order, and an on_send hook is told each was written. Records given their partition or
    keyed open batches in open_new, keyless ones in the line's turn (append_granted). It
    carried no `accepted` at all (None); counted without the kept record, the resumed call
    would send it again, and the hook was told the interrupt for a record written."""
    from aioproducer import accepted

    topic = topic_factory(1)
    given = [(b"k" if records == "keyed" else None, b"%05d" % i + b"v" * 95)
             for i in range(2000)]
    told = _Told()
    hooks = [told] if records.endswith("hooked") else []
    async with Producer(broker.bootstrap, batch_size=4096, linger_ms=0,
                        hooks=hooks) as producer:
        accumulator = producer._accumulator
        wake = accumulator.wake_sender_for
        openings = 0

        def interrupted_at_the_fifth_opening(batch, opened):
            nonlocal openings
            wake(batch, opened)
            openings += opened
            if opened and openings == 5:  # (once)
                raise KeyboardInterrupt

        accumulator.wake_sender_for = interrupted_at_the_fifth_opening
        partition = 0 if records == "placed" else None
        with pytest.raises(KeyboardInterrupt) as caught:
            await producer.enqueue_many(topic, given, partition=partition)
        bulk = accepted(caught.value)
        assert bulk is not None, "the interrupt says nothing of what was buffered"
        assert 0 < len(bulk) < len(given)
        rest = await producer.enqueue_many(topic, given[len(bulk):], partition=partition)
        first = await asyncio.wait_for(bulk, 20)
        await asyncio.wait_for(rest, 20)
    got = consume_all(broker.bootstrap, topic, expected=len(given))
    assert [r.value for r in got] == [value for _, value in given]
    assert [md.offset for md in first] == [r.offset for r in got[:len(bulk)]]
    if hooks:
        assert (told.written, told.errors) == (len(given), [])


@pytest.mark.parametrize("records", ["placed", "keyed", "hooked"])
async def test_a_ctrl_c_at_any_point_of_enqueue_many_s_python_code_says_what_it_buffered(
        broker, topic_factory, records):
    """A Ctrl-C (KeyboardInterrupt) strikes enqueue_many() at each point in turn where
    CPython could raise it in the Python code around the records' appends: the intake's glue
    (the batch opened for a placed or keyed record, each record's entry in the call's
    result) and, in the pure-Python twin, its loop and batch opening; with an on_send hook
    (each record through append(), one by one), the entry of each. Each time the interrupt
    carries `accepted`, exactly the records buffered: resuming from there, every record
    lands once and in order, and the hook is told each was written. Struck after an append
    and before the record's entry, it was left out of `accepted` (sent, and sent again by
    the resumed call); in the twin's opening, after the batch's queueing, the batch was
    sent though its memory was given back and `accepted` left its record out. (Not struck:
    inside append(), whose return a Ctrl-C may still lose: see docs/architecture.md.)"""
    from aioproducer import _speedups, accepted
    from aioproducer._internal import intake

    if records == "hooked":  # each record through append() (see the docstring), then:
        traced = [intake._taken]
    else:  # the compiled loop (or its twin), and batches opened for keyed or placed records
        traced = [intake.RecordIntake._append_many, intake.RecordIntake.open_new,
                  intake._taken]
        if _speedups.IMPLEMENTATION == "python":
            traced += [_speedups.append_many, _speedups.AccumulatorFields.open_new,
                       _speedups.AccumulatorFields._open]
    topic = topic_factory(1)
    told = _Told()
    hooks = [told] if records == "hooked" else []
    partition = 0 if records == "placed" else None
    expected: list[bytes] = []
    futures = []
    struck = 0
    async with Producer(broker.bootstrap, batch_size=256, linger_ms=0,
                        hooks=hooks) as producer:
        for n in range(1, 2001):  # (every point is struck well before: bounded all the same)
            given = [(b"k" if records == "keyed" else None, b"%04d.%d" % (n, i) + b"v" * 90)
                     for i in range(5)]
            expected += [value for _, value in given]
            with InterruptAt(traced, n) as interrupt:
                try:
                    futures.append(await producer.enqueue_many(topic, given,
                                                               partition=partition))
                except KeyboardInterrupt as exc:
                    bulk = accepted(exc)
                    assert bulk is not None, f"{interrupt.where}: nothing said of what it buffered"
                    futures.append(bulk)
            if not interrupt.struck:
                break
            struck += 1
            futures.append(await producer.enqueue_many(topic, given[len(bulk):],
                                                       partition=partition))
        assert struck > 10, f"only {struck} points struck"
        await asyncio.wait_for(asyncio.gather(*futures), 60)
    got = consume_all(broker.bootstrap, topic, expected=len(expected))
    assert [r.value for r in got] == expected
    if hooks:
        assert (told.written, told.errors) == (len(expected), [])


async def test_a_second_ctrl_c_in_enqueue_many_s_fix_up_leaves_accepted_whole(broker, topic):
    """A Ctrl-C strikes the sender's wake as enqueue_many() opens a batch for a record on its
    one-by-one path (an on_send hook), and a second one strikes the fix-up that enters that
    record in the call's result (`_taken`), at each point in turn. Whatever the second one
    cut short, `accepted` is whole: each record it counts has its metadata, at the offset
    where the broker has that record. Struck between the two lists' updates, the result had
    one batch more than offset deltas: awaiting it raised, so nothing buffered was known.
    (The record the second one struck before its entry is sent and not counted: no call can
    count what a Ctrl-C in its own clean-up left out.)"""
    from aioproducer import accepted
    from aioproducer._internal import intake

    sent: list[tuple[bytes, int]] = []  # (value, offset) of each record `accepted` counted
    struck = 0
    async with Producer(broker.bootstrap, batch_size=256, linger_ms=0,
                        hooks=[_Told()]) as producer:
        accumulator = producer._accumulator
        wake = accumulator.wake_sender_for
        for n in range(1, 50):  # (far more than _taken's points: bounded all the same)
            given = [(None, b"%02d.%d" % (n, i) + b"v" * 90) for i in range(5)]
            second = InterruptAt([intake._taken], n)

            def interrupted_twice(batch, opened, second=second):
                wake(batch, opened)
                if opened and not second.points:  # (the call's first opening, then armed)
                    second.__enter__()
                    raise KeyboardInterrupt

            accumulator.wake_sender_for = interrupted_twice
            try:
                with pytest.raises(KeyboardInterrupt) as caught:
                    await producer.enqueue_many(topic, given)
            finally:
                second.__exit__()
                accumulator.wake_sender_for = wake
            bulk = accepted(caught.value)
            assert bulk is not None, f"{second.where}: nothing said of what it buffered"
            metadata = list(await asyncio.wait_for(bulk, 20))
            assert len(metadata) == len(bulk), second.where
            sent += [(value, md.offset) for (_, value), md in zip(given, metadata)]
            if not second.struck:
                break
            struck += 1
        assert struck >= 3, f"only {struck} points struck"
    got = consume_all(broker.bootstrap, topic, expected=len(sent))
    at = {r.offset: r.value for r in got}
    assert [(value, at.get(offset)) for value, offset in sent] == \
        [(value, value) for value, _ in sent]
