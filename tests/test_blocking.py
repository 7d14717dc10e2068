"""BlockingProducer, for code without an event loop: what many threads produce arrives once
and in each thread's order, errors reach the future and the callback with their type, and
flush, close, transactions and fork behave as documented. Read back with librdkafka."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

import pytest

from aioproducer import BlockingProducer, RecordMetadata, accepted
from aioproducer.errors import BufferExhaustedError, InvalidRecordError, ProducerClosedError
from tests.support.ports import free_port
from tests.support.processes import run_in_own_group
from tests.support.readback import consume_all

THREADS, PER_THREAD = 8, 2_000


def _from_threads(broker: Any, produce: Callable[[BlockingProducer, int, list[Any]], None]
                  ) -> list[list[Any]]:
    """THREADS threads at once, each running produce(producer, thread, its futures) on one
    producer; then flush(), after which every future they made must be done."""
    futures: list[list[Any]] = [[] for _ in range(THREADS)]
    start = threading.Barrier(THREADS)

    def run(thread: int) -> None:
        start.wait(10)
        produce(producer, thread, futures[thread])

    with BlockingProducer(broker.bootstrap, linger_ms=5) as producer:
        threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        producer.flush(30)
        assert all(f.done() for fs in futures for f in fs), "flush() returned before the acks"
    return futures


def test_threads_producing_at_once_lose_duplicate_and_reorder_nothing(broker, topic_factory):
    topic = topic_factory(3)

    def produce(producer: BlockingProducer, thread: int, out: list[Any]) -> None:
        for i in range(PER_THREAD):  # one key per thread: its records share a partition
            out.append(producer.produce(topic, b"%d-%d" % (thread, i), key=b"thread-%d" % thread))

    futures = _from_threads(broker, produce)
    offsets = [[f.result().offset for f in fs] for fs in futures]
    assert all(o == sorted(o) for o in offsets), "a thread's records were reordered"

    got = consume_all(broker.bootstrap, topic, expected=THREADS * PER_THREAD)
    values = [r.value for r in sorted(got, key=lambda r: (r.partition, r.offset))]
    assert len(values) == len(set(values)) == THREADS * PER_THREAD
    for thread in range(THREADS):
        mine = [v for v in values if v.startswith(b"%d-" % thread)]
        assert mine == [b"%d-%d" % (thread, i) for i in range(PER_THREAD)]


def test_send_returns_the_metadata_and_bad_input_fails_with_its_type(broker, topic):
    delivered: list[tuple[RecordMetadata | None, BaseException | None]] = []
    with BlockingProducer(broker.bootstrap) as producer:
        metadata = producer.send(topic, b"v", key=b"k", headers=[("h", b"1")], timeout=30)
        assert (metadata.topic, metadata.offset) == (topic, 0)
        with pytest.raises(InvalidRecordError, match="value must be bytes"):
            producer.send(topic, "not bytes")  # type: ignore[arg-type]
        bad = producer.produce(topic, 42, on_delivery=lambda md, exc: delivered.append((md, exc)))
        good = producer.produce(topic, b"w", on_delivery=lambda md, exc: delivered.append((md, exc)))
        producer.flush(30)
    assert isinstance(bad.exception(), InvalidRecordError)
    assert good.result().offset == 1
    assert [(md is None, type(exc)) for md, exc in delivered] == \
        [(True, InvalidRecordError), (False, type(None))]
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [(r.key, r.value, r.headers) for r in got] == [(b"k", b"v", [("h", b"1")]),
                                                          (None, b"w", [])]


def test_a_record_refused_in_the_producers_thread_is_logged_if_nobody_is_told(
        broker, topic, caplog):
    """A script that produce()s str values and never looks at the futures: every record was
    refused (its future failed), flush() and close() returned, nothing was sent and nothing
    said so. Now it is logged, one line per 10 s as a failed batch is, unless on_delivery
    is given (it is told)."""
    caplog.set_level(logging.WARNING, logger="aioproducer")
    told: list[BaseException | None] = []
    with BlockingProducer(broker.bootstrap) as producer:
        futures = [producer.produce(topic, "row %d" % i)  # type: ignore[arg-type]
                   for i in range(3)]
        producer.produce(topic, "told",  # type: ignore[arg-type]
                         on_delivery=lambda md, exc: told.append(exc))
        producer.flush(30)
    assert all(isinstance(f.exception(), InvalidRecordError) for f in futures)
    assert len(told) == 1 and isinstance(told[0], InvalidRecordError)
    said = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(said) == 1, said
    assert repr(topic) in said[0] and "value must be bytes" in said[0]


def test_a_record_send_refuses_is_reported_once_by_its_exception(broker, topic, caplog):
    """send() of a str value raises InvalidRecordError to its caller; it also logged the
    warning meant for records whose failure nobody sees ("produce(...) failed, the record
    is not sent"): the same error said twice. A produce() after it, its future unread,
    is still logged."""
    caplog.set_level(logging.WARNING, logger="aioproducer")
    with BlockingProducer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match="value must be bytes"):
            producer.send(topic, "row", timeout=30)  # type: ignore[arg-type]
        assert not [r for r in caplog.records if "not sent" in r.getMessage()]
        unseen = producer.produce(topic, "unseen")  # type: ignore[arg-type]
        producer.flush(30)
    assert isinstance(unseen.exception(), InvalidRecordError)
    said = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(said) == 1 and "value must be bytes" in said[0], said


def test_a_record_refused_after_its_send_stopped_waiting_is_logged(broker, caplog):
    """send(timeout=...) gives up waiting (TimeoutError) while the record waits for its
    topic's metadata; the producer refuses it later (UnknownTopicError at max_block_ms): no
    caller sees that, so it is logged once (it was said nowhere: send()'s own delivery
    callback marked the refusal as its caller's)."""
    caplog.set_level(logging.WARNING, logger="aioproducer")
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with BlockingProducer(broker.bootstrap, allow_auto_create_topics=False,
                          max_block_ms=1500) as producer:
        with pytest.raises(TimeoutError):
            producer.send(missing, b"never sent", timeout=0.2)
        deadline = time.monotonic() + 20  # (the refusal comes at max_block_ms)
        while not [r for r in caplog.records if "not sent" in r.getMessage()] and \
                time.monotonic() < deadline:
            time.sleep(0.05)
    said = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(said) == 1 and f"send({missing!r}, ...) failed after its wait ended" in said[0] \
        and "UnknownTopicError" in said[0], said


def test_a_delivery_callback_in_confluent_kafkas_order_is_refused(broker, topic):
    """confluent-kafka's README's callback, delivery_report(err, msg), moved over as it is:
    called (metadata, None), it counted every record delivered as failed ("Message delivery
    failed: RecordMetadata(...)"), and would count a failure as delivered. produce() now
    refuses it, taking nothing; the Java client's order, as a function or a method, runs."""
    failed: list[Any] = []
    delivered: list[RecordMetadata] = []

    def delivery_report(err, msg):  # (confluent-kafka's README)
        if err is not None:
            failed.append(err)
        else:
            delivered.append(msg)

    def on_delivery(metadata, exception):
        if exception is not None:
            failed.append(exception)
        else:
            delivered.append(metadata)

    class Report:
        def done(self, metadata, exception):
            on_delivery(metadata, exception)

    with BlockingProducer(broker.bootstrap) as producer:
        for _ in range(2):  # (the second call too: what was refused is not taken as checked)
            with pytest.raises(TypeError, match=r"first parameter of '.*delivery_report' is "
                                                r"'err': confluent-kafka's order, .* Swap them"):
                producer.produce(topic, b"refused", on_delivery=delivery_report)
        producer.produce(topic, b"a function", on_delivery=on_delivery)
        producer.produce(topic, b"a method", on_delivery=Report().done)
        producer.flush()
    assert failed == []
    assert [md.offset for md in delivered] == [0, 1]
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"a function", b"a method"]


def test_a_blocking_call_from_async_code_says_to_await_a_producer(broker, topic,
                                                                   monkeypatch, caplog):
    """A BlockingProducer called in `async def` handlers blocks their event loop for every
    wait (50 concurrent handlers: ~300 ms, where `await Producer.send()` took 6 ms), unsaid.
    Its first blocking call from a thread whose event loop runs warns once, at the user's
    line, naming Producer and `await producer.send()`; the records are sent all the same. Not
    from a plain thread, nor in a Jupyter or marimo notebook (their kernels run the cells in
    their loop: blocking there is what BlockingProducer is for)."""
    import warnings
    from types import ModuleType

    async def handlers(producer: BlockingProducer, tag: bytes) -> None:
        async def handler(i: int) -> None:
            producer.send(topic, b"%s %d" % (tag, i))
            producer.flush()
        await asyncio.gather(*(handler(i) for i in range(60)))

    with BlockingProducer(broker.bootstrap) as producer, \
            warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        caplog.set_level(logging.WARNING, logger="aioproducer")
        line = sys._getframe().f_lineno - 8  # (the send() in handler())
        asyncio.run(handlers(producer, b"async"))
        threading.Thread(target=producer.send, args=(topic, b"thread")).start()
        producer.flush()
    said = [w for w in warned if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and (said[0].filename, said[0].lineno) == (__file__, line), said
    assert "blocks its event loop" in str(said[0].message) and \
        "aioproducer.Producer and `await producer.send(...)`" in str(said[0].message), said
    # (Not also the advice for a loop of send() in sync code: produce() and flush().)
    assert "send() calls in a row" not in caplog.text
    # A marimo kernel's thread (marimo.running_in_notebook(), checked with marimo 0.25.2's
    # `marimo export html`: the warning came from its cells), then a Jupyter kernel.
    marimo = ModuleType("marimo")
    marimo.running_in_notebook = lambda: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "marimo", marimo)
    for host in (b"marimo", b"jupyter"):
        with BlockingProducer(broker.bootstrap) as producer, \
                warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            asyncio.run(handlers(producer, host))
        assert [w for w in warned if issubclass(w.category, RuntimeWarning)] == [], host
        if host == b"marimo":
            monkeypatch.delitem(sys.modules, "marimo")
            monkeypatch.setitem(sys.modules, "ipykernel", ModuleType("ipykernel"))
    got = consume_all(broker.bootstrap, topic, expected=181)
    assert sorted(r.value for r in got) == sorted(
        [b"async %d" % i for i in range(60)] + [b"thread"] +
        [b"marimo %d" % i for i in range(60)] + [b"jupyter %d" % i for i in range(60)])


def test_the_asyncio_repl_s_blocking_calls_do_not_warn(broker, topic):
    """`python -m asyncio` runs every statement typed in its loop's thread, as a Jupyter
    kernel does: a BlockingProducer there warned that it blocks the loop (where nothing
    else runs) and to use Producer. With -W error the warning was an exception. (The REPL
    with stdin piped, as a terminal feeds it.)"""
    typed = textwrap.dedent(f"""
        from aioproducer import BlockingProducer
        producer = BlockingProducer({broker.bootstrap!r})
        print("sent at", producer.send({topic!r}, b"typed").offset)
        producer.close()
    """)
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "asyncio"],
                          input=typed, capture_output=True, text=True, timeout=60)
    assert "sent at 0" in done.stdout and "Warning" not in done.stderr, done.stderr
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"typed"]


def test_confluent_kafkas_poll_and_list_topics_say_what_to_use(broker, topic):
    """confluent-kafka's produce loop calls poll(0) before each produce() (its callbacks run
    there): AttributeError "no attribute 'poll'" said nothing of why. It now says the call
    is not needed, and list_topics() names partitions_for(); a misspelt name is Python's
    plain AttributeError."""
    with BlockingProducer(broker.bootstrap) as producer:
        with pytest.raises(AttributeError, match=r"no attribute 'poll': not needed: "
                                                 r"on_delivery callbacks run in the "
                                                 r"producer's thread without it"):
            producer.poll(0)
        with pytest.raises(AttributeError, match=r"'list_topics': partitions_for\(topic\)"):
            producer.list_topics(topic)
        with pytest.raises(AttributeError, match=r"^'BlockingProducer' object has no "
                                                 r"attribute 'flsh'$"):
            producer.flsh()  # type: ignore[attr-defined]
        assert producer.partitions_for(topic) == {0}


def test_kafka_pythons_send_then_get_returns_the_metadata(broker, topic):
    """kafka-python's `producer.send(topic, value).get(timeout=10)`: our send() waited for
    the ack and returned the RecordMetadata, on which .get() raised AttributeError after the
    record was sent. get() returns it, warning once per line with what produce() is; a
    kafka-python callback on it says where callbacks go."""
    with BlockingProducer(broker.bootstrap) as producer:
        with pytest.warns(RuntimeWarning, match=r"get\(\) returns it\. kafka-python's `future "
                                                r"= producer.send\(\.\.\.\)` is `future = "
                                                r"producer.produce\(\.\.\.\)`"):
            md = producer.send(topic, b"one").get(timeout=10)
        assert (md.topic, md.partition, md.offset) == (topic, 0, 0)
        with pytest.raises(AttributeError, match=r"no attribute 'add_callback': send\(\) "
                                                 r"waited .*\.produce\(\.\.\., "
                                                 r"on_delivery=cb\)"):
            producer.send(topic, b"two").add_callback(print)  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match=r"^'RecordMetadata' object has no attribute "
                                                 r"'offst'$"):
            md.offst  # type: ignore[attr-defined]  # noqa: B018
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"one", b"two"]


def test_confluent_kafkas_len_and_callback_keyword(broker, topic):
    """confluent-kafka's `len(producer)` (records not yet delivered) raised "object of type
    'BlockingProducer' has no len()", and its `produce(..., callback=cb)` "unexpected keyword
    argument 'callback'". len() counts the records not yet acknowledged (a producer stays
    true when idle); callback= says it is on_delivery= here, in the other order, and sends
    nothing."""
    with BlockingProducer(broker.bootstrap, linger_ms=60_000) as producer:
        assert len(producer) == 0 and producer
        futures = [producer.produce(topic, b"%d" % i) for i in range(3)]
        assert len(producer) == 3  # (lingering: none can be acknowledged yet)
        with pytest.raises(TypeError, match=r"callback= is on_delivery= here, called "
                                            r"on_delivery\(metadata, exception\), the other "
                                            r"order than confluent-kafka's \(err, msg\)"):
            producer.produce(topic, b"refused", callback=print)  # type: ignore[arg-type]
        producer.flush(30)
        assert len(producer) == 0 and all(f.result().offset >= 0 for f in futures)
    assert len(producer) == 0
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=3)] == \
        [b"0", b"1", b"2"]


# A notebook cell run again, or a function that makes a producer per call: the producer
# made at line 5 is dropped unclosed and collected once its pump is idle.
_DROPPED_UNCLOSED = """
import gc, sys, threading, time
from aioproducer import BlockingProducer
def cell():
    producer = BlockingProducer(sys.argv[1])
    producer.send(sys.argv[2], b"sent")
cell()
gc.collect()
deadline = time.monotonic() + 30
while threading.active_count() > 1 and time.monotonic() < deadline:
    time.sleep(0.05)
print("threads", threading.active_count())
"""


def test_a_blocking_producer_dropped_unclosed_is_reported_as_one(broker, topic):
    """Collected unclosed, a BlockingProducer was reported as the Producer inside it, made
    at aioproducer/blocking.py:124, with `await producer.close()` to do, and asyncio added
    "Task was destroyed but it is pending!" for its pump. One line now names the
    BlockingProducer, the user's line that made it and its own close(); its thread ends."""
    done = subprocess.run([sys.executable, "-c", _DROPPED_UNCLOSED, broker.bootstrap, topic],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == "threads 1\n", (done.stdout, done.stderr)
    said = done.stderr.strip().splitlines()
    assert said == [(f"unclosed <BlockingProducer of <Producer aioproducer started bootstrap="
                     f"{broker.bootstrap}>> created at <string>:5 was collected, 0 record(s) "
                     "unsent: call `producer.close()` when done with it (or use `with`)")], said
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"sent"]


def test_a_blocking_call_from_a_delivery_callback_raises_instead_of_hanging(broker, topic):
    errors: list[BaseException] = []

    def on_delivery(md: RecordMetadata | None, exc: BaseException | None) -> None:
        try:
            producer.flush()
        except RuntimeError as error:
            errors.append(error)
        raise ValueError("a callback's own error is logged, not spread")

    with BlockingProducer(broker.bootstrap) as producer:
        first = producer.produce(topic, b"1", on_delivery=on_delivery)
        second = producer.produce(topic, b"2")
        producer.flush(30)
    assert first.result().offset == 0 and second.result().offset == 1
    assert len(errors) == 1 and "never return" in str(errors[0])


def test_flush_times_out_and_close_fails_what_is_left(proxied_broker):
    cluster = proxied_broker
    cluster.create_topic("stalled", 1)
    producer = BlockingProducer(cluster.bootstrap, acks=1, delivery_timeout_ms=60_000)
    try:
        producer.send("stalled", b"before", timeout=30)
        cluster.proxy.stall(True)
        future = producer.produce("stalled", b"stuck")
        with pytest.raises(TimeoutError):
            producer.flush(timeout=0.3)
        assert not future.done()
    finally:
        producer.close(timeout=0.5)
        cluster.proxy.stall(False)
    assert isinstance(future.exception(5), ProducerClosedError)
    producer.close()  # a second close returns at once
    with pytest.raises(ProducerClosedError, match="closed"):
        producer.produce("stalled", b"after")


def test_a_full_buffer_holds_produce_back_and_nothing_accepted_is_lost(proxied_broker):
    """The broker's answers held back: buffer_memory fills, the records behind wait in the
    queue, and produce() raises BufferExhaustedError once it waited max_block_ms for room.
    Once the answers flow again every record produce() accepted ends: acknowledged, in the
    order produced, or failed with its type (one that waited in line past max_block_ms)."""
    cluster = proxied_broker
    cluster.create_topic("full", 1)
    producer = BlockingProducer(cluster.bootstrap, acks=1, linger_ms=0, batch_size=16_384,
                                buffer_memory=65_536, max_block_ms=1_000,
                                delivery_timeout_ms=60_000)
    futures: list[Future[RecordMetadata]] = []
    try:
        producer.send("full", b"first", timeout=30)
        cluster.proxy.stall(True)
        with pytest.raises(BufferExhaustedError, match="max_block_ms=1000"):
            for i in range(10_000):  # the queue holds 5,000 records: it fills long before
                futures.append(producer.produce("full", b"%06d" % i + bytes(1_000)))
        assert 5_000 <= len(futures) < 10_000
        cluster.proxy.stall(False)
        producer.flush(60)
    finally:
        cluster.proxy.stall(False)
        producer.close(30)
    assert all(f.done() for f in futures), "flush() returned before every record ended"
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert all(isinstance(exc, BufferExhaustedError) for exc in failed), failed[:3]
    sent = [(i, f.result()) for i, f in enumerate(futures) if f.exception() is None]
    assert len(sent) > 60, "nothing was sent once the broker answered again"
    assert [md.offset for _, md in sent] == list(range(1, len(sent) + 1))
    got = consume_all(cluster.bootstrap, "full", expected=1 + len(sent))
    assert [r.value[:6] for r in got] == [b"first"] + [b"%06d" % i for i, _ in sent]


def test_close_sends_what_threads_produced_without_a_flush(broker, topic_factory):
    topic = topic_factory(3)
    futures: list[list[Future[RecordMetadata]]] = [[] for _ in range(4)]

    def produce(thread: int) -> None:
        for i in range(1_000):
            futures[thread].append(
                producer.produce(topic, b"%d-%d" % (thread, i), key=b"thread-%d" % thread))

    producer = BlockingProducer(broker.bootstrap, linger_ms=50)
    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    producer.close()
    assert all(f.done() and f.exception() is None for fs in futures for f in fs)
    offsets = [[f.result().offset for f in fs] for fs in futures]
    assert all(o == sorted(o) for o in offsets), "a thread's records were reordered"
    got = consume_all(broker.bootstrap, topic, expected=4_000)
    assert sorted(r.value for r in got) == sorted(b"%d-%d" % (t, i)
                                                  for t in range(4) for i in range(1_000))


def test_a_produce_waiting_for_room_as_close_runs_gets_a_future_that_ends(broker, topic):
    """A value serializer that never finishes holds the producer's thread: 5,000 records
    queue behind it and the next produce() waits for room. close() gives up on them all;
    the produce() that waited returns a future that fails with ProducerClosedError, as
    every other one does (it was queued after close() drained the queue, and stayed
    pending for ever), and the thread's next produce() raises it."""
    async def never_done(value: bytes) -> bytes:
        await asyncio.sleep(3600)
        return value

    producer = BlockingProducer(broker.bootstrap, value_serializer=never_done,
                                max_block_ms=60_000)
    futures: list[Future[RecordMetadata]] = []
    raised: list[BaseException] = []

    def produce() -> None:
        try:
            for i in range(10_000):
                futures.append(producer.produce(topic, b"%d" % i))
        except ProducerClosedError as exc:
            raised.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    deadline, count = time.monotonic() + 30, -1
    while (count < 5_000 or count != len(futures)) and time.monotonic() < deadline:
        count = len(futures)  # (until it waits for room: 5,000 queued, 5,001 with the first)
        time.sleep(0.3)
    assert 5_000 <= len(futures) <= 5_001 and thread.is_alive()
    producer.close(timeout=0.5)
    thread.join(30)
    assert not thread.is_alive() and len(raised) == 1
    assert len(futures) == count + 1  # the call that waited for room returned a future
    wait(futures, 10)
    assert [i for i, f in enumerate(futures) if not f.done()] == []
    assert all(isinstance(f.exception(), ProducerClosedError) for f in futures)


def test_a_future_cancelled_before_the_producer_took_it_is_not_sent(broker, topic_factory):
    """The first record to a new topic waits for its metadata, and the records behind it
    wait in the queue: one cancelled there is not sent; the others are, in order."""
    topic = topic_factory(1)
    with BlockingProducer(broker.bootstrap) as producer:
        first = producer.produce(topic, b"0")
        behind = [producer.produce(topic, b"%d" % i) for i in range(1, 200)]
        cancelled = [f for f in behind[100:] if f.cancel()]
        assert cancelled, "the producer took every record before any could be cancelled"
        producer.flush(30)
    assert first.result().offset == 0
    kept = [f for f in behind if not f.cancelled()]
    wait(kept, 30)
    got = consume_all(broker.bootstrap, topic, expected=1 + len(kept))
    sent = [r.value for r in got]
    assert sent == [b"0"] + [b"%d" % (behind.index(f) + 1) for f in kept]
    assert len(sent) == 200 - len(cancelled)


def test_transactions_commit_what_was_produced_in_them(broker, topic):
    with BlockingProducer(broker.bootstrap, transactional_id=f"blocking-{topic}") as producer:
        with producer.transaction():
            futures = [producer.produce(topic, b"%d" % i) for i in range(100)]
        assert all(f.done() for f in futures), "commit returned before its records were acked"
        producer.begin_transaction()
        producer.produce(topic, b"aborted")
        producer.abort_transaction()
        assert producer.metrics().transaction_state == "ready"
    got = consume_all(broker.bootstrap, topic, expected=100, isolation_level="read_committed")
    assert [r.value for r in got][:100] == [b"%d" % i for i in range(100)]


def test_a_closed_producer_flushes_nothing_and_refuses_a_with_block(broker, topic):
    """flush() after close() returns, as Producer.flush() does (close() sent everything; a
    teardown that flushes after the app's shutdown closed it raised ProducerClosedError);
    a `with` block on a closed producer is refused at its start, as `async with` refuses a
    closed Producer (it was entered, and the first produce() in it raised)."""
    producer = BlockingProducer(broker.bootstrap, linger_ms=1000)
    future = producer.produce(topic, b"sent by close()")
    producer.close()
    assert future.result(0).offset == 0
    producer.flush()
    producer.flush(timeout=1)
    with pytest.raises(ProducerClosedError, match="closed"):
        producer.produce(topic, b"after close")
    with pytest.raises(ProducerClosedError, match="closed"):
        with producer:
            pass
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == \
        [b"sent by close()"]


_LEFT_OPEN = """
import sys
sys.modules["uvloop"] = None  # a plain install, without the [speed] extra
from aioproducer import BlockingProducer

producer = BlockingProducer(sys.argv[1])
sys.setswitchinterval(5)  # (the producer's thread gets to run once this one waits: at exit)
for i in range(1000):
    producer.produce(sys.argv[2], b"%d" % i, partition=0)
# no flush() or close(): the interpreter's exit closes it
"""


def test_a_producer_left_open_sends_at_exit_to_brokers_advertised_by_name(tmp_path):
    """A script that produces, then ends without close(): the close at interpreter exit
    connects to the partition's leader, which a real cluster advertises by name
    (kafka-1:9092). On asyncio's own loop (no uvloop) the name is looked up in the loop's
    thread pool, which takes no work once the interpreter is exiting: the connection failed
    ("can't register atexit after shutdown", a traceback) and every record was lost."""
    from aioproducer.testing.broker import _binary

    port = free_port()
    log = open(tmp_path / "tansu.log", "wb")
    broker = subprocess.Popen(
        [_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://localhost:{port}",
         "--storage-engine", "memory://tansu/"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and broker.poll() is None, "no broker"
                time.sleep(0.05)
        bootstrap = f"127.0.0.1:{port}"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", _LEFT_OPEN, bootstrap, "left-open"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started < 9, done.stderr  # (not the close's 10 s timeout)
        got = consume_all(bootstrap, "left-open", expected=1000)
        assert [r.value for r in got] == [b"%d" % i for i in range(1000)]
    finally:
        broker.kill()
        broker.wait(10)
        log.close()


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
# Forking a process with the producer's thread running is this test's subject (3.12+ warn).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_after_fork_the_child_is_told_to_create_its_own(broker, topic):
    with BlockingProducer(broker.bootstrap) as producer:
        producer.send(topic, b"parent", timeout=30)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what produce() raised, and leave at once
            try:
                producer.produce(topic, b"child")
                message = b"no error"
            except ProducerClosedError as error:
                message = str(error).encode()
            os.write(write, message)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read()
        os.waitpid(pid, 0)
        assert b"create a new one here" in said
        producer.send(topic, b"parent again", timeout=30)  # the parent's goes on
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"parent", b"parent again"]


_FORKED_CHILD_EXITS = """
import os, sys, time
from aioproducer import BlockingProducer

producer = BlockingProducer(sys.argv[1])
producer.send(sys.argv[2], b"parent", timeout=30)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a child that leaves as a script or a gunicorn worker does: atexit, collection
deadline = time.monotonic() + 20
while (ended := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
    time.sleep(0.05)
if ended == (0, 0):
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("the child hung")
else:
    print("the child exited", os.waitstatus_to_exitcode(ended[1]))
producer.send(sys.argv[2], b"parent again", timeout=30)
producer.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_child_forked_from_a_producers_process_exits(broker, topic, host):
    """A child forked after a BlockingProducer started that leaves normally (sys.exit, the end
    of a script, a gunicorn worker), not by os._exit as multiprocessing's children do: the
    producer's thread portal was collected at the child's exit and waited for the parent's
    thread, which is not in the child. The child hung until killed. Bootstrapped by a host
    name, which uvloop's getaddrinfo looked up in libuv's thread pool, the child died of
    SIGSEGV at its exit (libuv's clean-up joined the pool's threads, which are not in it)."""
    bootstrap = broker.bootstrap.replace("127.0.0.1", host)
    done = subprocess.run([sys.executable, "-c", _FORKED_CHILD_EXITS, bootstrap, topic],
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.stdout.split("\n")[0] == "the child exited 0", done.stderr
    assert "Task was destroyed" not in done.stderr  # (the parent's tasks, collected there)
    assert done.returncode == 0, done.stderr
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"parent", b"parent again"]


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): there is no forked child to guard")
def test_a_child_forked_in_asyncio_debug_mode_makes_the_copy_inert_quietly(broker, topic):
    """In asyncio's debug mode (-X dev, PYTHONASYNCIODEBUG=1), which refuses a call into a
    loop from a thread not its own: the at-fork hook closed the child's copy of a
    BlockingProducer's producer through that producer's loop, whose thread is the parent's
    alone, and every forked child printed "Exception ignored in: <function
    _forked_in_child>" with "RuntimeError: Non-thread-safe operation invoked on an event loop
    other than the current one" (uvloop's words; asyncio's are alike), the hook stopping
    there, before the copy's tasks and the next producer's. The child's copy is refused
    (closed) all the same, and the parent's goes on."""
    done = subprocess.run([sys.executable, "-X", "dev", "-c", _FORKED_CHILD_EXITS,
                           broker.bootstrap, topic],
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.stdout.split("\n")[0] == "the child exited 0", done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"parent", b"parent again"]

_POOL_WORKERS_PRODUCE = """
import multiprocessing, sys

producer = None

def start(bootstrap):
    global producer
    producer = BlockingProducer(bootstrap, linger_ms=1000)  # made in the worker, never closed

def task(i):
    producer.produce(sys.argv[2], b"%d" % i)  # returns at once: the record is buffered
    return i

from aioproducer import BlockingProducer

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[3])
    pool = context.Pool(2, initializer=start, initargs=(sys.argv[1],))
    print(sum(pool.map(task, range(20))))
    pool.close()
    pool.join()  # the workers leave as their tasks end, by os._exit(): atexit does not run
"""


@pytest.mark.skipif(not hasattr(os, "fork"),
                    reason="Windows has no os.fork(): no fork or forkserver start method")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_producer_left_open_in_a_multiprocessing_worker_sends_as_the_worker_leaves(
        broker, topic, method, tmp_path):
    """A multiprocessing Pool's workers (fork, forkserver: 3.14's default) leave by
    os._exit(), past atexit, where a BlockingProducer left open is closed: the records a
    worker's producer still buffered were lost, unsaid (none of the 20 arrived). The worker
    runs multiprocessing's finalizers before it leaves: one closes them there."""
    script = tmp_path / "pool.py"  # (a forkserver's workers import the script's functions)
    script.write_text(_POOL_WORKERS_PRODUCE)
    done = run_in_own_group([sys.executable, str(script), broker.bootstrap, topic, method],
                            timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sum(range(20))), done.stderr
    got = consume_all(broker.bootstrap, topic, expected=20)
    assert sorted(int(r.value) for r in got) == list(range(20)), done.stderr


def test_pickling_a_producer_says_to_create_it_where_it_is_used(broker):
    """A producer passed to a multiprocessing child (spawn, forkserver) or captured by a Spark
    job's function is pickled: pickle's own error named an asyncio Future."""
    with BlockingProducer(broker.bootstrap) as producer, \
            pytest.raises(TypeError, match=r"a BlockingProducer cannot be pickled: create it "
                          r"in the process that uses it .*for multiprocessing: in a Pool's "
                          r"initializer or the function the child runs"):
        pickle.dumps(producer)


def test_asyncio_code_does_not_import_the_blocking_facade():
    """Its thread portal (anyio's) loads on first use of BlockingProducer, not with the
    package: ~50 ms of imports an asyncio service never needs."""
    probe = ("import sys, aioproducer; before = 'anyio' in sys.modules; "
             "aioproducer.BlockingProducer; print(before, 'anyio' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr


# -- produce_many(): the bulk call -----------------------------------------------------------

def test_produce_many_records_arrive_intact_in_order_once(broker, topic_factory):
    """More records than enqueue_many takes in one chunk, keyed, keyless, null values: the
    future's metadata is in input order and each position holds its record, once."""
    topic = topic_factory(3)
    records: list[tuple[bytes | None, bytes | None]] = [
        (None if i % 5 == 0 else b"key-%d" % (i % 7), None if i % 11 == 0 else b"v-%d" % i)
        for i in range(25_000)]
    with BlockingProducer(broker.bootstrap, linger_ms=5) as producer:
        future = producer.produce_many(topic, records)
        assert isinstance(future, Future) and len(future) == len(records)
        assert not future.cancel(), "buffered records cannot be unsent"
        metadata = future.result(30)
    assert len(metadata) == len(records)
    positions = [(md.partition, md.offset) for md in metadata]
    assert {md.topic for md in metadata} == {topic}
    got = consume_all(broker.bootstrap, topic, expected=len(records))
    assert len(got) == len(records), "lost or duplicated"
    stored = {(r.partition, r.offset): (r.key, r.value) for r in got}
    assert [stored[position] for position in positions] == records
    by_key: dict[bytes, list[int]] = {}
    for (key, _), (_, offset) in zip(records, positions):
        if key is not None:
            by_key.setdefault(key, []).append(offset)
    assert all(offsets == sorted(offsets) for offsets in by_key.values())


async def _yielding(value: bytes) -> bytes:
    await asyncio.sleep(0)  # one loop turn per record, in the pump and in enqueue_many alike
    return value


@pytest.mark.parametrize("serializer", [None, _yielding], ids=["bytes", "async-serializer"])
def test_produce_many_between_produce_calls_keeps_their_order_on_a_key(
        broker, topic_factory, serializer):
    """produce() queues its records for the pump; produce_many() runs in the loop's thread.
    Those produced before it go first, then its records, then the produce() calls after it.
    With an async serializer the pump yields to the loop at every record it hands over: a
    bulk call that did not wait for it to finish would interleave with them."""
    topic = topic_factory(3)
    with BlockingProducer(broker.bootstrap, linger_ms=5,
                          value_serializer=serializer) as producer:
        before = [producer.produce(topic, b"before-%d" % i, key=b"k") for i in range(2_000)]
        bulk = producer.produce_many(topic, [(b"k", b"bulk-%d" % i) for i in range(2_000)])
        after = [producer.produce(topic, b"after-%d" % i, key=b"k") for i in range(500)]
        producer.flush(30)
        assert bulk.done() and all(f.done() for f in after)
    expected = [b"before-%d" % i for i in range(2_000)] + \
        [b"bulk-%d" % i for i in range(2_000)] + [b"after-%d" % i for i in range(500)]
    got = consume_all(broker.bootstrap, topic, expected=len(expected))
    assert [r.value for r in sorted(got, key=lambda r: r.offset)] == expected
    offsets = [f.result().offset for f in before] + [md.offset for md in bulk.result()] + \
        [f.result().offset for f in after]
    assert offsets == list(range(len(expected)))


def test_a_bad_record_midway_raises_and_those_before_it_are_sent(broker, topic):
    records = [(None, b"ok-%d" % i) for i in range(5)] + [(None, "not bytes")] + \
        [(None, b"never")]
    with BlockingProducer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match="value must be bytes") as caught:
            producer.produce_many(topic, records)  # type: ignore[arg-type]
        buffered = caught.value.accepted  # type: ignore[attr-defined]
        assert isinstance(buffered, Future) and len(buffered) == 5
        assert accepted(caught.value) is buffered
        assert [md.offset for md in buffered.result(30)] == [0, 1, 2, 3, 4]
        producer.send(topic, b"next", timeout=30)
    got = consume_all(broker.bootstrap, topic, expected=6)
    assert [r.value for r in got] == [b"ok-%d" % i for i in range(5)] + [b"next"]


def test_a_generator_that_raises_midway_keeps_what_it_gave(broker, topic):
    """`records` is read as the call goes, in the producer's thread: its own error reaches
    the caller, with `accepted` the future of the first records, those buffered, which are
    sent (as enqueue_many(), it may have read a few more than it buffered: the rest of a
    10,000-record chunk)."""
    def rows():
        for i in range(12_000):
            yield None, b"%d" % i
        raise LookupError("the source ran dry")

    with BlockingProducer(broker.bootstrap) as producer:
        with pytest.raises(LookupError, match="ran dry") as caught:
            producer.produce_many(topic, rows())
        buffered = accepted(caught.value)
        assert buffered is not None and 0 < len(buffered) <= 12_000
        assert [md.offset for md in buffered.result(30)] == list(range(len(buffered)))
    got = consume_all(broker.bootstrap, topic, expected=len(buffered))
    assert [r.value for r in got] == [b"%d" % i for i in range(len(buffered))]


# A loading script stopped with Ctrl-C in the middle of a produce_many() call. Its generator
# (read in the producer's thread) says when it is under way, and from then on gives a row
# each ~0.1 ms (20 s for the rest: the interrupt must stop it well before); a small
# buffer_memory makes the call wait for memory, where a cancellation lands, every few
# hundred records. The calling thread blocks SIGINT, so the signal always reaches another
# thread, as the kernel may choose anyway (CI: every record buffered, the interrupt raised
# only as the call returned).
_CTRL_C_LOAD = """
import signal, sys, time
import aioproducer
from aioproducer import BlockingProducer

def rows():
    for i in range(200_000):
        if i == 2_000:
            print("under way", flush=True)
        if i >= 2_000:
            time.sleep(0.0001)
        yield None, b"row %07d" % i

try:
    with BlockingProducer(sys.argv[1], buffer_memory=65_536) as producer:
        # The kernel gives a process's SIGINT to any thread that does not block it: here
        # never this one (its threads, started above, keep their masks).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        producer.produce_many(sys.argv[2], rows())
except KeyboardInterrupt as interrupt:
    buffered = aioproducer.accepted(interrupt)
    print("interrupted", None if buffered is None else len(buffered), flush=True)
"""


def test_ctrl_c_in_produce_many_stops_it_and_says_what_it_buffered(broker, topic):
    """Ctrl-C in the calling thread left the call going on in the producer's thread, which
    buffered more records (sent by the close() on the way out) that the KeyboardInterrupt
    said nothing of: a script that resumed from what it knew sent those again. Now the call
    stops there too, and the interrupt carries `accepted`: exactly what was sent."""
    count = _interrupted_load(_CTRL_C_LOAD, broker, topic, ctrl_c=True, timeout=60)
    assert 2_000 <= count < 200_000
    got = consume_all(broker.bootstrap, topic, expected=count)
    assert [r.value for r in got] == [b"row %07d" % i for i in range(count)]


# The same, the Ctrl-C seen just as the call is handed to the producer's thread: the wake-up
# written to its loop lets that thread take the GIL, and the calling thread, taking it back,
# raises the KeyboardInterrupt of a SIGINT that came meanwhile, before it held the call's
# future. Here the signal is raised at that instant, once the call has begun there (the
# portal's hand-over wrapped once).
_CTRL_C_AT_HAND_OVER = """
import signal, sys, threading, time
import aioproducer
from aioproducer import BlockingProducer

begun = threading.Event()

def rows():
    begun.set()
    for i in range(50_000):
        time.sleep(0.0001)
        yield None, b"row %07d" % i

try:
    with BlockingProducer(sys.argv[1]) as producer:
        hand_over = producer._portal.start_task_soon
        def ctrl_c_as_handed_over(*args):
            producer._portal.start_task_soon = hand_over
            running = hand_over(*args)
            begun.wait(30)  # (the call under way there, as in CI)
            signal.raise_signal(signal.SIGINT)
            return running
        producer._portal.start_task_soon = ctrl_c_as_handed_over
        producer.produce_many(sys.argv[2], rows())
except KeyboardInterrupt as interrupt:
    buffered = aioproducer.accepted(interrupt)
    print("interrupted", None if buffered is None else len(buffered), flush=True)
"""


def test_ctrl_c_as_produce_many_is_handed_over_stops_it(broker, topic):
    """CI: a Ctrl-C'd produce_many() buffered every record first (200000 < 200000): the
    interrupt came as the call was handed over, before the calling thread held the call's
    future, so nothing cancelled it. Now whatever the call buffered, none or some, is what
    `accepted` says and what was sent."""
    count = _interrupted_load(_CTRL_C_AT_HAND_OVER, broker, topic, ctrl_c=False, timeout=120)
    assert count < 50_000
    got = consume_all(broker.bootstrap, topic, expected=count) if count else []
    assert [r.value for r in got] == [b"row %07d" % i for i in range(count)]



def _interrupted_load(script: str, broker, topic: str, *, ctrl_c: bool, timeout: float) -> int:
    """Run a loading script (Ctrl-C'd here once it says it is under way, if `ctrl_c`) and
    return how many records its KeyboardInterrupt's `accepted` holds. SIGINT has its default
    action in the child (start_interruptible): a shell without job control ignores it."""
    from tests.support.processes import start_interruptible

    load = start_interruptible([sys.executable, "-c", script, broker.bootstrap, topic],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if ctrl_c:
            assert load.stdout.readline() == "under way\n"
            load.send_signal(signal.SIGINT)
        out, err = load.communicate(timeout=timeout)
    finally:
        if load.poll() is None:
            load.kill()
            load.communicate(timeout=10)
    assert load.returncode == 0, err
    said = out.split()
    assert said[:1] == ["interrupted"] and said[1:] != ["None"], out
    return int(said[1])

# A Ctrl-C as a blocking call begins: the signal raised as the call's `stop` future is made,
# which _call did after counting the call under way and before the `try` that counts it off.
_CTRL_C_AS_A_CALL_BEGINS = """
import signal, sys
import aioproducer.blocking as blocking
from aioproducer import BlockingProducer

made = blocking.Future

class CtrlCAsMade(made):
    def __init__(self):
        super().__init__()
        blocking.Future = made  # (once)
        signal.raise_signal(signal.SIGINT)

with BlockingProducer(sys.argv[1]) as producer:
    producer.send(sys.argv[2], b"before", timeout=30)
    blocking.Future = CtrlCAsMade
    try:
        producer.flush()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    producer.send(sys.argv[2], b"after", timeout=30)
print("closed", flush=True)
"""


def test_ctrl_c_as_a_blocking_call_begins_leaves_close_to_return(broker, topic):
    """The Ctrl-C race fix made each blocking call's `stop` future after counting the call
    under way (close() waits for those to end) and before the `try` whose `finally` counts
    it off: a KeyboardInterrupt raised there (a SIGINT handled as the future was made) left
    a call counted for ever, and close(), the `with` block's end included, hung (killed
    here after 30 s). The call now counts itself only once nothing but its `try` follows."""
    from tests.support.processes import start_interruptible

    run = start_interruptible([sys.executable, "-c", _CTRL_C_AS_A_CALL_BEGINS,
                               broker.bootstrap, topic],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = run.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        run.kill()
        out, err = run.communicate(timeout=10)
    assert out.split() == ["interrupted", "closed"], (out, err)
    assert run.returncode == 0, err
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == \
        [b"before", b"after"]


def test_a_ctrl_c_at_any_point_of_close_leaves_the_producer_closed(broker, topic):
    """A Ctrl-C (KeyboardInterrupt) strikes close() at each point in turn where CPython
    could raise it (tests/support/interrupting.py), a record lingering (60 s) in the buffer.
    Wherever it strikes, once close() marked the producer closed, it closes it, at once as
    a Ctrl-C in close() promises: the record's future fails with ProducerClosedError, the
    producer's thread ends, and a second close() returns. Struck as close() left its lock,
    the producer said closed and was not: the record's future never ended (nor was it sent:
    its thread, a daemon, died at exit, and the exit-time close skipped it)."""
    from tests.support.interrupting import InterruptAt

    struck = 0
    for n in range(1, 101):  # (close() has a few dozen points: bounded all the same)
        before = set(threading.enumerate())
        producer = BlockingProducer(broker.bootstrap, linger_ms=60_000)
        future = producer.produce(topic, b"lingering")
        with InterruptAt([BlockingProducer.close], n) as interrupt:
            try:
                producer.close()
            except KeyboardInterrupt:
                pass
        producer.close()  # (returns: closed by the first)
        if not interrupt.struck:
            assert future.result(10).offset >= 0  # (closed in full: sent)
            break
        struck += 1
        assert future.done() or future.exception(10) is not None, \
            f"struck at {interrupt.where}: the record's future never ends"
        outcome = future.exception(0)
        assert outcome is None or isinstance(outcome, ProducerClosedError), interrupt.where
        left = set(threading.enumerate()) - before
        for thread in left:
            thread.join(10)
        assert not any(t.is_alive() for t in left), f"struck at {interrupt.where}: {left}"
    assert struck >= 3, f"only {struck} points struck"


def test_a_closed_producer_refuses_produce_many_and_close_settles_its_future(broker, topic):
    producer = BlockingProducer(broker.bootstrap, linger_ms=1_000)
    sent = producer.produce_many(topic, [(None, b"a"), (None, b"b")])
    producer.close()
    assert sent.done(), "close() returned before the future of what it sent was resolved"
    assert [md.offset for md in sent.result(0)] == [0, 1]
    with pytest.raises(ProducerClosedError, match="closed") as caught:
        producer.produce_many(topic, [(None, b"after close")])
    nothing = accepted(caught.value)
    assert nothing is not None and len(nothing) == 0 and list(nothing.result(0)) == []
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == [b"a", b"b"]


def test_produce_many_from_a_delivery_callback_raises_instead_of_hanging(broker, topic):
    errors: list[BaseException] = []

    def on_delivery(md: RecordMetadata | None, exc: BaseException | None) -> None:
        try:
            producer.produce_many(topic, [(None, b"from the callback")])
        except RuntimeError as error:
            errors.append(error)

    with BlockingProducer(broker.bootstrap) as producer:
        first = producer.produce(topic, b"1", on_delivery=on_delivery)
        producer.flush(30)
        assert first.result().offset == 0
    assert len(errors) == 1 and "never return" in str(errors[0])
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"1"]


def test_threads_calling_produce_many_at_once_lose_and_duplicate_nothing(broker, topic_factory):
    topic = topic_factory(3)
    calls, per_call = 10, 500

    def produce(producer: BlockingProducer, thread: int, out: list[Any]) -> None:
        for call in range(calls):  # one key per thread: its records share a partition
            out.append(producer.produce_many(topic, [
                (b"thread-%d" % thread, b"%d-%d" % (thread, call * per_call + i))
                for i in range(per_call)]))

    futures = _from_threads(broker, produce)
    total = THREADS * calls * per_call
    assert sum(len(f.result()) for fs in futures for f in fs) == total
    got = consume_all(broker.bootstrap, topic, expected=total)
    values = [r.value for r in sorted(got, key=lambda r: (r.partition, r.offset))]
    assert len(values) == len(set(values)) == total
    for thread in range(THREADS):
        mine = [v for v in values if v.startswith(b"%d-" % thread)]
        assert mine == [b"%d-%d" % (thread, i) for i in range(calls * per_call)]


class _Racing(BlockingProducer):
    """A producer whose `racer` thread's blocking call pauses on its way into the producer's
    thread, for close() to run from another thread meanwhile: in the calling thread once its
    closed check passed (`in_thread`), or in the producer's thread just before its work
    there, until close()'s own work there ended (`in_loop`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.pause = ""  # set once the producer is ready for the race
        self.racer: threading.Thread | None = None
        self.paused = threading.Event()  # the racer's call stopped where asked
        self.go_on = threading.Event()  # let it go on (in_thread: close() returned)
        self.closed_there = threading.Event()  # close()'s work in the producer's thread ended
        super().__init__(*args, **kwargs)

    def _check_usable(self) -> None:
        super()._check_usable()
        if self.pause == "in_thread" and threading.current_thread() is self.racer and \
                not self.paused.is_set():
            self.paused.set()
            self.go_on.wait(10)

    async def _in_loop(self) -> None:
        if self.pause == "in_loop" and not self.paused.is_set():
            self.paused.set()
            for _ in range(1_000):  # (at most 10 s)
                if self.closed_there.is_set():
                    return
                await asyncio.sleep(0.01)

    async def _flush(self, timeout: float | None) -> None:
        await self._in_loop()
        await super()._flush(timeout)

    async def _after_handover(self, call: Callable[[], Any]) -> Any:
        await self._in_loop()
        return await super()._after_handover(call)

    async def _close(self, timeout: float | None) -> None:
        await super()._close(timeout)
        self.closed_there.set()


_CALLS: dict[str, Callable[[BlockingProducer, str], object]] = {
    "produce_many": lambda p, topic: p.produce_many(topic, [(None, b"raced")]),
    "flush": lambda p, topic: p.flush(10),
    "begin_transaction": lambda p, topic: p.begin_transaction(),
    "commit_transaction": lambda p, topic: p.commit_transaction(),
    "send_offsets_to_transaction": lambda p, topic: p.send_offsets_to_transaction(
        {(topic, 0): 1}, "raced-group"),
    "metrics": lambda p, topic: p.metrics(),
    "partitions_for": lambda p, topic: p.partitions_for(topic),
}


def _race_close(broker: Any, topic: str, call: str, pause: str) -> BaseException | None:
    """`call` in a thread, paused as `pause` says while close() runs in another: what it
    raised (None: it returned). Both threads must end."""
    producer = _Racing(broker.bootstrap, transactional_id=f"raced-{call}-{topic}")
    if call in ("commit_transaction", "send_offsets_to_transaction"):
        producer.begin_transaction()
    producer.pause = pause
    outcome: list[BaseException | None] = []

    def race() -> None:
        try:
            _CALLS[call](producer, topic)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    racer = producer.racer = threading.Thread(target=race, daemon=True)
    closer = threading.Thread(target=producer.close, args=(10,), daemon=True)
    racer.start()
    assert producer.paused.wait(10), "the call did not get to its pause"
    closer.start()
    if pause == "in_thread":
        closer.join(20)
        producer.go_on.set()
    racer.join(20)
    closer.join(20)
    assert not racer.is_alive(), f"{call}() racing close() never returned"
    assert not closer.is_alive(), f"close() racing {call}() never returned"
    return outcome[0]


@pytest.mark.parametrize("call", list(_CALLS))
def test_a_call_that_found_the_producer_open_as_another_thread_closed_it(broker, topic, call):
    """The call passed the closed check, then close() ran to its end in another thread
    before the call reached the producer's thread: it raises ProducerClosedError (flush()
    returns, as on a closed producer), not anyio's "This portal is not running"."""
    raised = _race_close(broker, topic, call, "in_thread")
    if call == "flush":
        assert raised is None
    else:
        assert isinstance(raised, ProducerClosedError), repr(raised)


@pytest.mark.parametrize("call", ["flush", "commit_transaction"])
def test_a_call_that_reached_the_producers_thread_as_close_ended_there_ends(broker, topic,
                                                                           call):
    """The call's work in the producer's thread began after close() had stopped the pump
    and failed what was queued: it waited for ever for the pump to take its marker (and
    close() for it). flush() returns; a transaction call raises ProducerClosedError."""
    raised = _race_close(broker, topic, call, "in_loop")
    if call == "flush":
        assert raised is None
    else:
        assert isinstance(raised, ProducerClosedError), repr(raised)


# A script whose blocking call waits on a broker that holds its answers back (the test
# stalls the proxy in front of it), stopped there with Ctrl-C. As in _CTRL_C_LOAD, the
# calling thread blocks SIGINT, so the signal reaches another thread. It says when it is
# interrupted and what became of the record that was waiting; the test then lets the
# answers flow, and the script closes the producer.
_CTRL_C_WAIT = """
import signal, sys, time
from aioproducer import BlockingProducer

topic, call = sys.argv[2], sys.argv[3]
producer = BlockingProducer(sys.argv[1], acks=1, linger_ms=0, buffer_memory=65_536,
                            max_block_ms=120_000, delivery_timeout_ms=120_000)
producer.send(topic, b"first", timeout=30)
print("connected", flush=True)
sys.stdin.readline()  # the answers are held back from now on
waiting = producer.produce(topic, b"waiting")
produced = [waiting]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
print("calling", flush=True)
started = time.monotonic()
try:
    if call == "flush":
        producer.flush()
    elif call == "close":
        producer.close()
    elif call == "send":
        producer.send(topic, b"sent")
    else:  # buffer_memory fills, then the queue for the producer's thread: produce() waits
        for i in range(50_000):
            produced.append(producer.produce(topic, b"%05d" % i + bytes(1_000)))
    print("returned", flush=True)
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - started, 1),
          type(waiting.exception(5)).__name__ if call == "close" else waiting.done(),
          flush=True)
sys.stdin.readline()  # the answers flow again
producer.close(30)
outcomes = [f.exception(0) for f in produced]
print("sent", sum(exc is None for exc in outcomes),
      "failed", sorted({type(exc).__name__ for exc in outcomes if exc is not None}), flush=True)
"""


def _lines_of(process: subprocess.Popen) -> "queue.Queue[str]":
    """The process's stdout lines, read by a thread: a test waits for each with a timeout."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.parametrize("call", ["flush", "close", "send", "produce"])
def test_ctrl_c_stops_a_blocking_call_waiting_on_the_broker(proxied_broker, call):
    """Ctrl-C in flush(), close(), send() or a produce() waiting for room, while the broker
    holds its answers back: each waited on the producer's thread with no timeout (produce():
    max_block_ms), so a Ctrl-C the kernel gave another thread was raised only as the call
    returned (never, here, while the answers were held). Now it is raised within a fraction
    of a second. flush() and send() leave their records buffered, and they are sent; close()
    closes at once, the record not acknowledged failing with ProducerClosedError; produce()
    has produced the records before the one it waited with, which are sent. (Before: no
    "interrupted" line within 10 s.)"""
    from tests.support.processes import start_interruptible

    cluster = proxied_broker
    cluster.create_topic("held", 1)
    script = start_interruptible(
        [sys.executable, "-c", _CTRL_C_WAIT, cluster.bootstrap, "held", call],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _lines_of(script)
        assert lines.get(timeout=30) == "connected\n"
        cluster.proxy.stall(True)
        script.stdin.write("held\n")
        script.stdin.flush()
        assert lines.get(timeout=30) == "calling\n"
        time.sleep(1.0 if call == "produce" else 0.5)  # (under way: waiting on the broker)
        script.send_signal(signal.SIGINT)
        said = lines.get(timeout=10).split()
        assert said[0] == "interrupted", said
        assert float(said[1]) < 8, said
        assert said[2] == ("ProducerClosedError" if call == "close" else "False"), said
        cluster.proxy.stall(False)
        script.stdin.write("flowing\n")
        script.stdin.flush()
        outcome = lines.get(timeout=60).rstrip("\n").split(maxsplit=3)
        _, err = script.communicate(timeout=30)
    finally:
        cluster.proxy.stall(False)
        if script.poll() is None:
            script.kill()
            script.communicate(timeout=10)
    assert script.returncode == 0, err
    assert outcome[0] == "sent", outcome
    sent = int(outcome[1])
    if call == "close":
        assert (sent, outcome[3]) == (0, "['ProducerClosedError']")
    else:
        assert outcome[3] == "[]" and sent >= 1
    # (The proxy held the answers only: the broker has the record whose close failed it.)
    written = 1 + sent + (call == "send") + (call == "close")
    got = consume_all(cluster.bootstrap, "held", expected=written)
    assert [r.value for r in got[:2]] == [b"first", b"waiting"] and len(got) == written
