"""The Sender: one task that moves batches from the accumulator to the brokers.

Each round, as in the Java client's `Sender.runOnce`: refresh metadata if due, ask the
accumulator which brokers have sendable batches, make sure their connections are up and have
room in flight, drain one request's worth per broker, expire what waited too long, and write
one ProduceRequest per broker. It never waits for a response: the response's callback
completes the batches (or re-queues them with backoff, splits one the broker found too large,
or fails them) and wakes the task.
Between rounds it sleeps until the earliest deadline (linger, retry backoff, delivery
timeout, reconnect, metadata age) or until something wakes it; not at all while a broker it
wrote to has room for another request and a batch queued for it is sendable (lingering ones
are not). A connection whose write buffer holds more than a request's worth unsent
(`paused`) has no room either, whatever acks is: at acks=0, where nothing else bounds
what is written, its records wait in the accumulator, inside buffer_memory, so enqueue()
feels a slow broker as at acks=1.

A batch opened or closed wakes it only if its broker can take a request now (`wake_for`):
one that cannot (paused, in-flight full, throttled, re-authenticating) wakes the sender
itself when it can (its resume, a response, the throttle's timer, the re-authentication's
end), and that round takes what queued meanwhile. Against a broker slower than the producer
a wake-up per batch was a round that wrote nothing (300k records of 1 KB in 16 KiB batches:
~21,500 rounds, ~18,200 of them empty, now ~3,400). A batch opened that only lingers sets
the timer for its linger's end instead: the round it woke did only that.

The requests are written last, after the round's bookkeeping and the next wake-up are set:
the broker a write wakes can be scheduled on this process's core, and then it waits until
the event loop goes idle. How much that costs depends on the host (on the benchmark VM, 20 us
of work after a write added 13 to 37 us to the round trip, from one run to another).

At linger_ms=0, a new batch that is the only one queued, for a broker with nothing in flight
(an idle producer: a service sending now and then), is written at once by the `send()` that
opened it: no loop turn and no round, which on an idle CPU are most of a send's own cost.
Under load something is in flight, and rounds gather what queued meanwhile as before.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from .._speedups import produce_parts, settle_produce
from ..client.backoff import exponential_backoff
from ..errors import (
    BrokerOutOfOrderSequenceNumberError,
    DuplicateSequenceNumberError,
    KafkaConnectionError,
    KafkaError,
    MessageTooLargeError,
    OutOfOrderSequenceNumberError,
    TransactionAbortedError,
    UnknownProducerIdError,
    UnknownTopicIdError,
    error_for_code,
)
from ..protocol.messages import PRODUCE_TOPIC_IDS_FROM, ApiKey
from .accumulator import RecordAccumulator, delivery_timeout_error
from .batch import ProducerBatch, run_watchers_of
from .observer import Observer
from .transactions import TransactionManager, TxnState

if TYPE_CHECKING:
    from ..client.cluster import Cluster
    from ..client.connection import BrokerConnection
    from ..config import ProducerConfig

# How long a producer nobody closes goes on sending what it holds (`Sender.finish`), as a
# BlockingProducer left open at interpreter exit is closed within 10 s; or less, its
# delivery_timeout_ms, past which its records would fail anyway.
FINISH_WITHIN = 10.0
# The transaction states in which a producer nobody closes aborts its transaction (ABORTING:
# an abort cut short).
_ABORT_AT_FINISH = frozenset({TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR,
                              TxnState.ABORTING})

log = logging.getLogger(__name__)


class Sender:
    """Runs `run()` as one task per producer; `wake()` makes it look again at once."""

    def __init__(self, config: ProducerConfig, cluster: Cluster,
                 accumulator: RecordAccumulator, txn: TransactionManager | None,
                 observer: Observer) -> None:
        self._config = config
        self._cluster = cluster
        self._accumulator = accumulator
        self._txn = txn
        self._observer = observer
        self._loop = asyncio.get_running_loop()
        self._wakeup: asyncio.Future[None] | None = None
        # Kept from round to round and moved only to an earlier time: an early wake-up costs
        # a round that finds nothing to do, a timer per round costs every round. Its time is
        # kept beside it: uvloop's call_at() for a time under half a millisecond away gives a
        # plain Handle (call_soon), which has no when().
        self._timer: asyncio.Handle | None = None
        self._timer_when = float("inf")
        self._in_flight: dict[ProducerBatch, None] = {}  # ordered set of batches on the wire
        # Requests of this round, written when it has done everything else (with the bytes of
        # their record batches).
        self._unwritten: list[tuple[BrokerConnection, dict[str, Any], list[ProducerBatch],
                                    int]] = []
        # (earliest deadline, number, batches) of each request, or of what remains of one
        # after an expiry; may hold batches no longer in flight. One entry per request, not
        # per batch: at 10,000 partitions a batch may hold one record.
        self._expiry_heap: list[tuple[float, int, list[ProducerBatch]]] = []
        self._expiry_numbers = itertools.count()
        self._acks = config.acks
        self._max_in_flight = config.max_in_flight_requests_per_connection
        # The connections written to this round that have room for another request, while
        # batches are queued: the next round follows at once unless each is paused by then.
        self._again: list[BrokerConnection] = []
        self._send_at_once = config.linger_ms == 0 and config.acks != 0
        self._linger = config.linger_ms / 1000
        self._retry_backoff = config.retry_backoff_ms / 1000
        self._retry_backoff_max = config.retry_backoff_max_ms / 1000
        self.running = True
        # Loop time by which a producer nobody will close sends what it holds (`finish`).
        self.finish_by: float | None = None
        # Whether it took the cancel of its loop's end to finish (`_finish_when_cancelled`).
        self.finishing_as_loop_ends = False
        # For its report: records incomplete when finish() began, and the accumulator's
        # count of acknowledged records then (what is acknowledged after is of those).
        self.held_at_finish = self.acknowledged_before_finish = 0
        self.finish_within = min(FINISH_WITHIN, config.delivery_timeout_ms / 1000)
        # A transaction open at finish() is aborted, one whose commit was under way is
        # committed (`finish`): whether one was (until its EndTxn has an outcome,
        # `_ending_txn` too), how many buffered records of an aborted one failed unsent, why
        # a commit under way could not be (a record of it failed: aborted instead), and
        # why the EndTxn failed, if it did.
        self.aborted_at_finish = self.committing_at_finish = self._ending_txn = False
        self.failed_at_abort = 0
        self.commit_failure: BaseException | None = None
        self.txn_end_failure: BaseException | None = None
        self._still_finishing: asyncio.TimerHandle | None = None  # (`_say_still_finishing`)
        # Per broker, since when it has had a batch ready to send and taken none: one that
        # waited so for partitioner_availability_timeout_ms gets no new keyless records
        # (KIP-794). A broker leaves it when it takes a batch (in a round or by `_send_now`)
        # or has none queued any more (they expired or failed).
        self._waiting_since: dict[int, float] = {}
        self._availability_timeout = config.partitioner_availability_timeout_ms / 1000
        # For Producer.metrics():
        self.bytes_sent = self.requests = self.responses = self.retries = self.splits = 0
        self.latency = 0.0  # seconds from write to response, summed over the responses
        self.throttle_time_ms = self.throttle_time_max_ms = 0  # KIP-219, summed and largest
        self.redirects = 0  # batches retried at once at a leader a response named (KIP-951)

    def wake(self) -> None:
        """Run a round soon."""
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def wake_for(self, batch: ProducerBatch, opened: bool) -> None:
        """`batch` was opened (`opened`: its linger starts, or the one before it is full) or
        closed for appends: run a round soon, unless its broker cannot take a request now
        (that round would write nothing; the broker's unblocking wakes the sender, and the
        round then takes this batch), or it was opened and only lingers (that round would
        only set a timer for its linger's end: set here). At linger_ms=0 a new batch may be
        written at once."""
        wakeup = self._wakeup
        if wakeup is None or wakeup.done():
            return
        leader = self._cluster.leader_for(batch.topic, batch.partition)
        if self._blocked(leader):
            return
        if opened:
            txn = self._txn
            # (A round fetches a missing producer id, asks for an unknown leader's metadata,
            # and fails what a transaction's error makes unsendable.)
            if leader >= 0 and (txn is None or txn.has_producer_id and txn.error is None) \
                    and self._accumulator.lingers(batch):
                self._wake_by(batch.created + self._linger)
                return
            if self._send_at_once and self._send_now(batch):
                return
        wakeup.set_result(None)

    def wake_unless_blocked(self) -> None:
        """Run a round soon unless every broker's connection is blocked: records wait for
        memory, which makes every queued batch sendable, lingering or not."""
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done() and \
                not all(self._blocked(node) for node in self._cluster.brokers):
            wakeup.set_result(None)

    def _blocked(self, node: int) -> bool:
        """Whether broker `node`'s connection can take no Produce request now, and will wake
        the sender when it can: paused (its resume), in-flight full (a response),
        re-authenticating (its end), throttled (the timer this sets for the throttle's end).
        Not a broker without a connection, nor one whose leader is unknown (-1)."""
        conn = self._cluster.connected(node) if node >= 0 else None  # (bootstrap ids are < 0)
        if conn is None:
            return False
        if conn.paused or conn.in_flight_produce >= self._max_in_flight or conn.reauthenticating:
            return True
        if conn.throttled_until > self._loop.time():
            self._wake_by(conn.throttled_until)
            return True
        return False

    async def run(self) -> None:
        """Rounds until told to stop and nothing is left (the producer closes it), or, after
        `finish()`, until its deadline."""
        try:
            while self.running or self._accumulator.incomplete or self._ending_txn:
                now = self._loop.time()
                if self.finish_by is not None and now >= self.finish_by:
                    if self._ending_txn:  # (its records had no outcome by then: no EndTxn)
                        self.txn_end_failure = TimeoutError(
                            "its records were not all acknowledged in time")
                    return
                try:
                    if not self.running and not self._accumulator.incomplete:
                        await self._end_transaction_at_finish()  # (after finish())
                        continue
                    delay = self._run_once(now)
                    if self.finish_by is not None:  # (a response may never come to wake it)
                        delay = min(delay, self.finish_by - now)
                    await self._sleep(now, delay)
                except asyncio.CancelledError:
                    if not self._finish_when_cancelled():
                        raise
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self._still_finishing is not None:
                self._still_finishing.cancel()

    def finish(self) -> None:
        """Send what is buffered, for at most `finish_within` seconds, then end: for a
        producer that will not be closed (collected unclosed, or open as its event loop
        ends). An open transaction is never committed so: it is aborted, as close() does
        (its buffered records fail), rather than left to hold back read_committed consumers
        until its coordinator's timeout (transaction_timeout_ms). One whose commit was under
        way (commit_transaction() called: the commit is decided) is committed once its
        records are sent, or aborted if one of them failed."""
        if self.finish_by is not None:
            return
        accumulator = self._accumulator
        self.held_at_finish = sum(b.record_count for b in accumulator.incomplete)
        self.acknowledged_before_finish = accumulator.records_sent
        self.running = False
        self.finish_by = self._loop.time() + self.finish_within
        accumulator.begin_closing()
        txn = self._txn
        if txn is not None and txn.is_transactional and txn.state in _ABORT_AT_FINISH:
            txn.start_commit_or_abort(commit=False)
            accumulator.fail_all(TransactionAbortedError(
                "the producer ended without close() with this record's transaction open: the "
                "transaction was aborted (never committed)"))
            self.failed_at_abort = self.held_at_finish - sum(
                b.record_count for b in accumulator.incomplete)
            self.aborted_at_finish = self._ending_txn = True
        elif txn is not None and txn.is_transactional and txn.state is TxnState.COMMITTING:
            # (Its own task, cancelled by the loop's end, or cancelled with the rest of a
            # producer collected once the sender ends, would leave it open.)
            self.committing_at_finish = self._ending_txn = True
        self.wake()

    async def _end_transaction_at_finish(self) -> None:
        """EndTxn for the transaction finish() ends, once its records sent have outcomes,
        before finish()'s deadline: the abort, or the commit under way (an abort if a record
        of it failed: a commit is refused then)."""
        txn = self._txn
        assert txn is not None and self.finish_by is not None
        commit = self.committing_at_finish
        try:
            async with asyncio.timeout_at(self.finish_by):
                while True:  # (twice at most: a commit turns into an abort once)
                    if commit and txn.state is TxnState.ABORTABLE_ERROR:
                        self.commit_failure, commit = txn.error, False
                        txn.start_commit_or_abort(commit=False)
                    try:
                        await txn.end_transaction(commit=commit)
                        break
                    except KafkaError:
                        # (The commit's own EndTxn, waited for above, failed for good: the
                        # transaction can only be aborted now.)
                        if not (commit and txn.state is TxnState.ABORTABLE_ERROR):
                            raise
        except (KafkaError, TimeoutError) as exc:
            # (If the state moved on, it ended: what failed came after, a new epoch's
            # InitProducerId.)
            if txn.state in _ABORT_AT_FINISH or txn.state is TxnState.COMMITTING:
                self.txn_end_failure = exc
        self._ending_txn = False

    def _finish_when_cancelled(self) -> bool:
        """Cancelled from outside the producer while it is open (asyncio.run() cancels every
        task left as its loop ends: `await producer.close()` was never called, its buffered
        records would be lost), or after `finish()` (a producer collected unclosed, then the
        loop's end): finish instead, once. Not when the producer stops it itself (close(), a
        forked child: `running` is False, and no `finish()`)."""
        task = asyncio.current_task()
        if task is None or self.finishing_as_loop_ends or \
                not (self.running or self.finish_by is not None):
            return False
        self.finishing_as_loop_ends = True
        task.uncancel()
        if self.running:
            self.finish()
        self._still_finishing = self._loop.call_later(1.0, self._say_still_finishing)
        return True

    def _say_still_finishing(self) -> None:
        """The loop's end has waited a second for the records of a producer nobody closed
        (a broker down or slow): say why the script does not end yet, and how to end it (a
        Ctrl-C now interrupts the loop's wait: asyncio.run() handles only the first)."""
        held = sum(b.record_count for b in self._accumulator.incomplete)
        if self.finish_by is None or not (held or self._ending_txn):
            return
        log.warning("the event loop ends with a producer open (never closed): it %s for up to "
                    "%.0f s more (Ctrl-C leaves now%s)",
                    f"sends the {held} record(s) it holds" if held else
                    "commits its transaction" if self.committing_at_finish else
                    "aborts its open transaction",
                    max(self.finish_by - self._loop.time(), 0), ", losing them" if held else "")

    async def _sleep(self, now: float, delay: float) -> None:
        """Set the next wake-up, `delay` after the round's `now`, write the round's requests,
        then wait, unless a connection written to has room for another request (`_again`)
        and the writes left it unpaused: then only for a loop turn. (From `now`, not the
        clock after the round's work: uvloop's clock moves in whole milliseconds, and a tick
        during the round set every linger's timer a millisecond late.)"""
        if delay <= 0:
            self._write_requests()
            await asyncio.sleep(0)
            return
        self._wakeup = wakeup = self._loop.create_future()
        self._wake_by(now + delay)
        try:
            self._write_requests()
            for conn in self._again:
                # (A write that filled the transport's buffer paused its connection: at
                # acks=0, where nothing is in flight, the next round found no room.)
                if not conn.paused:
                    break
            else:
                self._accumulator.sender_sleeps(self._timer_when, self._cluster.topics)
                await wakeup
                return
        finally:
            self._wakeup = None
            self._accumulator.sender_sleeps(0.0, {})
        await asyncio.sleep(0)  # room for another request, and batches queued

    def _wake_by(self, when: float) -> None:
        """Make sure a round runs by loop time `when` (inf: no deadline)."""
        if when >= self._timer_when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)
        self._timer_when = when
        if self._wakeup is not None:  # asleep: the batches lingering past `when` need not wake it
            self._accumulator.sender_sleeps(when, self._cluster.topics)

    def _on_timer(self) -> None:
        self._timer, self._timer_when = None, float("inf")
        self.wake()

    def _send_now(self, batch: ProducerBatch) -> bool:
        """Write a batch opened at linger_ms=0 while the sender sleeps, if it is the only one
        queued and its broker has nothing in flight; False leaves it to a round."""
        if self._txn is not None and self._txn.is_transactional:
            return False  # transactions add partitions in rounds
        cluster = self._cluster
        conn = cluster.ready_connection(cluster.leader_for(batch.topic, batch.partition))
        if conn is None or conn.in_flight_produce or conn.throttled_until > self._loop.time() \
                or conn.reauthenticating or conn.paused or not self._accumulator.drain_lone(batch):
            return False
        if self._waiting_since:
            self._waiting_since.pop(conn.node_id, None)  # it takes data
        self._prepare_produce(conn, [batch])
        self._wake_by(self._next_in_flight_expiry())  # also drops acknowledged batches' entries
        self._write_requests()
        return True

    def _run_once(self, now: float) -> float:
        """One round; returns how long to sleep before the next (unless woken sooner)."""
        cluster, accumulator = self._cluster, self._accumulator
        next_wake = cluster.maybe_refresh(now)
        txn = self._txn
        if txn is not None:
            if txn.is_transactional:
                txn.maybe_add_partitions()
                if txn.error is not None and accumulator.has_queued():
                    self._fail_unsendable(txn)
            elif not txn.has_producer_id:
                task = txn.ensure_producer_id()
                if task is not None:
                    task.add_done_callback(self._producer_id_done)

        # Without a producer id every batch waits for one, and its arrival wakes the sender
        # (TransactionManager.on_change): a round then looks for no sendable batch, only for
        # a partition whose leader to ask for. (At 10,000 partitions the round a flush()
        # woke before InitProducerId's answer walked every queue to take nothing.)
        held = txn is not None and not txn.has_producer_id
        ready: set[int]
        unknown_leader: set[str]
        if held and accumulator.all_led(cluster.topics):
            ready, next_check, unknown_leader = set(), float("inf"), set()
        else:
            ready, next_check, unknown_leader = accumulator.ready(cluster, now)
        next_wake = min(next_wake, next_check)
        if unknown_leader:
            cluster.want(unknown_leader)
            next_wake = min(next_wake, cluster.maybe_refresh(now))

        sendable: dict[int, BrokerConnection] = {}
        waiting = self._waiting_since if self._availability_timeout else None
        for node in ready:
            if waiting is not None and node not in waiting:
                waiting[node] = now
            conn = cluster.ready_connection(node)
            if conn is None:
                backoff = cluster.backoff_remaining(node)
                if backoff:
                    next_wake = min(next_wake, backoff)
            elif conn.throttled_until > now:
                next_wake = min(next_wake, conn.throttled_until - now)
            elif conn.reauthenticating or conn.paused:
                pass  # (its end, or its write buffer draining, wakes the sender)
            elif conn.in_flight_produce < self._max_in_flight:
                sendable[node] = conn
        again = self._again
        again.clear()
        if sendable and not held:
            drained = accumulator.drain(cluster, sendable, self._config.max_request_size, now)
            limit = self._max_in_flight
            for node, batches in drained.items():
                if waiting:
                    waiting.pop(node, None)
                conn = sendable[node]
                self._prepare_produce(conn, batches)
                if conn.in_flight_produce + 1 < limit:
                    again.append(conn)

        self._expire(now)
        if waiting:
            # Not ready this round: still waiting while it has batches queued (lingering, or
            # in retry backoff); with none, it waits for nothing.
            for node in [n for n in waiting if n not in ready]:
                if not accumulator.has_queued_for(cluster, node):
                    del waiting[node]
        next_wake = min(next_wake, accumulator.next_expiry() - now, self._next_in_flight_expiry() - now)
        if again:
            next_wake = min(next_wake, self._keep_sendable(again, now))
        # With room left on a broker written to and a batch still sendable to it (`again`),
        # the next round follows at once, as the Java sender polls with no timeout while it
        # has data to send: for the batches this request had no place for (a partition's
        # next one; a request's worth more). Else, with batches of a request each (records
        # of 1 MB), only a response woke the sender: one request in flight. At acks=0 no
        # response wakes it at all.
        return max(next_wake, 0.0)

    def _keep_sendable(self, again: list[BrokerConnection], now: float) -> float:
        """Keep in `again` the connections written to that a queued batch is sendable on
        now; return the seconds until another may become sendable. A round that followed
        at once for batches still lingering wrote nothing: at linger_ms > 0 a busy
        partition's next batch, which send() opens in the call that closes the full one,
        is one. (This round's first ready() skipped the partitions of brokers it had found
        ready: their lingers and backoffs count from here.)"""
        accumulator = self._accumulator
        if not accumulator.has_queued():
            again.clear()
            return float("inf")
        ready, next_check, _ = accumulator.ready(self._cluster, now)
        again[:] = [conn for conn in again if conn.node_id in ready]
        return next_check

    def node_unavailable(self, node: int) -> bool:
        """Whether `node` has had batches ready to send, and taken none, for longer than
        partitioner_availability_timeout_ms (never, with the timeout 0)."""
        since = self._waiting_since.get(node)
        return since is not None and \
            self._loop.time() - since > self._availability_timeout

    def _fail_unsendable(self, txn: TransactionManager) -> None:
        """After a fatal error nothing queued will be sent, after an abortable one nothing not
        yet sent (its partition may never be added): fail those records now with the cause,
        not at delivery_timeout_ms (the Java Sender's maybeAbortBatches)."""
        assert txn.error is not None
        if txn.state is TxnState.FATAL_ERROR:
            self._accumulator.fail_all(txn.error)
        elif txn.state is TxnState.ABORTABLE_ERROR:
            self._accumulator.fail_all(txn.error, unsent_only=True)

    def _producer_id_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("cannot obtain a producer id: %s", exc)
            self._accumulator.fail_all(exc)  # type: ignore[arg-type]
        self.wake()

    # -- produce requests ------------------------------------------------------------------

    def _prepare_produce(self, conn: BrokerConnection, batches: list[ProducerBatch]) -> None:
        """Encode the batches into a request for `_write_requests()`; they count as in flight.
        (The speed-up's produce_parts does it in one call, and an idempotent producer's
        sequencer is told in one call: at 10,000 partitions a request holds ~490 batches.)"""
        txn = self._txn
        topic_data, size, earliest, waited, waited_most = produce_parts(
            batches, self._in_flight, self._loop.time(), txn is not None,
            txn is not None and txn.is_transactional)
        if txn is not None:
            txn.sequencer.sent_all(batches)
        heapq.heappush(self._expiry_heap, (earliest, next(self._expiry_numbers), batches))
        self._observer.queue_time.observe_many(len(batches), waited, waited_most)
        body = {
            "transactional_id": txn.transactional_id if txn is not None else None,
            "acks": self._acks,
            "timeout_ms": self._config.request_timeout_ms,
            "topic_data": topic_data,
        }
        self._unwritten.append((conn, body, batches, size))

    def _write_requests(self) -> None:
        requests, self._unwritten = self._unwritten, []
        expect_response = self._acks != 0
        txn = self._txn if self._txn is not None and self._txn.is_transactional else None
        for conn, body, batches, size in requests:
            try:
                # (a transaction's Produce is v12+ only in a V2 transaction)
                version = txn.version_for(conn, ApiKey.PRODUCE) if txn is not None else \
                    conn.version_for(ApiKey.PRODUCE)
                names = None
                if version >= PRODUCE_TOPIC_IDS_FROM:
                    names = self._name_topics_by_id(body["topic_data"])
                    if names is None:
                        version = PRODUCE_TOPIC_IDS_FROM - 1
                conn.send(ApiKey.PRODUCE, body, partial(
                    self._on_produce_response, conn, batches, names, time.perf_counter())
                    if expect_response else None, version=version)
            except KafkaError as exc:  # the connection closed between ready() and now
                self._on_request_failed(batches, exc)
                continue
            self.requests += 1
            self.bytes_sent += size
            if not expect_response:
                for batch in batches:
                    self._complete(batch, -1, -1)

    def _name_topics_by_id(self, topic_data: list[dict[str, Any]]) -> dict[bytes, str] | None:
        """Give each topic of a request its id (Produce v13+) as the metadata has it now, and
        return the names by id, which its response is read with (not the metadata by then:
        the topic may be recreated meanwhile, KAFKA-19397); None if one has no id known."""
        names = {}
        for topic in topic_data:
            info = self._cluster.topics.get(topic["name"])
            if info is None or info.topic_id is None:
                return None
            topic["topic_id"] = info.topic_id
            names[info.topic_id] = topic["name"]
        return names

    def _on_produce_response(self, conn: BrokerConnection, batches: list[ProducerBatch],
                             names: dict[bytes, str] | None, written: float,
                             response: dict[str, Any] | None,
                             exc: BaseException | None) -> None:
        latency = time.perf_counter() - written
        try:
            self._observer.responded(conn.node_id, latency, exc)
            if exc is not None:
                self._cluster.request_update()
                self._on_request_failed(batches, exc)
            else:
                assert response is not None
                self._settle(conn, batches, names, latency, response)
        except Exception as bug:
            self._response_not_handled(conn, batches, bug)
        # Another round only if it has work: batches queued behind this request (or put back
        # for a retry), or closing. Otherwise it would run before the woken tasks resume.
        if not self.running or self._accumulator.has_queued():
            self.wake()

    def _settle(self, conn: BrokerConnection, batches: list[ProducerBatch],
                names: dict[Any, str] | None, latency: float, response: dict[str, Any]) -> None:
        """Each batch of a produce response completed, retried or failed as it was answered."""
        self.responses += 1
        self.latency += latency
        throttle_ms = response.get("throttle_time_ms", 0)
        if throttle_ms > 0:
            self._throttled(conn, throttle_ms)
        # The batches answered without an error are completed in one compiled call,
        # their records' callbacks in one loop callback: at 10,000 partitions a response
        # answers ~490 batches. An idempotent producer's are, and its sequencer told in
        # one call, only when every batch is: an error's handling (a retry, a new
        # producer id) sees the partition's acknowledgements in order, as before.
        if names is not None:  # answered by topic id (v13+): an id not asked for, None
            for topic in response["responses"]:
                topic["name"] = names.get(topic["topic_id"])
        txn = self._txn
        try:
            acked, rest = settle_produce(batches, response["responses"], self._in_flight,
                                         run_watchers_of, txn is not None)
        except Exception:
            self._settled_in_part(batches)
            raise
        try:
            if txn is not None and acked:
                txn.acked_all(acked)
            for batch, p in rest:
                if p is None:
                    self._retry_or_fail(batch, KafkaConnectionError(
                        f"{conn.address} left {batch.topic}-{batch.partition} out of its "
                        "produce response"))
                elif p["error_code"] == 0:  # (in a response with an error: idempotent)
                    self._complete(batch, p["base_offset"], p["log_append_time_ms"], acked)
                else:
                    self._on_partition_error(conn, batch, p,
                                             response.get("node_endpoints", ()))
        finally:  # (acknowledged, whatever else failed: their memory and counts settled)
            if acked:
                self._accumulator.finish_acked(acked)

    def _settled_in_part(self, batches: list[ProducerBatch]) -> None:
        """settle_produce raised (a bug of ours) part way: the batches it took out of flight
        and completed are finished here (their memory returned, their records' callbacks
        run); one it took out and could not complete goes back in flight, for the caller to
        fail with the rest (_response_not_handled)."""
        for batch in batches:
            if batch in self._in_flight or batch not in self._accumulator.incomplete:
                continue
            if batch.future.done():
                self._accumulator.finish(batch)
                self._loop.call_soon(run_watchers_of, [batch])
            else:
                self._in_flight[batch] = None

    def _response_not_handled(self, conn: BrokerConnection, batches: list[ProducerBatch],
                              bug: Exception) -> None:
        """Handling a produce response raised (a bug of ours): its batches not settled yet
        fail now with an error saying so, rather than wait in flight for their delivery
        timeout with nothing said."""
        unsettled = [batch for batch in batches if batch in self._in_flight]
        log.error("aioproducer: handling the produce response from %s raised (a bug: please "
                  "report it); its %d batch(es) not settled yet fail with it", conn.address,
                  len(unsettled), exc_info=bug)
        error = KafkaError(
            f"the produce response from {conn.address} could not be handled ({bug!r}, a bug "
            "in aioproducer: please report it); the broker may have written the record")
        error.__cause__ = bug
        for batch in unsettled:
            self._fail(batch, error)

    def _throttled(self, conn: BrokerConnection, throttle_ms: int) -> None:
        """A quota was exceeded: counted, and while the connection holds back (KIP-219, its
        throttled_until) the sender drains no batch for that broker; a round when it ends."""
        self.throttle_time_ms += throttle_ms
        self.throttle_time_max_ms = max(self.throttle_time_max_ms, throttle_ms)
        self._observer.throttled(conn.node_id, throttle_ms)
        if conn.throttled_until > self._loop.time():
            self._wake_by(conn.throttled_until)

    def _on_partition_error(self, conn: BrokerConnection, batch: ProducerBatch,
                            p: dict[str, Any], endpoints: list[dict[str, Any]]) -> None:
        too_large = p["error_code"] == MessageTooLargeError.error_code
        if too_large and batch.record_count > 1:
            self._split(batch)
            return
        where = f"producing to {batch.topic}-{batch.partition}"
        if p.get("error_message"):
            where += f": {p['error_message']}"
        elif too_large:
            where += (f": a record of {batch.writer.size} bytes (in its own batch) is over the "
                      "broker's message.max.bytes or the topic's max.message.bytes")
        if p["error_code"] == UnknownTopicIdError.error_code:  # (Produce v13+)
            where += (": the topic was deleted (a topic made again under its name has another "
                      "id; the producer looks it up and writes there)")
        elif p["error_code"] == BrokerOutOfOrderSequenceNumberError.error_code and \
                self._cluster.recreated.get(batch.topic, -1.0) >= batch.created:
            # (Kafka 4.4 refuses it from a Transactions V2 producer, which must begin a
            # partition at sequence 0, and takes any sequence from others)
            where += (": the topic was deleted and made again after this batch was made, and "
                      "the new topic's partition does not take this producer's sequence")
        if p.get("record_errors"):
            # Produce v8+: which records made the broker refuse the batch (KIP-467). As in the
            # Java client, the whole batch fails; the message names the culprits.
            where += _record_errors(p["record_errors"])
        exc = error_for_code(p["error_code"], where)
        moved = False  # to a leader the response named: retried there at once
        if exc.refresh_metadata:
            leader = p.get("current_leader")
            moved = leader is not None and self._cluster.update_leader(
                batch.topic, batch.partition, leader, endpoints, conn.node_id)
            if moved:
                self.redirects += 1
            else:
                self._cluster.request_update()
        txn = self._txn
        if txn is not None:
            if isinstance(exc, DuplicateSequenceNumberError):
                # The broker already has this batch (an earlier attempt was written); Apache
                # Kafka answers with its original offset, some brokers with -1.
                if batch.attempts == 0:  # there was no earlier attempt: the broker is wrong
                    log.warning("%s, sent once, was answered as a duplicate: the broker "
                                "may not have written it", batch)
                self._complete(batch, p["base_offset"], p["log_append_time_ms"])
                return
            if isinstance(exc, (OutOfOrderSequenceNumberError, UnknownProducerIdError)):
                if not txn.sequencer.is_expected_next(batch):
                    # An older batch of this partition failed or is being retried: this one
                    # was refused only because of the gap. Retry it in order.
                    self._retry(batch, exc)
                    return
                txn.sequence_state_lost(exc)
                if txn.is_transactional:
                    self._fail(batch, exc)  # the transaction must abort
                else:
                    self._retry(batch, exc)  # numbered afresh under a new producer id
                return
        self._retry_or_fail(batch, exc, at_once=moved)

    def _split(self, batch: ProducerBatch) -> None:
        """The broker's limit (message.max.bytes, or the topic's max.message.bytes) is below
        this batch: send its records in smaller batches instead, as the Java client does. Not
        a retry: it does not count against `retries`."""
        self._in_flight.pop(batch, None)
        if self._txn is not None:
            self._txn.sequencer.resolved(batch)
        if batch.done:
            return  # expired while in flight; its outcome was already reported
        self.splits += 1
        if batch.parent is None:  # once per batch the user filled, not per piece
            log.warning("%s of %d bytes refused as too large by the broker: sending it in "
                        "smaller batches (lower batch_size, or raise the topic's "
                        "max.message.bytes, to save the round trips)", batch, batch.writer.size)
        self._accumulator.split(batch)

    def _on_request_failed(self, batches: list[ProducerBatch], exc: BaseException) -> None:
        for batch in batches:
            self._retry_or_fail(batch, exc)

    def _retry_or_fail(self, batch: ProducerBatch, exc: BaseException,
                       at_once: bool = False) -> None:
        retriable = isinstance(exc, KafkaError) and exc.retriable
        if retriable and batch.attempts < self._config.retries:
            self._retry(batch, exc, at_once)
        else:
            self._fail(batch, exc)

    def _retry(self, batch: ProducerBatch, exc: BaseException, at_once: bool = False) -> None:
        """Queue the batch again, after retry backoff unless `at_once` (its partition's new
        leader is known: nothing to wait for, KIP-951)."""
        self._in_flight.pop(batch, None)
        if self._txn is not None:
            self._txn.sequencer.resolved(batch)
            self._txn.sequencer.renumber_on_reset(batch)
        if batch.done:
            return  # expired while in flight; its outcome was already reported
        now = self._loop.time()
        if now >= batch.deadline:
            self._fail(batch, delivery_timeout_error(
                batch, self._config.delivery_timeout_ms, "still failing when retries ran out of time"))
            return
        self._accumulator.reenqueue(batch, now if at_once else now + exponential_backoff(
            self._retry_backoff, batch.attempts, self._retry_backoff_max))
        self.retries += 1
        self._observer.retried(batch.topic, batch.partition, batch.record_count, exc)

    def _complete(self, batch: ProducerBatch, base_offset: int, log_append_time: int,
                  acked: list[ProducerBatch] | None = None) -> None:
        """The batch is acknowledged; its memory and counts are settled now, or, given the
        list `acked`, by the caller once for all of a response's batches."""
        self._in_flight.pop(batch, None)
        if self._txn is not None:
            self._txn.sequencer.resolved(batch)
            self._txn.acked(batch)
        batch.complete(base_offset, log_append_time)
        if acked is None:
            self._accumulator.finish(batch)
        else:
            acked.append(batch)

    def _fail(self, batch: ProducerBatch, exc: BaseException) -> None:
        self._in_flight.pop(batch, None)
        if self._txn is not None:
            self._txn.sequencer.resolved(batch)
            self._txn.batch_failed(batch, exc)
        batch.fail(exc)
        self._accumulator.finish(batch)

    # -- expiry ----------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        timeout_ms = self._config.delivery_timeout_ms
        for batch in self._accumulator.expire(now):
            cause = "waited for a retry" if batch.attempts else "waited in the buffer"
            why = self._cluster.unreachable_leader(batch.topic, batch.partition)
            self._fail(batch, delivery_timeout_error(
                batch, timeout_ms, f"{cause}: {why}" if why else cause))
        if self._next_in_flight_expiry() > now:
            return
        heap, in_flight = self._expiry_heap, self._in_flight
        expired: dict[ProducerBatch, None] = {}
        while heap and heap[0][0] <= now:
            _, _, batches = heapq.heappop(heap)
            left = [batch for batch in batches if batch in in_flight and batch not in expired]
            for batch in left:
                if batch.deadline <= now:
                    expired[batch] = None
            left = [batch for batch in left if batch not in expired]
            if left:  # in flight still, within their time
                heapq.heappush(heap, (min(batch.deadline for batch in left),
                                      next(self._expiry_numbers), left))
        for batch in sorted(expired, key=_deadline_order):
            # Its request is still out (so it stays in flight for the transaction manager's
            # ordering); whatever the broker answers later is ignored.
            exc = delivery_timeout_error(batch, timeout_ms, "no response in time")
            in_flight.pop(batch)
            if self._txn is not None:
                self._txn.batch_failed(batch, exc)
            batch.fail(exc)
            self._accumulator.finish(batch)

    def _next_in_flight_expiry(self) -> float:
        """No batch on the wire has an earlier deadline than this (a request's earliest:
        entries of requests with no batch there any more are dropped as they come to the
        top, one membership test per batch rather than a heap entry per batch)."""
        heap, in_flight = self._expiry_heap, self._in_flight
        while heap and in_flight.keys().isdisjoint(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def fail_in_flight(self, exc: BaseException) -> None:
        """Closing without waiting: fail what is on the wire (its outcome stays unknown)."""
        for batch in list(self._in_flight):
            self._fail(batch, exc)


def _deadline_order(batch: ProducerBatch) -> tuple[float, tuple[int, ...]]:
    """Expired batches fail in order of deadline, then creation."""
    return batch.deadline, batch.number


def _record_errors(errors: list[dict[str, Any]], shown: int = 5) -> str:
    parts = [f"record {e['batch_index']}" + (f" ({e['batch_index_error_message']})"
                                              if e.get("batch_index_error_message") else "")
             for e in errors[:shown]]
    more = f" and {len(errors) - shown} more" if len(errors) > shown else ""
    return f"; invalid: {', '.join(parts)}{more} (offset deltas in the batch)"
