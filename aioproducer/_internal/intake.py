"""The record intake: what send(), enqueue() and enqueue_many() do with a record up to its
future. Check it, serialize it, pick its partition, and append it to a batch; or wait for
what it needs first (the topic's metadata, buffer memory).

The common case is a plain call with no await: a coroutine per record (and a handle per
record, in send) was a tenth of a send's cost with 1,000 tasks sending. In a started producer
it is one compiled call, the speed-up's Appender: the producer's enqueue() and send() are
those calls, and everything else (and every error) comes here, to the methods of the same names.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
import time
import weakref
from contextvars import Context
from functools import partial
from threading import get_ident
from typing import Any, Callable, Coroutine, Iterable, Sequence, TypeVar, overload

from ..client.cluster import Cluster, TopicInfo
from ..client.tasks import TaskSet
from ..config import ProducerConfig
from ..errors import InvalidRecordError, KafkaConnectionError, ProducerClosedError, \
    RecordTooLargeError, SerializationError, UnknownTopicError
from ..hooks import DeliveryCallback
from ..protocol.records import Headers, record_size_upper_bound
from ..serializers import MutableHeaders
from .._speedups import DONE, NEEDS_BATCH, Appender, Columns, Ready, append_many, \
    append_record
from .._speedups._py import SECONDS_LIKE_BELOW
from .accumulator import RecordAccumulator, take_kept
from .arguments import BYTES_TYPES, as_bytes, as_int, bad_partition, check_topic_name, \
    checked_headers, checked_timestamp, encode_checked_headers, iterate_records, serialize, \
    serialize_async, serializer_call, topic_str
from .batch import BulkFuture, ProducerBatch, RecordFuture, RecordMetadata, Sending, \
    WaitingRecord
from .deferred import Deferred, coroutine_function
from .lifecycle import STARTED, Lifecycle
from .observer import deliver, deliver_each, overridden
from .partitioner import StickyPartitioner, partition_for_key
from .transactions import TransactionManager

# A record's batch (for send(), maybe its place in line for memory), offset delta, timestamp.
Appended = tuple[ProducerBatch | WaitingRecord, int, int]
# A record's key, value and headers, serialized and checked (the headers as serializers left them).
KeyValue = tuple[bytes | None, bytes | None, Headers | None]
_Future = TypeVar("_Future", bound=RecordFuture)  # what append() makes in its common case
_T = TypeVar("_T")
_CHUNK = 10_000  # enqueue_many takes its records this many at a time
_DELTA = struct.Struct("=i")  # an offset delta in a BulkFuture (as the speed-up writes them)

log = logging.getLogger(__name__)


class _TopicWait:
    """One fetch of a topic's metadata (`Cluster.topic`, up to `deadline`) and the futures
    of the calls waiting for it, set as it ends (see RecordIntake.partition_count)."""

    __slots__ = ("deadline", "fetch", "waiters")

    def __init__(self, fetch: asyncio.Task[TopicInfo], deadline: float) -> None:
        self.fetch, self.deadline = fetch, deadline
        self.waiters: list[asyncio.Future[TopicInfo]] = []


class RecordIntake:
    """The append path of one producer. Made with the producer; given the cluster, the
    accumulator and the transaction manager when it starts (`attach`). The lifecycle it
    shares with the producer says whether records may come in."""

    def __init__(self, config: ProducerConfig, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle
        self._buffer_memory = config.buffer_memory
        self._max_request_size = config.max_request_size
        self._max_block = config.max_block_ms / 1000
        self._key_serializer = serializer_call(config.key_serializer)
        self._value_serializer = serializer_call(config.value_serializer)
        self._serializing = self._key_serializer is not None or self._value_serializer is not None
        self._config = config
        self._custom_partitioner = config.partitioner
        self._ignore_keys = config.partitioner_ignore_keys
        # Records the speed-up's bulk loop cannot place (it knows murmur2 and sticky only).
        self._partition_in_python = self._custom_partitioner is not None or self._ignore_keys
        self._partitioner: StickyPartitioner  # made by attach(), from the accumulator
        # Set by attach() before the lifecycle lets any record in.
        self._cluster: Cluster
        self._accumulator: RecordAccumulator
        self._tasks: TaskSet
        self._txn: TransactionManager | None = None
        # Hooks that see every record (the rest see batches, through the Observer). Without
        # them send() costs nothing more: the told variant replaces it only where needed.
        self.on_send_hooks = overridden(config.hooks, "on_send")
        self._said_seconds = False  # (a timestamp_ms that looks like seconds: warned once)
        # Calls waiting for a topic's metadata, and the future close() waits on for them to
        # end (see metadata_waits_ended).
        self._waiting_for_metadata = 0
        self._metadata_waits_ended: asyncio.Future[None] | None = None
        self._topic_waits: dict[str, _TopicWait] = {}  # (see partition_count)
        # enqueue_many's records go through the speed-up's loop, unless something needs each
        # of them in Python: serializers, a partitioner it does not know, on_send hooks.
        self._bulk_in_c = not self._serializing and not self._partition_in_python and \
            not self.on_send_hooks
        # The producer's enqueue() and send(): the common case in one compiled call (an
        # Appender, given the parts by attach()), the rest by the methods of those names. With
        # on_send hooks, the told variants.
        self.enqueue_call: Callable[..., Coroutine[Any, Any, RecordFuture]]
        self.send_call: Callable[..., Coroutine[Any, Any, RecordMetadata]]
        self._appenders: tuple[Appender, ...] = ()
        if self.on_send_hooks:
            self.send = self._send_told  # type: ignore[method-assign]
            self.enqueue_call, self.send_call = self.enqueue_told, self._send_told
        else:
            common = (lifecycle, STARTED, time.time, self._serializing, self._partition_in_python)
            self._appenders = (Appender(self.enqueue, RecordFuture, True, *common),
                               Appender(self.send, Sending, False, *common))
            self.enqueue_call, self.send_call = self._appenders

    def attach(self, cluster: Cluster, accumulator: RecordAccumulator,
               txn: TransactionManager | None, node_unavailable: Callable[[int], bool],
               tasks: TaskSet) -> None:
        self._cluster, self._accumulator, self._tasks = cluster, accumulator, tasks
        self._partitioner = StickyPartitioner(
            self._config.batch_size, self._config.partitioner_adaptive_partitioning_enable,
            accumulator.queued, accumulator.drained_bytes, node_unavailable)
        self._txn = txn if txn is not None and txn.is_transactional else None
        for appender in self._appenders:
            appender.attach(cluster, accumulator,
                            None if self._txn is None else self._txn.check_can_send,
                            self._partitioner.partition, accumulator.open_new)

    # -- the verbs' entries ----------------------------------------------------------------

    def send(self, topic: str, value: Any, key: Any = None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers: Headers | None = None
             ) -> Coroutine[Any, Any, RecordMetadata]:
        """send(): in the producer's running loop, append now and return a future that is
        also a coroutine; else (or before the topic's metadata is known) a coroutine that
        does it all when awaited."""
        lifecycle = self._lifecycle
        if lifecycle.state is not STARTED or get_ident() != lifecycle.thread or \
                not lifecycle.loop_running():
            return Deferred(
                self._send_when_awaited(topic, value, key, partition, timestamp_ms, headers),
                "send", topic, lifecycle)
        appended = self.append(topic, value, key, partition, timestamp_ms, headers, True,
                               False, Sending)
        if isinstance(appended, Sending):
            return appended
        if isinstance(appended, tuple):
            sending = Sending(*appended)
            if type(appended[0]) is WaitingRecord:
                appended[0].record = sending
            return sending
        return _deferred(_send_appended(appended), appended, "send", topic, lifecycle)

    @coroutine_function
    def _send_told(self, topic: str, value: Any, key: Any = None, *,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Headers | None = None) -> Coroutine[Any, Any, RecordMetadata]:
        """send() with on_send hooks: they see the record first, then are told its fate
        (the record's, not its future's: see _tell_hooks)."""
        headers, told = self.tell_send(topic, key, value, headers)
        if told is None:
            return RecordIntake.send(self, topic, value, key, partition=partition,
                                     timestamp_ms=timestamp_ms, headers=headers)
        lifecycle = self._lifecycle
        if lifecycle.state is not STARTED or get_ident() != lifecycle.thread or \
                not lifecycle.loop_running():
            return Deferred(self._send_when_awaited(topic, value, key, partition, timestamp_ms,
                                                    headers, told), "send", topic, lifecycle)
        try:
            appended = self.append(topic, value, key, partition, timestamp_ms, headers, True,
                                   False, Sending)
        except BaseException as exc:  # refused at the call: told so at once
            deliver(told, None, exc)
            raise
        if isinstance(appended, Sending):
            sending = appended
        elif isinstance(appended, tuple):
            sending = Sending(*appended)
            if type(appended[0]) is WaitingRecord:
                appended[0].record = sending
        else:
            return _deferred(_send_appended(appended, told), appended, "send", topic,
                             lifecycle)
        _tell_hooks(sending, told)
        return sending

    def enqueue(self, topic: str, value: Any, key: Any = None, *,
                partition: int | None = None, timestamp_ms: int | None = None,
                headers: Headers | None = None) -> Coroutine[Any, Any, RecordFuture]:
        """Producer.enqueue() beyond the Appender's common case: a record that waits for
        the topic's metadata, a serializer, a new batch or buffer memory, or is refused. In
        the producer's running loop what needs no wait is done by the call, as in send():
        a keyless record that opens a batch was appended only when awaited, so a loop of
        enqueue() calls never awaited opened none and lost every record."""
        appended = self.append(topic, value, key, partition, timestamp_ms, headers, False,
                               False, RecordFuture)
        if isinstance(appended, RecordFuture):
            return Ready(appended)
        if isinstance(appended, tuple):
            return Ready(RecordFuture(*appended))
        return _deferred(_enqueued(appended), appended, "enqueue", topic, self._lifecycle)

    @coroutine_function
    def enqueue_told(self, topic: str, value: Any, key: Any = None, *,
                     partition: int | None = None, timestamp_ms: int | None = None,
                     headers: Headers | None = None) -> Coroutine[Any, Any, RecordFuture]:
        """Producer.enqueue() where on_send hooks see every record (it takes the place of
        the Appender): they see it at the call, which buffers it as enqueue() does."""
        headers, told = self.tell_send(topic, key, value, headers)
        try:
            appended = self.append(topic, value, key, partition, timestamp_ms, headers, False,
                                   False, RecordFuture)
        except BaseException as exc:  # refused at the call: told so at once
            if told is not None:
                deliver(told, None, exc)
            raise
        if not isinstance(appended, (RecordFuture, tuple)):
            enqueued = _enqueued(appended) if told is None else _enqueued_told(appended, told)
            return _deferred(enqueued, appended, "enqueue", topic, self._lifecycle)
        future = appended if isinstance(appended, RecordFuture) else RecordFuture(*appended)
        if told is not None:
            _tell_hooks(future, told)
        return Ready(future)

    def tell_send(self, topic: str, key: Any, value: Any, headers: Headers | None
                  ) -> tuple[Headers | None, DeliveryCallback | None]:
        """Show a record to the on_send hooks: the headers they left, and what to tell of
        its outcome (None if no hook asked). What a hook raises raises here: the record is
        not buffered."""
        record_headers: MutableHeaders = checked_headers(headers) if headers else []
        told: list[DeliveryCallback] = []
        for hook in self.on_send_hooks:
            callback = hook(topic, key, value, record_headers)
            if callback is not None:
                told.append(callback)
            try:  # what it added, checked here to say so (the user's own are checked above)
                checked_headers(record_headers)
            except InvalidRecordError as exc:
                refused = InvalidRecordError(
                    f"{exc} (added by the on_send hook of "
                    f"{type(getattr(hook, '__self__', hook)).__name__})")
                for callback in told:  # (told as a refusal at the call is)
                    deliver(callback, None, refused)
                raise refused from None
        outcome = None if not told else told[0] if len(told) == 1 \
            else partial(deliver_each, told)
        return record_headers or None, outcome

    async def _send_when_awaited(self, topic: str, value: Any, key: Any,
                                 partition: int | None, timestamp_ms: int | None,
                                 headers: Headers | None, told: DeliveryCallback | None = None
                                 ) -> RecordMetadata:
        try:
            appended = self.append(topic, value, key, partition, timestamp_ms, headers, True)
            if not isinstance(appended, tuple):
                appended = await appended
        except BaseException as exc:  # (nothing buffered)
            if told is not None:
                deliver(told, None, exc)
            raise
        record = RecordFuture(*appended)
        if type(appended[0]) is WaitingRecord:
            appended[0].record = record
        if told is not None:
            _tell_hooks(record, told)
        return await record

    @overload
    def append(self, topic: str, value: Any, key: Any, partition: int | None,
               timestamp_ms: int | None, headers: Headers | None, eager: bool,
               serialized: bool = False, make: None = None
               ) -> Appended | Coroutine[Any, Any, Appended]: ...

    @overload
    def append(self, topic: str, value: Any, key: Any, partition: int | None,
               timestamp_ms: int | None, headers: Headers | None, eager: bool,
               serialized: bool, make: type[_Future]
               ) -> _Future | Appended | Coroutine[Any, Any, Appended]: ...

    def append(self, topic: str, value: Any, key: Any, partition: int | None,
               timestamp_ms: int | None, headers: Headers | None, eager: bool,
               serialized: bool = False, make: type[_Future] | None = None
               ) -> _Future | Appended | Coroutine[Any, Any, Appended]:
        """(batch, offset delta, timestamp) of the appended record, or, when the topic's
        metadata, an async serializer or (unless `eager`, as for send()) a new batch is
        needed, a coroutine that returns them. `serialized`: the key and value are already
        the serializers' bytes. With `make` (a RecordFuture class), a record that goes into
        its partition's open batch (the common case) comes back as `make`'s future, made
        by the same C call that appends it."""
        lifecycle = self._lifecycle
        if lifecycle.state is not STARTED:
            lifecycle.raise_not_started()
        if get_ident() != lifecycle.thread or not lifecycle.loop_running():
            # Another thread or loop: refused when awaited, before anything is buffered (where
            # asyncio.run_coroutine_threadsafe() hands the call to the producer's loop, it
            # goes on there).
            return self._append_when_awaited(topic, value, key, partition, timestamp_ms,
                                             headers, eager, serialized)
        if self._txn is not None:
            self._txn.check_can_send()
        if type(topic) is not str:
            topic = topic_str(topic)
        info = self._cluster.topics.get(topic)
        if info is None or not info.leaders:
            return self._append_when_known(topic, value, key, partition, timestamp_ms, headers,
                                           eager, serialized)
        # The common case, bytes and no serializers, costs one test: this is per record.
        if self._serializing and not serialized or \
                (value is not None and type(value) is not bytes) or \
                (key is not None and type(key) is not bytes):
            checked = self._key_value(topic, key, value, headers)
            if not isinstance(checked, tuple):  # an async serializer: append once it is done
                return self._append_serialized(checked, topic, partition, timestamp_ms, eager)
            key, value, headers = checked
        encoded_headers = encode_checked_headers(headers) if headers else None
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        else:
            timestamp_ms = self._checked_timestamp(timestamp_ms, topic)
        leaders = info.leaders
        sticky = False
        if partition is not None:
            if type(partition) is not int:
                partition = as_int(partition)  # (numpy's integers)
            if type(partition) is not int or not 0 <= partition < len(leaders):
                raise bad_partition(topic, partition, len(leaders))
        elif self._partition_in_python:
            partition, sticky = self._place(topic, key, leaders)
        elif key is not None:
            partition = partition_for_key(key, len(leaders))
        else:
            partition, sticky = self._partitioner.partition(topic, leaders), True

        accumulator = self._accumulator
        if make is not None and not accumulator.line:
            open_ = accumulator.appendable.get(topic)
            if open_ is not None:
                future = append_record(open_[0], open_[1], partition, timestamp_ms, key, value,
                                       encoded_headers, make)
                if future is not None:
                    return future  # type: ignore[no-any-return]
        batch = accumulator.try_append(topic, partition, timestamp_ms, key, value,
                                       encoded_headers)
        if batch is None:
            return self._append_new(topic, partition, sticky, leaders, timestamp_ms,
                                    key, value, encoded_headers, eager)
        return batch, batch.writer.count - 1, timestamp_ms

    async def enqueue_many(self, topic: str, records: Iterable[tuple[Any, Any]],
                           partition: int | None, timestamp_ms: int | None,
                           context: Context | None = None) -> BulkFuture:
        """enqueue_many(): whatever it raises, the records before stay buffered, and the
        exception's `accepted` is the BulkFuture of those. on_send hooks see each record as
        it is read (in `context`, if given: BlockingProducer.produce_many()'s caller's)."""
        out_batches: list[ProducerBatch] = []
        out_deltas = bytearray()
        stamp = 0
        failures = ProducerBatch.failures
        try:
            lifecycle = self._lifecycle
            if lifecycle.state is not STARTED:
                lifecycle.raise_not_started()
            if self._txn is not None:
                self._txn.check_can_send()
            lifecycle.check_loop()
            stamp = timestamp_ms = self._checked_timestamp(timestamp_ms, topic)
            if type(topic) is not str:
                topic = topic_str(topic)
            count = await self.partition_count(topic)
            if partition is not None:
                partition = as_int(partition)
                if type(partition) is not int or not 0 <= partition < count:
                    raise bad_partition(topic, partition, count)
            if type(records) is Columns:  # read where they lie, all in one go
                await self._append_many(topic, records, count, partition, timestamp_ms,
                                        out_batches, out_deltas, context)
                return BulkFuture(out_batches, out_deltas, stamp, failures)
            # In chunks, so a generator of any length is fine; a list is read as the call goes.
            iterator = iterate_records(records)
            while True:
                chunk: list[Any] = []
                try:
                    chunk.extend(itertools.islice(iterator, _CHUNK))
                except Exception:  # the iterable's own error: what it gave before goes in
                    await self._append_many(topic, chunk, count, partition, timestamp_ms,
                                            out_batches, out_deltas, context)
                    raise
                if not chunk:
                    break
                await self._append_many(topic, chunk, count, partition, timestamp_ms,
                                        out_batches, out_deltas, context)
        except BaseException as exc:  # also the iterable's own errors, and a Ctrl-C
            exc.accepted = BulkFuture(  # type: ignore[attr-defined]
                out_batches, out_deltas, stamp, failures)
            raise
        return BulkFuture(out_batches, out_deltas, stamp, failures)

    def _place(self, topic: str, key: bytes | None, leaders: Sequence[int]) -> tuple[int, bool]:
        """The partition of a record without an explicit one, with a custom partitioner or
        partitioner_ignore_keys (else append() places it inline), and whether it is sticky."""
        if self._custom_partitioner is not None:
            count = len(leaders)
            chosen = self._custom_partitioner(
                topic, key, count, [p for p, leader in enumerate(leaders) if leader >= 0])
            if chosen is not None:
                if type(chosen) is not int:
                    chosen = as_int(chosen)  # (a partitioner using numpy)
                if type(chosen) is not int or not 0 <= chosen < count:
                    raise InvalidRecordError(
                        f"the partitioner returned {chosen!r} for topic {topic!r}, which has "
                        f"partitions 0 to {count - 1}")
                return chosen, False
        if key is not None and not self._ignore_keys:
            return partition_for_key(key, len(leaders)), False
        return self._partitioner.partition(topic, leaders), True

    def _checked_timestamp(self, timestamp_ms: Any, topic: str) -> int:
        """A record's timestamp (now if None), checked. One that looks like seconds (above 0,
        before 1973 as ms: `int(time.time())`) is taken as given, as the Java client takes
        it, but the broker dates the record 1970: said once per producer."""
        checked = checked_timestamp(timestamp_ms)
        if 0 < checked < SECONDS_LIKE_BELOW and not self._said_seconds:
            self._said_seconds = True
            log.warning(
                "timestamp_ms=%d (topic %r) is %s as milliseconds since the epoch, which "
                "the broker and consumers take it for: was it seconds? Give "
                "int(time.time() * 1000). The records are sent with it as given. (Said once.)",
                checked, topic, time.strftime("%Y-%m-%d", time.gmtime(checked / 1000)))
        return checked

    async def partition_count(self, topic: str) -> int:
        """The topic's partition count, its metadata waited for up to max_block_ms from this
        call if not known. The calls waiting for one topic share one fetch (`_TopicWait`),
        whose end wakes them all: a wait each (a future, a timer and a callback on the
        fetch) cost 100,000 fire-and-forget sends to a new topic 44 us a send, 22 us now
        (most of it the collector's, with them all pending). A call that joined a wait begun
        before it, which timed out, waits on in another until its own deadline."""
        info = self._cluster.topics.get(topic)
        if info is not None and info.leaders:
            return len(info.leaders)
        self._waiting_for_metadata += 1
        try:
            check_topic_name(topic)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._max_block
            while True:
                shared = self._topic_waits.get(topic)
                if shared is None:
                    shared = self._topic_waits[topic] = _TopicWait(self._tasks.spawn(
                        self._cluster.topic(topic, self._max_block, deadline),
                        f"aioproducer-metadata-wait-{topic}", reported=True), deadline)
                    shared.fetch.add_done_callback(
                        partial(self._topic_wait_ended, topic, shared))
                waiter: asyncio.Future[TopicInfo] = loop.create_future()
                shared.waiters.append(waiter)
                try:
                    return len((await waiter).leaders)
                except (KafkaConnectionError, UnknownTopicError):  # (what its deadline raises)
                    if not (shared.deadline < deadline and loop.time() < deadline):
                        raise
        except asyncio.CancelledError:
            self._lifecycle.count_cancelled_unbuffered()
            raise
        finally:
            self._waiting_for_metadata -= 1
            ended = self._metadata_waits_ended
            if not self._waiting_for_metadata and ended is not None:
                self._metadata_waits_ended = None
                if not ended.done():
                    ended.set_result(None)

    def metadata_waits_ended(self) -> asyncio.Future[None] | None:
        """Done once no call waits for a topic's metadata (None if none waits now). close()
        waits for it first: `create_task(producer.send(...))` for a topic not used yet, then
        `await producer.close()`, buffers the record (once the metadata came, in the same
        loop step, before this is done), and close() sends it."""
        if not self._waiting_for_metadata:
            return None
        if self._metadata_waits_ended is None:
            self._metadata_waits_ended = asyncio.get_running_loop().create_future()
        return self._metadata_waits_ended

    def _topic_wait_ended(self, topic: str, shared: _TopicWait,
                          fetch: asyncio.Task[TopicInfo]) -> None:
        """The fetch ended: each call still waiting gets its metadata, or its error (marked
        retrieved: a call cancelled before it resumes never reads it, and asyncio would log
        it as never retrieved)."""
        if self._topic_waits.get(topic) is shared:
            del self._topic_waits[topic]
        if fetch.cancelled():  # (by close(), or the loop's end)
            exc: BaseException | None = ProducerClosedError(
                f"the producer was closed while it fetched metadata for topic {topic!r}")
        else:
            exc = fetch.exception()
        for waiter in shared.waiters:
            if waiter.done():  # (its call was cancelled)
                continue
            if exc is None:
                waiter.set_result(fetch.result())
            else:
                waiter.set_exception(exc)
                waiter.exception()

    # -- the steps -------------------------------------------------------------------------

    def _key_value(self, topic: str, key: Any, value: Any, headers: Headers | None
                   ) -> KeyValue | Coroutine[Any, Any, KeyValue]:
        """Serialize (if serializers are set) and check that key and value are bytes; a
        coroutine when a serializer is async. Serializers get the headers as a list they may
        change, the key's first, as the Java client calls them."""
        if self._serializing:
            record_headers = checked_headers(headers) if headers else []
            if self._key_serializer is not None and key is not None:
                key = serialize(self._key_serializer, key, "key", topic, record_headers)
                if type(key) is not bytes:
                    return self._key_value_awaited(topic, key, value, record_headers, True)
            if self._value_serializer is not None and value is not None:
                value = serialize(self._value_serializer, value, "value", topic, record_headers)
                if type(value) is not bytes:
                    return self._key_value_awaited(topic, key, value, record_headers, False)
            headers = record_headers
        if value is not None and type(value) is not bytes:
            value = as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = as_bytes(key, "key")
        return key, value, headers

    async def _key_value_awaited(self, topic: str, key: Any, value: Any,
                                 headers: MutableHeaders, key_pending: bool
                                 ) -> KeyValue:
        """_key_value's end once a serializer returned an awaitable: the key's (then the
        value is still to serialize) or the value's."""
        value_pending = not key_pending
        if key_pending:
            key = await serialize_async(key, "key", topic)
            if self._value_serializer is not None and value is not None:
                value = serialize(self._value_serializer, value, "value", topic, headers)
                value_pending = type(value) is not bytes
        if value_pending:
            value = await serialize_async(value, "value", topic)
        if value is not None and type(value) is not bytes:  # (no value_serializer)
            value = as_bytes(value, "value")
        if key is not None and type(key) is not bytes:  # (no key_serializer)
            key = as_bytes(key, "key")
        return key, value, headers

    async def _append_when_awaited(self, topic: str, value: Any, key: Any,
                                   partition: int | None, timestamp_ms: int | None,
                                   headers: Headers | None, eager: bool,
                                   serialized: bool) -> Appended:
        """append() called outside the producer's running loop: all of it once awaited,
        which raises unless that is in the producer's loop."""
        self._lifecycle.check_loop()
        appended = self.append(topic, value, key, partition, timestamp_ms, headers, eager,
                               serialized)
        return appended if isinstance(appended, tuple) else await appended

    async def _append_serialized(self, serializing: Coroutine[Any, Any, KeyValue], topic: str,
                                 partition: int | None, timestamp_ms: int | None,
                                 eager: bool) -> Appended:
        """append() for a record with an async serializer: serialize, then append (what
        was checked before the await is checked again: the producer may be closing)."""
        key, value, headers = await serializing
        appended = self.append(topic, value, key, partition, timestamp_ms, headers, eager, True)
        return appended if isinstance(appended, tuple) else await appended

    async def _append_when_known(self, topic: str, value: Any, key: Any,
                                 partition: int | None, timestamp_ms: int | None,
                                 headers: Headers | None, eager: bool,
                                 serialized: bool) -> Appended:
        """append() for a topic without metadata yet: fetch it first (as the Java client
        does, so the record is serialized once, with the topic known), then append."""
        self._lifecycle.check_loop()
        await self.partition_count(topic)
        # Nothing ran since the metadata arrived: this time append() finds the topic.
        appended = self.append(topic, value, key, partition, timestamp_ms, headers, eager,
                               serialized)
        return appended if isinstance(appended, tuple) else await appended

    def _append_new(self, topic: str, partition: int, sticky: bool, leaders: Sequence[int],
                    timestamp_ms: int, key: bytes | None, value: bytes | None,
                    headers: bytes | None, eager: bool) -> Appended | Coroutine[Any, Any, Appended]:
        """The record needs a new batch: check its size, close the partition's full batch,
        move a sticky partition on (KIP-480). Then, if the memory is free and `eager` or no
        full batch was closed, append now; else return a coroutine that does it. (enqueue()
        to many partitions opens a batch every few records: a coroutine each was a tenth of
        its CPU at 10,000 partitions.)"""
        self._lifecycle.check_loop()
        accumulator = self._accumulator
        count = len(leaders)
        self._cluster.touch(topic)  # once per batch, not per record
        size = record_size_upper_bound(key, value, headers)
        if size > self._max_request_size:
            raise RecordTooLargeError(
                f"a record of {size} bytes (serialized, in its own batch) is larger than "
                f"max_request_size={self._max_request_size}: raise max_request_size (and the "
                "broker's message.max.bytes) or send smaller records")
        if size > self._buffer_memory:
            raise RecordTooLargeError(
                f"a record of {size} bytes is larger than buffer_memory={self._buffer_memory}")
        memory = accumulator.batch_memory(size)
        if accumulator.waiting:  # behind the records waiting for memory, whatever is open
            return self._wait_in_line(topic, partition, timestamp_ms, key, value, headers,
                                      memory, count, eager)
        closed = accumulator.close_for_appends(topic, partition)
        if sticky:
            partition = self._partitioner.on_new_batch(topic, leaders, partition, closed)
        if eager or not closed:
            # The new sticky partition may have a batch with room; a keyed one has none now.
            batch = accumulator.try_append(topic, partition, timestamp_ms, key, value,
                                           headers) if sticky else None
            if batch is None and accumulator.reserve_now(memory):
                batch = accumulator.open_batch(topic, partition, timestamp_ms, key, value,
                                               headers, memory, count)
            if batch is not None:
                return batch, batch.writer.count - 1, timestamp_ms
            if eager:
                return self._wait_in_line(topic, partition, timestamp_ms, key, value,
                                          headers, memory, count, eager)
        return self._append_soon(topic, partition, timestamp_ms, key, value, headers,
                                 memory, count)

    def _wait_in_line(self, topic: str, partition: int, timestamp_ms: int,
                      key: bytes | None, value: bytes | None, headers: bytes | None,
                      memory: int, count: int, eager: bool
                      ) -> Appended | Coroutine[Any, Any, Appended]:
        """Join the line for memory: send() (`eager`) at once, its future following the
        line's entry (send() makes it follow); enqueue() in a coroutine that waits its turn."""
        waiting = self._accumulator.join_line(topic, partition, timestamp_ms, key, value,
                                              headers, memory, count, eager)
        if eager:
            return waiting, 0, timestamp_ms
        appending = self._append_in_turn(waiting)
        # Dropped never run (an enqueue() not awaited), its turn would come and the line
        # wait for ever behind it: it leaves the line then, as a cancelled one does.
        waiting.awaiter = weakref.ref(appending, partial(self._dropped_in_line, waiting))
        return appending

    def _dropped_in_line(self, waiting: WaitingRecord, _: object) -> None:
        assert waiting.turn is not None
        if waiting.granted or not waiting.turn.done():  # neither appended, failed nor left
            loop = self._lifecycle.loop
            assert loop is not None
            with contextlib.suppress(RuntimeError):  # (the loop closed: nothing waits now)
                loop.call_soon_threadsafe(self._leave_line, waiting)

    def _leave_line(self, waiting: WaitingRecord) -> None:
        assert waiting.turn is not None
        waiting.turn.cancel()  # (its entry is skipped when its turn comes) ...
        self._accumulator.leave_line(waiting)  # ... or, come already, given up

    async def _append_in_turn(self, waiting: WaitingRecord) -> Appended:
        """Wait for `waiting`'s turn in the line (up to max_block_ms), then append it.
        Cancelled or failed before appending, it has buffered nothing: enqueue() is all or
        nothing."""
        accumulator = self._accumulator
        assert waiting.turn is not None
        try:
            await waiting.turn
        except BaseException:
            accumulator.leave_line(waiting)
            raise
        batch = accumulator.append_granted(waiting)
        return batch, batch.writer.count - 1, waiting.timestamp

    async def _append_soon(self, topic: str, partition: int, timestamp_ms: int,
                           key: bytes | None, value: bytes | None, headers: bytes | None,
                           memory: int, count: int) -> Appended:
        """enqueue()'s append of a record that needs a new batch and closed a full one, or
        found the memory short: with the memory free, take the head of the line for one loop
        turn first (turn_soon: the sender ships the closed batch, and no record overtakes
        this one meanwhile); else wait in line."""
        accumulator = self._accumulator
        if accumulator.reserve_now(memory):
            waiting = accumulator.turn_soon(topic, partition, timestamp_ms, key, value,
                                            headers, memory, count)
        else:
            waiting = accumulator.join_line(topic, partition, timestamp_ms, key, value,
                                            headers, memory, count, False)
        return await self._append_in_turn(waiting)

    async def _append_many(self, topic: str, records: list[Any] | Columns, count: int,
                           partition: int | None, timestamp_ms: int,
                           out_batches: list[ProducerBatch], out_deltas: bytearray,
                           context: Context | None) -> None:
        """Hand the records to the speed-up's loop; take over where it stops (a new batch is
        needed, or a record needs serializing or checking), then hand back the rest."""
        accumulator = self._accumulator
        batches, writers = accumulator.open_batches(topic, count)
        fixed = -1 if partition is None else partition
        index, end = 0, len(records)
        while index < end:
            # (Else, one by one: see _bulk_in_c; or records in line for memory.)
            if self._bulk_in_c and not accumulator.waiting:
                info = self._cluster.topics.get(topic)
                known = info is not None and len(info.leaders) == count
                leaders = info.leaders if info is not None and known \
                    else (-1,) * count  # (forgotten meanwhile: any partition, for now)
                index, status, placed = append_many(
                    records, index, batches, writers, fixed,
                    self._partitioner.partition(topic, leaders), timestamp_ms,
                    out_batches, out_deltas)
                if status == DONE:
                    return
                if status == NEEDS_BATCH and known and writers[placed] is not None:
                    # Its batch is full: closed here (the sender may take it), and the record
                    # taken again, a sticky one on the partition it moves on to.
                    accumulator.close_for_appends(topic, placed)
                    if records[index][0] is None and fixed < 0:
                        self._partitioner.on_new_batch(topic, leaders, placed, True)
                    if accumulator.request_worth_closed(count, len(self._cluster.brokers)):
                        # One loop turn, before the next batch opens: the sender writes the
                        # full ones in one request meanwhile (a turn per full batch, as
                        # enqueue() takes, made a request per batch), and the broker works
                        # while this call goes on.
                        await asyncio.sleep(0)
                        batches, writers = accumulator.open_batches(topic, count)
                    continue
                if status == NEEDS_BATCH and known:
                    key, value = records[index]  # (the loop checked: bytes or None)
                    if key is not None or fixed >= 0:  # (a sticky one may move: see append)
                        counted = len(out_batches)
                        try:
                            opened = self.open_new(topic, placed, key, value, timestamp_ms,
                                                   count)
                            if opened is not None:
                                _taken((opened, 0, timestamp_ms), None, out_batches,
                                       out_deltas, counted)
                        except BaseException as exc:
                            # A Ctrl-C, wherever it struck: the record has one entry if its
                            # batch was queued (it is then the partition's open batch, which
                            # had none: nothing else ran meanwhile).
                            take_kept(exc)
                            queued = batches[placed]
                            if queued is not None:
                                _taken((queued, 0, timestamp_ms), None, out_batches,
                                       out_deltas, counted)
                            raise
                        if opened is not None:
                            index += 1
                            continue
            # One record the loop could not take, done the way enqueue() does it.
            record = records[index]
            try:
                if isinstance(record, (str, dict, *BYTES_TYPES)):  # would unpack if of length
                    raise TypeError  # 2 (a dict into its first two keys)
                key, value = record
            except (TypeError, ValueError):
                raise InvalidRecordError(  # out_batches has an entry per record before it
                    f"enqueue_many takes (key, value) pairs, not {type(record).__name__} "
                    f"(record {len(out_batches)}: {record!r:.80}){_pair_hint(record)}"
                ) from None
            headers: Headers | None = None
            told: DeliveryCallback | None = None
            if self.on_send_hooks:  # as enqueue() shows them its records (what they raise
                # raises here: the record is not buffered)
                headers, told = self.tell_send(topic, key, value, None) if context is None \
                    else context.run(self.tell_send, topic, key, value, None)
            counted, appended = len(out_batches), None
            try:
                appending = self.append(topic, value, key, partition, timestamp_ms, headers,
                                        False)
                appended = appending if isinstance(appending, tuple) else await appending
                _taken(appended, None, out_batches, out_deltas, counted)
                if told is not None:  # (told = None before the one call that tells it)
                    future, tell = RecordFuture(*appended), partial(_tell_outcome, told)
                    told = None
                    future.add_done_callback(tell)
            except BaseException as exc:
                kept = take_kept(exc)
                if kept is not None:
                    appended = (*kept, timestamp_ms)
                if appended is not None:  # buffered all the same (a Ctrl-C struck after):
                    _taken(appended, told, out_batches, out_deltas, counted)  # counted, told
                    raise
                if told is not None:
                    deliver(told, None, exc)
                if isinstance(exc, _RECORD_ERRORS) and type(records) is not Columns:
                    # (a Spark task's Arrow batch: its index there would mislead)
                    _name_the_record(exc, len(out_batches))  # (one entry per record before)
                raise
            index += 1

    def open_new(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 timestamp_ms: int, count: int) -> ProducerBatch | None:
        """A new batch for a record that enqueue_many's loop placed (bytes, no headers, its
        partition keyed or given) where the partition has none open, if the memory is free:
        append()'s work without the checks the loop made. None, having done nothing:
        append() takes the record (to raise, or to wait in line). (The Appender calls the
        accumulator's open_new itself: it checked the state and the transaction already.)"""
        if self._lifecycle.state is not STARTED:
            return None
        if self._txn is not None:
            self._txn.check_can_send()
        batch: ProducerBatch | None = self._accumulator.open_new(topic, partition, key, value,
                                                                 timestamp_ms, count)
        return batch


# The producer's send() and enqueue() are these methods (or an Appender that hands them its
# arguments): a call with an argument missing, or one too many, names the verb the user
# called, "Producer.send() missing 1 required positional argument: 'value'", not ours.
for _verb, _name in ((RecordIntake.send, "send"), (RecordIntake._send_told, "send"),
                     (RecordIntake.enqueue, "enqueue"),
                     (RecordIntake.enqueue_told, "enqueue")):
    _verb.__qualname__ = f"Producer.{_name}"
del _verb, _name


# What enqueue_many() raises for one record of its input (not for the call as a whole).
_RECORD_ERRORS = (InvalidRecordError, RecordTooLargeError, SerializationError)


def _taken(appended: Appended, told: DeliveryCallback | None,
           out_batches: list[ProducerBatch], out_deltas: bytearray, counted: int) -> None:
    """enqueue_many() buffered a record (outside the compiled loop): its entry in the
    call's BulkFuture, the one after the first `counted` (made whole again: a Ctrl-C may
    have struck as it was being made); on_send hooks that asked are told its outcome. The
    two lists change with no point between where a Ctrl-C could strike (the append's
    return is after both): a second one, in a fix-up, leaves the entry whole or not made."""
    batch, delta, _ = appended
    assert isinstance(batch, ProducerBatch)  # (only send()'s records wait apart)
    packed = _DELTA.pack(delta)
    del out_batches[counted:], out_deltas[4 * counted:]
    out_deltas += packed
    out_batches.append(batch)
    if told is not None:
        RecordFuture(*appended).add_done_callback(partial(_tell_outcome, told))


def _name_the_record(exc: BaseException, index: int) -> None:
    """Put the refused record's index in the input at the front of the error's message: a
    load of a file that stops on a type or size gives the row to look at and resume from."""
    if len(exc.args) == 1 and isinstance(exc.args[0], str) \
            and type(exc).__str__ is BaseException.__str__:
        exc.args = (f"records[{index}]: {exc.args[0]}",)


def _pair_hint(record: object) -> str:
    """What to do with a record enqueue_many() cannot take, where a user's habit shows."""
    if isinstance(record, dict):
        return ": make each a tuple, e.g. (row['key'], row['value'])"
    if isinstance(record, (tuple, list)) and len(record) == 3:
        return ": its records have no headers (a record with headers: enqueue() or send())"
    return ""


_SERIALIZING = RecordIntake._append_serialized.__code__  # (see _deferred)


def _deferred(finishing: Coroutine[Any, Any, _T], appending: Coroutine[Any, Any, Appended],
              verb: str, topic: object, lifecycle: Lifecycle) -> Coroutine[Any, Any, _T]:
    """What send() or enqueue() returns for a record that `appending` buffers once awaited:
    `finishing` (which awaits it) in a Deferred, which reports the record lost if it is
    dropped unawaited. Not where `appending` awaits an async serializer in the producer's
    loop: one is made per record there, and the wrapper was 10-15% of the record's CPU (3.5
    us); Python's own warning says that one was never awaited."""
    if getattr(appending, "cr_code", None) is _SERIALIZING:
        return finishing
    return Deferred(finishing, verb, topic, lifecycle)


async def _enqueued(appending: Coroutine[Any, Any, Appended]) -> RecordFuture:
    return RecordFuture(*await appending)


async def _enqueued_told(appending: Coroutine[Any, Any, Appended],
                         told: DeliveryCallback) -> RecordFuture:
    try:
        future = RecordFuture(*await appending)
    except BaseException as exc:
        deliver(told, None, exc)
        raise
    _tell_hooks(future, told)
    return future


async def _send_appended(appending: Coroutine[Any, Any, Appended],
                         told: DeliveryCallback | None = None) -> RecordMetadata:
    if told is None:
        return await RecordFuture(*await appending)
    try:
        record = RecordFuture(*await appending)
    except BaseException as exc:  # (nothing buffered)
        deliver(told, None, exc)
        raise
    _tell_hooks(record, told)
    return await record


def _tell_hooks(record: RecordFuture, told: DeliveryCallback) -> None:
    """Tell on_send hooks the outcome of `record`'s record, followed by a future of their
    own: the caller's may be cancelled (a Ctrl-C in asyncio.run() cancels the main task, as
    asyncio.timeout or a client gone cancel a handler) while the record is still sent, and
    hooks see every record as the broker stored it. (One still waiting in line for memory
    is followed by its own future: cancelled there, it leaves the line unsent.)"""
    batch = record._batch
    follower = RecordFuture(batch, record._offset_delta, record._timestamp) \
        if type(batch) is ProducerBatch else record
    follower.add_done_callback(partial(_tell_outcome, told))


def _tell_outcome(told: DeliveryCallback, future: asyncio.Future[RecordMetadata]) -> None:
    if future.cancelled():
        deliver(told, None, asyncio.CancelledError())
    else:
        exc = future.exception()
        deliver(told, None if exc is not None else future.result(), exc)
