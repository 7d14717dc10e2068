"""A `concurrent.futures.Future` that makes its lock only when a thread needs it.

A plain one makes a Condition (an RLock, a deque and two lists: about 1 KB with the future)
when it is made. BlockingProducer.produce() returns a future per record, and a loop that
produces 100,000 records holds 100,000 of them: making those was most of the cost of a
record (6 us of 8 in a measured run). Most of them are resolved before any thread waits on
them, so this one makes its Condition the first time a thread waits on it, cancels it or adds
a callback (through `_condition`, as `wait()`, `as_completed()` and every base method reach
it), and the producer resolves the others without a lock.

That is safe where the GIL orders every read and write (CPython as built by default): the
producer writes the state first, then looks for a Condition. A thread that made one before
that write either finds the future resolved or is waited for under its lock.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures._base import (  # the states every Future method reads
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    RUNNING,
)
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .batch import BulkMetadata, RecordFailure

T = TypeVar("T")
_MAKING = threading.Lock()  # two threads making one future's Condition at once make one


class ThreadFuture(Future[T]):
    """A Future whose lock (and waiter and callback lists) are made when first needed."""

    # Not Future.__init__, which makes the Condition now: a new one is pending, with neither
    # result nor exception, which these class attributes say until the instance's own.
    __init__ = object.__init__
    _state = PENDING
    _result: T | None = None
    _exception: BaseException | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        made: threading.Condition | None = self.__dict__.get("_made_condition")
        if made is None:
            with _MAKING:
                made = self.__dict__.get("_made_condition")
                if made is None:
                    made = self.__dict__["_made_condition"] = threading.Condition()
                    self.__dict__["_waiters"] = []
                    self.__dict__["_done_callbacks"] = []
        return made

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        self._condition  # (makes the lists with it)
        waiters: list[Any] = self.__dict__["_waiters"]
        return waiters

    @property
    def _done_callbacks(self) -> list[Any]:
        self._condition
        callbacks: list[Any] = self.__dict__["_done_callbacks"]
        return callbacks

    def take(self) -> bool:
        """`set_running_or_notify_cancel()` without a lock: False if the future was
        cancelled first (then the record is not sent) or refused. The producer, cancel() and
        refuse() claim the future through one atomic dict.setdefault: exactly one wins."""
        claimed = self.__dict__.setdefault("_claimed_by", "producer")
        if claimed == "producer":
            self._state = RUNNING
            return True
        if claimed != "cancel":
            return False  # refused: failed already
        with self._condition:  # cancel() won, and has set CANCELLED or is about to
            self._state = CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        return False

    def refuse(self) -> bool:
        """Claim the future to fail it before the producer took it (its producer is
        closing): False if the producer took it, or it was cancelled or refused already."""
        token = object()
        return self.__dict__.setdefault("_claimed_by", token) is token

    def cancel(self) -> bool:
        if self.__dict__.setdefault("_claimed_by", "cancel") != "cancel":
            return False  # the producer took the record: it is being sent
        return super().cancel()

    def resolve(self, result: T | None, exception: BaseException | None) -> None:
        """`set_result()` or `set_exception()`, without a lock while no thread has touched
        the future."""
        self._result, self._exception = result, exception
        self._state = FINISHED
        if "_made_condition" not in self.__dict__:
            return  # whoever makes the Condition from now on finds the future done
        with self._condition:
            for waiter in self._waiters:
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            self._condition.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]


class BulkThreadFuture(ThreadFuture["BulkMetadata"]):
    """`BlockingProducer.produce_many()`'s future of its records' metadata (or of the first
    failure among them; `failures()` then names every record that failed). Its len() is how
    many records the call buffered, known at once, as a BulkFuture's: a caller cut off
    midway resumes from there without waiting for acks."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._failed: list[RecordFailure] = []

    def __len__(self) -> int:
        return self.count

    def settle(self, result: BulkMetadata | None, exception: BaseException | None,
               failed: list[RecordFailure]) -> None:
        """The records' outcome: their metadata, or the first failure and every record
        that failed."""
        self._failed = failed
        self.resolve(result, exception)

    def failures(self, timeout: float | None = None) -> list[RecordFailure]:
        """As BulkFuture.failures(): once done (waiting up to `timeout` seconds, as
        exception() does), each record that failed, by index, with its error; the records
        not listed were written."""
        self.exception(timeout)
        return list(self._failed)
