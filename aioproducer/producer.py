"""The public Producer: the verbs users call (start / send / enqueue / enqueue_many / flush /
close, and transactions), each handing its work to the part that owns it."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import sys
import traceback
import warnings
import weakref
from contextvars import Context
from threading import get_ident
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Coroutine, \
    Generic, Iterable, NoReturn, Sequence, SupportsIndex, TypeAlias, TypeVar, Unpack, overload

from ._internal.accumulator import RecordAccumulator
from ._internal.arguments import check_timeout, checked_offsets, group_fields, topic_str
from ._internal.batch import BulkFuture, RecordFuture, RecordMetadata
from ._internal.deferred import Deferred, coroutine_function
from ._internal.intake import RecordIntake
from ._internal.lifecycle import CLOSED, CLOSING, FAILED, NEW, STARTED, STARTING, \
    CloseDeadline, Lifecycle
from ._internal.metrics import ProducerMetrics
from ._internal.observer import Observer
from ._internal.sender import Sender
from ._internal.telemetry_samples import TelemetrySamples
from ._internal.thread_future import BulkThreadFuture
from ._internal.transaction_flow import TransactionFlow
from ._internal.transactions import TransactionManager
from ._speedups import Ready
from .client.cluster import Cluster
from .client.telemetry import ClientTelemetry
from .client.tasks import TaskSet, cancelling
from .config import ProducerConfig, ProducerSettingsBase
from .errors import ConfigError, KafkaConnectionError, ProducerClosedError, \
    RequestTimeoutError, TransactionStateError
from .protocol.compression import codec_from_name
from .protocol.records import Headers
from .serializers import SerializerOf

log = logging.getLogger(__name__)
METRICS_WAIT_S = 5.0  # metrics() from another thread waits this long for the loop

# What send() takes without a serializer.
Bytes: TypeAlias = bytes | bytearray | memoryview
if TYPE_CHECKING:  # (a default, PEP 696: Any where a serializer's type cannot be inferred,
    # a lambda's say; typing's own TypeVar takes one from Python 3.13)
    from typing_extensions import TypeVar as DefaultedTypeVar
    # What send() takes as keys: Bytes, or what key_serializer takes; and as values. Only
    # taken, never given back: contravariant, so a producer of Bytes is one of bytes too
    # (a parameter typed Producer[bytes, bytes] takes Producer("host:9092")).
    K = DefaultedTypeVar("K", default=Any, contravariant=True)
    V = DefaultedTypeVar("V", default=Any, contravariant=True)
else:
    K, V = TypeVar("K", contravariant=True), TypeVar("V", contravariant=True)


# Other clients' verbs that are not ours, each with what to use instead.
_OTHER_CLIENTS_VERBS = {
    "produce": "confluent-kafka's produce() is `await producer.enqueue(topic, value, key)` "
               "here, which returns a future of the record's metadata (BlockingProducer has "
               "produce() for sync code)",
    "poll": "not needed: the producer's own task delivers the outcomes (await the futures "
            "enqueue() returns, or flush())",
    "create_batch": "aiokafka's create_batch() and send_batch() are "
                    "`await producer.enqueue_many(topic, [(key, value), ...])` here",
    "list_topics": "`await producer.partitions_for(topic)` gives a topic's partition ids",
}
_OTHER_CLIENTS_VERBS["send_batch"] = _OTHER_CLIENTS_VERBS["create_batch"]


def raise_not_picklable(kind: str) -> NoReturn:
    """A producer handed to another process (a ProcessPoolExecutor's submit, multiprocessing,
    a Spark job's function) is pickled: say where to make one instead, not which inner part
    failed to pickle."""
    raise TypeError(
        f"a {kind} cannot be pickled: create it in the process that uses it (for Spark: in "
        "the function foreachPartition runs, or write the DataFrame with "
        "format(\"aioproducer\"); for multiprocessing: in a Pool's initializer or the "
        "function the child runs, from the settings: a ProducerConfig pickles, unless a "
        "setting is a lambda or an SSLContext). It holds the connections and tasks of the "
        "event loop that started it")


def no_such_verb(obj: object, name: str, hints: dict[str, str]) -> AttributeError:
    """Python's AttributeError for a missing attribute, saying what to use where another
    client has the name (a poll() after each produce(), moved over from confluent-kafka)."""
    message = f"{type(obj).__name__!r} object has no attribute {name!r}"
    return AttributeError(f"{message}: {hints[name]}" if name in hints else message,
                          name=name, obj=obj)


class Producer(Generic[K, V]):
    """An asyncio Kafka producer.

    ```py
    async with Producer("localhost:9092", linger_ms=5) as producer:
        md = await producer.send("orders", b"payload", key=b"user-7")
    ```

    `send()` returns once the broker acknowledged the record; `enqueue()` returns as soon as
    the record is buffered, with a future of its metadata, so a loop can buffer many records
    before waiting. Settings are Kafka's producer settings in snake case (`linger.ms` ->
    `linger_ms`) with the Java client's defaults (but batch_size, 256 KiB): idempotent,
    `acks="all"`. See `ProducerConfig` for the list.

    Typed by its serializers: without any, a `Producer[Bytes, Bytes]` (bytes, bytearray or
    memoryview: mypy refuses a str, as send() does); with a key serializer taking int and a
    value serializer taking Order, a `Producer[int, Order]`; made from a ProducerConfig, or
    with a serializer whose type is not said (a lambda), Any. Types only: no cost per record.
    """

    @overload
    def __init__(self: Producer[Bytes, Bytes],
                 bootstrap_servers: str | Sequence[str] | None = None, *,
                 key_serializer: None = None, value_serializer: None = None,
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: Producer[K, Bytes], bootstrap_servers: str | Sequence[str] | None = None,
                 *, key_serializer: SerializerOf[K], value_serializer: None = None,
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: Producer[Bytes, V], bootstrap_servers: str | Sequence[str] | None = None,
                 *, key_serializer: None = None, value_serializer: SerializerOf[V],
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: Producer[K, V], bootstrap_servers: str | Sequence[str] | None = None,
                 *, key_serializer: SerializerOf[K], value_serializer: SerializerOf[V],
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: Producer[Any, Any], *, config: ProducerConfig) -> None: ...

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, *,
                 config: ProducerConfig | None = None, **settings: Any) -> None:
        if config is not None:
            if settings or bootstrap_servers is not None:
                raise ConfigError("pass either config=ProducerConfig(...) or settings, not both")
            if not isinstance(config, ProducerConfig):
                raise ConfigError(f"config must be a ProducerConfig, not {type(config).__name__}")
            # One built directly, ProducerConfig(...), was not validated yet (validating twice
            # changes nothing). Idempotence counts as defaulted: off if acks etc. conflict.
            self.config = config._validated(None)
        else:
            given: dict[str, Any] = dict(settings)
            if bootstrap_servers is not None:
                given["bootstrap_servers"] = bootstrap_servers
            self.config = ProducerConfig.from_kwargs(**given)
        self._codec = codec_from_name(self.config.compression_type)
        self._started: asyncio.Future[None] | None = None  # the outcome of starting
        # Where it was made, for the warning if it is dropped unclosed: the caller's line
        # (1-3 us), and in asyncio's debug mode the whole stack, as asyncio keeps for tasks.
        caller = sys._getframe(1)
        self._created_at = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        self._source_traceback = traceback.extract_stack(caller) if _debug_mode() else None
        self._blocking = False  # run by a BlockingProducer: the report of one dropped says so
        self._collected = False  # dropped unclosed: `_let_go` ends its parts
        self._renew()

    def _renew(self) -> None:
        """The parts of a producer not started yet: a new one's, or one whose start failed."""
        self._lifecycle = Lifecycle()
        intake = self._intake = RecordIntake(self.config, self._lifecycle)
        # enqueue() and send() are the intake's calls, with no frame of ours between (their
        # common case is one compiled call), unless a subclass has verbs of its own.
        if type(self).enqueue is Producer.enqueue:
            self.enqueue = intake.enqueue_call  # type: ignore[method-assign]
        if type(self).send is Producer.send:
            self.send = intake.send_call  # type: ignore[method-assign]
        self._cluster: Cluster | None = None
        self._accumulator: RecordAccumulator | None = None
        self._sender: Sender | None = None
        self._sender_task: asyncio.Task[None] | None = None
        self._txn: TransactionManager | None = None
        self._observer: Observer | None = None
        self._transactions: TransactionFlow | None = None  # with a transactional_id
        self._telemetry: ClientTelemetry | None = None  # enable_metrics_push (KIP-714)
        self._tasks = TaskSet()  # every task of this producer's, whoever spawns it
        self._closing: asyncio.Task[None] | None = None
        self._close_deadline: CloseDeadline | None = None
        self._close_called = False  # by the user (a failed start closes what it started too)

    def __repr__(self) -> str:
        return (f"<Producer {self.config.client_id} {self._lifecycle.state.value} "
                f"bootstrap={self.config.bootstrap_servers}>")

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise_not_picklable("Producer")

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to the cluster (fails fast with KafkaConnectionError if no bootstrap server
        answers) and start the sender task. Calls while it starts wait for that start. A
        start that fails or is cancelled leaves the producer as new: start() may be retried."""
        while self._started is not None and not self._started.done():
            started = self._started
            try:
                await asyncio.shield(started)  # (a transactional one is "started" meanwhile)
                return
            except asyncio.CancelledError:
                if not started.cancelled() or cancelling():
                    raise
                # Its own caller cancelled that start, leaving the producer new: start it here.
        lifecycle = self._lifecycle
        if lifecycle.state is not NEW:
            if lifecycle.state is STARTED:
                return
            raise ProducerClosedError("this producer was closed; create a new one")
        lifecycle.become(STARTING)
        started = self._started = asyncio.get_running_loop().create_future()
        try:
            await self._start()
        except BaseException as exc:
            if lifecycle.state is STARTING:  # failed (a TLS file not there yet, say): as new
                lifecycle.become(NEW)
                self._renew()
            if isinstance(exc, Exception):
                started.set_exception(exc)
                started.exception()  # retrieved: nobody else may be waiting for it
            else:  # its caller's cancellation, not that of the start() calls waiting for it
                started.cancel()
            raise
        started.set_result(None)

    async def _start(self) -> None:
        """Make the parts, fetch the first metadata (within max_block_ms), start the sender;
        a transactional producer then initializes its transactions."""
        config, lifecycle = self.config, self._lifecycle
        cluster = self._cluster = Cluster(config, self._tasks)
        txn = None
        if config.enable_idempotence:
            txn = self._txn = TransactionManager(config, cluster, self._tasks)
        observer = self._observer = Observer(config.hooks)
        accumulator = self._accumulator = RecordAccumulator(config, self._codec, txn, observer)
        sender = self._sender = Sender(config, cluster, accumulator, txn, observer)
        # What wakes the sender, and who may let a topic's metadata go: wired part to part,
        # so no call goes up through the producer and down again.
        cluster.on_change = accumulator.wake_sender = sender.wake
        accumulator.wake_sender_for = sender.wake_for
        accumulator.wake_sender_short = sender.wake_unless_blocked
        if txn is not None:
            txn.on_change = sender.wake
        cluster.release_topic = accumulator.release_topic
        accumulator.touched = cluster.touched  # (a new batch's topic is produced to)
        self._intake.attach(cluster, accumulator, txn, sender.node_unavailable, self._tasks)
        if txn is not None and txn.is_transactional:
            self._transactions = TransactionFlow(txn, accumulator, self._tasks, lifecycle,
                                                 config.client_id)
        refresh = cluster.refresh()
        try:
            # max_block_ms, whatever request_timeout_ms is: a broker that takes connections
            # but never answers is asked again until then (one that refuses them fails at
            # once). max_block_ms=0, "sends never wait", leaves start() one attempt.
            bound = config.max_block_ms / 1000 or config.request_timeout_ms / 1000
            loop = asyncio.get_running_loop()
            deadline = loop.time() + bound
            while True:
                if not (await asyncio.wait({refresh}, timeout=deadline - loop.time()))[0]:
                    raise KafkaConnectionError(
                        f"no broker answered within {bound:g} s (max_block_ms="
                        f"{config.max_block_ms}; bootstrap_servers={config.bootstrap_servers})"
                        ": is it a Kafka broker, and up?")
                failure = None if refresh.cancelled() else refresh.exception()
                if loop.time() >= deadline or not isinstance(failure, KafkaConnectionError) \
                        or not isinstance(failure.__cause__, RequestTimeoutError):
                    break
                refresh = cluster.refresh()
            refresh.result()
        except BaseException:
            cluster.close()  # (then start() makes the producer new again)
            await self._tasks.aclose()
            # By close(), not the caller (who may have cancelled too: then cancelled, as asked).
            if lifecycle.state is not STARTING and refresh.cancelled() and not cancelling():
                raise ProducerClosedError("the producer was closed while it started") from None
            raise
        if lifecycle.state is not STARTING:  # close() came as the metadata did
            raise ProducerClosedError("the producer was closed while it started")
        lifecycle.bind_to_running_loop()
        if config.enable_metrics_push:
            # KIP-714's resource attributes of a producer, as the Java client sets them (the
            # broker adds client_id, the software's name and version, and the address).
            resource = {"transactional_id": config.transactional_id} \
                if config.transactional_id is not None else {}
            self._telemetry = ClientTelemetry(
                cluster, self._tasks, TelemetrySamples(config, cluster, accumulator, sender,
                                                       observer),
                resource, config.client_id)
            self._telemetry.start()
        self._sender_task = self._tasks.spawn(
            sender.run(), f"aioproducer-sender-{config.client_id}", reported=True)
        # Weakly: no task of its own keeps the producer, so one dropped unclosed is collected
        # (and let go, by __del__).
        self._sender_task.add_done_callback(functools.partial(_sender_done, weakref.ref(self)))
        lifecycle.become(STARTED)
        _STARTED.add(self)
        if not self._blocking:  # (a BlockingProducer closes its own at exit)
            _SENDERS[self._sender_task] = (
                f"unclosed {self!r} created at {self._created_at}", accumulator, sender)
        observer.started(self)
        if self._transactions is not None:
            try:
                await self.init_transactions()
            except BaseException:
                closing = self._close_task(timeout=0)
                cancelled = False
                while not closing.done():  # cancelled (again) meanwhile: still tear down first
                    try:
                        await asyncio.wait({closing})
                    except asyncio.CancelledError:
                        cancelled = True
                if not self._close_called:  # (also while it tore down: the producer stays closed)
                    lifecycle.become(NEW)
                    self._renew()
                if cancelled:
                    raise asyncio.CancelledError()
                raise

    async def __aenter__(self) -> "Producer[K, V]":
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Send what is buffered and stop. With `timeout` (seconds), records not acknowledged
        by then fail with ProducerClosedError; `timeout=0` closes at once.

        Idempotent: a second call waits for the first to finish; a shorter `timeout` in it
        bounds the closing too. Cancelling a caller does not stop the closing, which goes on
        in its own task. No task of the producer outlives close(). On a producer whose event
        loop has ended (whose end sent what it could and reported it), or in a child process
        forked after it started, it only marks it closed."""
        check_timeout("close(timeout=...)", timeout)
        lifecycle = self._lifecycle
        if lifecycle.loop is not None and (lifecycle.loop.is_closed() or lifecycle.forked):
            # Its loop ended without close(): its end sent what it could (Sender.finish) and
            # said so; its tasks are gone and nothing can be flushed (in a forked child, they
            # are the parent's: only the parent's close() sends its records). Closed as far
            # as it can be.
            self._close_called = lifecycle.closing = True
            lifecycle.ended_with_loop = False  # (closed as asked: calls say it is closed)
            if lifecycle.state is STARTED:
                lifecycle.become(CLOSING)
            if lifecycle.state is not CLOSED:
                lifecycle.become(CLOSED)
            return
        lifecycle.check_loop()
        self._close_called = True
        await asyncio.shield(self._close_task(timeout))

    def _close_task(self, timeout: float | None) -> asyncio.Task[None]:
        """The task that closes the producer: started now, or the one under way (whose
        deadline `timeout` brings nearer if it is shorter)."""
        if self._closing is None:
            self._close_deadline = CloseDeadline(timeout)
            self._lifecycle.closing = True
            self._closing = asyncio.get_running_loop().create_task(
                self._close(self._close_deadline),
                name=f"aioproducer-close-{self.config.client_id}")
            self._closing.add_done_callback(self._close_done)
        else:
            assert self._close_deadline is not None
            self._close_deadline.bring_nearer(timeout)
        return self._closing

    async def _close(self, deadline: CloseDeadline) -> None:
        """End the transaction left open, send what is buffered (until the deadline; then
        fail it), stop the sender, then every task."""
        lifecycle = self._lifecycle
        if lifecycle.state is CLOSED:
            return
        if lifecycle.state in (NEW, STARTING, FAILED):
            failed = lifecycle.state is FAILED  # (started, so its hooks were told)
            lifecycle.become(CLOSED)
            await self._stop_tasks()
            if failed and self._observer is not None:
                self._observer.closed(self)
            return
        # Sends begun before close() that wait for their topic's metadata buffer first (a
        # fire-and-forget send to a topic not used yet), within the deadline and max_block_ms;
        # those for a topic the cluster says it does not have fail (Cluster.closing).
        metadata_waits = self._intake.metadata_waits_ended()
        if metadata_waits is not None:
            if self._cluster is not None:
                self._cluster.closing = True
            await deadline.wait({metadata_waits})
        if self._transactions is not None:
            await self._end_transaction_at_close(self._transactions, deadline)
        lifecycle.become(CLOSING)
        accumulator, sender = self._accumulator, self._sender
        assert accumulator is not None and sender is not None
        accumulator.begin_closing()
        sender.running = False
        sender.wake()
        await deadline.wait({b.future for b in accumulator.incomplete})
        if accumulator.incomplete:
            exc = ProducerClosedError(
                "the producer was closed before these records were acknowledged "
                f"(close(timeout={deadline.timeout}))")
            accumulator.fail_all(exc)
            sender.fail_in_flight(exc)
        if self._sender_task is not None:
            sender.wake()
            try:
                await asyncio.wait_for(asyncio.shield(self._sender_task), 5)
            except (asyncio.TimeoutError, Exception):  # its failure was already reported
                self._sender_task.cancel()
                await asyncio.wait({self._sender_task})
        # The sender is done: no record may be left awaiting it.
        accumulator.fail_unresolved(ProducerClosedError(
            "the producer closed before these records could be sent"))
        if self._telemetry is not None:  # KIP-714's last push, within close()'s timeout
            final = self._telemetry.stop()
            if final is not None and not await deadline.wait({final}):
                final.cancel()
        assert self._cluster is not None
        await _settle(self._cluster, deadline)
        await self._stop_tasks()
        lifecycle.become(CLOSED)
        if self._observer is not None:
            self._observer.closed(self)

    async def _end_transaction_at_close(self, transactions: TransactionFlow,
                                        deadline: CloseDeadline) -> None:
        """Let another task's commit or abort end, as the Java client's sender does; then
        abort a transaction left open, as it does too: left open, it would hold back
        read_committed consumers until the coordinator times it out."""
        ending = transactions.ending()
        if ending is not None:
            await deadline.wait({ending})
        if deadline.passed or not transactions.left_open:
            return
        log.warning("closing with a transaction open: aborting it")
        aborting = self._tasks.spawn(self.abort_transaction(),
                                     f"aioproducer-abort-at-close-{self.config.client_id}")
        if not await deadline.wait({aborting}):
            aborting.cancel()  # (its task is stopped with the others)
            log.warning("could not abort the open transaction within close()'s timeout: "
                        "its coordinator will, after transaction_timeout_ms")
        elif not aborting.cancelled() and aborting.exception() is not None:
            log.warning("could not abort the open transaction (%r): its coordinator will, "
                        "after transaction_timeout_ms", aborting.exception())

    async def _stop_tasks(self) -> None:
        """Close the connections, then end every task of the producer's: a commit or abort
        close() gave up on ends with the reason (its connections are gone) within 5 s; the
        rest are cancelled. None outlives close()."""
        if self._txn is not None:
            self._txn.close()
        if self._cluster is not None:
            self._cluster.close()
        ending = self._transactions.ending() if self._transactions is not None else None
        if ending is not None:
            await asyncio.wait({ending}, timeout=5)
        await self._tasks.aclose()

    def _forked_in_child(self) -> None:
        """In a child forked after this producer started: closed, and its tasks (the
        sender's) and connections made inert. The child's copy of the parent's loop runs on
        when os.fork() was called in a coroutine: the copy took the child's sends and wrote
        them over the parent's sockets (with the parent's producer id and sequences), and
        the child read the parent's responses; the parent's later records were lost, or its
        sends hung. Only the parent sends its records."""
        lifecycle = self._lifecycle
        if lifecycle.state not in (STARTED, FAILED, CLOSING):
            return
        self._close_called = lifecycle.closing = True
        if lifecycle.state is STARTED:
            lifecycle.become(CLOSING)
        lifecycle.become(CLOSED)
        # Its loop runs on here only in the thread that forked (os.fork() in a coroutine).
        # Another thread's loop (a BlockingProducer's) never runs here: a call into it from
        # this thread is refused in asyncio's debug mode (RuntimeError in the hook).
        loop_runs_here = lifecycle.thread == get_ident()
        if self._sender is not None:
            self._sender.running = False  # (cancelled, it must not send the parent's records)
        if self._cluster is not None:
            self._cluster.close_in_forked_child(loop_runs_here)
        self._tasks.cancel_in_forked_child(loop_runs_here)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        if task is not self._sender_task:  # (that of a start torn down)
            return
        lifecycle = self._lifecycle
        if task.cancelled():
            if lifecycle.state is STARTED and not lifecycle.closing and \
                    lifecycle.loop is not None:
                # Not by close(): the loop shuts down (asyncio.run() cancels what is left)
                # with the producer open, and its sender did not finish (cancelled again; a
                # close() begun is _close_done's to report). Said where it
                # is seen without -W, as asyncio says a task was destroyed pending.
                pending = sum(b.record_count for b in self._accumulator.incomplete) \
                    if self._accumulator is not None else 0
                lifecycle.loop.call_exception_handler({
                    "message": f"unclosed {self!r} created at {self._created_at} (its sender "
                               f"was cancelled, {pending} record(s) unsent): call `await "
                               "producer.close()` before the loop ends (or use `async with`)",
                    "producer": self})
                if self._cluster is not None:
                    # Its sockets, while the loop runs to close them: left open, each
                    # transport warned (ResourceWarning) when the producer was collected
                    # after the loop closed.
                    self._cluster.close()
            return
        exc = task.exception()
        if exc is None and self._sender is not None and self._sender.finish_by is not None \
                and not lifecycle.closing and not self._collected:
            # It outlived the cancel of the loop's end (asyncio.run() returning with the
            # producer open) and sent what it could: the producer is closed as it can be.
            lifecycle.ended_with_loop = True
            _end_parts(f"unclosed {self!r} created at {self._created_at}",
                       "open as its event loop ended",
                       "call `await producer.close()` before the loop ends (or use `async with`)",
                       self._source_traceback, lifecycle, self._tasks, self._cluster,
                       self._txn, self._accumulator, self._sender)
            if self._observer is not None:
                self._observer.closed(self)
        elif exc is not None:
            log.error("aioproducer sender task failed: %r", exc, exc_info=exc)
            lifecycle.failure = exc
            lifecycle.become(FAILED)
            if self._sender is not None:
                self._sender.fail_in_flight(exc)
            if self._accumulator is not None:
                self._accumulator.fail_unresolved(exc)

    def _close_done(self, task: asyncio.Task[None]) -> None:
        """The closing task cancelled: only the loop's end does that (close() shields it).
        Its caller was cancelled (an anyio cancel scope around `async with` cancels every
        await of the close again) and asyncio.run() ended as the task still sent: the records
        it held may be lost, said where it is seen without -W. Then the producer is closed as
        it can be while the loop still runs: what it held fails, its sockets close (left open,
        each warned when the producer was collected, with the producer itself)."""
        lifecycle = self._lifecycle
        loop = lifecycle.loop
        if not task.cancelled() or loop is None or self._accumulator is None:
            return
        pending = sum(b.record_count for b in self._accumulator.incomplete)
        exc = ProducerClosedError("close() did not finish before the producer's event loop "
                                  "ended: the record was not acknowledged")
        if self._sender is not None:
            self._sender.running = False
            self._sender.fail_in_flight(exc)
        self._accumulator.fail_unresolved(exc)
        if self._txn is not None:
            self._txn.close()
        if self._cluster is not None:
            self._cluster.close()
        self._tasks.cancel()
        if lifecycle.state is STARTED:
            lifecycle.become(CLOSING)
        if lifecycle.state is CLOSING:
            lifecycle.become(CLOSED)
            if self._observer is not None:
                self._observer.closed(self)
        if pending:
            loop.call_exception_handler({
                "message": f"{self!r}: close() did not finish before its event loop ended, "
                           f"{pending} record(s) not acknowledged (some may have reached the "
                           "broker; none will be retried): its caller was cancelled (a cancel "
                           "scope or timeout around `async with`) and the closing went on "
                           "until the loop ended. Close the producer outside the cancelled "
                           "scope, or await `producer.close()` again after it",
                "producer": self})

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        """Dropped unclosed while its loop runs on (a handler that makes a producer and
        forgets it): warn, and let its parts go on the loop (see `_let_go`)."""
        lifecycle = getattr(self, "_lifecycle", None)
        if lifecycle is None or lifecycle.state not in (STARTED, FAILED, CLOSING) or \
                lifecycle.forked:  # (a forked child's copy: the parent's closes it)
            return
        if self._blocking:
            unclosed = f"unclosed <BlockingProducer of {self!r}> created at {self._created_at}"
            advice = "call `producer.close()` when done with it (or use `with`)"
        else:
            unclosed = f"unclosed {self!r} created at {self._created_at}"
            advice = "call `await producer.close()` when done with it (or use `async with`)"
        _warn(f"{unclosed}: {advice}", ResourceWarning, source=self)
        loop = lifecycle.loop
        if loop is None or loop.is_closed():  # (its loop's end cancelled its tasks already)
            return
        self._collected = True  # (_let_go ends it: a warning may keep it a while as source)
        try:  # (collected in any thread, at any allocation: nothing is done here but this)
            loop.call_soon_threadsafe(
                _let_go, unclosed, advice, self._source_traceback, lifecycle, self._tasks,
                self._cluster, self._txn, self._accumulator, self._sender,
                None if self._blocking else self._sender_task)
        except RuntimeError:  # closed meanwhile
            pass

    # -- producing -------------------------------------------------------------------------

    @coroutine_function
    def send(self, topic: str, value: V | None, key: K | None = None, *,
             partition: int | None = None,
             timestamp_ms: int | None = None,
             headers: Headers | None = None) -> Coroutine[Any, Any, RecordMetadata]:
        """Produce one record: awaited, returns its metadata once the broker acknowledged it.

        In the producer's running loop, the call itself buffers the record, or, when
        buffer_memory is full, puts it in line for memory (served in call order, up to
        max_block_ms); either way what it returns is a future to asyncio, so
        `asyncio.gather(*(producer.send(...) ...))` makes no Task per record, and a coroutine
        to `create_task()` and TaskGroups. Before the topic's metadata is known, and outside
        the producer's running loop (`loop.run_until_complete(producer.send(...))`), it is a
        coroutine that does all that when awaited (never awaited, its record is lost: that
        is logged at ERROR through the loop's exception handler, with the call's line). Bad
        arguments raise from the call.

        Cancelled after the record was buffered, it is still sent: only the wait ends.
        Cancelled while in line for memory (the future, or every task awaiting it), the
        record is not sent."""
        return self._intake.send_call(topic, value, key, partition=partition,
                                      timestamp_ms=timestamp_ms, headers=headers)

    @coroutine_function
    def enqueue(self, topic: str, value: V | None, key: K | None = None, *,
                partition: int | None = None, timestamp_ms: int | None = None,
                headers: Headers | None = None) -> Coroutine[Any, Any, RecordFuture]:
        """Buffer one record; return a future of its RecordMetadata.

        Waits only for what it must: the topic's metadata the first time, and buffer memory
        when `buffer_memory` is full (both at most `max_block_ms`). Errors in the arguments
        raise here; delivery errors are raised by the returned future.

        In the producer's running loop, a record that fits its partition's open batch, or
        opens one, is buffered by the call itself, and what it returns is then complete:
        awaiting it costs no coroutine and no loop turn (to `create_task()` and TaskGroups it
        is a coroutine).
        """
        return self._intake.enqueue_call(topic, value, key, partition=partition,
                                         timestamp_ms=timestamp_ms, headers=headers)

    @coroutine_function
    def enqueue_many(self, topic: str, records: Iterable[tuple[K | None, V | None]], *,
                     partition: int | None = None, timestamp_ms: int | None = None
                     ) -> Coroutine[Any, Any, BulkFuture]:
        """Buffer many (key, value) records in one call; return one future of their metadata.

        The bulk path of `enqueue()`: the same checks and partitioning, no per-record await or
        handle, and for (bytes | None, bytes | None) tuples without serializers, a loop in
        the compiled speed-up. All records get the same timestamp (now, unless given) and no
        headers (but what on_send hooks add: they see each record as it is read, as
        enqueue() shows them its own, and those records take the Python path). Whatever
        the call raises (a record refused for its type or size, an unknown topic, a
        cancellation, `records` itself raising), the records before stay buffered:
        the exception's `accepted` attribute is the BulkFuture of those, always the first
        len(accepted) records. A timeout around the call raises a TimeoutError of its own:
        `aioproducer.accepted(error)` finds the BulkFuture on any of them. `records` is read
        as the call goes (it may wait for buffer memory): do not change it until the call
        returns. Nothing is buffered until it is awaited (never awaited, that is logged at
        ERROR through the loop's exception handler, with the call's line).
        """
        return Deferred(self._intake.enqueue_many(topic, records, partition, timestamp_ms),
                        "enqueue_many", topic, self._lifecycle)

    async def _enqueue_many_for(self, context: Context | None, topic: str,
                                records: Iterable[tuple[K | None, V | None]],
                                partition: int | None, timestamp_ms: int | None) -> BulkFuture:
        """enqueue_many() for a call made in another thread (BlockingProducer.produce_many()):
        on_send hooks see the records in `context`, the calling thread's."""
        return await self._intake.enqueue_many(topic, records, partition, timestamp_ms, context)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now (ignoring linger) and wait until each of those records
        is acknowledged or failed. Failures stay on the records' futures; flush itself raises
        TimeoutError if `timeout` (seconds) passes first. On a producer not started (nothing
        can be buffered before start() returns) or closed it returns at once: a `finally:`
        that flushes after a start() that failed leaves start()'s error to be seen."""
        check_timeout("flush(timeout=...)", timeout)
        lifecycle = self._lifecycle
        if lifecycle.state not in (STARTED, CLOSING):  # closing also sends what is buffered
            return
        lifecycle.check_loop()
        assert self._accumulator is not None
        not_done = await self._accumulator.flush(timeout)
        if not_done:
            raise TimeoutError(
                f"flush(timeout={timeout}): {not_done} batch(es) still unacknowledged")

    def metrics(self) -> ProducerMetrics:
        """Counters since start() and the state now (see ProducerMetrics); cheap enough to
        call every few seconds for a monitoring system. Before start(): all zero but
        buffer_memory_available, the whole buffer_memory.

        Callable from any thread (a metrics exporter's): from outside the producer's loop
        it asks the loop for the snapshot and waits up to `METRICS_WAIT_S` for it (then
        TimeoutError: the loop is blocked)."""
        lifecycle = self._lifecycle
        loop = lifecycle.loop
        if loop is not None and get_ident() != lifecycle.thread and loop.is_running():
            return asyncio.run_coroutine_threadsafe(self._metrics_async(), loop).result(
                METRICS_WAIT_S)
        return self._metrics_now()

    async def _metrics_async(self) -> ProducerMetrics:
        return self._metrics_now()

    def _metrics_now(self) -> ProducerMetrics:
        accumulator, sender, cluster, txn, observer = \
            self._accumulator, self._sender, self._cluster, self._txn, self._observer
        if accumulator is None or sender is None or cluster is None or observer is None:
            return ProducerMetrics(buffer_memory_available=self.config.buffer_memory,
                                   state=self._lifecycle.state.value)  # (closed unstarted)
        connections = cluster.open_connections()
        return ProducerMetrics(
            records_sent=accumulator.records_sent,
            records_failed=accumulator.records_failed,
            batches_sent=accumulator.batches_sent,
            bytes_sent=sender.bytes_sent,
            produce_requests=sender.requests,
            produce_responses=sender.responses,
            produce_latency_s=sender.latency,
            retries=sender.retries,
            splits=sender.splits,
            produce_throttle_time_ms=sender.throttle_time_ms,
            produce_throttle_time_max_ms=sender.throttle_time_max_ms,
            leader_redirects=sender.redirects,
            reauthentications=cluster.reauthentications,
            rebootstraps=cluster.rebootstraps,
            state="closing" if self._lifecycle.closing and self._lifecycle.state is STARTED
            else self._lifecycle.state.value,
            records_pending=sum(batch.record_count for batch in accumulator.incomplete),
            oldest_pending_s=accumulator.oldest_pending_s(),
            requests_in_flight=sum(conn.in_flight_produce for conn in connections),
            connections=len(connections),
            buffer_memory_available=accumulator.memory_available,
            waiting_for_memory=accumulator.waiting,
            producer_id=txn.producer_id if txn is not None else -1,
            producer_epoch=txn.producer_epoch if txn is not None else -1,
            transaction_state=txn.state.value if txn is not None and txn.is_transactional
            else "",
            transaction_version=txn.transaction_version if txn is not None else 0,
            finalized_features=dict(cluster.finalized_features),
            topics=observer.topics(),
            produce_latency_histogram=observer.request_latency(),
            record_latency_histogram=observer.record_latency(),
        )

    async def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of `topic` (fetching its metadata if needed), as aiokafka's
        partitions_for() returns them: `len()` of it is the partition count."""
        if self._lifecycle.state is not STARTED:
            self._lifecycle.raise_not_started()
        self._lifecycle.check_loop()
        return set(range(await self._intake.partition_count(topic_str(topic))))

    async def send_and_wait(self, topic: str, value: V | None, key: K | None = None, *,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Headers | None = None) -> RecordMetadata:
        """aiokafka's name for `send()`, which waits for the acknowledgement already."""
        return await self.send(topic, value, key, partition=partition,
                               timestamp_ms=timestamp_ms, headers=headers)

    async def stop(self) -> None:
        """aiokafka's name for `close()`."""
        await self.close()

    if not TYPE_CHECKING:  # (to mypy, a misspelt name stays an error)
        def __getattr__(self, name: str) -> Any:
            raise no_such_verb(self, name, _OTHER_CLIENTS_VERBS)

    # -- transactions ----------------------------------------------------------------------

    async def init_transactions(self) -> None:
        """Register our `transactional_id` with its coordinator: fences any older producer
        with the same id and aborts its open transaction. `start()` does this already.

        Goes on when its caller is cancelled, as commit_transaction() does (the coordinator
        may have given us a new epoch already): call it again to wait for its outcome."""
        transactions = self._transaction_flow()
        self._lifecycle.check_loop()
        await transactions.init()

    def begin_transaction(self) -> Awaitable[None]:
        """Start a transaction: records sent until commit or abort are in it. Synchronous, as
        in the Java client (nothing is sent until a record is): it has begun when the call
        returns. What it returns may be awaited, as aiokafka's coroutine is
        (`await producer.begin_transaction()`), at no cost."""
        self._transaction_flow().begin()
        return Ready(None)  # (aiokafka's is a coroutine: `await None` was a TypeError)

    async def commit_transaction(self) -> None:
        """Send what is buffered, wait for every record of the transaction to be acknowledged,
        then commit. If a record failed, raises TransactionStateError: abort instead.

        Cancelling the caller (a timeout) does not stop the commit, which goes on in its own
        task: call commit_transaction() again to learn its outcome (until the next
        begin_transaction(): it returns if the commit succeeded, even after it ended). One
        that failed on a lost connection or a timeout is tried again by that call."""
        transactions = self._transaction_flow()
        self._lifecycle.check_loop()  # before the state changes: on another loop it could never end
        await transactions.end(commit=True)

    async def abort_transaction(self) -> None:
        """Abort: records not yet sent fail with TransactionAbortedError, records already on
        their way are written but marked aborted, which consumers with
        isolation_level=read_committed skip. Goes on when its caller is cancelled, and says
        its outcome when called again, as commit_transaction() does; one that failed on a
        lost connection or a timeout may be tried again."""
        transactions = self._transaction_flow()
        self._lifecycle.check_loop()
        await transactions.end(commit=False)

    async def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any) -> None:
        """Commit a consumer group's offsets as part of the transaction (consume-transform-
        produce, exactly once). `offsets`: {(topic, partition): next_offset_to_read}, the
        offset there also an OffsetAndMetadata (aiokafka's, kafka-python's: its .metadata
        and .leader_epoch are committed with it), or a
        list of objects with .topic, .partition and .offset (confluent-kafka's
        TopicPartition, as `consumer.position(consumer.assignment())` gives them; a logical
        offset there, a partition not read from yet, is left out, as librdkafka does).
        `group_metadata`: the group id, or an object (or mapping) with
        group_id and, for fencing of zombie consumers (KIP-447), generation_id, member_id and
        group_instance_id."""
        transactions = self._transaction_flow()
        self._lifecycle.check_loop()
        await transactions.send_offsets(checked_offsets(offsets), group_fields(group_metadata))

    async def committed_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]
                                ) -> dict[tuple[str, int], int]:
        """The offsets `group_id` has committed for `partitions`, {(topic, partition):
        offset} with -1 where none is. What send_offsets_to_transaction() committed, read
        back after a restart, says which of our transactions committed (the Spark sink
        skips those); a transaction still open on them is waited out."""
        self._transaction_flow()
        self._lifecycle.check_loop()
        assert self._txn is not None
        return await self._txn.committed_offsets(group_id, list(partitions))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator["Producer[K, V]"]:
        """`async with producer.transaction():` commits when the block ends, aborts if it
        raises (and re-raises). The block's exception, a cancellation say, always goes on up:
        an abort that fails too is a note on it (the next transaction call says what state
        that left). The abort goes on in a task of its own when the block is cancelled (a
        cancel scope cancels every await in it); the next transaction() waits for it. Cut
        short in its commit (the body done), the commit goes on: a note on the cancellation
        says so."""
        ending = self._transaction_flow().ending()
        if ending is not None:
            await asyncio.wait({ending})  # the last one's commit or abort
        self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            # Once close() began, the transaction is its to abort (not with timeout=0).
            transactions = self._transactions
            if not self._lifecycle.closing and transactions is not None and \
                    transactions.may_abort:
                try:
                    await self.abort_transaction()
                except Exception as abort_error:
                    exc.add_note(f"aborting the transaction failed too: {abort_error!r}")
            raise
        try:
            await self.commit_transaction()
        except asyncio.CancelledError as cancelled:  # (a timeout, say: not an abort)
            cancelled.add_note(
                "the transaction's commit was under way and goes on: the block's records may "
                "be committed; `await producer.commit_transaction()` returns once it is, or "
                "raises why not (do not redo the transaction before)")
            raise

    def _transaction_flow(self) -> TransactionFlow:
        if self.config.transactional_id is None:
            raise TransactionStateError(
                "transactions need a transactional_id: Producer(..., transactional_id='my-app-1')")
        if self._lifecycle.state is not STARTED:
            self._lifecycle.raise_not_started()
        assert self._transactions is not None
        return self._transactions


# The producers started in this process: a child forked since closes its copies of them.
_STARTED: weakref.WeakSet[Producer] = weakref.WeakSet()
# Their sender tasks, with what to call each producer, its records and its sender, for the
# report at exit (a forked child's copies are the parent's to report).
_SENDERS: weakref.WeakKeyDictionary[asyncio.Task[None],
                                    tuple[str, RecordAccumulator, Sender]] = \
    weakref.WeakKeyDictionary()


def _forked_in_child() -> None:
    for producer in list(_STARTED):
        producer._forked_in_child()
    _STARTED.clear()
    _SENDERS.clear()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_forked_in_child)


@atexit.register
def _report_left_at_exit() -> None:
    """Records still buffered at exit by a sender whose loop was neither running nor run to
    its end by asyncio.run() (`loop.run_until_complete(main())` without close(), as older
    tutorials do): nothing cancelled the sender, so nothing finished the producer or said
    so, and its records were lost unsaid. Or whose sending at the loop's end
    (`Sender.finish`) a KeyboardInterrupt cut short: a second Ctrl-C, which asyncio.run()
    leaves to Python's default handler as it cancels the tasks left."""
    for task, (unclosed, accumulator, sender) in list(_SENDERS.items()):
        loop = task.get_loop()
        if loop.is_running() or task.done():  # (a sender that ended was reported as it did)
            continue
        pending = sum(batch.record_count for batch in accumulator.incomplete)
        if pending and sender.finishing_as_loop_ends:
            loop.call_exception_handler({
                "message": f"{unclosed}: {pending} record(s) unsent at exit, interrupted (a "
                           "second Ctrl-C) while it sent what it held as its event loop "
                           "ended: call `await producer.close()` before the loop ends (or "
                           "use `async with`)"})
        elif pending:
            loop.call_exception_handler({
                "message": f"{unclosed}: {pending} record(s) unsent at exit, its event loop "
                           "never run to its end (loop.run_until_complete() without close()): "
                           "call `await producer.close()` before the loop stops, or run the "
                           "program with asyncio.run(main()), whose end sends them"})


def _sender_done(producer: weakref.ref[Producer], task: asyncio.Task[None]) -> None:
    alive = producer()
    if alive is not None:  # (else collected: `_let_go` ends its parts)
        alive._sender_done(task)


async def _settle(cluster: Cluster, deadline: CloseDeadline) -> None:
    """At acks=0 a record's future is done once its request is written: before the
    connections close, wait for each broker to have handled those requests (its answer to a
    barrier written after them), until the deadline or request_timeout_ms (the connection's
    timer fails the barrier then); warn of each broker that did not answer."""
    barriers = cluster.barriers()
    if not barriers:
        return
    await deadline.wait(barriers)
    for barrier, conn in barriers.items():
        if not barrier.done():
            barrier.cancel()
            log.warning("close(): %s had not answered when close()'s timeout ended: acks=0 "
                        "records it had not read yet are lost", conn.address)
        elif barrier.exception() is not None:
            log.warning("close(): %s did not confirm that it handled every acks=0 request "
                        "(%s): records in them may be lost (Kafka closes the connection when "
                        "it refuses one)", conn.address, barrier.exception())


def _let_go(unclosed: str, advice: str, source_traceback: traceback.StackSummary | None,
            lifecycle: Lifecycle, tasks: TaskSet, cluster: Cluster | None,
            txn: TransactionManager | None, accumulator: RecordAccumulator | None,
            sender: Sender | None, sender_task: asyncio.Task[None] | None) -> None:
    """The parts of a producer collected unclosed. Its sender (`sender_task`) sends what it
    held, as close() would, for up to 10 s (`Sender.finish`; the loop's end included: a
    script whose `main()` returns without close() loses nothing; an open transaction is
    aborted), then they are let go (`_end_parts`). A BlockingProducer's (no `sender_task`:
    its thread and loop end with it) are let go at once."""
    if lifecycle.state is CLOSED:
        return
    if sender is not None and sender.running and \
            sender_task is not None and not sender_task.done():
        sender.finish()
        sender_task.add_done_callback(lambda _: _end_parts(
            unclosed, "collected", advice, source_traceback, lifecycle, tasks, cluster, txn,
            accumulator, sender))
        return
    _end_parts(unclosed, "collected", advice, source_traceback, lifecycle, tasks, cluster, txn,
               accumulator, sender)


def _end_parts(unclosed: str, how: str, advice: str,
               source_traceback: traceback.StackSummary | None, lifecycle: Lifecycle,
               tasks: TaskSet, cluster: Cluster | None, txn: TransactionManager | None,
               accumulator: RecordAccumulator | None, sender: Sender | None) -> None:
    """The end of a producer nobody closed (`how`: collected, or open as its loop ended):
    fail what it still holds, close its sockets, cancel its tasks, and say so where it is
    seen without -W, as aiohttp does for an unclosed session. Its hooks are not told
    on_close here."""
    if lifecycle.state is CLOSED:
        return
    pending = unacknowledged = 0
    finished = sender is not None and sender.finish_by is not None
    if accumulator is not None and sender is not None:
        pending = sum(batch.record_count for batch in accumulator.incomplete)
        # (those that failed while it finished, a delivery timeout, count as well)
        unacknowledged = sender.held_at_finish - (
            accumulator.records_sent - sender.acknowledged_before_finish)
        exc = ProducerClosedError(
            f"the producer was {how} without close() ({unclosed}): records it held were not "
            + (f"acknowledged within {sender.finish_within:g} s" if finished else "sent"))
        accumulator.begin_closing()
        sender.running = False
        sender.fail_in_flight(exc)
        accumulator.fail_unresolved(exc)
    lifecycle.closing = True
    if txn is not None:
        txn.close()
    if cluster is not None:
        cluster.close()
    tasks.cancel()
    if lifecycle.state is STARTED:
        lifecycle.become(CLOSING)
    lifecycle.become(CLOSED)
    if finished and sender is not None and sender.aborted_at_finish:
        outcome = _abort_outcome(sender)
    elif finished and sender is not None and sender.committing_at_finish:
        outcome = _commit_outcome(sender)
    elif finished and not unacknowledged:
        assert sender is not None
        outcome = f"its {sender.held_at_finish} buffered record(s) were sent before it " \
                  "closed" if sender.held_at_finish else "with nothing buffered"
    elif finished:
        assert sender is not None
        outcome = f"{unacknowledged} of its {sender.held_at_finish} buffered record(s) were not " \
                  f"acknowledged within {sender.finish_within:g} s and failed"
    else:
        outcome = f"{pending} record(s) unsent"
    if lifecycle.cancelled_unbuffered:  # (lost before the producer held them)
        outcome += f"; {lifecycle.cancelled_unbuffered} call(s) were cancelled before they " \
            "buffered their records (sends waiting for a topic's metadata, or never run): " \
            "those records were not sent"
    context: dict[str, Any] = {"message": f"{unclosed} was {how}, {outcome}: {advice}"}
    if source_traceback is not None:
        context["source_traceback"] = source_traceback
    asyncio.get_running_loop().call_exception_handler(context)


def _abort_outcome(sender: Sender) -> str:
    """What became of the transaction a producer nobody closed aborted (`Sender.finish`)."""
    failed = f" ({sender.failed_at_abort} record(s) of it still buffered failed)" \
        if sender.failed_at_abort else ""
    if sender.txn_end_failure is None:
        return f"its open transaction was aborted, not committed{failed}"
    return f"its open transaction could not be aborted within {sender.finish_within:g} s " \
           f"({sender.txn_end_failure!r}){failed}: read_committed consumers of its partitions " \
           "wait until its coordinator aborts it (transaction_timeout_ms)"


def _commit_outcome(sender: Sender) -> str:
    """What became of the transaction whose commit was under way as a producer nobody closed
    ended (`Sender.finish` completes it, or aborts it if a record of it failed)."""
    if sender.txn_end_failure is not None:
        return f"its transaction's commit, under way, could not complete within " \
               f"{sender.finish_within:g} s ({sender.txn_end_failure!r}): read_committed " \
               "consumers of its partitions wait until its coordinator aborts it " \
               "(transaction_timeout_ms)"
    if sender.commit_failure is not None:
        return f"its transaction's commit, under way, could not complete " \
               f"({sender.commit_failure!r}): the transaction was aborted"
    sent = f"its {sender.held_at_finish} buffered record(s) were sent and " \
        if sender.held_at_finish else ""
    return f"{sent}its transaction's commit, under way, completed"


def _debug_mode() -> bool:
    """asyncio's debug mode, as asyncio decides it for a new loop (or the running loop's)."""
    loop = asyncio._get_running_loop()  # (None outside a loop: no exception's cost)
    if loop is not None:
        return loop.get_debug()
    return sys.flags.dev_mode or (not sys.flags.ignore_environment and
                                  bool(os.environ.get("PYTHONASYNCIODEBUG")))


def accepted(error: BaseException) -> BulkFuture | BulkThreadFuture | None:
    """The records an `enqueue_many()` call buffered before `error` ended it, as the
    BulkFuture of those (they are sent), wherever the error went: on the exception itself,
    or on the one it was raised from or during, as when `asyncio.timeout()`, `wait_for()` or
    `anyio.fail_after()` turn the call's cancellation into a TimeoutError. From
    `BlockingProducer.produce_many()`, a concurrent.futures.Future of those (both have the
    number of records as their len()). None if `error` came from neither call."""
    seen: set[int] = set()
    chained: BaseException | None = error
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        found = getattr(chained, "accepted", None)
        if isinstance(found, (BulkFuture, BulkThreadFuture)):
            return found
        chained = chained.__cause__ or chained.__context__
    return None
