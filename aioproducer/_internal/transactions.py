"""The producer id and epoch (idempotence), and the transaction: its state table and requests.

Idempotence: the producer id and epoch come from InitProducerId (here); the sequence numbers
are kept by `Sequencer` (sequencing.py). When the sequence state is lost (an unknown producer
id, a real gap, a failed batch with nothing after it to show that the broker has it) an
idempotent producer starts a new session (KIP-360) and numbers its batches afresh: Apache
Kafka answers its InitProducerId with a new producer id (the Java client bumps the epoch of
its id itself; Tansu fences a bumped epoch it did not hand out); a transactional one gets a
new epoch when it aborts.

Transactions (KIP-98): the transaction coordinator, found with FindCoordinator, hands out the
producer id and epoch for a `transactional_id` (fencing older producers with the same id),
learns each partition before its first batch (AddPartitionsToTxn) and each consumer group whose
offsets join the transaction (AddOffsetsToTxn, then TxnOffsetCommit to the group coordinator),
and writes the COMMIT or ABORT markers on EndTxn; a group's committed offsets are read back
with OffsetFetch (what a restarted exactly-once writer committed). Every request here is an
awaitable handler on the same per-broker connections the produce requests use.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterable, Mapping, TypeVar

from ..client.backoff import Backoff
from ..client.cluster import Broker
from ..client.tasks import TaskSet
from ..errors import (
    ERROR_CLASSES,
    BrokerError,
    ClusterAuthorizationFailedError,
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    CorruptMessageError,
    BrokerInvalidRecordError,
    InvalidProducerEpochError,
    InvalidTimestampError,
    InvalidTxnStateError,
    KafkaError,
    MessageTooLargeError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    ProducerClosedError,
    ProducerFailedError,
    ProducerFencedError,
    RecordListTooLargeError,
    RequestTimeoutError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    TransactionFailedError,
    TransactionStateError,
    UnsupportedForMessageFormatError,
    UnsupportedVersionError,
    error_for_code,
)
from ..protocol.messages import TXN_V2_FROM, ApiKey
from .arguments import OffsetCommit
from .batch import ProducerBatch, TopicPartition
from .sequencing import Sequencer

if TYPE_CHECKING:
    from ..client.cluster import Cluster
    from ..client.connection import BrokerConnection
    from ..config import ProducerConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


_GROUP, _TRANSACTION = 0, 1  # FindCoordinator key types

# A coordinator's answers that say it moved: it is looked up again before the retry. (Its
# other retriable answers, a coordinator still loading or a transaction still ending, are
# retried with it.)
_COORDINATOR_MOVED = (CoordinatorNotAvailableError, NotCoordinatorError)
# AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS while the last transaction's markers are
# still being written (the first add of each V1 transaction after a commit, as a rule):
# retried after 5 ms, doubling, rather than retry_backoff_ms, as the Java client retries it
# early (its ADD_PARTITIONS_RETRY_BACKOFF_MS, 20 ms). The markers take a few ms on a local
# broker: 5 ms made 10-record transactions 2.5x as fast as 20 ms (benchmarks/transactions.py).
_CONCURRENT_RETRY_S = 0.005
# From a coordinator an old epoch means another producer took ours, as in the Java client.
_FENCED = (InvalidProducerEpochError, ProducerFencedError)

# Failures after which a transactional producer cannot go on, as in the Java client (its
# TransactionManager.maybeTransitionToErrorState); any other failure of a batch makes the
# transaction abortable.
_FATAL = (ProducerFencedError, ClusterAuthorizationFailedError,
          TransactionalIdAuthorizationFailedError, UnsupportedVersionError)
# A coordinator's answers add these (the Java client's request handlers).
_FATAL_FROM_COORDINATOR = _FATAL + (InvalidTxnStateError, UnsupportedForMessageFormatError)
# A leader's answers to a batch that it checks before appending anything (its size, its
# timestamps, its records, the principal's permission): a batch refused so was never written,
# and the new session it leaves behind (its sequence numbers unused) is routine, said at
# DEBUG as the Java client bumps its epoch without a word; the record's error says the rest.
_REFUSED_UNWRITTEN = (MessageTooLargeError, RecordListTooLargeError, InvalidTimestampError,
                      BrokerInvalidRecordError, TopicAuthorizationFailedError)


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


# The transaction state table: where each state may go. Every change goes through
# TransactionManager._transition; a fatal error may come in any state (the latest is kept).
_ALLOWED = {state: targets | {TxnState.FATAL_ERROR} for state, targets in {
    TxnState.UNINITIALIZED: {TxnState.INITIALIZING},
    TxnState.INITIALIZING: {TxnState.READY, TxnState.UNINITIALIZED},
    TxnState.READY: {TxnState.IN_TRANSACTION, TxnState.INITIALIZING},
    TxnState.IN_TRANSACTION: {TxnState.COMMITTING, TxnState.ABORTING, TxnState.ABORTABLE_ERROR},
    TxnState.COMMITTING: {TxnState.READY, TxnState.ABORTABLE_ERROR},
    TxnState.ABORTING: {TxnState.READY, TxnState.INITIALIZING},
    TxnState.ABORTABLE_ERROR: {TxnState.ABORTING, TxnState.ABORTABLE_ERROR},
    TxnState.FATAL_ERROR: set(),
}.items()}
# What to do when a call does not fit the state (the README promises it is said).
_WHAT_TO_DO = {
    TxnState.UNINITIALIZED: "call init_transactions() (or start()) first",
    TxnState.INITIALIZING: "wait for init_transactions() to finish",
    TxnState.READY: "no transaction is open: call begin_transaction() first",
    TxnState.IN_TRANSACTION: "a transaction is open: commit_transaction() or "
                             "abort_transaction() it first",
    TxnState.COMMITTING: "a commit is under way, or was cut short: call "
                         "commit_transaction() (again) to learn or finish it",
    TxnState.ABORTING: "an abort is under way, or was cut short: call abort_transaction() "
                       "(again) to learn or finish it",
    TxnState.ABORTABLE_ERROR: "the transaction failed: call abort_transaction()",
    TxnState.FATAL_ERROR: "the producer cannot continue: close it",
}


class TransactionManager:
    """The producer id and epoch (InitProducerId), what to do when sequencing fails, and
    (with a transactional id) the transaction: its state and its coordinator requests."""

    def __init__(self, config: ProducerConfig, cluster: Cluster, tasks: TaskSet) -> None:
        self._config = config
        self._cluster = cluster
        self._tasks = tasks  # the producer's: what this spawns, the producer's close() awaits
        self.transactional_id: str | None = config.transactional_id
        self.sequencer = Sequencer(config.max_in_flight_requests_per_connection)
        self._init_task: asyncio.Task[None] | None = None  # InitProducerId's, either kind
        self._bump_from: tuple[int, int] | None = None  # (id, epoch) whose epoch to bump
        # Transactions only:
        self.state = TxnState.UNINITIALIZED
        self.error: KafkaError | None = None  # why we are in ABORTABLE_ERROR or FATAL_ERROR
        self._partitions: set[TopicPartition] = set()  # added to the current transaction
        self._pending: set[TopicPartition] = set()  # to add before their batches may go
        self._add_task: asyncio.Task[None] | None = None
        self._coordinators: dict[tuple[int, str], int] = {}
        self._needs_epoch_bump = False
        self._offsets_added = False
        self._ending: asyncio.Future[None] | None = None  # an end_transaction() under way
        # Transactions V2 (KIP-890 part 2) for the current transaction: decided when it
        # begins, from the cluster's finalized transaction.version, and kept until it ends;
        # V2 only if it was on when InitProducerId gave our epoch (`_v2_at_init`): a
        # coordinator refuses V2 requests (INVALID_TXN_STATE) from a producer initialized
        # under V1, measured on Kafka 4.4 after an upgrade of the feature.
        self.txn_v2 = False
        self._v2_at_init = False
        self.transaction_version = 0  # what metrics() shows: 2 (V2) or 1, once one began
        self.on_change: Callable[[], None] = lambda: None  # wakes the sender

    @property
    def producer_id(self) -> int:
        return self.sequencer.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.sequencer.producer_epoch

    @property
    def has_producer_id(self) -> bool:
        return self.sequencer.has_producer_id

    @property
    def is_transactional(self) -> bool:
        return self.transactional_id is not None

    # -- idempotent producer id ------------------------------------------------------------

    def ensure_producer_id(self) -> asyncio.Task[None] | None:
        """Idempotent producers: start fetching a producer id unless there is one or a fetch
        is running; returns the task only when it starts one. Transactional producers get
        theirs from init_transactions()."""
        if self.has_producer_id or self.is_transactional:
            return None
        if self._init_task is not None and not self._init_task.done():
            return None
        self._init_task = self._tasks.spawn(
            self._init_idempotent(), f"aioproducer-init-producer-id-{self._config.client_id}")
        return self._init_task

    def close(self) -> None:
        """The producer is closing: stop the requests running on their own (an idempotent
        producer's InitProducerId retries for as long as no broker answers)."""
        for task in (self._init_task, self._add_task):
            if task is not None:
                task.cancel()

    def init_request(self) -> dict[str, Any]:
        """InitProducerId for an idempotent producer: after lost sequence state, ask to keep
        the producer id with the next epoch (KIP-360's request); otherwise (or if the broker
        refused that, as Tansu does) a new producer id. Apache Kafka's coordinator answers an
        idempotent producer with a new producer id at epoch 0 either way (it bumps epochs
        for transactional ids only: TransactionCoordinator.handleInitProducerId)."""
        producer_id, epoch = self._bump_from or (-1, -1)
        return {"transactional_id": None,
                "transaction_timeout_ms": self._config.transaction_timeout_ms,
                "producer_id": producer_id, "producer_epoch": epoch}

    async def _init_idempotent(self) -> None:
        config = self._config
        backoff = Backoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000)
        while True:
            try:
                conn = await self._cluster.any_connection()
                if self._bump_from and conn.version_for(ApiKey.INIT_PRODUCER_ID) < 3:
                    self._bump_from = None  # the broker predates KIP-360
                response = await conn.request(ApiKey.INIT_PRODUCER_ID, self.init_request())
                if response["error_code"]:
                    refused = error_for_code(response["error_code"], "InitProducerId")
                    if self._bump_from:
                        log.warning("the broker refused to bump producer id %d's epoch (%s); "
                                    "taking a new producer id", self._bump_from[0], refused)
                        self._bump_from = None
                        continue
                    if isinstance(refused, ClusterAuthorizationFailedError):
                        raise ClusterAuthorizationFailedError(
                            "InitProducerId: this producer's principal may not write "
                            "idempotently (enable_idempotence=True, the default): grant it "
                            "Write on the topic (brokers 2.8+) or IdempotentWrite on the "
                            "cluster, or turn idempotence off. The producer asks again for "
                            "each new batch, so it recovers once the permission is granted")
                    raise refused
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                delay = backoff.failed()
                log.info("InitProducerId failed (%s); retrying in %.2f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            self._set_producer_id(response)
            self._bump_from = None
            return

    def _set_producer_id(self, response: Mapping[str, Any]) -> None:
        self.sequencer.start(response["producer_id"], response["producer_epoch"])
        log.debug("producer id %d epoch %d", self.producer_id, self.producer_epoch)
        self.on_change()

    def sequence_state_lost(self, exc: KafkaError) -> None:
        """The broker no longer agrees with our sequence numbers for this producer id (or
        will not: a batch failed, its numbers used up, with nothing numbered after it)."""
        if self.is_transactional:
            # Only the transaction's abort can resynchronise (with a new epoch).
            self._needs_epoch_bump = True
            self.abortable(exc)
            return
        if isinstance(exc, _REFUSED_UNWRITTEN):
            log.debug("producer id %d epoch %d: a batch refused unwritten (%s) used up its "
                      "sequence numbers: starting a new session (KIP-360)", self.producer_id,
                      self.producer_epoch, exc)
        else:
            log.warning("producer id %d epoch %d lost its sequence state (%s): starting a "
                        "new session (KIP-360)", self.producer_id, self.producer_epoch, exc)
        self._bump_from = (self.producer_id, self.producer_epoch)
        self.sequencer.start(-1, -1)

    # -- sequencing: the decisions --------------------------------------------------------

    def may_send(self, batch: ProducerBatch) -> bool:
        """Whether the sender may put `batch` on the wire now: in order, and (transactional)
        once its partition is in the transaction. (_c.c's drain gives the first False below
        itself, on `drain_view`: keep the two in step.)"""
        # (is_transactional inline: the drain asks this of each batch it takes, ~490 a
        # request at 10,000 partitions)
        if self.transactional_id is not None and \
                (batch.topic, batch.partition) not in self._partitions:
            return False  # AddPartitionsToTxn first
        return self.sequencer.may_send(batch)

    def drain_view(self) -> tuple[set[TopicPartition] | None, int, int,
                                  dict[TopicPartition, list[ProducerBatch]],
                                  dict[TopicPartition, int],
                                  dict[TopicPartition, dict[ProducerBatch, None]]]:
        """The partitions in the transaction (None: not transactional), then
        `Sequencer.drain_view`: what the compiled drain reads to decide and number the
        common batch without calling `may_send` and `Sequencer.assign`."""
        return (self._partitions if self.transactional_id is not None else None,
                *self.sequencer.drain_view())

    def acked(self, batch: ProducerBatch) -> None:
        if self.sequencer.acked(batch) and not self.is_transactional:
            self._gap_behind(batch)

    def acked_all(self, batches: list[ProducerBatch]) -> None:
        """`acked` for each of a response's batches (all written), told in one call."""
        gap = self.sequencer.acked_all(batches)
        if gap is not None and not self.is_transactional:
            self._gap_behind(gap)

    def _gap_behind(self, batch: ProducerBatch) -> None:
        """A younger batch failed while this one was pending (the Java client's
        maybeResolveSequences): start afresh now, not at the next batch's refusal."""
        self.sequence_state_lost(KafkaError(
            f"a batch of {batch.topic}-{batch.partition} after sequence "
            f"{batch.base_sequence + batch.record_count - 1} failed unacknowledged"))

    # -- transaction state -----------------------------------------------------------------

    def _transition(self, target: TxnState) -> None:
        if target not in _ALLOWED[self.state]:
            raise self._state_error(
                f"cannot go from {self.state.value!r} to {target.value!r}: "
                f"{_WHAT_TO_DO[self.state]}" + (f" (after {self.error!r})" if self.error else ""))
        self.state = target

    def _state_error(self, message: str) -> TransactionStateError:
        """A call that does not fit the state. Its class says what the state leaves to do
        (KIP-1050): a failed transaction is abortable, a producer in a fatal error must be
        closed."""
        if self.state is TxnState.ABORTABLE_ERROR:
            return TransactionFailedError(message)
        if self.state is TxnState.FATAL_ERROR:
            return ProducerFailedError(message)
        return TransactionStateError(message)

    def _cannot_commit(self) -> TransactionStateError:
        exc = self._state_error(f"cannot commit: the transaction failed ({self.error!r}); abort it")
        exc.__cause__ = self.error
        return exc

    def check_can_send(self) -> None:
        """Raise unless records may be sent now (inside a transaction, when transactional)."""
        if self.state is TxnState.IN_TRANSACTION:
            return
        if self.state is TxnState.FATAL_ERROR:
            raise self._fatal_error()
        if self.state is TxnState.ABORTABLE_ERROR:
            raise self._state_error(
                f"the transaction failed ({self.error!r}): call abort_transaction(), "
                "then start a new one") from self.error
        raise self._state_error(
            f"a transactional producer sends only inside a transaction (state: "
            f"{self.state.value}): call begin_transaction() or use `async with "
            "producer.transaction()`")

    def _fatal_error(self) -> KafkaError:
        if isinstance(self.error, ProducerFencedError):
            return self.error
        return self._state_error(
            f"the producer hit a fatal error and cannot continue: {self.error!r}; close it")

    def fatal(self, exc: KafkaError) -> None:
        self.error = exc
        self._transition(TxnState.FATAL_ERROR)
        self.on_change()

    def abortable(self, exc: KafkaError) -> None:
        """A batch of the transaction failed: the transaction can only be aborted now."""
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):  # (the first error)
            self.error = exc
            self._transition(TxnState.ABORTABLE_ERROR)

    def batch_failed(self, batch: ProducerBatch, exc: BaseException) -> None:
        """A batch failed for good without an acknowledgement (every such path comes here)."""
        if self.sequencer.failed(batch):  # its sequence numbers are used up
            if self.is_transactional:
                self._needs_epoch_bump = True  # the abort that must follow starts a new epoch
            elif self.sequencer.gap_left(batch):
                self.sequence_state_lost(exc)  # type: ignore[arg-type]
        if not self.is_transactional:
            return
        if isinstance(exc, _FATAL):
            self.fatal(exc)
        elif isinstance(exc, KafkaError):
            self.abortable(exc)

    def _coordinator_failed(self, exc: KafkaError) -> None:
        """A coordinator request of the transaction failed for good (retries are behind)."""
        if isinstance(exc, _FATAL_FROM_COORDINATOR):
            self.fatal(exc)
        else:
            self.abortable(exc)

    def init_transactions_task(self) -> asyncio.Task[None]:
        """init_transactions() in a task of its own, which goes on when its caller is
        cancelled (close() stops it), or the one under way. A state that forbids it is
        said now, to the caller."""
        if self._init_task is None or self._init_task.done():
            self._transition(TxnState.INITIALIZING)
            self._init_task = self._tasks.spawn(
                self._init_producer_id(), f"aioproducer-init-transactions-{self._config.client_id}")
        return self._init_task

    async def init_transactions(self) -> None:
        """Get the producer id and epoch for our transactional id (fencing older producers)."""
        self._transition(TxnState.INITIALIZING)
        await self._init_producer_id()

    async def _init_producer_id(self) -> None:
        try:
            response = await self._coordinator_request(
                _TRANSACTION, ApiKey.INIT_PRODUCER_ID, lambda: {
                    "transactional_id": self.transactional_id,
                    "transaction_timeout_ms": self._config.transaction_timeout_ms,
                    "producer_id": -1,
                    "producer_epoch": -1,
                }, "InitProducerId")
        except KafkaError as exc:
            if exc.retriable:  # max_block_ms ran out: it may be called again, as in Java
                self._transition(TxnState.UNINITIALIZED)
            else:
                self.fatal(exc)
            raise
        self._set_producer_id(response)
        self._needs_epoch_bump = False
        self._v2_at_init = self._feature_v2()
        self._transition(TxnState.READY)

    def begin(self) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise self._fatal_error()
        if self.state is TxnState.UNINITIALIZED:
            raise self._state_error("call init_transactions() (or start()) first")
        if self.state is TxnState.IN_TRANSACTION:  # (often another task's, in a service)
            raise self._state_error(
                "a transaction is open already: commit_transaction() or abort_transaction() "
                "it first. A producer has one transaction at a time: tasks that run "
                "transactions at once (concurrent requests) must take turns (an asyncio.Lock "
                "around `async with producer.transaction()`), or each use a producer of its "
                "own, with a transactional_id of its own")
        self._transition(TxnState.IN_TRANSACTION)
        # Once per transaction, never in the middle of one: a feature level changed meanwhile
        # counts from the next. The request versions alone do not decide (a 4.x cluster may
        # speak them with the feature at 0).
        self.txn_v2 = self._v2_at_init and self._feature_v2()
        self.transaction_version = 2 if self.txn_v2 else 1

    def _feature_v2(self) -> bool:
        return self._cluster.finalized_features.get("transaction.version", 0) >= 2

    def version_for(self, conn: BrokerConnection, api_key: ApiKey) -> int:
        """The version of `api_key` to send on `conn`: the highest both sides speak, but below
        the Transactions V2 versions unless this transaction runs as V2 (a broker takes those
        as V2 requests). An idempotent producer's Produce takes the highest."""
        version = conn.version_for(api_key)
        first_v2 = TXN_V2_FROM.get(api_key)
        if first_v2 is not None and version >= first_v2 and self.is_transactional \
                and not self.txn_v2:
            return first_v2 - 1
        return version

    def add_partition(self, topic: str, partition: int) -> bool:
        """A batch for this partition exists: the coordinator must know it before it is sent.
        True if it must be told (an AddPartitionsToTxn, which a round starts)."""
        tp = (topic, partition)
        if self.txn_v2:
            self._partitions.add(tp)  # V2: its Produce request adds it (v12+)
            return False
        if tp in self._partitions or tp in self._pending:
            return False
        self._pending.add(tp)
        return True

    def maybe_add_partitions(self) -> None:
        """Start an AddPartitionsToTxn for partitions not yet in the transaction (the sender
        calls this each round; batches of those partitions wait in `may_send`)."""
        if not self._pending or (self._add_task is not None and not self._add_task.done()):
            return
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
            return
        self._add_task = self._tasks.spawn(
            self._add_partitions(), f"aioproducer-add-partitions-{self._config.client_id}")

    async def _add_partitions(self) -> None:
        adding = sorted(self._pending)
        topics: dict[str, list[int]] = {}
        for topic, partition in adding:
            topics.setdefault(topic, []).append(partition)

        def body() -> dict[str, Any]:
            return {
                "v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.producer_epoch,
                "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
            }

        def deciding_error(response: Mapping[str, Any]) -> int:
            return _deciding_error(p["partition_error_code"]
                                   for topic in response["results_by_topic_v3_and_below"]
                                   for p in topic["results_by_partition"])

        try:
            await self._coordinator_request(_TRANSACTION, ApiKey.ADD_PARTITIONS_TO_TXN, body,
                                            "AddPartitionsToTxn", deciding_error,
                                            quick_concurrent_retry=not self._partitions)
        except KafkaError as exc:
            self._coordinator_failed(exc)
            self.on_change()
            return
        self._partitions.update(adding)
        self._pending.difference_update(adding)
        self.on_change()

    def start_commit_or_abort(self, commit: bool) -> None:
        """Begin a commit or abort, or try again one that a lost connection or a timeout cut
        short (its state stays: the coordinator may have its EndTxn already)."""
        if self.state is TxnState.FATAL_ERROR:
            raise self._fatal_error()
        if commit and self.state is TxnState.ABORTABLE_ERROR:
            raise self._cannot_commit()
        target = TxnState.COMMITTING if commit else TxnState.ABORTING
        if self.state is not target:
            self._transition(target)

    async def end_transaction(self, commit: bool) -> None:
        """EndTxn, once every batch of the transaction has its outcome; one at a time: a
        call while another's is under way (a commit's own task, and the sender that
        finishes it as its producer is collected) waits for that one, and ends the
        transaction only if that one did not."""
        while self._ending is not None:
            await asyncio.wait({self._ending})
        if self.state not in (TxnState.COMMITTING, TxnState.ABORTING,
                              TxnState.ABORTABLE_ERROR):
            return  # (ended by that call)
        self._ending = asyncio.get_running_loop().create_future()
        try:
            await self._end_transaction(commit)
        finally:
            self._ending.set_result(None)
            self._ending = None

    async def _end_transaction(self, commit: bool) -> None:
        if self._add_task is not None and not self._add_task.done():
            # Its outcome, not its cancellation (close() stops it), is what decides below.
            await asyncio.wait({self._add_task})
        if self.state is TxnState.ABORTABLE_ERROR and commit:
            raise self._cannot_commit()
        if self._partitions or self._offsets_added:
            try:
                response = await self._coordinator_request(
                    _TRANSACTION, ApiKey.END_TXN, lambda: {
                        "transactional_id": self.transactional_id,
                        "producer_id": self.producer_id,
                        "producer_epoch": self.producer_epoch,
                        "committed": commit,
                    }, "EndTxn")
            except KafkaError as exc:
                if isinstance(exc, _FATAL_FROM_COORDINATOR):
                    self.fatal(exc)
                elif commit and not exc.retriable:
                    self.abortable(exc)
                # Else the state stays committing or aborting: calling it again tries again
                # (the Java client's "timed out and must be retried").
                raise
            if self.txn_v2 and response.get("producer_id", -1) >= 0:
                # V2: the coordinator bumped the epoch (or, the epoch spent, gave a new
                # producer id): the next transaction's, its sequences from zero. No
                # InitProducerId after an abort.
                self._set_producer_id(response)
                self._needs_epoch_bump = False
        self._partitions.clear()
        self._pending.clear()
        self._offsets_added = False
        self.error = None
        self._transition(TxnState.READY)
        if self._needs_epoch_bump:
            # The aborted transaction left our sequence numbers out of step with the broker:
            # a new epoch starts them afresh.
            await self.init_transactions()

    async def send_offsets(self, offsets: Mapping[TopicPartition, OffsetCommit],
                           group_id: str, generation_id: int = -1, member_id: str = "",
                           group_instance_id: str | None = None) -> None:
        """Make a consumer group's offsets part of the transaction (consume-transform-produce).

        If this fails (or is cancelled), the transaction can only be aborted: the offsets
        may be in it or not, and a commit without them would lose exactly-once."""
        if self.state is not TxnState.IN_TRANSACTION:
            self.check_can_send()
        try:
            await self._add_offsets(offsets, group_id, generation_id, member_id,
                                    group_instance_id)
        except KafkaError as exc:
            self._coordinator_failed(exc)
            if exc.retriable:  # out of max_block_ms: a timeout inside a transaction (KIP-1050)
                raise TransactionFailedError(
                    f"send_offsets_to_transaction() ran out of max_block_ms ({exc}): the "
                    "offsets may or may not be in the transaction; abort it") from exc
            raise
        except asyncio.CancelledError:
            self.abortable(TransactionStateError(
                "send_offsets_to_transaction() was cancelled: the offsets may or may not be "
                "part of the transaction"))
            raise

    async def _add_offsets(self, offsets: Mapping[TopicPartition, OffsetCommit], group_id: str,
                           generation_id: int, member_id: str,
                           group_instance_id: str | None) -> None:
        if not self.txn_v2:  # V2: TxnOffsetCommit v5 adds the group itself
            await self._coordinator_request(
                _TRANSACTION, ApiKey.ADD_OFFSETS_TO_TXN, lambda: {
                    "transactional_id": self.transactional_id,
                    "producer_id": self.producer_id,
                    "producer_epoch": self.producer_epoch,
                    "group_id": group_id,
                }, "AddOffsetsToTxn")
        self._offsets_added = True
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), commit in sorted(offsets.items()):
            topics.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": commit.offset,
                "committed_leader_epoch": commit.leader_epoch,
                "committed_metadata": commit.metadata})

        def deciding_error(response: Mapping[str, Any]) -> int:
            return _deciding_error(p["error_code"] for topic in response["topics"]
                                   for p in topic["partitions"])

        await self._coordinator_request(
            _GROUP, ApiKey.TXN_OFFSET_COMMIT, lambda: {
                "transactional_id": self.transactional_id,
                "group_id": group_id,
                "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch,
                "generation_id": generation_id,
                "member_id": member_id,
                "group_instance_id": group_instance_id,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
            }, "TxnOffsetCommit", deciding_error, key=group_id)

    async def committed_offsets(self, group_id: str, partitions: Iterable[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        """A group's committed offsets (-1: none), from its coordinator (OffsetFetch). Asks
        for stable offsets: one that an open transaction is committing is retried
        (UNSTABLE_OFFSET_COMMIT) until that transaction ends, within max_block_ms."""
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(set(partitions)):
            topics.setdefault(topic, []).append(partition)

        def deciding_error(response: Mapping[str, Any]) -> int:
            return response.get("error_code") or _deciding_error(
                p["error_code"] for topic in response["topics"] for p in topic["partitions"])

        response = await self._coordinator_request(
            _GROUP, ApiKey.OFFSET_FETCH, lambda: {
                "group_id": group_id,
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
                "require_stable": True,
            }, "OffsetFetch", deciding_error, key=group_id)
        return {(topic["name"], p["partition_index"]): p["committed_offset"]
                for topic in response["topics"] for p in topic["partitions"]}

    # -- coordinator requests --------------------------------------------------------------

    async def _coordinator_request(
        self, key_type: int, api_key: ApiKey, body: Callable[[], Mapping[str, Any]], what: str,
        error_of: Callable[[Mapping[str, Any]], int] = lambda r: r["error_code"],
        key: str | None = None, quick_concurrent_retry: bool = False,
    ) -> dict[str, Any]:
        """Send to the coordinator of `key` (the transactional id by default), retrying
        while the coordinator moves, loads or is busy, or the connection is lost (a broker
        restarting), within max_block_ms: a broker that stops answering does not hold the
        call for request_timeout_ms."""
        key = key if key is not None else self.transactional_id
        assert key is not None
        config = self._config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.max_block_ms / 1000
        backoff = Backoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000)
        concurrent = 0  # CONCURRENT_TRANSACTIONS answers so far (quick_concurrent_retry)
        while True:
            code = 0
            exc: KafkaError | None = None
            try:
                conn = await self._coordinator(key_type, key, deadline)
                response = await _within(conn.request(
                    api_key, body(), version=self.version_for(conn, api_key)), deadline, what)
                code = error_of(response)
            except KafkaError as error:
                if not error.retriable:
                    raise
                exc = error
                self._coordinators.pop((key_type, key), None)
            if exc is None:
                if not code:
                    return response
                exc = error_for_code(code, f"{what} for {key!r}")
                if isinstance(exc, _FENCED):
                    raise ProducerFencedError(
                        f"{what}: another producer with transactional_id {key!r} has started "
                        "(this one is fenced off and must be closed)")
                if isinstance(exc, _COORDINATOR_MOVED):
                    self._coordinators.pop((key_type, key), None)
                elif not exc.retriable:
                    raise exc
            delay = backoff.failed()
            if quick_concurrent_retry and isinstance(exc, ConcurrentTransactionsError):
                delay = min(_CONCURRENT_RETRY_S * 2 ** concurrent, delay)
                concurrent += 1
            if loop.time() + delay > deadline:
                raise exc
            if self._cluster.closed:  # close() cut it short: no retry to run on after it
                raise ProducerClosedError(f"the producer was closed during {what}") from exc
            log.debug("%s: %s; retrying in %.2f s", what, exc, delay)
            await self._cluster.pause(delay)  # (then, closed, _coordinator() raises)

    async def _coordinator(self, key_type: int, key: str, deadline: float) -> BrokerConnection:
        node_id = self._coordinators.get((key_type, key))
        if node_id is not None:
            return await self._cluster.connection(node_id)
        conn = await self._cluster.any_connection(deadline)
        version = conn.version_for(ApiKey.FIND_COORDINATOR)
        if version >= 4:
            response = await _within(conn.request(
                ApiKey.FIND_COORDINATOR, {"key_type": key_type, "coordinator_keys": [key]}),
                deadline, "FindCoordinator")
            if len(response["coordinators"]) != 1:
                raise CorruptMessageError(f"FindCoordinator for {key!r} answered "
                                          f"{len(response['coordinators'])} coordinators, not 1")
            found = response["coordinators"][0]
        else:
            found = await _within(conn.request(
                ApiKey.FIND_COORDINATOR, {"key": key, "key_type": key_type}),
                deadline, "FindCoordinator")
        if found["error_code"]:
            raise error_for_code(found["error_code"], f"FindCoordinator for {key!r}")
        broker = Broker.from_response(found["node_id"], found["host"], found["port"])
        self._coordinators[(key_type, key)] = broker.node_id
        return await self._cluster.connection(broker.node_id, broker)


async def _within(attempt: Coroutine[Any, Any, T], deadline: float, what: str) -> T:
    """`attempt`'s outcome, or RequestTimeoutError (retriable) once the loop time passes
    `deadline` (the attempt is cancelled: a late answer is dropped). It runs in the caller's
    task: no task of its own to outlive the caller (cancelled twice, by a cancel scope)."""
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            return await attempt
    except TimeoutError:
        if not timeout.expired():  # (the attempt's own)
            raise
        raise RequestTimeoutError(f"{what}: no answer within max_block_ms") from None


def _deciding_error(codes: Iterable[int]) -> int:
    """The error code that decides an answer with one per partition, as in the Java client:
    a fatal one, else a retriable one (the whole request is sent again), else any other.
    OPERATION_NOT_ATTEMPTED comes last: it only says that another partition failed."""
    def rank(code: int) -> int:
        cls = ERROR_CLASSES.get(code, BrokerError)
        if issubclass(cls, _FENCED + _FATAL_FROM_COORDINATOR):
            return 0
        if cls.retriable:
            return 1
        return 3 if cls is OperationNotAttemptedError else 2
    return min((code for code in codes if code), key=rank, default=0)
