"""The producer for code without an event loop: Django and Flask views, scripts, notebooks,
Celery tasks, Spark executors.

`BlockingProducer` runs a `Producer` on an event loop in a thread of its own, through anyio's
blocking portal. Records cross to that thread in batches, not one hop each: `produce()` puts
the record in a queue and wakes the loop's pump only when it is asleep, and the pump hands
everything queued to the producer in one go. Many threads may produce at once; each
thread's records keep their order. `produce_many()` hands a whole list over in one call:
the async `enqueue_many()`, run in the loop's thread once the caller's earlier records are in.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import importlib.util
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Generic, Iterable, \
    Iterator, NoReturn, Sequence, SupportsIndex, TypeVar, Unpack, overload

from anyio import CancelScope
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._internal.batch import BulkFuture, BulkMetadata, ProducerBatch, RecordFuture, \
    RecordMetadata
from ._internal.metrics import ProducerMetrics
from ._internal.observer import deliver, deliver_each
from ._internal.thread_future import BulkThreadFuture, ThreadFuture
from .client.ratelimit import LogEvery
from .config import ProducerConfig, ProducerSettingsBase
from .errors import BufferExhaustedError, ProducerClosedError
from .producer import Bytes, K, Producer, V, no_such_verb, raise_not_picklable
from .protocol.records import Headers
from .serializers import SerializerOf

log = logging.getLogger(__name__)
DeliveryCallback = Callable[[RecordMetadata | None, BaseException | None], None]
_T = TypeVar("_T")

# Records queued for the loop's thread before produce() waits for the pump to catch up:
# the producer's buffer_memory bounds what is buffered, this bounds what waits to be.
_QUEUE_LIMIT = 5_000
_POLL = 0.001  # how often the pump looks at the queue while records keep coming
# How often a calling thread's wait looks up (see _wait_for): a Ctrl-C is raised that soon.
_STEP = 0.1
_OPEN: weakref.WeakSet[BlockingProducer[Any, Any]] = weakref.WeakSet()
# The process whose multiprocessing finalizers close its producers left open (see
# _close_before_multiprocessing_child_exits).
_finalizer_in: int | None = None
# send() calls in a row from one thread, each made within _AT_ONCE of its last one's return
# and none from another thread between (those share batches: many threads sending is
# fine), before saying once that such a loop waits a round trip per record (as the
# accumulator says of a loop of `await send()`, which does not see this one: the thread hop
# makes its gap).
_SEND_LOOP_AFTER = 50
_AT_ONCE = 0.001
# What an on_delivery's first parameter is called when it takes confluent-kafka's order,
# on_delivery(err, msg): ours is the Java client's, (metadata, exception).
_ERROR_NAMES = frozenset({"err", "error", "exc", "exception", "e", "ex"})
# Other clients' verbs that are not ours, each with what to use instead.
_OTHER_CLIENTS_VERBS = {
    "poll": "not needed: on_delivery callbacks run in the producer's thread without it "
            "(drop the call; flush() waits for every record produced)",
    "create_batch": "aiokafka's create_batch() and send_batch() are "
                    "produce_many(topic, [(key, value), ...]) here",
    "list_topics": "partitions_for(topic) gives a topic's partition ids",
}
_OTHER_CLIENTS_VERBS["send_batch"] = _OTHER_CLIENTS_VERBS["create_batch"]


def _typed_into_a_host_s_loop() -> bool:
    """Whether the code running is a notebook's cell or a statement typed at the asyncio
    REPL (`python -m asyncio`), which their hosts run in their event loop's thread: a
    Jupyter kernel, marimo's (cells in `marimo edit`, `run` and `export`), the REPL's. Nothing
    else of the user's waits on that loop, and blocking there is what BlockingProducer is
    for. (marimo's test is its own, per thread: the handlers of a web app that mounts a
    marimo app still hear the warning.)"""
    if "ipykernel" in sys.modules:
        return True
    marimo = sys.modules.get("marimo")
    if marimo is not None and getattr(marimo, "running_in_notebook", bool)():
        return True
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main_spec, "name", None) == "asyncio.__main__"


class BlockingProducer(Generic[K, V]):
    """A Kafka producer with blocking calls; the same settings as `Producer`.

    ```py
    with BlockingProducer("localhost:9092", linger_ms=5) as producer:
        producer.produce("clicks", b"...")              # returns at once: a Future
        md = producer.send("orders", b"...", key=b"k")  # returns after the ack
        producer.flush()
    ```

    `produce()` returns a `concurrent.futures.Future` of the record's metadata; errors,
    bad arguments included, are set on it (and passed to `on_delivery`). Cancelling that
    future before the producer took the record means the record is not sent; after, it
    cannot be cancelled. Settings are checked in the constructor. Not usable after
    `os.fork()`: create a new one in the child.
    """

    # Typed by its serializers, as Producer is.
    @overload
    def __init__(self: BlockingProducer[Bytes, Bytes],
                 bootstrap_servers: str | Sequence[str] | None = None, *,
                 key_serializer: None = None, value_serializer: None = None,
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: BlockingProducer[K, Bytes],
                 bootstrap_servers: str | Sequence[str] | None = None, *,
                 key_serializer: SerializerOf[K], value_serializer: None = None,
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: BlockingProducer[Bytes, V],
                 bootstrap_servers: str | Sequence[str] | None = None, *,
                 key_serializer: None = None, value_serializer: SerializerOf[V],
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: BlockingProducer[K, V],
                 bootstrap_servers: str | Sequence[str] | None = None, *,
                 key_serializer: SerializerOf[K], value_serializer: SerializerOf[V],
                 **settings: Unpack[ProducerSettingsBase]) -> None: ...

    @overload
    def __init__(self: BlockingProducer[Any, Any], *, config: ProducerConfig) -> None: ...

    def __init__(self, bootstrap_servers: str | Sequence[str] | None = None, *,
                 config: ProducerConfig | None = None, **settings: Any) -> None:
        self._producer: Producer[K, V] = Producer(  # type: ignore[call-overload]
            bootstrap_servers, config=config, **settings)
        # Dropped unclosed (a notebook cell run again), its report names this and its maker.
        caller = sys._getframe(1)
        self._producer._created_at = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        self._producer._blocking = True
        self._max_block = self._producer.config.max_block_ms / 1000
        self._queue: deque[_Produced | asyncio.Future[None]] = deque()
        self._woken = False  # a wake-up of the pump is on its way or running
        self._room = threading.Event()
        self._room.set()
        self._closed = False
        self._forked = False
        # The blocking calls under way in the producer's thread (see _call): close() waits
        # for them before it stops that thread, and none begins once close() did.
        self._calls = 0
        self._gate = threading.Condition(threading.Lock())
        self._loop_thread: int | None = None
        # on_send hooks run in the loop's thread, in a copy of the producing thread's context
        # (so an OpenTelemetry span there is the child of the caller's span).
        self._tells_send = bool(self._producer._intake.on_send_hooks)
        # Per batch in flight, its records' futures, each followed by its RecordFuture.
        self._by_batch: dict[ProducerBatch, list[_Produced | RecordFuture]] = {}
        # produce_many()'s BulkFutures not done yet, each followed by a thread future.
        self._bulks: set[BulkFuture] = set()
        # A produce() refused for its arguments fails its future only: with nobody to look
        # at it (no on_delivery), a loop of records of the wrong type failed unseen.
        self._log_refused = LogEvery(log, logging.WARNING, 10)
        self._checked_on_delivery: object = None  # the code of the last on_delivery checked
        # The thread whose send() returned last, when, and how many came so in a row; not
        # said at linger_ms=0, which is the setting for one record at a time.
        self._last_send: tuple[int, float] = (0, 0.0)
        self._sends_in_a_row = 0
        self._said_send_loop = self._producer.config.linger_ms == 0
        self._said_async = False  # a blocking call from a running event loop was warned of
        self._portal_cm = start_blocking_portal("asyncio", _backend_options(),
                                                name="aioproducer-blocking")
        self._portal: BlockingPortal = self._portal_cm.__enter__()
        try:
            self._loop, self._wakeup, self._pump = self._portal.call(self._start)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        _OPEN.add(self)
        _close_before_multiprocessing_child_exits()

    @property
    def config(self) -> ProducerConfig:
        return self._producer.config

    def __repr__(self) -> str:
        return f"<BlockingProducer of {self._producer!r}>"

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise_not_picklable("BlockingProducer")

    def __enter__(self) -> BlockingProducer[K, V]:
        if self._closed:  # (as Producer's `async with` refuses a closed one)
            self._check_usable()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    if not TYPE_CHECKING:  # (to mypy, a misspelt name stays an error)
        def __getattr__(self, name: str) -> Any:
            raise no_such_verb(self, name, _OTHER_CLIENTS_VERBS)

    # -- producing -------------------------------------------------------------------------

    def produce(self, topic: str, value: V | None, key: K | None = None, *,
                partition: int | None = None, timestamp_ms: int | None = None,
                headers: Headers | None = None,
                on_delivery: DeliveryCallback | None = None,
                callback: None = None) -> Future[RecordMetadata]:
        """Queue one record; returns at once with a future of its metadata. `on_delivery`
        (metadata, None) or (None, exception) runs in the producer's thread: keep it short
        (one whose first parameter is named `err`, confluent-kafka's order, raises
        TypeError). `callback`, confluent-kafka's other name for its on_delivery, raises
        TypeError saying so (its arguments come in the other order). Waits (up to
        max_block_ms) only while 5,000 records are queued for that thread."""
        if self._closed:  # (or forked: that closes it too)
            self._check_usable()
        if callback is not None:
            raise TypeError("produce() takes no callback=: confluent-kafka's callback= is "
                            "on_delivery= here, called on_delivery(metadata, exception), the "
                            "other order than confluent-kafka's (err, msg)")
        if on_delivery is not None:
            code = getattr(on_delivery, "__code__", None)  # (a function's or a method's)
            if code is not self._checked_on_delivery:
                _check_delivery_order(on_delivery, code)
                self._checked_on_delivery = code
        future: _Produced = _Produced()
        future._record = (topic, value, key, partition, timestamp_ms, headers,
                          contextvars.copy_context() if self._tells_send else None)
        future._on_delivery = on_delivery
        queue = self._queue
        if len(queue) >= _QUEUE_LIMIT and threading.get_ident() != self._loop_thread:
            self._wait_for_room()
        queue.append(future)
        if not self._woken:
            self._woken = True
            with contextlib.suppress(RuntimeError):  # (the loop closed: see below)
                self._loop.call_soon_threadsafe(self._wakeup.set)
        if self._closed:  # close() began since the check above: it may have drained already
            self._refuse_if_left(future)
        return future

    def send(self, topic: str, value: V | None, key: K | None = None, *,
             partition: int | None = None, timestamp_ms: int | None = None,
             headers: Headers | None = None, timeout: float | None = None) -> RecordMetadata:
        """Produce one record and wait for its acknowledgement (at most `timeout` seconds:
        then TimeoutError, and the record may still be sent)."""
        self._check_blocking_allowed()
        called = time.monotonic()
        future = self.produce(topic, value, key, partition=partition,
                              timestamp_ms=timestamp_ms, headers=headers,
                              on_delivery=_raised_to_the_caller)
        try:
            _wait_for(future, timeout)  # (a Ctrl-C stops the wait: the record is still sent)
            metadata = future.result(0)
        except BaseException as exc:
            if not future.done() or future.exception(0) is not exc:  # not its outcome: a
                # timeout or a Ctrl-C ended the wait, and a refusal to come is logged
                future.add_done_callback(partial(self._say_refused_unwaited, topic))
            raise
        if not self._said_send_loop:
            self._count_send_loop(called)
        return metadata

    def _say_refused_unwaited(self, topic: str, future: _Produced) -> None:
        """A record refused (`_Produced.refused`) after its send() stopped waiting (its
        timeout, a Ctrl-C): logged as produce()'s are, since no caller will see it."""
        if future.refused:
            self._log_refused("send(%r, ...) failed after its wait ended, the record is not "
                              "sent: %r", topic, future.exception(0))

    def _count_send_loop(self, called: float) -> None:
        """Did this send() come as the last one, this thread's, returned? 50 in a row are a
        loop waiting for each record's ack (kafka-python's send() returns at once: moved
        over, such a loop ran at 122 records/s at linger_ms=5): said once, in the log.
        (Threads race here harmlessly: at worst a count starts again.)"""
        thread = threading.get_ident()
        last_thread, returned = self._last_send
        at_once = last_thread == thread and called - returned < _AT_ONCE
        self._sends_in_a_row = self._sends_in_a_row + 1 if at_once else 0
        self._last_send = (thread, time.monotonic())
        if self._sends_in_a_row == _SEND_LOOP_AFTER:
            self._said_send_loop = True
            log.warning(
                "%d send() calls in a row each waited for its record's acknowledgement "
                "(linger_ms=%d and a round trip) before the next: such a loop of send() runs "
                "at most ~%d records/s. produce() in the loop and flush() after it (or "
                "produce_many()); kafka-python's send(), which returns a future at once, is "
                "produce() here. (Said once.)", _SEND_LOOP_AFTER, self.config.linger_ms,
                round(1000 / (self.config.linger_ms + 1)))

    def produce_many(self, topic: str, records: Iterable[tuple[K | None, V | None]], *,
                     partition: int | None = None,
                     timestamp_ms: int | None = None) -> BulkThreadFuture:
        """Buffer many (key, value) records in one call, after every record this thread
        produce()d before it: `Producer.enqueue_many()`, run in the producer's thread (one
        thread hop for them all). Returns once they are buffered (waiting for memory up to
        max_block_ms) with a `concurrent.futures.Future` of their metadata (a BulkMetadata,
        in input order) or of the first failure; its len() is the number of records, and it
        cannot be cancelled. Whatever the call raises (a record refused, the producer closed,
        `records` itself raising), the records it buffered are sent: the exception's
        `accepted` (also found by `aioproducer.accepted(error)`) is such a future of those,
        always the first len(accepted) records (resume from there); a KeyboardInterrupt
        (Ctrl-C) in this thread stops the call there too, and carries `accepted` as well.
        `records` is read in the producer's thread as the call goes: do not change it until
        the call returns."""
        # What the call buffered, however it ended in the producer's thread: a Ctrl-C here
        # stops it there (see _call), and the KeyboardInterrupt then carries this.
        outcome: Future[BulkThreadFuture] = Future()
        try:
            future: BulkThreadFuture = self._call(
                self._produce_many, topic, records, partition, timestamp_ms,
                contextvars.copy_context() if self._tells_send else None, outcome,
                interruptible=True)
            return future
        except (Exception, KeyboardInterrupt) as exc:
            # (outcome.cancel() succeeds if the call never began there: nothing buffered)
            if isinstance(exc, KeyboardInterrupt) and not outcome.cancel():
                with contextlib.suppress(Exception):  # (bounded: the call was cancelled)
                    exc.accepted = outcome.result(  # type: ignore[attr-defined]
                        self._max_block + 10)
            if not isinstance(getattr(exc, "accepted", None), BulkThreadFuture):  # (none taken)
                exc.accepted = _none_buffered()  # type: ignore[union-attr]
            raise

    def flush(self, timeout: float | None = None) -> None:
        """Send everything produced so far (linger no longer counts) and wait until each
        record is acknowledged or failed; TimeoutError if `timeout` (seconds) passes first.
        Once closed, it returns at once (close() sent everything), as Producer.flush() does.
        A Ctrl-C (KeyboardInterrupt) stops the wait: the records stay buffered, and are sent
        (close() waits for them)."""
        if self._closed and not self._forked:
            return
        try:
            self._call(self._flush, timeout, interruptible=True)
        except ProducerClosedError:
            if self._closed and not self._forked:  # closed by another thread meanwhile
                return
            raise

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued and buffered, then stop the producer and its thread. With
        `timeout` (seconds), records not acknowledged by then fail with
        ProducerClosedError. A second call returns at once. A Ctrl-C (KeyboardInterrupt)
        while it waits closes at once, as close(timeout=0) (the Java client's interrupted
        close() forces the close too): the records not acknowledged yet fail with
        ProducerClosedError (their futures and on_delivery say so), then it is raised."""
        if self._closed:
            return
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("close() from the producer's own thread (an on_delivery "
                               "callback?) would never return")
        # From the moment this call marks the producer closed, it closes it, whatever
        # strikes: a Ctrl-C as it left the lock left a producer that said closed and was
        # not, to a second close() and at exit alike (its thread and records never ended).
        mine = False
        closing: Future[None] | None = None
        try:
            with self._gate:
                if self._closed:  # (another thread's close() came first)
                    return
                self._closed = mine = True
            if self._forked:
                return  # the loop's thread is not in this process
            closing = self._portal.start_task_soon(self._close, timeout)
            _wait_for(closing)
            closing.result()
        except KeyboardInterrupt:  # (also as the close was handed over: see _call)
            if mine and not self._forked:
                self._portal.start_task_soon(self._producer.close, 0)  # (joins, sooner)
                if closing is not None:
                    _wait_for(closing)
            raise
        finally:  # (each step in a `finally` of the one before: a Ctrl-C skips none)
            if mine:
                try:
                    _OPEN.discard(self)
                finally:
                    if not self._forked:
                        try:
                            with self._gate:  # the calls that began before: each ends once
                                while self._calls:  # the producer closed (records in line
                                    self._gate.wait()  # for memory fail, say)
                        finally:
                            self._portal_cm.__exit__(None, None, None)

    def metrics(self) -> ProducerMetrics:
        """As `Producer.metrics()`."""
        return self._call(self._producer.metrics)

    def __len__(self) -> int:
        """The records produced and not yet acknowledged or failed, as confluent-kafka's
        `len(producer)` (0 once closed)."""
        if self._closed:
            return 0
        return self._call(self._unfinished)

    def __bool__(self) -> bool:  # (with a __len__, an idle producer would be false)
        return True

    def _unfinished(self) -> int:
        # (a copy: other threads append as this counts; copying is one C call)
        queued = sum(isinstance(item, _Produced) for item in self._queue.copy())
        return queued + self._producer.metrics().records_pending

    def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of `topic` (fetching its metadata if needed)."""
        return self._call(self._producer.partitions_for, topic)

    # -- transactions ----------------------------------------------------------------------

    def begin_transaction(self) -> None:
        """As `Producer.begin_transaction()`; records produced before it stay out of it."""
        self._call(self._after_handover, self._producer.begin_transaction)

    def commit_transaction(self) -> None:
        """As `Producer.commit_transaction()`: every record produced before it is in it."""
        self._call(self._after_handover, self._producer.commit_transaction)

    def abort_transaction(self) -> None:
        """As `Producer.abort_transaction()`."""
        self._call(self._after_handover, self._producer.abort_transaction)

    def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any) -> None:
        """As `Producer.send_offsets_to_transaction()`."""
        self._call(self._after_handover, partial(
            self._producer.send_offsets_to_transaction, offsets, group_metadata))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[BlockingProducer[K, V]]:
        """`with producer.transaction():` commits when the block ends, aborts if it raises."""
        self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            try:
                self.abort_transaction()
            except Exception as abort_error:
                exc.add_note(f"aborting the transaction failed too: {abort_error!r}")
            raise
        self.commit_transaction()

    # -- the producing thread's side -------------------------------------------------------

    @overload
    def _call(self, func: Callable[..., Awaitable[_T]], *args: Any,
              interruptible: bool = False) -> _T: ...
    @overload
    def _call(self, func: Callable[..., _T], *args: Any, interruptible: bool = False) -> _T: ...

    def _call(self, func: Callable[..., Any], *args: Any, interruptible: bool = False) -> Any:
        """`func(*args)` in the producer's thread, awaited there if a coroutine, its result
        or error here. Refused (ProducerClosedError) once close() began; close() waits for
        the calls under way before it stops the thread: a call that found the producer open
        as another thread closed it got anyio's "This portal is not running". A
        KeyboardInterrupt in this thread stops the wait (see _wait_for); if `interruptible`
        it cancels the call there too (else the call goes on: a Ctrl-C'd produce_many() went
        on buffering its records)."""
        self._check_blocking_allowed()
        stop: Future[None] = Future()  # cancelled by a Ctrl-C here: the call there stops
        # (Made first: a Ctrl-C raised between the count and the `try` left the call
        # counted for ever, and close() waiting for it.)
        with self._gate:
            self._check_usable()
            self._calls += 1
        try:
            running = self._portal.start_task_soon(_stoppable, stop, func, *args) \
                if interruptible else self._portal.start_task_soon(func, *args)
            _wait_for(running)
            return running.result()
        except KeyboardInterrupt:
            # (Also when raised as the call was handed over, before `running` was set: the
            # wake-up written to the loop gives its thread the GIL, and this one, taking it
            # back, raises a SIGINT that came meanwhile. CI: a produce_many() went on.)
            stop.cancel()
            raise
        finally:
            with self._gate:
                self._calls -= 1
                if not self._calls:
                    self._gate.notify_all()

    def _check_blocking_allowed(self) -> None:
        """A call that waits for the producer's thread, made from that thread (in an
        on_delivery callback), would wait for ever."""
        self._check_usable()
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("a blocking call from the producer's own thread (an "
                               "on_delivery callback?) would never return: use produce() there")
        if not self._said_async and asyncio._get_running_loop() is not None:  # (~20 ns)
            self._warn_async_caller()

    def _warn_async_caller(self) -> None:
        """A blocking call in an event loop's thread (an `async def` handler) stops every
        task of that loop for the wait: 50 concurrent handlers took ~300 ms where `await
        Producer.send()` took 6 ms. Said once, at the caller's line; not in a notebook or
        the asyncio REPL (`_typed_into_a_host_s_loop`)."""
        self._said_async = self._said_send_loop = True  # (that advice is for sync code)
        if _typed_into_a_host_s_loop():
            return
        frame, stacklevel = sys._getframe(1), 2
        while frame.f_back is not None and frame.f_code.co_filename == __file__:
            frame, stacklevel = frame.f_back, stacklevel + 1
        warnings.warn(
            "BlockingProducer called from a thread running an event loop (an `async def` "
            "function): each call blocks its event loop, and every other task on it, until "
            "it returns. In async code use aioproducer.Producer and `await "
            "producer.send(...)` (or `enqueue()`), one per event loop (FastAPI and aiohttp: "
            "aioproducer.integrations). (Said once.)", RuntimeWarning, stacklevel=stacklevel)

    def _check_usable(self) -> None:
        if self._forked:
            raise ProducerClosedError(
                "this BlockingProducer was created before os.fork() (multiprocessing's fork "
                "start method, a server's worker processes, gunicorn --preload): its event "
                "loop's thread is not in this process; create a new one here (in the function "
                "the child runs, or on first use in each worker)")
        if self._closed:
            raise ProducerClosedError("the producer is closed: no more records can be sent")

    @staticmethod
    def _refuse_if_left(future: _Produced) -> None:
        """Fail a record queued as close() ran (by a produce() that waited for room, or
        raced it), unless the producer's thread took it first: the close may have drained
        the queue already, and the future must not stay pending."""
        if future.refuse():
            _fail(future, ProducerClosedError(
                "the producer was closed before this record was sent"))

    def _wait_for_room(self) -> None:
        """Wait until the pump has taken the queue down to half its limit (not to one below
        it: that would be a thread hop per record). A Ctrl-C stops the wait (see _wait_for):
        the record is not produced."""
        self._room.clear()
        if len(self._queue) < _QUEUE_LIMIT:
            return
        # (Only the pump's signal ends the wait: the queue a record shorter, as the pump
        # fails one that waited max_block_ms in line, is not room.)
        deadline = time.monotonic() + self._max_block
        while not self._room.is_set():
            left = deadline - time.monotonic()
            if left > 0:
                self._room.wait(min(left, _STEP))
                continue
            raise BufferExhaustedError(
                f"{len(self._queue)} records still queued for the producer after "
                f"max_block_ms={self._producer.config.max_block_ms}: it cannot keep up "
                "(buffer_memory full, or the cluster unreachable)")

    # -- the loop's side -------------------------------------------------------------------

    async def _start(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Event,
                                    asyncio.Task[None]]:
        await self._producer.start()
        self._loop_thread = threading.get_ident()
        wakeup = asyncio.Event()
        pump = asyncio.get_running_loop().create_task(self._pump_records(wakeup),
                                                      name="aioproducer-blocking-pump")
        # Collected pending with this producer dropped unclosed, which its producer's report
        # says (asyncio's "Task was destroyed but it is pending!" said it of the pump).
        pump._log_destroy_pending = False  # type: ignore[attr-defined]
        return asyncio.get_running_loop(), wakeup, pump

    async def _pump_records(self, wakeup: asyncio.Event) -> None:
        """Hand what the threads queued to the producer, in queue order. Woken by the first
        record after a quiet spell; while records keep coming it looks again every
        millisecond of its own accord, so producing threads make no wake-up call (a pipe
        write that hands the GIL to this thread: one per record when it keeps up)."""
        while True:
            await wakeup.wait()
            wakeup.clear()
            while True:
                await self._hand_over_queued()
                await asyncio.sleep(_POLL)
                if not self._queue:
                    self._woken = False
                    if not self._queue:  # (one queued since then woke, or wakes, us itself)
                        break

    async def _hand_over_queued(self) -> None:
        """Everything queued, to the producer, in order, as `enqueue()` takes a record (the
        common case one compiled call: no coroutine, no loop turn); each batch's records'
        futures are resolved together when it is done."""
        intake = self._producer._intake
        queue, room, by_batch = self._queue, self._room, self._by_batch
        # With on_send hooks, the hooks see the record first, in the producing thread's context.
        enqueue: Callable[..., Coroutine[Any, Any, RecordFuture]] = \
            intake.enqueue if self._tells_send else intake.enqueue_call
        while queue:
            future = queue.popleft()
            if isinstance(future, asyncio.Future):  # a flush's or a transaction's marker
                if not future.done():  # (not a flush that timed out)
                    future.set_result(None)
                continue
            if not future.take():  # cancelled by its producer before it was taken: not sent
                future._record = None
                continue
            topic, value, key, partition, timestamp_ms, headers, context = future._record
            future._record = None
            try:
                if context is not None:
                    headers, told = context.run(intake.tell_send, topic, key, value, headers)
                    if told is not None:
                        on_delivery = future._on_delivery
                        future._on_delivery = told if on_delivery is None \
                            else partial(deliver_each, [on_delivery, told])
                record = await enqueue(topic, value, key, partition=partition,
                                       timestamp_ms=timestamp_ms, headers=headers)
            except asyncio.CancelledError:  # close() stopped the pump as it waited
                _fail(future, ProducerClosedError(
                    "the producer was closed before this record was sent"))
                raise
            except Exception as exc:
                # Nobody is told (no on_delivery; send() gives one, and logs it if its wait
                # ended first): logged, as a batch that fails for good is.
                future.refused = True
                if future._on_delivery is None:
                    self._log_refused("produce(%r, ...) failed, the record is not sent: %r",
                                      topic, exc)
                _fail(future, exc)
            else:
                batch = record._batch
                waiting = by_batch.get(batch)  # type: ignore[arg-type]
                if waiting is None:
                    assert isinstance(batch, ProducerBatch)  # (enqueue() appended it)
                    waiting = by_batch[batch] = []
                    batch.future.add_done_callback(partial(self._batch_done, batch))
                waiting.append(future)
                waiting.append(record)
            if not room.is_set() and len(queue) <= _QUEUE_LIMIT // 2:
                room.set()  # (not at limit - 1: a thread hop per record)
        room.set()

    def _batch_done(self, batch: ProducerBatch, _: object) -> None:
        """Resolve the batch's records' futures (a split batch's from the piece of each)."""
        waiting = iter(self._by_batch.pop(batch))
        for future, record in zip(waiting, waiting):
            assert isinstance(future, _Produced) and isinstance(record, RecordFuture)
            exc = record.exception()
            if exc is not None:
                _fail(future, exc)
                continue
            metadata = record.result()
            future.resolve(metadata, None)
            on_delivery = future._on_delivery
            if on_delivery is not None:
                deliver(on_delivery, metadata, None)

    async def _handover(self) -> None:
        """Wait until every record queued before this call is in the producer (at once if
        close() stopped the pump: it failed what was queued, and nobody would take a marker)."""
        if self._pump.done():
            return
        marker = asyncio.get_running_loop().create_future()
        self._queue.append(marker)
        self._wakeup.set()
        await marker

    async def _produce_many(self, topic: str, records: Iterable[tuple[K | None, V | None]],
                            partition: int | None, timestamp_ms: int | None,
                            context: contextvars.Context | None,
                            outcome: Future[BulkThreadFuture]) -> BulkThreadFuture:
        """enqueue_many() here; `outcome` gets the future of what it buffered, however it
        ends (for a caller that a Ctrl-C took away before the call returned)."""
        if not outcome.set_running_or_notify_cancel():  # (the caller was interrupted)
            raise asyncio.CancelledError
        taken: BulkThreadFuture | None = None
        try:
            await self._handover()  # (once closed, enqueue_many() refuses)
            # (on_send hooks see the records in `context`, the caller's, as produce()'s)
            bulk = await self._producer._enqueue_many_for(context, topic, records, partition,
                                                          timestamp_ms)
        except BaseException as exc:
            accepted = getattr(exc, "accepted", None)
            if isinstance(accepted, BulkFuture):
                exc.accepted = taken = self._follow(accepted)  # type: ignore[attr-defined]
            raise
        else:
            taken = self._follow(bulk)
            return taken
        finally:
            outcome.set_result(  # (None: it ended waiting for the hand-over)
                _none_buffered() if taken is None else taken)

    def _follow(self, bulk: BulkFuture) -> BulkThreadFuture:
        """A thread future of `bulk`'s outcome; taken at once, as its records are buffered
        (cancel() returns False)."""
        future = BulkThreadFuture(len(bulk))
        future.take()
        if bulk.done():
            _settle(future, bulk)
        else:
            self._bulks.add(bulk)
            bulk.add_done_callback(partial(self._bulk_done, future))
        return future

    def _bulk_done(self, future: BulkThreadFuture, bulk: BulkFuture) -> None:
        self._bulks.discard(bulk)
        _settle(future, bulk)

    async def _after_handover(self, call: Callable[[], Any]) -> Any:
        await self._handover()
        result = call()
        return await result if asyncio.iscoroutine(result) else result

    async def _flush(self, timeout: float | None) -> None:
        async with asyncio.timeout(timeout):
            await self._handover()
            await self._producer.flush()
            await self._resolved()

    async def _resolved(self) -> None:
        """A batch acknowledged just before the producer's flush() looked is done, but the
        callback that resolves its records' futures (_batch_done, or _bulk_done) may still
        wait in the loop's queue: flush() returned with them pending, 1 run in 10 under load."""
        resolving: list[asyncio.Future[Any]] = [
            batch.future for batch in self._by_batch if batch.future.done()]
        resolving += [bulk for bulk in self._bulks if bulk.done()]
        if resolving:  # (their callbacks, queued before this wait's, run first)
            await asyncio.wait(resolving)

    async def _close(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                await self._handover()
        except TimeoutError:
            pass  # what is still queued fails below
        await self._producer.close(None if deadline is None else max(0.0, deadline - loop.time()))
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        error = ProducerClosedError("the producer was closed before this record was sent")
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, asyncio.Future):
                if not item.done():  # a marker queued as the pump stopped: its call goes on
                    item.set_result(None)
            elif item.take():
                _fail(item, error)
        self._room.set()


class _Produced(ThreadFuture[RecordMetadata]):
    """produce()'s future, holding its record's arguments while it is queued (None once the
    producer took it) and its on_delivery. The queue holds these alone, and each batch's
    list these and their RecordFutures: a tuple per record in each as well was two more
    objects per buffered record for the cyclic garbage collector to walk (its collections
    were half the CPU of a record), and a RecordFuture held by the future's own attributes
    made the cyclic collector track their dict too."""

    _record: Any = None  # (a tuple of the arguments, or None: unpacked per record unchecked)
    _on_delivery: DeliveryCallback | None = None
    refused = False  # (the producer refused the record: set before it fails the future)


def _raised_to_the_caller(metadata: RecordMetadata | None, exception: BaseException | None
                          ) -> None:
    """send()'s on_delivery: its caller gets the outcome. Given (not None) before the record
    is queued, it tells the pump that a record refused needs no warning: send() raises it."""


def _fail(future: _Produced, exc: BaseException) -> None:
    future.resolve(None, exc)
    future._record = None
    on_delivery = future._on_delivery
    if on_delivery is not None:
        deliver(on_delivery, None, exc)


def _check_delivery_order(on_delivery: DeliveryCallback, code: Any) -> None:
    """Refuse a callback written for confluent-kafka's on_delivery(err, msg): called with
    (metadata, None), it took every record delivered for a failure, and each failure for
    a delivery."""
    if code is None:  # (a partial or a callable object: its parameters are not read)
        return
    first = 1 if hasattr(on_delivery, "__self__") else 0  # (a bound method's self)
    names = code.co_varnames[first:code.co_argcount]
    if names and names[0] in _ERROR_NAMES:
        raise TypeError(
            f"on_delivery is called as on_delivery(metadata, exception), the Java client's "
            f"order, but the first parameter of {getattr(on_delivery, '__qualname__', '')!r} "
            f"is {names[0]!r}: confluent-kafka's order, on_delivery(err, msg). Swap them "
            "(and read the metadata's fields: metadata.offset, not msg.offset())")


async def _stoppable(stop: Future[None], func: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """`await func(*args)` in the producer's thread, cancelled once `stop` is, whether that
    came before the call began or while it runs (level cancellation: anyio's scope)."""
    loop = asyncio.get_running_loop()
    with CancelScope() as scope:
        stop.add_done_callback(lambda _: _soon(loop, scope.cancel))
        return await func(*args)
    raise asyncio.CancelledError  # (stopped: the call's future is cancelled)


def _soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], Any]) -> None:
    with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile: nothing to stop)
        loop.call_soon_threadsafe(callback)


def _wait_for(future: Future[Any], timeout: float | None = None) -> None:
    """Wait until `future` is done, or `timeout` seconds, in _STEP waits. The kernel gives a
    process's SIGINT to any of its threads: taken by another, its KeyboardInterrupt is raised
    in this one only when it next runs Python, and a wait without a timeout ran none until the
    future was done (CI: a Ctrl-C'd produce_many() buffered every record first; a Ctrl-C'd
    flush() waited for the broker)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not future.done():
        left = _STEP if deadline is None else min(_STEP, deadline - time.monotonic())
        if left <= 0:
            return
        wait((future,), left)


def _none_buffered() -> BulkThreadFuture:
    """The `accepted` of a produce_many() that buffered no record."""
    nothing = BulkThreadFuture(0)
    nothing.resolve(BulkMetadata([], bytearray(), 0), None)
    return nothing


def _settle(future: BulkThreadFuture, bulk: BulkFuture) -> None:
    exc = bulk.exception()
    future.settle(None if exc is not None else bulk.result(), exc, bulk.failures())


def _backend_options() -> dict[str, Any]:
    return {"use_uvloop": True} if importlib.util.find_spec("uvloop") is not None else {}


def _forked_in_child() -> None:
    for producer in list(_OPEN):
        producer._forked = producer._closed = True
        # Its portal's thread is the parent's: marked stopped (as anyio's stop() does), the
        # portal's exit when the producer is collected does not wait for that thread. It
        # waited forever: a forked child that exited normally (a gunicorn worker) hung.
        producer._portal._event_loop_thread_id = None
        for task in asyncio.all_tasks(producer._loop):  # (the parent's: they never run here)
            task._log_destroy_pending = False  # type: ignore[attr-defined]
    _OPEN.clear()


class _RunAtOnce(ThreadPoolExecutor):
    """The producer's loop's executor at interpreter exit. Python's thread pools take no more
    work once the interpreter began to exit (before atexit functions run), and asyncio looks
    a host name up in the loop's executor: a close at exit that had to connect to a broker
    by name (one advertised as kafka-1:9092, say) could not ("cannot schedule new futures
    after interpreter shutdown"), and lost its records. This one runs each call at once, in
    the loop's thread (blocking the loop meanwhile, at exit only)."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def _close_at_exit() -> None:
    """Records produced but never flushed are sent at exit (within 10 s each producer), as
    the loop's thread is a daemon that would otherwise die with them. A close still waiting
    after a second (a broker down) says so (`_say_still_closing`)."""
    for producer in list(_OPEN):
        closed = threading.Event()
        with contextlib.suppress(Exception):
            loop = producer._loop
            loop.call_soon_threadsafe(loop.set_default_executor, _RunAtOnce(max_workers=1))
            loop.call_soon_threadsafe(loop.call_later, 1.0, _say_still_closing, producer,
                                      closed)
            producer.close(timeout=10)
        closed.set()


def _close_before_multiprocessing_child_exits() -> None:
    """A child of multiprocessing's fork or forkserver start method (a Pool's worker, a
    Process) leaves by os._exit(), past atexit and `_close_at_exit`: what a producer made in
    it still buffered was lost, unsaid. Such a child runs multiprocessing's finalizers first
    (its registry starts empty in each child): one per child closes its producers there."""
    global _finalizer_in
    process = sys.modules.get("multiprocessing.process")
    if process is None or process.parent_process() is None or _finalizer_in == os.getpid():
        return
    from multiprocessing.util import Finalize
    Finalize(None, _close_at_exit, exitpriority=0)
    _finalizer_in = os.getpid()


def _say_still_closing(producer: BlockingProducer[Any, Any], closed: threading.Event) -> None:
    """In the producer's thread: why the script does not end yet, and how to end it (a Ctrl-C
    closes at once, as close() does when interrupted: no thread can be started at exit to
    say this from outside)."""
    accumulator = producer._producer._accumulator
    held = sum(b.record_count for b in accumulator.incomplete) if accumulator else 0
    if held and not closed.is_set():
        log.warning("a BlockingProducer left open at exit (created at %s) waits for its %d "
                    "record(s) for up to 9 s more (Ctrl-C leaves now, losing them)",
                    producer._producer._created_at, held)


os.register_at_fork(after_in_child=_forked_in_child)
atexit.register(_close_at_exit)
