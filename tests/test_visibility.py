"""Failures nobody awaits are seen: the on_delivery_error hook, a log line by default (at
most one per 10 s), a producer left open when its loop ends, and an outage's metadata
warnings rate-limited."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from aioproducer import BlockingProducer, Producer
from aioproducer.errors import (ConfigError, DeliveryTimeoutError, MessageTooLargeError,
                               ProducerClosedError, TransactionAbortedError)
from aioproducer.hooks import ProducerHooks
from tests.support.readback import consume_all, transaction_outcomes


async def test_the_delivery_error_hook_hears_of_records_nobody_awaits(proxied_broker):
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("unwatched", 1)
    heard: list[tuple[type, str, int, int]] = []

    def hook(error: BaseException, topic: str, partition: int, count: int) -> None:
        heard.append((type(error), topic, partition, count))
        raise RuntimeError("a hook that fails is logged, not raised into the producer")

    async with Producer(cluster.bootstrap, linger_ms=0, on_delivery_error=hook) as producer:
        await producer.enqueue("unwatched", os.urandom(5000))  # fire and forget
        await producer.flush()
        assert (await producer.send("unwatched", b"small")).offset >= 0  # and it goes on
    assert heard == [(MessageTooLargeError, "unwatched", 0, 1)]


async def test_without_a_hook_failures_are_logged_at_most_every_10_s(proxied_broker, caplog):
    cluster = proxied_broker
    cluster.proxy.message_max_bytes(3000)
    cluster.create_topic("logged", 1)
    caplog.set_level(logging.WARNING, logger="aioproducer")
    async with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for _ in range(5):
            await producer.enqueue("logged", os.urandom(5000))
            await producer.flush()
    lines = [r.getMessage() for r in caplog.records if "failed: MessageTooLargeError" in
             r.getMessage()]
    assert len(lines) == 1 and "1 record(s) for logged-0" in lines[0], lines


def test_a_bad_hook_is_refused():
    with pytest.raises(ConfigError, match="on_delivery_error"):
        Producer("127.0.0.1:9092", on_delivery_error="print")


def test_a_producer_left_open_when_its_loop_ends_sends_its_records_and_is_reported(broker,
                                                                                   topic):
    """asyncio.run() ends with the producer open (collected as `main()` returns): its
    buffered record is sent, as close() would (it was lost, "1 record(s) unsent"), and that
    it was left open is said on stderr, no -W needed."""
    script = textwrap.dedent(f"""
        import asyncio
        from aioproducer import Producer

        async def main():
            producer = Producer({broker.bootstrap!r})
            await producer.start()
            await producer.enqueue({topic!r}, b"never flushed")

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONWARNINGS": ""})
    assert "unclosed <Producer" in done.stderr and "created at <string>:6 was collected, " \
        "its 1 buffered record(s) were sent before it closed" in done.stderr, done.stderr
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == \
        [b"never flushed"]


@pytest.mark.parametrize("loop_closed", [False, True])
def test_records_left_in_a_loop_never_run_to_its_end_are_reported_at_exit(broker, topic,
                                                                          loop_closed):
    """`loop.run_until_complete(main())` without close() (older tutorials' way, not
    asyncio.run()): no task is cancelled, nothing ends the producer, and its 100 lingering
    records were lost with nothing said (exit status 0, stderr empty; with `loop.close()`,
    asyncio's "Task was destroyed but it is pending!" about our tasks only). At exit the
    records left unsent are reported with the line that made the producer and what to do."""
    script = textwrap.dedent(f"""
        import asyncio
        from aioproducer import Producer

        async def main():
            producer = Producer({broker.bootstrap!r}, linger_ms=60_000)
            await producer.start()
            for i in range(100):
                await producer.enqueue({topic!r}, b"%d" % i)

        loop = asyncio.new_event_loop()
        loop.run_until_complete(main())
        {"loop.close()" if loop_closed else ""}
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONWARNINGS": ""})
    assert done.returncode == 0, done.stderr
    assert "created at <string>:6: 100 record(s) unsent at exit, its event loop never run " \
        "to its end" in done.stderr and "asyncio.run(main())" in done.stderr, done.stderr


@pytest.mark.parametrize("runner", ["asyncio", "uvloop"])
def test_a_producer_kept_open_past_its_loop_s_end_sends_what_it_held(broker, topic, runner):
    """A producer still referenced when asyncio.run() ends without close() (a global, one
    returned by main()): the loop's end cancelled its sender and its 1,000 lingering records
    were lost ("its sender was cancelled, 1000 record(s) unsent"). The sender outlives that
    cancel and sends them first, as close() would; the producer ends closed and says so."""
    run = asyncio.run if runner == "asyncio" else pytest.importorskip("uvloop").run
    reported: list[str] = []

    async def main() -> Producer:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        producer = Producer(broker.bootstrap, linger_ms=60_000)
        await producer.start()
        await producer.enqueue_many(topic, [(None, b"%d" % i) for i in range(1000)])
        return producer

    producer = run(main())
    assert producer.metrics().state == "closed"
    assert len(reported) == 1 and "was open as its event loop ended, its 1000 buffered " \
        "record(s) were sent before it closed: call `await producer.close()` before the loop " \
        "ends" in reported[0], reported
    got = consume_all(broker.bootstrap, topic, expected=1000)
    assert [r.value for r in got] == [b"%d" % i for i in range(1000)]


@pytest.mark.parametrize("sends", ["waiting", "never run"])
def test_sends_to_a_new_topic_cut_off_by_the_loop_s_end_are_counted_in_its_report(
        broker, topic_factory, sends):
    """main() makes 100 `create_task(producer.send(...))` to a topic the producer has not
    used, then returns without close(): asyncio.run() cancels the sends, waiting for the
    topic's metadata (main awaited once after them) or not run yet, so none buffered its
    record, and the producer's report said "with nothing buffered" as if nothing was lost.
    It says how many were cancelled."""
    reported: list[str] = []

    async def main() -> Producer:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        producer = Producer(broker.bootstrap)
        await producer.start()
        topic = topic_factory(1)  # (made after start(): its metadata is not known)
        for i in range(100):
            asyncio.create_task(producer.send(topic, b"%d" % i))
        if sends == "waiting":
            await asyncio.sleep(0)  # (each send's first step: it waits for the metadata)
            assert producer._intake.metadata_waits_ended() is not None
        return producer

    producer = asyncio.run(main())
    assert producer.metrics().state == "closed"
    assert len(reported) == 1 and "was open as its event loop ended, with nothing buffered; " \
        "100 call(s) were cancelled before they buffered their records (sends waiting for a " \
        "topic's metadata, or never run): those records were not sent" in reported[0], \
        reported


def test_a_transactional_producer_left_open_at_its_loop_s_end_aborts_its_transaction(
        broker, topic):
    """asyncio.run() ends with a transaction open: never committed, it is aborted at once
    (an ABORT marker after the record it sent), the record still buffered fails with
    TransactionAbortedError, the producer ends closed, and the report says so. Before, its
    sender was cancelled ("1 record(s) unsent"), the transaction was left open (no marker:
    read_committed consumers held back until the coordinator's timeout) and metrics().state
    stayed 'started'. (Tansu writes the marker; tests/real_kafka checks a read_committed
    consumer.)"""
    reported: list[str] = []
    kept: list[tuple[Producer, asyncio.Future]] = []  # (open as the loop ends, not collected)

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        producer = Producer(broker.bootstrap, transactional_id=f"{topic}-txn", linger_ms=60_000)
        await producer.start()
        producer.begin_transaction()
        await producer.enqueue(topic, b"sent, never committed")
        await producer.flush()
        kept.append((producer, await producer.enqueue(topic, b"buffered")))

    asyncio.run(main())
    (producer, buffered), = kept
    assert len(reported) == 1 and f"created at {__file__}" in reported[0] and \
        "was open as its event loop ended, its open transaction was aborted, not committed " \
        "(1 record(s) of it still buffered failed)" in reported[0], reported
    assert isinstance(buffered.exception(), TransactionAbortedError)
    assert producer.metrics().state == "closed"
    outcomes = transaction_outcomes(broker.bootstrap, topic, 1)
    assert (outcomes.aborted, outcomes.committed, outcomes.open) == \
        ([b"sent, never committed"], [], []), outcomes


# What the report and the warning meanwhile say of a transaction the loop's end could not end.
_NOT_ENDED = {
    "abort": ("its open transaction could not be aborted within 1.5 s (",
              "it aborts its open transaction for up to"),
    "commit": ("its transaction's commit, under way, could not complete within 1.5 s (",
               "it commits its transaction for up to"),
}


@pytest.mark.parametrize("ending", _NOT_ENDED)
def test_a_transaction_the_loop_s_end_cannot_end_is_reported(proxied_broker, caplog, ending):
    """The broker stops answering before the loop's end ends the transaction, open (abort)
    or with its commit under way (commit): the end is given up at the bound (1.5 s here,
    delivery_timeout_ms), said while it waits, and the report says it did not end and what
    that holds back (not that the records were sent)."""
    cluster = proxied_broker
    topic = f"unended-{ending}"
    cluster.create_topic(topic, 1)
    reported: list[str] = []
    kept: list[Producer] = []  # (open as the loop ends, not collected before)
    caplog.set_level(logging.WARNING, logger="aioproducer")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        producer = Producer(cluster.bootstrap, transactional_id=f"{topic}-txn",
                            delivery_timeout_ms=1500, request_timeout_ms=1000)
        await producer.start()
        producer.begin_transaction()
        await producer.send(topic, b"sent, never committed")
        cluster.proxy.stall(True)
        if ending == "commit":
            asyncio.ensure_future(producer.commit_transaction())
            await asyncio.sleep(0)  # (the commit began)
            assert producer.metrics().transaction_state == "committing"
        kept.append(producer)

    try:
        asyncio.run(main())
    finally:
        cluster.proxy.stall(False)
    outcome, meanwhile = _NOT_ENDED[ending]
    assert len(reported) == 1 and outcome in reported[0] and "read_committed consumers of " \
        "its partitions wait until its coordinator aborts it" in reported[0], reported
    assert meanwhile in caplog.text, caplog.text


def _interrupted_twice(cluster, script: str) -> str:
    """Run `script` (argv[1]: the bootstrap), which prints "ready" once it holds records;
    stall the broker, Ctrl-C it (a real SIGINT), wait (30 s at most) for the warning that
    says a Ctrl-C leaves now, Ctrl-C it again: its stderr."""
    from tests.support.processes import start_interruptible

    process = start_interruptible([sys.executable, "-c", script, cluster.bootstrap],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONWARNINGS": ""})
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr],
                              daemon=True)
    said: list[str] = []
    try:
        assert process.stdout.readline() == "ready\n"
        cluster.proxy.stall(True)
        reader.start()
        process.send_signal(signal.SIGINT)
        for _ in range(200):  # (the script's lines before the warning: a few)
            said.append(lines.get(timeout=30))  # (queue.Empty: no word of the wait)
            if "Ctrl-C leaves now" in said[-1]:
                break
        else:
            raise AssertionError(f"no word of the wait in 200 lines: {said}")
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()
        cluster.proxy.stall(False)
        if reader.is_alive():
            reader.join(timeout=30)  # (to the end of its stderr: the process is gone)
        process.stdout.close()
        process.stderr.close()
    return "".join(said + list(lines.queue))


def test_a_second_ctrl_c_leaves_at_once_and_says_what_was_lost(proxied_broker):
    """A script's first Ctrl-C with its broker not answering: asyncio.run() ends, and the
    producer left open sends what it holds for up to 10 s, which it now says after a second
    (before, nothing was said until the 10 s ended). A second Ctrl-C leaves at once; the exit
    report says the sending was interrupted (it said the loop was never run to its end,
    `loop.run_until_complete()` without close(), the advice for another mistake)."""
    proxied_broker.create_topic("interrupted", 1)
    stderr = _interrupted_twice(proxied_broker, textwrap.dedent("""
        import asyncio, sys
        from aioproducer import Producer

        async def main():
            producer = Producer(sys.argv[1], linger_ms=60_000)
            await producer.start()
            for i in range(10):
                await producer.enqueue("interrupted", b"%d" % i)
            print("ready", flush=True)
            await asyncio.sleep(60)

        asyncio.run(main())
    """))
    assert "sends the 10 record(s) it holds for up to" in stderr, stderr
    assert "created at <string>:6: 10 record(s) unsent at exit, interrupted (a second " \
        "Ctrl-C) while it sent what it held as its event loop ended" in stderr, stderr
    assert "never run to its end" not in stderr and "within 10 s" not in stderr, stderr


def test_a_blocking_producer_closing_at_exit_says_a_ctrl_c_leaves_now(proxied_broker):
    """The same in sync code: a BlockingProducer left open is closed at exit within 10 s;
    with its broker not answering, a Ctrl-C'd script sat silent for those 10 s. It now says
    so after a second; a second Ctrl-C leaves at once, its records failed and said."""
    proxied_broker.create_topic("interrupted-sync", 1)
    stderr = _interrupted_twice(proxied_broker, textwrap.dedent("""
        import sys, time
        from aioproducer import BlockingProducer

        producer = BlockingProducer(sys.argv[1], linger_ms=60_000)
        for i in range(10):
            producer.produce("interrupted-sync", b"%d" % i)
        print("ready", flush=True)
        time.sleep(60)
    """))
    assert "a BlockingProducer left open at exit (created at <string>:5) waits for its 10 " \
        "record(s) for up to" in stderr, stderr
    assert "10 record(s) for interrupted-sync-0 failed: ProducerClosedError('the producer " \
        "was closed before these records were acknowledged (close(timeout=0))')" in stderr, \
        stderr


def _left_open_with_a_record_unanswered(cluster, topic: str, wait: float):
    """asyncio.run() of a producer (delivery timeout 1.5 s) that sends a record, then enqueues
    one as its broker stops answering, waits `wait` s and returns without close(): that
    record's future and what the loop's exception handler was told."""
    cluster.create_topic(topic, 1)
    reported: list[str] = []

    async def main() -> asyncio.Future:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        producer = Producer(cluster.bootstrap, linger_ms=0, delivery_timeout_ms=1500,
                            request_timeout_ms=1000)
        await producer.start()
        await producer.send(topic, b"acknowledged")
        cluster.proxy.stall(True)
        future = await producer.enqueue(topic, b"never acknowledged")
        await asyncio.sleep(wait)
        return future

    try:
        return asyncio.run(main()), reported
    finally:
        cluster.proxy.stall(False)


def test_a_producer_left_open_sends_for_its_delivery_timeout_at_most(proxied_broker):
    """The sending at the loop's end is bounded (10 s, or delivery_timeout_ms if shorter): a
    broker that stopped answering does not hold the script's exit; the record fails, and the
    report says how many were not acknowledged."""
    future, reported = _left_open_with_a_record_unanswered(proxied_broker, "left-open", 0)
    assert len(reported) == 1 and "1 of its 1 buffered record(s) were not acknowledged " \
        "within 1.5 s and failed" in reported[0], reported
    # Its delivery timeout (1.5 s from the enqueue) and the bound (1.5 s from the loop's end)
    # end together: whichever fails it first, the report above says it failed (it said
    # "sent" when the delivery timeout came first: 1 in 3 loaded runs).
    with pytest.raises((DeliveryTimeoutError, ProducerClosedError),
                       match="not acknowledged within"):
        future.result()


def test_a_record_that_expires_as_a_producer_left_open_finishes_is_reported_failed(
        proxied_broker):
    """Its delivery timeout passes 1 s into the sending at the loop's end (bounded at 1.5 s):
    it fails with DeliveryTimeoutError, and the report counts it failed, not sent."""
    future, reported = _left_open_with_a_record_unanswered(proxied_broker, "expires", 1.0)
    assert len(reported) == 1 and "1 of its 1 buffered record(s) were not acknowledged " \
        "within 1.5 s and failed" in reported[0], reported
    with pytest.raises(DeliveryTimeoutError):
        future.result()


def test_a_close_cut_short_by_the_loops_end_is_reported(proxied_broker):
    """`async with` inside an anyio cancel scope that fires: the scope cancels close() too
    (every await, again and again), the closing goes on in the producer's task, and
    asyncio.run() ends and cancels it with a record unacknowledged. Said through the loop's
    exception handler, as for a producer never closed (it went unsaid: the sender ended in
    'closing'). Then the producer is closed: its sockets were left open, and warned of with
    the producer when it was collected (in whichever test ran next)."""
    import anyio

    cluster = proxied_broker
    cluster.create_topic("cut-at-the-end", 1)
    reported: list[str] = []
    kept: list[Producer] = []
    closed: list[Producer] = []

    class Hooks(ProducerHooks):
        def on_close(self, producer):
            closed.append(producer)

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context["message"]))
        with anyio.move_on_after(0.5):
            async with Producer(cluster.bootstrap, linger_ms=0, hooks=[Hooks()]) as producer:
                kept.append(producer)
                await producer.send("cut-at-the-end", b"acknowledged")
                cluster.proxy.stall(True)
                await producer.enqueue("cut-at-the-end", b"never acknowledged")
                await anyio.sleep(30)  # the work the scope's deadline cuts short

    try:
        asyncio.run(main())
    finally:
        cluster.proxy.stall(False)
    said = [m for m in reported if "<Producer" in m]
    assert len(said) == 1 and "close() did not finish before its event loop ended, 1 " \
        "record(s) not acknowledged" in said[0], reported
    assert kept[0].metrics().state == "closed" and closed == kept
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        kept.clear()
        gc.collect()
    unclosed = [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)]
    del warned  # (each holds its source)
    assert unclosed == []


async def test_an_outage_logs_its_metadata_failures_once_and_its_end(proxied_broker, caplog):
    cluster = proxied_broker
    cluster.create_topic("outage", 1)
    caplog.set_level(logging.INFO, logger="aioproducer")
    async with Producer(cluster.bootstrap, linger_ms=0, retry_backoff_ms=10,
                        retry_backoff_max_ms=50, reconnect_backoff_ms=10,
                        reconnect_backoff_max_ms=50) as producer:
        await producer.send("outage", b"before")
        cluster.proxy.refuse(True)
        pending = await producer.enqueue("outage", b"during")
        await asyncio.sleep(2)
        cluster.proxy.heal()
        assert (await asyncio.wait_for(pending, 30)).offset == 1
    messages = [r.getMessage() for r in caplog.records]
    failed = [m for m in messages if m.startswith("metadata refresh failed")]
    assert len(failed) == 1, failed
    assert messages.count("metadata refresh works again") == 1


LINGER_BOUND = "bound by linger_ms"


@pytest.mark.parametrize("shape", ["sequential", "gather", "paced", "linger 0"])
async def test_a_loop_of_sends_bound_by_linger_is_said_once(broker, topic, caplog, shape):
    """A loop awaiting send() one record at a time runs at ~1/linger_ms records a second:
    said once, after 50 in a row. Not for records sent together (gather), not for a service
    whose sends come apart from each other (paced), not at linger_ms=0."""
    caplog.set_level(logging.WARNING, logger="aioproducer")
    linger = 0 if shape == "linger 0" else 2
    async with Producer(broker.bootstrap, linger_ms=linger, acks=1) as producer:
        if shape == "gather":
            for _ in range(3):
                await asyncio.gather(*(producer.send(topic, b"v") for _ in range(100)))
        else:
            for i in range(120):
                await producer.send(topic, b"%d" % i)
                if shape == "paced":
                    await asyncio.sleep(0.005)  # the next request comes later than the ack
    said = [r for r in caplog.records if LINGER_BOUND in r.getMessage()]
    assert len(said) == (1 if shape == "sequential" else 0), [r.getMessage() for r in said]
    if said:
        assert "linger_ms=2" in said[0].getMessage() and "enqueue()" in said[0].getMessage()


SEND_LOOP = "such a loop of send() runs at most ~"


@pytest.mark.parametrize("shape", ["sequential", "produce then flush", "paced", "linger 0",
                                   "threads"])
def test_a_loop_of_blocking_sends_is_said_once(broker, topic, caplog, shape):
    """kafka-python's `for row in rows: producer.send(topic, row)` returns at once per record
    there; moved to BlockingProducer, whose send() waits for the ack, it ran at ~120
    records/s with nothing said (the accumulator's word on a loop of `await send()` did not
    come: the thread hop between an ack and the next record is over its 1 ms). Said once, by
    send() itself, after 50 in a row: not for produce() then flush(), not for sends that come
    apart (a view's), not at linger_ms=0, not for threads each sending in a loop (a
    thread pool's views: their records share batches). A thread descheduled mid-loop starts
    the count again, so the loop runs until said (bounded), then 60 more."""
    caplog.set_level(logging.WARNING, logger="aioproducer")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if SEND_LOOP in r.getMessage()]

    sent = 0
    with BlockingProducer(broker.bootstrap, linger_ms=0 if shape == "linger 0" else 2,
                          acks=1) as producer:
        if shape == "produce then flush":
            for i in range(300):
                producer.produce(topic, b"%d" % i)
            producer.flush(30)
            sent = 300
        elif shape == "sequential":
            while not said() and sent < 2_000:
                producer.send(topic, b"%d" % sent)
                sent += 1
            for _ in range(60):
                producer.send(topic, b"%d" % sent)
                sent += 1
        elif shape == "threads":
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda i: producer.send(topic, b"%d" % i), range(400)))
            sent = 400
        else:
            for i in range(120):
                producer.send(topic, b"%d" % i)
                if shape == "paced":
                    time.sleep(0.005)  # the next request comes later than the ack
            sent = 120
        assert producer.metrics().records_sent == sent
    assert len(said()) == (1 if shape == "sequential" else 0), said()
    if shape == "sequential":
        assert "linger_ms=2 and a round trip" in said()[0] and "at most ~333 records/s" in \
            said()[0] and "produce() in the loop and flush()" in said()[0]


def test_a_sender_cancelled_twice_as_its_loop_ends_is_not_reported_again_at_exit(
        proxied_broker):
    """A script's asyncio.run() ends with a producer open and its broker not answering: the
    loop's end cancels the sender, which goes on sending what it holds; something cancels
    it again (here a timer of the script's), and it ends, saying what it could not send.
    The exit report said so a second time, wrongly: "interrupted (a second Ctrl-C)", where
    no Ctrl-C came. A sender that ended is not reported at exit."""
    proxied_broker.create_topic("cancelled-twice", 1)
    script = textwrap.dedent("""
        import asyncio, sys
        from aioproducer import Producer

        KEPT = []  # (open as the loop ends, not collected)

        async def main():
            producer = Producer(sys.argv[1], linger_ms=60_000)
            await producer.start()
            KEPT.append(producer)
            for i in range(10):
                await producer.enqueue("cancelled-twice", b"%d" % i)
            print("ready", flush=True)
            sys.stdin.readline()  # (the test stalls the broker meanwhile)
            # The sender's second cancel, after the one of asyncio.run()'s end:
            asyncio.get_running_loop().call_later(0.5, producer._sender_task.cancel)

        asyncio.run(main())
    """)
    process = subprocess.Popen([sys.executable, "-c", script, proxied_broker.bootstrap],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONWARNINGS": ""})
    try:
        assert process.stdout.readline() == "ready\n"
        proxied_broker.proxy.stall(True)
        _, stderr = process.communicate("\n", timeout=30)
    finally:
        proxied_broker.proxy.stall(False)
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert stderr.count("10 record(s) unsent") == 1, stderr  # (the sender's own report)
    assert "its sender was cancelled" in stderr and "second Ctrl-C" not in stderr, stderr
