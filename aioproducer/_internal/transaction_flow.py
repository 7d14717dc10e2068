"""What the producer's transaction verbs do, over the TransactionManager's state table and
coordinator requests: one commit or abort at a time, each in a task of its own.

That task outlives its callers' cancellation (the coordinator may have begun ending the
transaction already), and its outcome is kept until the next transaction begins: calling
commit or abort again reports it, or, if a lost connection or a timeout cut it short, tries
again (as the Java client's "timed out and must be retried").
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from ..client.tasks import TaskSet, shielded
from ..errors import KafkaError, ProducerClosedError, TransactionAbortedError
from .accumulator import RecordAccumulator
from .arguments import OffsetCommit
from .batch import TopicPartition
from .lifecycle import Lifecycle
from .transactions import TransactionManager, TxnState

# The states in which close() aborts what is left open (ABORTING: an abort that failed).
_OPEN = frozenset({TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING})


class TransactionFlow:
    """A transactional producer's transaction verbs: made when it starts."""

    def __init__(self, manager: TransactionManager, accumulator: RecordAccumulator,
                 tasks: TaskSet, lifecycle: Lifecycle, client_id: str) -> None:
        self.manager = manager
        self._accumulator = accumulator
        self._tasks = tasks
        self._lifecycle = lifecycle
        self._client_id = client_id
        self._ending: tuple[bool, asyncio.Task[None]] | None = None  # (commit?, its task)

    async def init(self) -> None:
        await shielded(self.manager.init_transactions_task(),
                       "the producer was closed while it initialized its transactions")

    def begin(self) -> None:
        if self._lifecycle.closing:
            raise ProducerClosedError("the producer is closing: no new transaction can begin")
        self.manager.begin()
        self._ending = None  # the last commit's or abort's outcome is no longer asked for

    async def end(self, commit: bool) -> None:
        """Start the commit or abort in a task of its own, or join the one under way or
        ended (its outcome, until the next transaction begins)."""
        if self._ending is None or self._ending[0] != commit or _may_retry(self._ending[1]):
            if commit and self._lifecycle.closing:  # (close() aborts what is left open)
                raise ProducerClosedError("the producer is closing: a transaction left open "
                                          "is aborted; commit before close()")
            self.manager.start_commit_or_abort(commit)  # refuses what the state does not allow
            task = self._tasks.spawn(  # (its callers may all be cancelled: it goes on)
                self._commit() if commit else self._abort(),
                f"aioproducer-{'commit' if commit else 'abort'}-{self._client_id}")
            self._ending = (commit, task)
        await asyncio.shield(self._ending[1])

    async def _commit(self) -> None:
        await self._accumulator.flush(None)
        await self.manager.end_transaction(commit=True)

    async def _abort(self) -> None:
        self._accumulator.fail_all(TransactionAbortedError(
            "the transaction was aborted before this record was sent"))
        await self._accumulator.settled()
        await self.manager.end_transaction(commit=False)

    async def send_offsets(self, offsets: Mapping[TopicPartition, OffsetCommit],
                           group: Mapping[str, Any]) -> None:
        if offsets:  # none: nothing to commit (as in the Java client)
            await self.manager.send_offsets(offsets, **group)

    def ending(self) -> asyncio.Task[None] | None:
        """The commit's or abort's task while it runs."""
        if self._ending is not None and not self._ending[1].done():
            return self._ending[1]
        return None

    @property
    def left_open(self) -> bool:
        """Whether a transaction is open (or its abort failed): close() aborts it."""
        return self.manager.state in _OPEN

    @property
    def may_abort(self) -> bool:
        return self.manager.state is not TxnState.FATAL_ERROR


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
