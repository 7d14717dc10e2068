"""RecordAccumulator: records gathered into per-partition batches until the sender drains them.

The Java client keeps `batches` in a copy-on-write map because many threads append while the
sender reads. Everything here runs on one event loop, so a plain dict of deques is enough:
no locks, and an append that finds room in the open batch never suspends. The dict holds only
partitions with batches queued, so a sender round costs what is queued, not every partition
the producer ever wrote to.

The memory bound is the Java client's BufferPool without its free list (a cleared bytearray
hands its memory back to CPython's allocator, which already recycles blocks), but a batch
reserves what it holds as it grows, not `batch_size` at once: a new batch reserves
`_FIRST_RESERVE` bytes (or its first record's size), and its writer doubles its reservation,
up to `batch_size`, when a record does not fit in it (or takes just what the record needs
when the double is not free): the writer draws on the free memory (a MemoryPool, a counter
the accumulator owns) itself, so the compiled append loops grow batches without stopping for
Python. With 3,000 partitions each open batch reserving 16 KiB took the whole 32 MiB for
batches of a few records, and records waited for memory at 11 us of CPU each (issue 42).
The batches' bytes stay within `buffer_memory`; a record that needs a new batch, or more
memory for its open one, when memory is short closes that batch (so it is sent, and frees
its memory) and waits in line, first come first served, up to `max_block_ms`; while anyone
waits, no batch grows but by the line's own records (the pool is `paused` except while the
line is served). The line is served here, synchronously, as batches finish: the head gathers
freed memory until it has enough (a large record is not starved by small ones), and the
records behind it go into the batch it opened, which grows for them as memory allows (kept
at its first 1 KiB, 500k sends gathered at once made 35k batches of ~14 records, not 5k). While anyone waits, every new record joins the line, so no record overtakes one sent
before it to the same partition.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from ..client.ratelimit import LogEvery
from ..errors import BufferExhaustedError, DeliveryTimeoutError, ProducerClosedError, \
    TransactionAbortedError
from .._speedups import AccumulatorFields, MemoryPool, take_acked
from .._speedups._py import KEPT_BATCH
from ..protocol.compression import Codec
from ..protocol.records import BatchWriter, encode_headers, read_batches
from .batch import ProducerBatch, TopicPartition, WaitingRecord

if TYPE_CHECKING:
    from ..client.cluster import Cluster, TopicInfo
    from ..config import ProducerConfig
    from .observer import Observer
    from .transactions import TransactionManager

log = logging.getLogger(__name__)

# Loop times are floats, and uvloop's are whole milliseconds: when a linger or a retry
# backoff is over, its time left can come out a hair above zero, and the sender would wait
# for the clock's next tick (spinning through the rest of the millisecond on uvloop).
_CLOCK_SLACK = 1e-6
_LINGER_BOUND_AFTER = 50  # lone, lingered records in a row before saying a loop is linger-bound
_AT_ONCE = 0.001  # the next record this soon after the last one's ack: that loop's signature
# A new batch's first reservation (or its first record's size, if larger; at most batch_size):
# 10,000 open batches take 10 MiB of the default 32 MiB, and a batch of 100-byte records
# reaches 16 KiB in four doublings.
_FIRST_RESERVE = 1024
# With KEPT_BATCH on an exception, the caller's record's offset delta in that batch (absent: 0).
_KEPT_DELTA = "_aioproducer_kept_delta"


class RecordAccumulator(AccumulatorFields):
    """Per-partition queues of batches; the sender asks which are ready and drains them."""

    def __init__(self, config: ProducerConfig, codec: Codec,
                 txn: TransactionManager | None, observer: Observer) -> None:
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self._observer = observer
        self._batch_size = config.batch_size
        self._first_reserve = min(_FIRST_RESERVE, config.batch_size)
        self._linger = config.linger_ms / 1000
        self._delivery_timeout = config.delivery_timeout_ms / 1000
        self._compression_level = config.compression_level
        self._codec = codec
        self.buffer_memory = config.buffer_memory
        # The memory no batch holds; open batches' writers draw on it as they grow.
        self._pool = MemoryPool(config.buffer_memory)
        # What `_open` makes (in C: no Python frame to make either).
        self._batch_type, self._writer_type = ProducerBatch, BatchWriter
        # Each topic's last new batch, in loop time: the cluster's (wired at start) record of
        # which topics are produced to (metadata_max_idle_ms).
        self.touched: dict[str, float] = {}
        self._max_block = config.max_block_ms / 1000
        # Records waiting for memory, in arrival order (while any waits, new records join
        # them: the intake's fast path reads it); what the head gathered meanwhile.
        self.line: deque[WaitingRecord] = deque()
        self._gathered = 0
        self._serving = False
        self._line_timer: asyncio.TimerHandle | None = None
        self._pending: asyncio.Future[None] = self._loop.create_future()  # never resolved
        self._txn = txn
        # Wired to the sender: `wake_sender` for flush(); `wake_sender_for` with each batch
        # opened (True: at linger_ms=0 the sender may write it at once) or closed for appends
        # (False), which wakes it only if that batch's broker can take a request now;
        # `wake_sender_short` when records begin to wait for memory (every batch is sendable
        # then), which wakes it unless no broker can take a request.
        self.wake_sender: Callable[[], None] = lambda: None
        self.wake_sender_for: Callable[[ProducerBatch, bool], None] = lambda batch, opened: None
        self.wake_sender_short: Callable[[], None] = lambda: None
        # The partitions with batches queued, least recently drained first (drain() moves a
        # partition it took from to the end: no partition starves). Empty queues are removed.
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        # Bytes of each partition's batches as first sent, for the partitioner (KIP-794).
        self._drained_bytes: dict[TopicPartition, int] = {}
        # No queued batch's delivery deadline is earlier than this (a new batch's is later
        # than every queued one's; a batch queued again lowers it): expire() and
        # next_expiry() scan the queues only once it has passed, not every round (with
        # 10,000 partitions queued, two scans per round were a tenth of the CPU).
        self._expiry_floor = float("inf")
        # The last walk of ready() found no batch sendable before this loop time, and every
        # partition's leader known in `_quiet_topics` (the cluster's metadata then): until
        # then a round need not walk the queues again. A batch closed, queued behind another
        # or put back for a retry clears it; a new batch's linger end lowers it. (A batch
        # that reaches batch_size exactly, and gets no record that would close it, waits
        # out its linger.) At 10,000 partitions a walk was ~1 ms, and a lingering producer
        # runs a round per new batch.
        self._quiet_until = 0.0
        self._quiet_topics: object = None
        # While the sender sleeps, the loop time its next round is due by (0.0: not known; see
        # sender_sleeps): a batch opened alone in its partition that lingers past it need not
        # wake the sender (`_lingers_unwoken`).
        self._round_by = 0.0
        # Each topic's metadata last found with every partition led (see all_led).
        self._led: dict[str, TopicInfo] = {}
        # Per topic, each partition's open batch and its writer, for appends without a tuple
        # key (the intake's fast path and enqueue_many's compiled loop read them too). A
        # batch leaves these lists when it is closed for appends or leaves its queue.
        self.appendable: dict[str, tuple[list[ProducerBatch | None],
                                         list[BatchWriter | None]]] = {}
        self._batches_created = 0
        # Batches closed full, and their bytes, since the sender last took batches for a
        # request: enqueue_many gives the sender its turn once they make a request's worth
        # (`request_worth_closed`), so that it writes several batches a request, not one.
        self._closed_since_drain = self._closed_bytes_since_drain = 0
        self._max_request_size = config.max_request_size
        self.incomplete: set[ProducerBatch] = set()
        # The flush() calls waiting, each for the batches incomplete when it was called.
        self._flushes: list[_Flush] = []
        # Final outcomes, for Producer.metrics() (a split batch counts as its pieces).
        self.records_sent = self.records_failed = self.batches_sent = 0
        self._flushing = 0
        self.closing = False
        self._on_delivery_error = config.on_delivery_error
        self._log_failure = LogEvery(log, logging.WARNING, 10)
        # A loop of `await send()`, one record at a time, waits linger_ms for each: when the
        # producer was idle but for a lone record that waited out its linger, and the next
        # record comes as it is acknowledged, that is the loop; said once.
        self._lone_acked_at: float | None = None
        self._lone_in_a_row = 0
        self._said_linger_bound = self._linger == 0

    @property
    def memory_available(self) -> int:
        """Bytes of buffer_memory no batch (nor a record's turn in line) holds."""
        return self._pool.available

    @memory_available.setter
    def memory_available(self, value: int) -> None:
        self._pool.available = value

    # -- appending (the hot path) ----------------------------------------------------------

    def try_append(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                   value: bytes | None, headers: bytes | None) -> ProducerBatch | None:
        """Append to the partition's open batch if it has room (the record is then the
        batch's last); None means a new batch is needed, or records wait in line for memory
        (`waiting`): they go first. `headers` come encoded."""
        if self.line:
            return None
        return self._append_to_open(topic, partition, timestamp, key, value, headers)

    def _append_to_open(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                        value: bytes | None, headers: bytes | None) -> ProducerBatch | None:
        open_ = self.appendable.get(topic)
        if open_ is not None and partition < len(open_[0]):
            batch = open_[0][partition]
            if batch is not None and batch.writer.try_append(timestamp, key, value, headers):
                return batch  # (the writer grew its reservation if it had to and could)
        return None

    def open_batches(self, topic: str, partitions: int) -> tuple[list[ProducerBatch | None],
                                                                  list[BatchWriter | None]]:
        """Each partition's open batch and its writer (None where there is none): the lists
        the accumulator keeps up to date, as enqueue_many's loop reads them."""
        open_ = self.appendable.get(topic)
        if open_ is None:
            open_ = self.appendable[topic] = ([], [])
        batches, writers = open_
        self._round_by = 0.0  # (a topic new, or grown: its leaders not looked at)
        if len(batches) != partitions:  # the topic grew (or, never in Kafka, shrank)
            del batches[partitions:], writers[partitions:]
            batches.extend([None] * (partitions - len(batches)))
            writers.extend([None] * (partitions - len(writers)))
        return open_

    def close_for_appends(self, topic: str, partition: int) -> bool:
        """A record did not fit in the partition's open batch: take no more appends into it
        (the Java client's closeForRecordAppends) and let the sender ship it now. False if
        the partition had no open batch."""
        open_ = self.appendable.get(topic)
        batch = open_[0][partition] if open_ is not None and partition < len(open_[0]) else None
        if open_ is None or batch is None:
            return False
        open_[0][partition] = open_[1][partition] = None
        batch.full = True
        self._closed_since_drain += 1
        self._closed_bytes_since_drain += batch.writer.size
        self._quiet_until = 0.0
        self.wake_sender_for(batch, False)
        return True

    def request_worth_closed(self, partitions: int, brokers: int) -> bool:
        """Whether the batches closed full since the sender last took any make a request's
        worth for each of `brokers`: as many as the topic's `partitions` (a request takes one
        batch a partition), or max_request_size bytes a broker."""
        return self._closed_since_drain >= partitions or \
            self._closed_bytes_since_drain >= brokers * self._max_request_size

    def batch_memory(self, record_size: int) -> int:
        """The memory a new batch reserves for its first record (it reserves more as it
        grows): _FIRST_RESERVE, at most batch_size, or the record's size if larger."""
        return max(self._first_reserve, record_size)

    @property
    def waiting(self) -> int:
        """How many records wait in line for memory (new records then join the line, and
        the sender sends batches at once, ignoring linger)."""
        return len(self.line)

    def _short_of_memory(self) -> bool:
        """A record in line waits for memory that is not there: then every batch goes now,
        lingered or not, to free it. A turn enqueue() holds after closing a full batch
        (turn_soon), and the records behind it that the free memory covers, are no shortage:
        sending their batches early made batches of one record each under load."""
        for waiting in self.line:
            if not waiting.granted:
                return waiting.memory - self._gathered > self._pool.available
        return False

    def reserve_now(self, size: int) -> bool:
        """Reserve a new batch's memory if it is free and nobody waits for memory before us."""
        if self.closing:
            raise closed_while_buffering()
        if self.line or size > self._pool.available:
            return False
        self._pool.available -= size
        return True

    def release(self, size: int) -> None:
        """Give back memory (of a finished batch, or reserved for one not opened after all)."""
        self._pool.available += size
        if self.line and not self._serving:  # (serving: its loop sees the memory)
            self._serve_line()

    def join_line(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                  value: bytes | None, headers: bytes | None, memory: int, partitions: int,
                  for_send: bool) -> WaitingRecord:
        """Put a record in line for memory: `memory` is what a new batch for it takes.
        `for_send`: send()'s future follows it (set `waiting.record` at once); else
        (enqueue()) await `waiting.turn`, then call append_granted(), or leave_line() if
        that was cancelled."""
        if self.closing:
            raise closed_while_buffering()
        waiting = WaitingRecord(topic, partition, timestamp, key, value, headers, memory,
                                partitions, self._loop.time() + self._max_block, self._pending)
        if not for_send:
            waiting.turn = self._loop.create_future()
        line = self.line
        line.append(waiting)
        self._pool.paused = True
        if not line[0].granted:
            if self._line_timer is None:
                self._line_timer = self._loop.call_at(waiting.deadline, self._expire_line)
            if line[0] is waiting:
                self.wake_sender_short()  # memory is short from now: every batch may go
        elif len(line) == 2 and self._short_of_memory():
            self.wake_sender_short()
        return waiting

    def turn_soon(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                  value: bytes | None, headers: bytes | None, memory: int,
                  partitions: int) -> WaitingRecord:
        """enqueue() closed a full batch and reserved `memory` (the line was empty): head the
        line, its turn coming after one loop turn, so that the sender ships the closed batch
        first (a loop of enqueue() that never waits keeps the broker busy rather than filling
        buffer_memory) and the records that come meanwhile wait behind it. Then as
        join_line's: await `waiting.turn`, then append_granted() or leave_line()."""
        waiting = WaitingRecord(topic, partition, timestamp, key, value, headers, memory,
                                partitions, self._loop.time() + self._max_block, self._pending)
        turn = waiting.turn = self._loop.create_future()
        waiting.granted = True
        self.line.append(waiting)
        self._pool.paused = True
        self._loop.call_soon(_grant, turn)
        return waiting

    def append_granted(self, waiting: WaitingRecord) -> ProducerBatch:
        """enqueue()'s turn came (it holds its memory): append its record, and serve on."""
        if not waiting.granted:  # failed since (the producer is closing, say)
            assert waiting.failure is not None
            raise waiting.failure
        waiting.granted = False
        assert self.line[0] is waiting
        self.line.popleft()
        self._pool.paused = bool(self.line)
        try:
            try:
                batch = self._append_to_open(waiting.topic, waiting.partition,
                                             waiting.timestamp, waiting.key, waiting.value,
                                             waiting.headers)
                if batch is None:
                    self.close_for_appends(waiting.topic, waiting.partition)
            except BaseException:
                self._pool.available += waiting.memory
                raise
            if batch is None:  # (the opening gives the memory back if it queues nothing)
                batch = self.open_batch(waiting.topic, waiting.partition, waiting.timestamp,
                                        waiting.key, waiting.value, waiting.headers,
                                        waiting.memory, waiting.partitions)
            else:
                self._pool.available += waiting.memory  # it fit in a batch opened meanwhile
        except BaseException:
            self._serve_line()
            raise
        delta = batch.writer.count - 1
        try:
            self._serve_line()
        except BaseException as exc:  # (a Ctrl-C in the wake of an opening for the line)
            # The record is buffered all the same: named for its caller (see take_kept).
            vars(exc).update({KEPT_BATCH: batch, _KEPT_DELTA: delta})
            raise
        return batch

    def leave_line(self, waiting: WaitingRecord) -> None:
        """enqueue() was cancelled in line: nothing of it stays (unless its turn had come,
        the line drops it when it gets there)."""
        if waiting.granted:
            waiting.granted = False
            self.line.popleft()
            self.release(waiting.memory)
            self._pool.paused = bool(self.line)

    def _serve_line(self) -> None:
        """Append the waiting records, in order, while memory allows: their batches may
        grow (the pool unpaused), since they are the records the line holds back others for."""
        self._serving = True
        self._pool.paused = False
        try:
            self._serve_in_order()
        finally:  # (also after a Ctrl-C in an opening's wake: the line still times out)
            self._serving = False
            line = self.line
            self._pool.paused = bool(line)
            if not line:
                self._pool.available += self._gathered
                self._gathered = 0
            elif self._line_timer is None and not line[0].granted:
                self._line_timer = self._loop.call_at(line[0].deadline, self._expire_line)

    def _serve_in_order(self) -> None:
        line = self.line
        while line:
            waiting = line[0]
            if waiting.granted:
                return  # enqueue()'s turn: the line goes on once its task appended
            if waiting.abandoned():
                line.popleft()
                continue
            queued_by_send = waiting.record is not None
            batch = self._append_to_open(waiting.topic, waiting.partition, waiting.timestamp,
                                         waiting.key, waiting.value, waiting.headers
                                         ) if queued_by_send else None
            if batch is None:
                need = waiting.memory - self._gathered
                if need > self._pool.available:
                    self._gathered += self._pool.available
                    self._pool.available = 0
                    return
                self._pool.available -= need
                self._gathered = 0
                if not queued_by_send:
                    assert waiting.turn is not None
                    waiting.granted = True
                    waiting.turn.set_result(None)
                    return
                line.popleft()
                closed = False
                try:
                    self.close_for_appends(waiting.topic, waiting.partition)
                    closed = True
                    batch = self.open_batch(waiting.topic, waiting.partition,
                                            waiting.timestamp, waiting.key, waiting.value,
                                            waiting.headers, waiting.memory,
                                            waiting.partitions)
                except BaseException as exc:
                    kept = take_kept(exc)
                    if kept is not None:  # queued, then the wake raised: the record is in it
                        waiting.append_to(*kept)
                        raise
                    if not closed:  # refused (the opening gave its memory back)
                        self._pool.available += waiting.memory
                    waiting.fail(exc)
                    if isinstance(exc, Exception):
                        continue
                    raise
            else:
                line.popleft()
            waiting.append_to(batch, batch.writer.count - 1)

    def _expire_line(self) -> None:
        """Fail the records that waited max_block_ms (the head's deadline comes first)."""
        self._line_timer = None
        line, now = self.line, self._loop.time()
        while line and line[0].deadline <= now and not line[0].granted:
            waiting = line.popleft()
            waiting.fail(BufferExhaustedError(
                f"waited {self._max_block * 1000:.0f} ms (max_block_ms) for {waiting.memory} "
                f"bytes of buffer memory ({self._pool.available + self._gathered} of "
                f"{self.buffer_memory} free): the broker is not keeping up or is "
                "unreachable; slow down, or raise buffer_memory or max_block_ms"))
        self._serve_line()  # (what the expired head gathered goes to the next; a new timer)

    def _fail_line(self, exc: BaseException) -> None:
        line, self.line = self.line, deque()
        self._pool.paused = False
        if self._line_timer is not None:
            self._line_timer.cancel()
            self._line_timer = None
        self._pool.available += self._gathered
        self._gathered = 0
        for waiting in line:
            if waiting.granted:
                self._pool.available += waiting.memory
            waiting.fail(exc)

    def begin_closing(self) -> None:
        """No new batch from now on: every record waiting for memory fails at once (as the
        Java client's BufferPool.close() wakes its waiters)."""
        self.closing = True
        self._fail_line(closed_while_buffering())

    def open_batch(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                   value: bytes | None, headers: bytes | None, reserved: int,
                   partitions: int) -> ProducerBatch:
        """Open a batch, with `reserved` bytes of memory already reserved for it, for a record
        that try_append() found no room for; the record is its first. (The opening itself is
        the speed-up's `_open`; `open_new` is the short path of a record placed by compiled
        code, the Appender or enqueue_many's loop, with no Python frame.) Raising, it has
        queued nothing and given `reserved` back (but for what a KeyboardInterrupt in the
        sender's wake leaves: the batch, queued, named on the interrupt: take_kept)."""
        if self.closing:
            self._pool.available += reserved
            raise closed_while_buffering()
        batch: ProducerBatch = self._open(topic, partition, timestamp, key, value, headers,
                                          reserved, partitions, self._loop.time())
        return batch

    # -- the sender's side -----------------------------------------------------------------

    def ready(self, cluster: Cluster, now: float) -> tuple[set[int], float, set[str]]:
        """Brokers with a sendable batch, seconds until the next batch may become sendable,
        and the topics with a batch for a partition whose leader is unknown."""
        ready: set[int] = set()
        next_check = float("inf")
        unknown_leader: set[str] = set()
        drain_all = self._flushing > 0 or self.closing or self._short_of_memory()
        topics = cluster.topics
        if not drain_all and self._quiet_until - now > _CLOCK_SLACK and \
                topics is self._quiet_topics:
            return ready, self._quiet_until - now, unknown_leader
        brokers = len(cluster.brokers)
        last_topic: str | None = None
        leaders: Sequence[int] = ()
        for (topic, partition), queue in self._batches.items():
            if topic is not last_topic:  # (cluster.leader_for, inline: this is per partition)
                info = topics.get(topic)
                leaders, last_topic = (info.leaders if info is not None else ()), topic
            leader = leaders[partition] if partition < len(leaders) else -1
            if leader < 0:
                unknown_leader.add(topic)
                continue
            if leader in ready:
                continue
            batch = queue[0]
            if batch.retry_at - now > _CLOCK_SLACK:
                next_check = min(next_check, batch.retry_at - now)
                continue
            if not (drain_all or batch.full or len(queue) > 1
                    or batch.writer.size >= self._batch_size or batch.attempts > 0):
                linger_left = batch.created + self._linger - now
                if linger_left > _CLOCK_SLACK:
                    next_check = min(next_check, linger_left)
                    continue
            ready.add(leader)
            if len(ready) == brokers and self.all_led(topics):
                break  # the rest would only be skipped (flushing 10,000 partitions: ~1 ms)
        quiet = not (ready or unknown_leader or drain_all)
        self._quiet_until = now + next_check if quiet else 0.0
        self._quiet_topics = topics
        return ready, next_check, unknown_leader

    def lingers(self, batch: ProducerBatch) -> bool:
        """Whether `batch`, just opened, makes nothing sendable before its linger ends: no
        flush, not closing, nobody in line for memory (ready()'s drain_all), the only batch
        of its partition, smaller than batch_size. The sender then need not run a round for
        it, only by its linger's end (a round for it wrote nothing: enqueue() opens a busy
        partition's next batch a loop turn after closing the full one)."""
        if self._flushing or self.closing or self.line or \
                batch.writer.size >= self._batch_size or self._linger <= _CLOCK_SLACK:
            return False
        queue = self._batches.get((batch.topic, batch.partition))
        return queue is not None and len(queue) == 1 and queue[0] is batch

    def sender_sleeps(self, round_by: float, topics: dict[str, TopicInfo]) -> None:
        """The sender sleeps, its next round due by loop time `round_by` (0.0: it is awake,
        or inf: no round due). Batches opened meanwhile that only linger past then need not
        wake it (`_lingers_unwoken`: Sender.wake_for would find nothing to do for them),
        as long as no flush is on and every partition of the topics produced to has a
        leader (`topics`: the cluster's metadata; a batch whose leader is unknown wakes it).
        A topic appended to for the first time since, or grown, lists its batches anew
        (open_batches), which ends this till the next sleep."""
        self._round_by = round_by if round_by and not self._flushing and \
            self._linger > _CLOCK_SLACK and self.all_led(topics) else 0.0

    def all_led(self, topics: dict[str, TopicInfo]) -> bool:
        """Whether every partition of every topic appended to has a leader: then no queued
        batch's leader is unknown, and ready() may stop once every broker is ready. A
        topic's metadata (a TopicInfo, immutable) found led is remembered: a scan of its
        leaders per round was 4% of the instructions at 10,000 partitions."""
        led = self._led
        for topic in self.appendable:
            info = topics.get(topic)
            if info is None:
                return False
            if led.get(topic) is not info:
                if not info.leaders or min(info.leaders) < 0:
                    return False
                led[topic] = info
        return True

    def queued(self, topic: str, partition: int) -> int:
        """Batches waiting for the partition (the adaptive partitioner's load)."""
        queue = self._batches.get((topic, partition))
        return len(queue) if queue is not None else 0

    def drained_bytes(self, topic: str, partition: int) -> int:
        """Bytes of the partition's batches sent so far (uncompressed)."""
        return self._drained_bytes.get((topic, partition), 0)

    def has_queued(self) -> bool:
        """Whether some batch waits to be drained."""
        return bool(self._batches)

    def has_queued_for(self, cluster: Cluster, node: int) -> bool:
        """Whether some batch waits to be drained to broker `node` (a scan: for the rare
        broker the sender watches as unavailable, KIP-794)."""
        return any(cluster.leader_for(*tp) == node for tp in self._batches)

    def drain(self, cluster: Cluster, nodes: Iterable[int], max_request_size: int,
              now: float) -> dict[int, list[ProducerBatch]]:
        """Take at most one batch per partition for each broker, up to `max_request_size`,
        partitions least recently drained first (so no partition starves). One pass over
        the queued partitions, which stops once every broker's request is full: a request
        costs the batches it takes, not every partition queued (10,000 of them, 1 MiB
        requests of 2 KiB batches: each drain scanned 10,000 to take 450). The pass and the
        takings are the speed-up's `_drain`, one call (~490 batches a request there)."""
        drained: dict[int, list[ProducerBatch]] = self._drain(cluster.topics, nodes,
                                                              max_request_size, now)
        if drained:
            self._closed_since_drain = self._closed_bytes_since_drain = 0
        return drained

    def drain_lone(self, batch: ProducerBatch) -> bool:
        """Drain `batch` if it is the only batch queued and may go now (a send on an idle
        producer at linger_ms=0); False, taking nothing, otherwise."""
        tp = (batch.topic, batch.partition)
        queue = self._batches.get(tp)
        if len(self._batches) != 1 or queue is None or len(queue) != 1 or \
                self._take_sendable(tp, queue) is None:
            return False
        self._closed_since_drain = self._closed_bytes_since_drain = 0
        return True

    def _unlist(self, batch: ProducerBatch) -> None:
        """The batch left its queue: it is no longer its partition's open batch."""
        batches, writers = self.appendable.get(batch.topic) or ([], [])
        if batch.partition < len(batches) and batches[batch.partition] is batch:
            batches[batch.partition] = writers[batch.partition] = None

    def reenqueue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a failed batch back for a retry."""
        batch.attempts += 1
        batch.retry_at = retry_at
        self._insert(batch)

    def split(self, batch: ProducerBatch) -> None:
        """The broker refused `batch` as too large: queue its records again as two batches,
        each half of them, in its place (its sequence numbers and delivery deadline, its
        memory shared out). Halving ends, at worst, in batches of one record, which then fail
        as too large on their own. (The Java client splits into batch_size pieces, which
        cannot get under a broker limit that is itself below batch_size.)"""
        [read] = read_batches(batch.writer.encode())
        records = read.records
        half = len(records) // 2
        pieces = []
        for index, part in enumerate((records[:half], records[half:])):
            writer = BatchWriter(part[0].timestamp, sys.maxsize)  # no limit: they were one batch
            for record in part:
                writer.try_append(record.timestamp, record.key, record.value,
                                  encode_headers(record.headers) if record.headers else None)
            reserved = batch.reserved // 2 if index == 0 else batch.reserved - batch.reserved // 2
            piece = ProducerBatch(batch.number + (index,), batch.topic, batch.partition, writer,
                                  self._loop.create_future(), batch.created, batch.deadline,
                                  reserved)
            piece.full = True  # sendable now
            pieces.append(piece)
        batch.split_into(pieces)
        if self._txn is not None:
            self._txn.sequencer.split(batch, pieces)
        self.incomplete.discard(batch)
        for flush in self._flushes:  # (its pieces take its place among what flush() awaits)
            if batch.number[0] <= flush.upto:
                flush.left += len(pieces) - 1
        for piece in pieces:
            self.incomplete.add(piece)
            self._insert(piece)

    def _insert(self, batch: ProducerBatch) -> None:
        """Queue a batch in creation order among its partition's queued ones (the Java
        client's insertInSequenceOrder: batches are numbered in creation order)."""
        queue = self._batches.setdefault((batch.topic, batch.partition), deque())
        self._quiet_until = 0.0
        if batch.deadline < self._expiry_floor:
            self._expiry_floor = batch.deadline
        index = 0
        while index < len(queue) and queue[index].number < batch.number:
            index += 1
        queue.insert(index, batch)

    def expire(self, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches whose delivery_timeout_ms has passed."""
        if now < self._expiry_floor:
            return []
        expired: list[ProducerBatch] = []
        floor = float("inf")
        for queue in self._batches.values():
            while queue and queue[0].deadline <= now:
                batch = queue.popleft()
                self._unlist(batch)
                batch.writer.seal()
                expired.append(batch)
            if queue and queue[0].deadline < floor:
                floor = queue[0].deadline
        self._expiry_floor = floor
        if expired:  # rare: the common round copies nothing (the order is kept)
            self._batches = {tp: queue for tp, queue in self._batches.items() if queue}
        return expired

    def next_expiry(self) -> float:
        """When expire() may next find something (no later than a queued batch's deadline)."""
        return self._expiry_floor

    def finish(self, batch: ProducerBatch) -> None:
        """A batch has its final outcome: return its memory, and count it."""
        if batch not in self.incomplete:
            return
        failure = batch.future.exception()
        if failure is None:
            self.finish_acked([batch])
        else:
            self.incomplete.discard(batch)
            if self._flushes:
                self._flushed((batch,), batch.number[0])
            self.release(batch.reserved)
            self.records_failed += batch.record_count
            self._observer.failed(batch.topic, batch.partition, batch.record_count, failure)
            self._report_failure(batch, failure)

    def finish_acked(self, batches: list[ProducerBatch]) -> None:
        """Batches acknowledged (complete() called on each), most often those of one
        response: return their memory and count them, in one call rather than one per batch
        (at 10,000 partitions a batch may hold a single record)."""
        incomplete = self.incomplete
        # (Those that had their outcome already, expired in flight, are not counted again.)
        counted, freed, records, newest = take_acked(batches, incomplete)
        if not counted:
            return
        if self._flushes:
            self._flushed(counted, newest)
        self.release(freed)
        self.records_sent += records
        self.batches_sent += len(counted)
        now = self._loop.time()
        self._observer.acked(counted, now)
        # (Only the last can have left nothing incomplete: the lone record of an idle loop.)
        last = counted[-1]
        if not self._said_linger_bound and last.writer.count == 1 and not incomplete \
                and now - last.created >= self._linger:
            self._lone_acked_at = now

    def _wake_failed(self, exc: Exception) -> None:
        """Opening a batch woke the sender (`wake_sender_for`), and that raised: a bug of
        ours, reported through the loop's exception handler. The record is in the batch,
        queued, so the call that opened it does not fail (the Appender would append it
        again: uvloop's timer Handle once made records land twice); the sender is woken
        plainly."""
        self._loop.call_exception_handler({
            "message": "aioproducer: waking the sender for a new batch failed (a bug: please "
                       "report it); the record is buffered and the sender woken",
            "exception": exc})
        self.wake_sender()

    def _count_linger_bound(self, now: float) -> None:
        """A new batch: does it follow at once on a lone record that waited out its linger?"""
        acked_at, self._lone_acked_at = self._lone_acked_at, None
        if acked_at is None or now - acked_at > _AT_ONCE:
            self._lone_in_a_row = 0
            return
        self._lone_in_a_row += 1
        if self._lone_in_a_row == _LINGER_BOUND_AFTER:
            self._said_linger_bound = True
            log.warning(
                "%d records in a row were each sent alone after waiting linger_ms=%d for "
                "others, the next one coming as the last was acknowledged: a loop of "
                "`await send()` one record at a time is bound by linger_ms (at most ~%d "
                "records/s). Buffer many before waiting (enqueue() then flush(), or "
                "asyncio.gather over send()), or set linger_ms=0 for one-at-a-time latency. "
                "(Said once.)", _LINGER_BOUND_AFTER, round(self._linger * 1000),
                round(1 / self._linger))

    def _report_failure(self, batch: ProducerBatch, failure: BaseException) -> None:
        """Say that records failed for good, to the on_delivery_error hook if there is one,
        else in the log: those nobody awaits would fail unseen."""
        hook = self._on_delivery_error
        if hook is None:
            if not isinstance(failure, TransactionAbortedError):  # (the user's own abort)
                self._log_failure("%d record(s) for %s-%d failed: %r", batch.record_count,
                                  batch.topic, batch.partition, failure)
            return
        try:
            hook(failure, batch.topic, batch.partition, batch.record_count)
        except Exception:
            log.exception("on_delivery_error raised (for %r)", failure)

    def fail_all(self, exc: BaseException, unsent_only: bool = False) -> None:
        """Fail every queued batch (the producer is closing without flushing, or broken), or
        with `unsent_only` those never drained (a failed transaction: what it sent is retried
        until it has an outcome, as in the Java client's abortUndrainedBatches)."""
        queues, self._batches = self._batches, {}
        for tp, queue in queues.items():
            for batch in queue:
                if unsent_only and batch.attempts > 0:
                    self._batches.setdefault(tp, deque()).append(batch)
                    continue
                self._unlist(batch)
                batch.writer.seal()
                if self._txn is not None:
                    self._txn.batch_failed(batch, exc)
                batch.fail(exc)
                self.finish(batch)

    async def flush(self, timeout: float | None) -> int:
        """Make every batch buffered now sendable (linger no longer counts) and wait until
        each is acknowledged or failed, at most `timeout` seconds; how many are still
        pending then. One future for the call, resolved when the count of its batches that
        left `incomplete` reaches them all, not a callback per batch (asyncio.wait over
        10,000 batches' futures was 8% of enqueue_many's CPU at 10,000 partitions)."""
        if not self.incomplete:
            return 0
        # Every incomplete batch (a piece too) is numbered no later than the last one made.
        flush = _Flush(self._batches_created, len(self.incomplete), self._loop.create_future())
        self._flushes.append(flush)
        self._flushing += 1
        self.wake_sender()
        try:
            await asyncio.wait((flush.done,), timeout=timeout)
        finally:
            self._flushing -= 1
            self._flushes.remove(flush)
        if flush.left <= 0:
            return 0
        # The batches made before the call without an outcome: a split one's pieces, one.
        return len({batch.number[0] for batch in self.incomplete
                    if batch.number[0] <= flush.upto})

    def _flushed(self, batches: Sequence[ProducerBatch], newest: int) -> None:
        """`batches` left `incomplete`: count them off the flush() calls that wait for them
        (each of them all, when none was made after the call: `newest`, their latest
        number[0])."""
        for flush in self._flushes:
            upto = flush.upto
            flush.left -= len(batches) if newest <= upto else \
                sum(1 for batch in batches if batch.number[0] <= upto)
            if flush.left <= 0 and not flush.done.done():
                flush.done.set_result(None)

    async def settled(self) -> None:
        """Wait until every batch buffered now is acknowledged or failed."""
        pending = [batch.future for batch in self.incomplete]
        if pending:
            await asyncio.wait(pending)

    def oldest_pending_s(self) -> float:
        """How long the oldest batch without an outcome has been open (0.0 with none): it
        grows while no broker takes them (a readiness signal for services)."""
        if not self.incomplete:
            return 0.0
        return self._loop.time() - min(batch.created for batch in self.incomplete)

    def fail_unresolved(self, exc: BaseException) -> None:
        """Fail every batch still without an outcome, queued or not: the sender is gone, and
        nothing else would resolve them (a batch it was preparing when it failed, say)."""
        self._fail_line(exc)
        self.fail_all(exc)
        for batch in list(self.incomplete):
            batch.fail(exc)
            self.finish(batch)

    def release_topic(self, topic: str) -> bool:
        """Forget a topic (its metadata is being dropped); False, forgetting nothing, while
        it has batches queued or in flight. (A record waiting for memory holds nothing: its
        batch fetches the topic's metadata again.)"""
        if any(batch.topic == topic for batch in self.incomplete):
            return False
        self.appendable.pop(topic, None)
        self._led.pop(topic, None)
        for tp in [tp for tp in self._drained_bytes if tp[0] == topic]:
            del self._drained_bytes[tp]
        return True


class _Flush:
    """A flush() call's wait: for the batches numbered up to `upto` still incomplete, `left`
    of them (a split batch's pieces in its place); `done` once none is."""

    __slots__ = ("upto", "left", "done")

    def __init__(self, upto: int, left: int, done: asyncio.Future[None]) -> None:
        self.upto, self.left, self.done = upto, left, done


def _grant(turn: asyncio.Future[None]) -> None:
    if not turn.done():  # (else cancelled: leave_line() gave its place up)
        turn.set_result(None)


def delivery_timeout_error(batch: ProducerBatch, timeout_ms: int, cause: str) -> DeliveryTimeoutError:
    return DeliveryTimeoutError(
        f"{batch.record_count} record(s) for {batch.topic}-{batch.partition} not acknowledged "
        f"within delivery_timeout_ms={timeout_ms} ({cause})")


def closed_while_buffering() -> ProducerClosedError:
    """No new batch once close() began: nothing may wait for the stopped sender (the Java
    client's "producer closed while send in progress")."""
    return ProducerClosedError("the producer is closing: this record was not buffered (nor sent)")


def take_kept(exc: BaseException) -> tuple[ProducerBatch, int] | None:
    """The batch holding a caller's record, and its offset delta there, when `exc` struck
    after the record was buffered (not an Exception: a KeyboardInterrupt in the sender's
    wake, after an opening queued its batch, see `_open`; or in serving the line after
    append_granted placed it), or None: the record is buffered, and its caller counts it.
    Taken off `exc`, so that no caller further up counts it as its own."""
    named = vars(exc)
    kept: ProducerBatch | None = named.pop(KEPT_BATCH, None)
    delta: int = named.pop(_KEPT_DELTA, 0)  # (an opening's: its first record)
    return None if kept is None else (kept, delta)
