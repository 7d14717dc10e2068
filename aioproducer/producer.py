"""The public Producer: send / enqueue / enqueue_many / flush / close, and transactions."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
import time
import warnings
from threading import get_ident
from typing import Any, AsyncIterator, Callable, Coroutine, Iterable, Sequence

from ._internal.accumulator import RecordAccumulator
from ._internal.arguments import BYTES_TYPES, as_bytes, bad_partition, check_timeout, \
    check_topic_name, checked_offsets, checked_timestamp, encode_checked_headers, group_fields, \
    iterate_records, serialize, topic_str
from ._internal.batch import BulkFuture, ProducerBatch, RecordFuture, RecordMetadata, Sending, \
    WaitingRecord
from ._internal.lifecycle import CLOSED, CLOSING, FAILED, NEW, STARTED, STARTING, State, \
    next_state
from ._internal.metrics import ProducerMetrics
from ._internal.partitioner import StickyPartitioner, partition_for_key
from ._internal.sender import Sender
from ._internal.transactions import TransactionManager, TxnState
from .client.cluster import Cluster, TopicInfo
from .client.tasks import TaskSet, cancelling, shielded
from .config import ProducerConfig
from .errors import (
    ConfigError,
    InvalidRecordError,
    KafkaConnectionError,
    KafkaError,
    ProducerClosedError,
    RecordTooLargeError,
    TransactionAbortedError,
    TransactionStateError,
)
from ._speedups import DONE, append_many
from .protocol.compression import codec_from_name
from .protocol.records import Headers, record_size_upper_bound

log = logging.getLogger(__name__)

# A record's batch (for send(), maybe its place in line for memory), offset delta, timestamp.
Appended = tuple[ProducerBatch | WaitingRecord, int, int]
_CHUNK = 10_000  # enqueue_many takes its records this many at a time
_DELTA = struct.Struct("=i")  # an offset delta in a BulkFuture (as the speed-up writes them)


class Producer:
    """An asyncio Kafka producer.

    ::

        async with Producer("localhost:9092", linger_ms=5) as producer:
            md = await producer.send("orders", b"payload", key=b"user-7")

    `send()` returns once the broker acknowledged the record; `enqueue()` returns as soon as
    the record is buffered, with a future of its metadata, so a loop can buffer many records
    before waiting. Settings are Kafka's producer settings in snake case (`linger.ms` ->
    `linger_ms`) with the Java client's defaults: idempotent, `acks="all"`. See
    `ProducerConfig` for the list.
    """

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
            if bootstrap_servers is not None:
                settings["bootstrap_servers"] = bootstrap_servers
            self.config = ProducerConfig.from_kwargs(**settings)
        self._codec = codec_from_name(self.config.compression_type)
        self._key_serializer: Callable[[Any], bytes] | None = self.config.key_serializer
        self._value_serializer: Callable[[Any], bytes] | None = self.config.value_serializer
        self._serializing = self._key_serializer is not None or self._value_serializer is not None
        self._max_block = self.config.max_block_ms / 1000
        self._max_request_size = self.config.max_request_size
        self._partitioner = StickyPartitioner()
        self._transactional = self.config.transactional_id is not None
        self._started: asyncio.Future[None] | None = None  # the outcome of starting
        self._state = NEW  # changed only by _become(), as _internal/lifecycle.py allows
        self._renew()

    def _renew(self) -> None:
        """The state of a producer not started yet: a new one's, or one whose start failed."""
        self._cluster: Cluster | None = None
        self._accumulator: RecordAccumulator | None = None
        self._sender: Sender | None = None
        self._sender_task: asyncio.Task[None] | None = None
        self._txn: TransactionManager | None = None
        self._tasks = TaskSet()  # every task of this producer's, whoever spawns it
        self._failure: BaseException | None = None
        self._closing: asyncio.Task[None] | None = None
        # When close() gives up on what is pending (None: never); a later close(timeout) may
        # bring it nearer, and then resolves (and replaces) the future.
        self._close_deadline: float | None = None
        self._close_timeout: float | None = None  # the close(timeout) that set it, to say so
        self._close_timer: asyncio.Timeout | None = None  # what waits for it, to move it
        self._close_called = False  # by the user (a failed start closes what it started too)
        self._ending: tuple[bool, asyncio.Task[None]] | None = None  # (commit?, its task)
        self._loop: asyncio.AbstractEventLoop | None = None  # the one start() ran on
        self._thread: int | None = None  # and the thread it runs in
        self._loop_running: Callable[[], bool] = lambda: False

    def __repr__(self) -> str:
        return (f"<Producer {self.config.client_id} {self._state.value} "
                f"bootstrap={self.config.bootstrap_servers}>")

    def _become(self, state: State) -> None:
        self._state = next_state(self._state, state)

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
        if self._state is not NEW:
            if self._state is STARTED:
                return
            raise ProducerClosedError("this producer was closed; create a new one")
        self._become(STARTING)
        started = self._started = asyncio.get_running_loop().create_future()
        try:
            await self._start()
        except BaseException as exc:
            if self._state is STARTING:  # failed (a TLS file not there yet, say): as new
                self._become(NEW)
                self._renew()
            if isinstance(exc, Exception):
                started.set_exception(exc)
                started.exception()  # retrieved: nobody else may be waiting for it
            else:  # its caller's cancellation, not that of the start() calls waiting for it
                started.cancel()
            raise
        started.set_result(None)

    async def _start(self) -> None:
        config = self.config
        self._cluster = Cluster(config, self._wake_sender, self._release_topic, self._tasks)
        if config.enable_idempotence:
            self._txn = TransactionManager(config, self._cluster, self._tasks)
            self._txn.on_change = self._wake_sender
        self._accumulator = RecordAccumulator(config, self._codec, self._txn,
                                              self._wake_sender)
        self._sender = Sender(config, self._cluster, self._accumulator, self._txn)
        refresh = self._cluster.refresh()
        try:
            # No longer than max_block_ms: a broker that takes connections but never answers
            # would otherwise hold start() for request_timeout_ms. (max_block_ms=0, "sends
            # never wait", leaves start() its request_timeout_ms.)
            bound = self._max_block or config.request_timeout_ms / 1000
            if not (await asyncio.wait({refresh}, timeout=bound))[0]:
                raise KafkaConnectionError(
                    f"no broker answered within {bound:g} s (max_block_ms="
                    f"{config.max_block_ms}; bootstrap_servers={config.bootstrap_servers}): "
                    "is it a Kafka broker, and up?")
            refresh.result()
        except BaseException:
            self._cluster.close()  # (then start() makes the producer new again)
            await self._tasks.aclose()
            # By close(), not the caller (who may have cancelled too: then cancelled, as asked).
            if self._state is not STARTING and refresh.cancelled() and not cancelling():
                raise ProducerClosedError("the producer was closed while it started") from None
            raise
        if self._state is not STARTING:  # close() came as the metadata did
            raise ProducerClosedError("the producer was closed while it started")
        self._loop = asyncio.get_running_loop()
        self._thread = get_ident()
        self._loop_running = self._loop.is_running
        self._sender_task = self._tasks.spawn(
            self._sender.run(), f"aioproducer-sender-{config.client_id}")
        self._sender_task.add_done_callback(self._sender_done)
        self._become(STARTED)
        if self._txn is not None and self._txn.is_transactional:
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
                    self._become(NEW)
                    self._renew()
                if cancelled:
                    raise asyncio.CancelledError()
                raise

    async def __aenter__(self) -> "Producer":
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Send what is buffered and stop. With `timeout` (seconds), records not acknowledged
        by then fail with ProducerClosedError; `timeout=0` closes at once.

        Idempotent: a second call waits for the first to finish; a shorter `timeout` in it
        bounds the closing too. Cancelling a caller does not stop the closing, which goes on
        in its own task. No task of the producer outlives close()."""
        check_timeout("close(timeout=...)", timeout)
        self._check_loop()
        self._close_called = True
        await asyncio.shield(self._close_task(timeout))

    def _close_task(self, timeout: float | None) -> asyncio.Task[None]:
        """The task that closes the producer: started now, or the one under way (whose
        deadline `timeout` brings nearer if it is shorter)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if self._closing is None:
            self._close_deadline, self._close_timeout = deadline, timeout
            self._closing = loop.create_task(
                self._close(), name=f"aioproducer-close-{self.config.client_id}")
        elif deadline is not None and (self._close_deadline is None or
                                       deadline < self._close_deadline):
            self._close_deadline, self._close_timeout = deadline, timeout
            timer = self._close_timer
            if timer is not None and not timer.expired():  # (once expired, it cannot move)
                timer.reschedule(deadline)
        return self._closing

    def _close_remaining(self) -> float | None:
        """Seconds until close() gives up on what is pending (None: no limit)."""
        if self._close_deadline is None:
            return None
        return max(0.0, self._close_deadline - asyncio.get_running_loop().time())

    async def _within_close_deadline(self, waits: Iterable[asyncio.Future[Any]]) -> bool:
        """Wait for `waits` until close()'s deadline (a later close(timeout) that brings it
        nearer reschedules the wait); whether they all ended."""
        pending = {future for future in waits if not future.done()}
        if not pending:
            return True
        if self._close_remaining() == 0:  # (close(timeout=0): not even one loop turn)
            return False
        try:
            async with asyncio.timeout_at(self._close_deadline) as self._close_timer:
                await asyncio.wait(pending)
        except TimeoutError:
            return False
        finally:
            self._close_timer = None
        return True

    async def _close(self) -> None:
        if self._state is CLOSED:
            return
        if self._state in (NEW, STARTING, FAILED):
            self._become(CLOSED)
            await self._stop_tasks()
            return
        txn = self._txn
        if self._ending is not None and not self._ending[1].done():
            # Another task's commit or abort: let it end, as the Java client's sender does.
            await self._within_close_deadline({self._ending[1]})
        if txn is not None and self._close_remaining() != 0 and txn.state in (
                TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING):
            # As the Java client does: left open, the transaction would hold back
            # read_committed consumers until the coordinator times it out. (ABORTING: an
            # abort that failed; its task ended above.)
            log.warning("closing with a transaction open: aborting it")
            aborting = self._tasks.spawn(self.abort_transaction(),
                                         f"aioproducer-abort-at-close-{self.config.client_id}")
            if not await self._within_close_deadline({aborting}):
                aborting.cancel()  # (its task is stopped with the others below)
                log.warning("could not abort the open transaction within close()'s timeout: "
                            "its coordinator will, after transaction_timeout_ms")
            elif not aborting.cancelled() and aborting.exception() is not None:
                log.warning("could not abort the open transaction (%r): its coordinator will, "
                            "after transaction_timeout_ms", aborting.exception())
        self._become(CLOSING)
        accumulator, sender = self._accumulator, self._sender
        assert accumulator is not None and sender is not None and self._cluster is not None
        accumulator.begin_closing()
        sender.running = False
        sender.wake()
        await self._within_close_deadline({b.future for b in accumulator.incomplete})
        if accumulator.incomplete:
            exc = ProducerClosedError(
                "the producer was closed before these records were acknowledged "
                f"(close(timeout={self._close_timeout}))")
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
        await self._stop_tasks()
        self._become(CLOSED)

    async def _stop_tasks(self) -> None:
        """Close the connections, then end every task of the producer's: a commit or abort
        close() gave up on ends with the reason (its connections are gone) within 5 s; the
        rest are cancelled. None outlives close()."""
        if self._txn is not None:
            self._txn.close()
        if self._cluster is not None:
            self._cluster.close()
        if self._ending is not None and not self._ending[1].done():
            await asyncio.wait({self._ending[1]}, timeout=5)
        await self._tasks.aclose()

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        if task is not self._sender_task:  # (that of a start torn down)
            return
        if task.cancelled():
            if self._state is STARTED and self._loop is not None:
                # Not by close(): the loop shuts down (asyncio.run() cancels what is left)
                # with the producer open. Said where it is seen without -W, as asyncio says
                # a task was destroyed pending.
                pending = sum(b.record_count for b in self._accumulator.incomplete) \
                    if self._accumulator is not None else 0
                self._loop.call_exception_handler({
                    "message": f"unclosed {self!r} (its sender was cancelled, {pending} "
                               "record(s) unsent): call `await producer.close()` before the "
                               "loop ends (or use `async with`)",
                    "producer": self})
            return
        exc = task.exception()
        if exc is not None:
            log.error("aioproducer sender task failed: %r", exc, exc_info=exc)
            self._failure = exc
            self._become(FAILED)
            if self._sender is not None:
                self._sender.fail_in_flight(exc)
            if self._accumulator is not None:
                self._accumulator.fail_unresolved(exc)

    def _release_topic(self, topic: str) -> bool:
        return self._accumulator is None or self._accumulator.release_topic(topic)

    def _wake_sender(self, new_batch: ProducerBatch | None = None) -> None:
        if self._sender is not None:
            self._sender.wake(new_batch)

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_state", None) in (STARTED, FAILED, CLOSING):
            message = f"unclosed {self!r}: call `await producer.close()` (or use `async with`)"
            _warn(message, ResourceWarning, source=self)

    # -- producing -------------------------------------------------------------------------

    def send(self, topic: str, value: Any, key: Any = None, *, partition: int | None = None,
             timestamp_ms: int | None = None,
             headers: Headers | None = None) -> Coroutine[Any, Any, RecordMetadata]:
        """Produce one record: awaited, returns its metadata once the broker acknowledged it.

        In the producer's running loop, the call itself buffers the record, or, when
        buffer_memory is full, puts it in line for memory (served in call order, up to
        max_block_ms); either way what it returns is a future to asyncio, so
        `asyncio.gather(*(producer.send(...) ...))` makes no Task per record, and a coroutine
        to `create_task()` and TaskGroups. Before the topic's metadata is known, and outside
        the producer's running loop (`loop.run_until_complete(producer.send(...))`), it is a
        coroutine that does all that when awaited. Bad arguments raise from the call.

        Cancelled after the record was buffered, it is still sent: only the wait ends.
        Cancelled while in line for memory (the future, or every task awaiting it), the
        record is not sent."""
        if self._state is not STARTED or get_ident() != self._thread or not self._loop_running():
            return self._send_when_awaited(topic, value, key, partition, timestamp_ms, headers)
        appended = self._append(topic, value, key, partition, timestamp_ms, headers, True)
        if isinstance(appended, tuple):
            sending = Sending(*appended)
            if type(appended[0]) is WaitingRecord:
                appended[0].record = sending
            return sending
        return self._send_appended(appended)

    async def _send_when_awaited(self, topic: str, value: Any, key: Any,
                                 partition: int | None, timestamp_ms: int | None,
                                 headers: Headers | None) -> RecordMetadata:
        appended = self._append(topic, value, key, partition, timestamp_ms, headers, True)
        if not isinstance(appended, tuple):
            appended = await appended
        record = RecordFuture(*appended)
        if type(appended[0]) is WaitingRecord:
            appended[0].record = record
        return await record

    @staticmethod
    async def _send_appended(appending: Coroutine[Any, Any, Appended]) -> RecordMetadata:
        return await RecordFuture(*await appending)

    async def enqueue(self, topic: str, value: Any, key: Any = None, *,
                      partition: int | None = None, timestamp_ms: int | None = None,
                      headers: Headers | None = None) -> RecordFuture:
        """Buffer one record; return a future of its RecordMetadata.

        Waits only for what it must: the topic's metadata the first time, and buffer memory
        when `buffer_memory` is full (both at most `max_block_ms`). Errors in the arguments
        raise here; delivery errors are raised by the returned future.
        """
        appended = self._append(topic, value, key, partition, timestamp_ms, headers, False)
        return RecordFuture(*(appended if isinstance(appended, tuple) else await appended))

    def _append(self, topic: str, value: Any, key: Any, partition: int | None,
                timestamp_ms: int | None, headers: Headers | None, eager: bool
                ) -> Appended | Coroutine[Any, Any, Appended]:
        """send() and enqueue() up to their waiting: (batch, offset delta, timestamp) of the
        appended record, or, when the topic's metadata or (unless `eager`) a new batch is
        needed, a coroutine that returns them. A plain call in the common case: a coroutine
        per record (and a handle per record, in send) were a tenth of a send's cost with
        1,000 tasks sending."""
        if self._state is not STARTED:
            self._raise_not_started()
        if get_ident() != self._thread or not self._loop_running():
            self._check_loop()  # raises: another thread, or another loop in this one
        if self._transactional:
            self._txn.check_can_send()  # type: ignore[union-attr]
        if type(topic) is not str:
            topic = topic_str(topic)
        info = self._cluster.topics.get(topic)  # type: ignore[union-attr]
        if info is None or not info.leaders:
            return self._append_when_known(topic, value, key, partition, timestamp_ms, headers,
                                           eager)
        # The common case, bytes and no serializers, costs one test: this is per record.
        if self._serializing or (value is not None and type(value) is not bytes) or \
                (key is not None and type(key) is not bytes):
            key, value = self._key_value(topic, key, value)
        encoded_headers = encode_checked_headers(headers) if headers else None
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        else:
            timestamp_ms = checked_timestamp(timestamp_ms)
        count = len(info.leaders)
        sticky = partition is None and key is None
        if partition is not None:
            if type(partition) is not int or not 0 <= partition < count:
                raise bad_partition(topic, partition, count)
        elif key is not None:
            partition = partition_for_key(key, count)
        else:
            partition = self._partitioner.partition(topic, count)

        batch = self._accumulator.try_append(  # type: ignore[union-attr]
            topic, partition, timestamp_ms, key, value, encoded_headers)
        if batch is None:
            return self._append_new(topic, partition, sticky, count, timestamp_ms,
                                    key, value, encoded_headers, eager)
        return batch, batch.writer.count - 1, timestamp_ms

    async def _append_when_known(self, topic: str, value: Any, key: Any,
                                 partition: int | None, timestamp_ms: int | None,
                                 headers: Headers | None, eager: bool) -> Appended:
        """_append() for a topic without metadata yet: fetch it first (as the Java client
        does, so the record is serialized once, with the topic known), then append."""
        self._check_loop()
        await self._partition_count(topic)
        # Nothing ran since the metadata arrived: this time _append finds the topic.
        appended = self._append(topic, value, key, partition, timestamp_ms, headers, eager)
        return appended if isinstance(appended, tuple) else await appended

    def _append_new(self, topic: str, partition: int, sticky: bool, count: int,
                    timestamp_ms: int, key: bytes | None, value: bytes | None,
                    headers: bytes | None, eager: bool) -> Appended | Coroutine[Any, Any, Appended]:
        """The record needs a new batch: check its size, close the partition's full batch,
        move a sticky partition on (KIP-480). Then, if `eager` and the memory is free, append
        now; else return a coroutine that does it."""
        self._check_loop()
        accumulator = self._accumulator
        assert accumulator is not None and self._cluster is not None
        self._cluster.touch(topic)  # once per batch, not per record
        size = record_size_upper_bound(key, value, headers)
        if size > self._max_request_size:
            raise RecordTooLargeError(
                f"a record of {size} bytes (serialized, in its own batch) is larger than "
                f"max_request_size={self._max_request_size}: raise max_request_size (and the "
                "broker's message.max.bytes) or send smaller records")
        if size > self.config.buffer_memory:
            raise RecordTooLargeError(
                f"a record of {size} bytes is larger than buffer_memory={self.config.buffer_memory}")
        memory = accumulator.batch_memory(size)
        if accumulator.waiting:  # behind the records waiting for memory, whatever is open
            return self._wait_in_line(topic, partition, timestamp_ms, key, value, headers,
                                      memory, count, eager)
        closed = accumulator.close_for_appends(topic, partition)
        if sticky:
            self._partitioner.on_new_batch(topic, count, partition)
            partition = self._partitioner.partition(topic, count)
        if eager:
            # The new sticky partition may have a batch with room; a keyed one has none now.
            batch = accumulator.try_append(topic, partition, timestamp_ms, key, value,
                                           headers) if sticky else None
            if batch is None and accumulator.reserve_now(memory):
                batch = accumulator.open_batch(topic, partition, timestamp_ms, key, value,
                                               headers, memory, count)
            if batch is not None:
                return batch, batch.writer.count - 1, timestamp_ms
            return self._wait_in_line(topic, partition, timestamp_ms, key, value, headers,
                                      memory, count, eager)
        return self._append_soon(topic, partition, timestamp_ms, key, value, headers,
                                 memory, count, closed)

    def _wait_in_line(self, topic: str, partition: int, timestamp_ms: int,
                      key: bytes | None, value: bytes | None, headers: bytes | None,
                      memory: int, count: int, eager: bool
                      ) -> Appended | Coroutine[Any, Any, Appended]:
        """Join the line for memory: send() (`eager`) at once, its future following the
        line's entry (send() makes it follow); enqueue() in a coroutine that waits its turn."""
        accumulator = self._accumulator
        assert accumulator is not None
        if eager:
            return accumulator.join_line(topic, partition, timestamp_ms, key, value, headers,
                                         memory, count, True), 0, timestamp_ms
        return self._append_in_turn(accumulator.join_line(
            topic, partition, timestamp_ms, key, value, headers, memory, count, False))

    async def _append_in_turn(self, waiting: WaitingRecord) -> Appended:
        """Wait for `waiting`'s turn in the line (up to max_block_ms), then append it.
        Cancelled or failed before appending, it has buffered nothing: enqueue() is all or
        nothing."""
        accumulator = self._accumulator
        assert accumulator is not None and waiting.turn is not None
        try:
            await waiting.turn
        except BaseException:
            accumulator.leave_line(waiting)
            raise
        batch = accumulator.append_granted(waiting)
        return batch, batch.writer.count - 1, waiting.timestamp

    async def _append_soon(self, topic: str, partition: int, timestamp_ms: int,
                           key: bytes | None, value: bytes | None, headers: bytes | None,
                           memory: int, count: int, closed: bool) -> Appended:
        """enqueue()'s append of a record that needs a new batch: with the memory free,
        yield once first if it closed a full batch (the sender ships it, so a loop that
        never waits keeps the broker busy instead of filling buffer_memory first), then
        append; else wait in line."""
        accumulator = self._accumulator
        assert accumulator is not None
        if not accumulator.reserve_now(memory):
            return await self._append_in_turn(accumulator.join_line(
                topic, partition, timestamp_ms, key, value, headers, memory, count, False))
        try:
            if closed:
                await asyncio.sleep(0)
                batch = accumulator.try_append(topic, partition, timestamp_ms, key, value,
                                               headers)
                if batch is not None:  # into a batch others opened meanwhile
                    accumulator.release(memory)
                    return batch, batch.writer.count - 1, timestamp_ms
            batch = accumulator.open_batch(topic, partition, timestamp_ms, key, value,
                                           headers, memory, count)
        except BaseException:
            accumulator.release(memory)
            raise
        return batch, 0, timestamp_ms

    async def enqueue_many(self, topic: str,
                           records: Iterable[tuple[Any, Any]], *, partition: int | None = None,
                           timestamp_ms: int | None = None) -> BulkFuture:
        """Buffer many (key, value) records in one call; return one future of their metadata.

        The bulk path of `enqueue()`: the same checks and partitioning, no per-record await or
        handle, and for (bytes | None, bytes | None) tuples without serializers, a loop in
        the compiled speed-up. All records get the same timestamp (now, unless given) and no
        headers. Whatever the call raises (a record refused for its type or size, an unknown
        topic, a cancellation, `records` itself raising), the records before stay buffered:
        the exception's `accepted` attribute is the BulkFuture of those, always the first
        len(accepted) records. A timeout around the call raises a TimeoutError of its own:
        `aioproducer.accepted(error)` finds the BulkFuture on any of them. `records` is read as the call goes (it may wait for buffer
        memory): do not change it until the call returns.
        """
        out_batches: list[ProducerBatch] = []
        out_deltas = bytearray()
        stamp = 0
        try:
            if self._state is not STARTED:
                self._raise_not_started()
            if self._transactional:
                self._txn.check_can_send()  # type: ignore[union-attr]
            self._check_loop()
            stamp = timestamp_ms = checked_timestamp(timestamp_ms)
            if type(topic) is not str:
                topic = topic_str(topic)
            count = await self._partition_count(topic)
            if partition is not None and (type(partition) is not int or
                                          not 0 <= partition < count):
                raise bad_partition(topic, partition, count)
            # In chunks, so a generator of any length is fine; a list is read as the call goes.
            iterator = iterate_records(records)
            while chunk := list(itertools.islice(iterator, _CHUNK)):
                await self._append_many(topic, chunk, count, partition, timestamp_ms,
                                        out_batches, out_deltas)
        except (Exception, asyncio.CancelledError) as exc:  # also the iterable's own errors
            exc.accepted = BulkFuture(out_batches, out_deltas, stamp)  # type: ignore[union-attr]
            raise
        return BulkFuture(out_batches, out_deltas, stamp)

    async def _append_many(self, topic: str, records: list[Any], count: int,
                           partition: int | None, timestamp_ms: int,
                           out_batches: list[ProducerBatch], out_deltas: bytearray) -> None:
        """Hand the records to the speed-up's loop; take over where it stops (a new batch is
        needed, or a record needs serializing or checking), then hand back the rest."""
        accumulator = self._accumulator
        assert accumulator is not None
        batches, writers = accumulator.open_batches(topic, count)
        fixed = -1 if partition is None else partition
        index, end = 0, len(records)
        while index < end:
            if not self._serializing and not accumulator.waiting:  # (else: in line, one by one)
                index, status, _ = append_many(
                    records, index, batches, writers, fixed,
                    self._partitioner.partition(topic, count), timestamp_ms,
                    out_batches, out_deltas)
                if status == DONE:
                    return
            # One record the loop could not take, done the way enqueue() does it.
            record = records[index]
            try:
                if isinstance(record, (str, *BYTES_TYPES)):  # would unpack if of length 2
                    raise TypeError
                key, value = record
            except (TypeError, ValueError):
                raise InvalidRecordError(  # out_batches has an entry per record before it
                    f"enqueue_many takes (key, value) pairs, not {type(record).__name__} "
                    f"(record {len(out_batches)}: {record!r:.80})") from None
            appended = self._append(topic, value, key, partition, timestamp_ms, None, False)
            batch, delta, _ = appended if isinstance(appended, tuple) else await appended
            assert isinstance(batch, ProducerBatch)  # (only send()'s records wait apart)
            out_batches.append(batch)
            out_deltas += _DELTA.pack(delta)
            index += 1

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now (ignoring linger) and wait until each of those records
        is acknowledged or failed. Failures stay on the records' futures; flush itself raises
        TimeoutError if `timeout` (seconds) passes first. On a closed producer it
        returns at once."""
        check_timeout("flush(timeout=...)", timeout)
        if self._state not in (STARTED, CLOSING):  # closing also sends what is buffered
            if self._state in (NEW, STARTING):
                self._raise_not_started()
            return
        self._check_loop()
        accumulator = self._accumulator
        assert accumulator is not None
        pending = [b.future for b in accumulator.incomplete]
        if not pending:
            return
        accumulator.flushing += 1
        self._wake_sender()
        try:
            done, not_done = await asyncio.wait(pending, timeout=timeout)
        finally:
            accumulator.flushing -= 1
        if not_done:
            raise TimeoutError(
                f"flush(timeout={timeout}): {len(not_done)} batch(es) still unacknowledged")

    def metrics(self) -> ProducerMetrics:
        """Counters since start() and the state now (see ProducerMetrics); cheap enough to
        call every few seconds for a monitoring system. Before start(): all zero but
        buffer_memory_available, the whole buffer_memory."""
        accumulator, sender, cluster, txn = \
            self._accumulator, self._sender, self._cluster, self._txn
        if accumulator is None or sender is None or cluster is None:
            return ProducerMetrics(buffer_memory_available=self.config.buffer_memory)
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
            records_pending=sum(batch.record_count for batch in accumulator.incomplete),
            requests_in_flight=sum(conn.in_flight_produce for conn in connections),
            connections=len(connections),
            buffer_memory_available=accumulator.memory_available,
            waiting_for_memory=accumulator.waiting,
            producer_id=txn.producer_id if txn is not None else -1,
            producer_epoch=txn.producer_epoch if txn is not None else -1,
            transaction_state=txn.state.value if txn is not None and txn.is_transactional
            else "",
        )

    # -- transactions ----------------------------------------------------------------------

    async def init_transactions(self) -> None:
        """Register our `transactional_id` with its coordinator: fences any older producer
        with the same id and aborts its open transaction. `start()` does this already.

        Goes on when its caller is cancelled, as commit_transaction() does (the coordinator
        may have given us a new epoch already): call it again to wait for its outcome."""
        txn = self._transaction_manager()
        self._check_loop()
        await shielded(txn.init_transactions_task(),
                       "the producer was closed while it initialized its transactions")

    def begin_transaction(self) -> None:
        """Start a transaction: records sent until commit or abort are in it."""
        txn = self._transaction_manager()
        if self._closing is not None:
            raise ProducerClosedError("the producer is closing: no new transaction can begin")
        txn.begin()
        self._ending = None  # the last commit's or abort's outcome is no longer asked for

    async def commit_transaction(self) -> None:
        """Send what is buffered, wait for every record of the transaction to be acknowledged,
        then commit. If a record failed, raises TransactionStateError: abort instead.

        Cancelling the caller (a timeout) does not stop the commit, which goes on in its own
        task: call commit_transaction() again to learn its outcome (until the next
        begin_transaction(): it returns if the commit succeeded, even after it ended). One
        that failed on a lost connection or a timeout is tried again by that call."""
        await self._end_transaction(commit=True)

    async def abort_transaction(self) -> None:
        """Abort: records not yet sent fail with TransactionAbortedError, records already on
        their way are written but marked aborted, which consumers with
        isolation_level=read_committed skip. Goes on when its caller is cancelled, and says
        its outcome when called again, as commit_transaction() does; one that failed on a
        lost connection or a timeout may be tried again."""
        await self._end_transaction(commit=False)

    async def _end_transaction(self, commit: bool) -> None:
        """Start the commit or abort in a task of its own, or join the one under way or
        ended (its outcome, until the next transaction begins)."""
        txn = self._transaction_manager()
        self._check_loop()  # before the state changes: on another loop it could never end
        if self._ending is None or self._ending[0] != commit or _may_retry(self._ending[1]):
            if commit and self._closing is not None:  # (close() aborts what is left open)
                raise ProducerClosedError("the producer is closing: a transaction left open "
                                          "is aborted; commit before close()")
            txn.start_commit_or_abort(commit)  # refuses what the state does not allow
            task = self._tasks.spawn(  # (its callers may all be cancelled: it goes on)
                self._commit(txn) if commit else self._abort(txn),
                f"aioproducer-{'commit' if commit else 'abort'}-{self.config.client_id}")
            self._ending = (commit, task)
        await asyncio.shield(self._ending[1])

    async def _commit(self, txn: TransactionManager) -> None:
        await self.flush()
        await txn.end_transaction(commit=True)

    async def _abort(self, txn: TransactionManager) -> None:
        accumulator = self._accumulator
        assert accumulator is not None
        accumulator.fail_all(TransactionAbortedError(
            "the transaction was aborted before this record was sent"))
        pending = [b.future for b in accumulator.incomplete]
        if pending:
            await asyncio.wait(pending)
        await txn.end_transaction(commit=False)

    async def send_offsets_to_transaction(self, offsets: Any, group_metadata: Any) -> None:
        """Commit a consumer group's offsets as part of the transaction (consume-transform-
        produce, exactly once). `offsets`: {(topic, partition): next_offset_to_read} or a
        list of objects with .topic, .partition and .offset (confluent-kafka's
        TopicPartition). `group_metadata`: the group id, or an object (or mapping) with
        group_id and, for fencing of zombie consumers (KIP-447), generation_id, member_id and
        group_instance_id."""
        txn = self._transaction_manager()
        self._check_loop()
        by_partition = checked_offsets(offsets)
        group = group_fields(group_metadata)
        if by_partition:  # none: nothing to commit (as in the Java client)
            await txn.send_offsets(by_partition, **group)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator["Producer"]:
        """`async with producer.transaction():` commits when the block ends, aborts if it
        raises (and re-raises). The block's exception, a cancellation say, always goes on up:
        an abort that fails too is a note on it (the next transaction call says what state
        that left). The abort goes on in a task of its own when the block is cancelled (a
        cancel scope cancels every await in it); the next transaction() waits for it."""
        if self._ending is not None and not self._ending[1].done():
            await asyncio.wait({self._ending[1]})  # the last one's commit or abort
        self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            # Once close() began, the transaction is its to abort (not with timeout=0).
            if self._closing is None and self._txn is not None and \
                    self._txn.state is not TxnState.FATAL_ERROR:
                try:
                    await self.abort_transaction()
                except Exception as abort_error:
                    exc.add_note(f"aborting the transaction failed too: {abort_error!r}")
            raise
        await self.commit_transaction()

    def _transaction_manager(self) -> TransactionManager:
        if not self._transactional:
            raise TransactionStateError(
                "transactions need a transactional_id: Producer(..., transactional_id='my-app-1')")
        if self._state is not STARTED:
            self._raise_not_started()
        assert self._txn is not None
        return self._txn

    async def partitions_for(self, topic: str) -> int:
        """Number of partitions of `topic` (fetching its metadata if needed)."""
        if self._state is not STARTED:
            self._raise_not_started()
        self._check_loop()
        return len((await self._topic_info(topic_str(topic))).leaders)

    # -- helpers ---------------------------------------------------------------------------

    def _key_value(self, topic: str, key: Any, value: Any) -> tuple[bytes | None, bytes | None]:
        """Serialize (if serializers are set) and check that key and value are bytes."""
        if self._key_serializer is not None and key is not None:
            key = serialize(self._key_serializer, key, "key", topic)
        if self._value_serializer is not None and value is not None:
            value = serialize(self._value_serializer, value, "value", topic)
        if value is not None and type(value) is not bytes:
            value = as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = as_bytes(key, "key")
        return key, value

    async def _partition_count(self, topic: str) -> int:
        assert self._cluster is not None
        info = self._cluster.topics.get(topic)
        if info is None or not info.leaders:
            info = await self._topic_info(topic)
        return len(info.leaders)

    async def _topic_info(self, topic: str) -> TopicInfo:
        check_topic_name(topic)
        assert self._cluster is not None
        return await self._cluster.topic(topic, self._max_block)

    def _check_loop(self) -> None:
        """Refuse a call from an event loop other than the producer's (its tasks and futures
        live there: the call would hang or fail obscurely, and from another thread, corrupt
        a batch). Per record, cheaper: the same thread with the producer's loop running in it
        means the same loop (asking for the running loop costs a syscall)."""
        if self._loop is not None and (get_ident() != self._thread or
                                       asyncio.get_running_loop() is not self._loop):
            raise RuntimeError(
                "this producer belongs to the event loop that started it and cannot be used "
                "from another one: use one producer per event loop (and close it on its own)")

    def _raise_not_started(self) -> None:
        if self._failure is not None:
            raise ProducerClosedError(
                f"the producer stopped after an internal failure: {self._failure!r}"
            ) from self._failure
        if self._state in (NEW, STARTING):
            raise ProducerClosedError(
                "the producer is not started: `await producer.start()` (and let it finish) "
                "or use `async with`")
        raise ProducerClosedError("the producer is closed: no more records can be sent")





def accepted(error: BaseException) -> BulkFuture | None:
    """The records an `enqueue_many()` call buffered before `error` ended it, as the
    BulkFuture of those (they are sent), wherever the error went: on the exception itself,
    or on the one it was raised from or during, as when `asyncio.timeout()`, `wait_for()` or
    `anyio.fail_after()` turn the call's cancellation into a TimeoutError. None if `error`
    did not come from an enqueue_many() call."""
    seen: set[int] = set()
    chained: BaseException | None = error
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        found = getattr(chained, "accepted", None)
        if isinstance(found, BulkFuture):
            return found
        chained = chained.__cause__ or chained.__context__
    return None


def _may_retry(task: asyncio.Task[None]) -> bool:
    """Whether a commit's or abort's task ended without an outcome, cut short by a lost
    connection, a timeout or a cancellation: called again, it is tried again (any other
    outcome is reported again)."""
    if not task.done():
        return False
    if task.cancelled():
        return True
    error = task.exception()
    return isinstance(error, KafkaError) and error.retriable







