"""Who owns the producer's tasks, and awaiting them from callers that may be cancelled.

No task without a responsible parent (trio's rule): the producer makes one TaskSet when it
starts and hands it to whoever spawns (the cluster, the transaction manager, itself); close()
awaits it, so no task outlives close(). A task's failure is recorded on the task (its owner
reads it, or it is retrieved so asyncio does not log it as lost); it cancels no sibling. A
failure that is no KafkaError (a bug, or input nothing checked) is logged with its traceback:
the owner of a background task may never look, and a child's error must reach someone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine, TypeVar

from ..errors import KafkaError, ProducerClosedError

log = logging.getLogger(__name__)

T = TypeVar("T")


class TaskSet:
    """The tasks of one producer: kept until they end, cancelled and awaited by aclose()."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coroutine: Coroutine[Any, Any, T], name: str, *,
              reported: bool = False) -> asyncio.Task[T]:
        """A task of the set; `reported`: its owner logs any failure itself."""
        if self.closed:
            coroutine.close()
            raise ProducerClosedError("the producer is closed")
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended if not reported else self._ended_reported)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, KafkaError):
            log.error("aioproducer background task %s failed: %r", task.get_name(), exc,
                      exc_info=exc)

    def _ended_reported(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        retrieve_exception(task)

    def cancel(self) -> None:
        """Cancel the tasks still running without waiting (their producer was collected:
        nobody is left to wait); they end a loop turn or two later."""
        self.closed = True
        for task in self._tasks:
            task.cancel()

    def cancel_in_forked_child(self, loop_runs_here: bool) -> None:
        """cancel(), in a child forked after they started: they end if the child runs its
        copy of the parent's loop on, and are not reported as destroyed pending if it never
        does (a multiprocessing child runs a loop of its own). Not cancelled unless their
        loop's thread is this one (`loop_runs_here`): see Producer._forked_in_child."""
        if loop_runs_here:
            self.cancel()
        for task in self._tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        """Cancel the tasks still running and wait until they (and any they spawned while
        ending) have ended."""
        self.closed = True
        while self._tasks:
            running = set(self._tasks)
            self.cancel()
            await asyncio.wait(running)


async def shielded(task: asyncio.Task[T], closed: str) -> T:
    """Await a task that outlives its caller's cancellation. Cancelled by close(), not by the
    caller, it raises ProducerClosedError(`closed`) rather than a CancelledError nobody
    asked for."""
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if task.cancelled() and not cancelling():
            raise ProducerClosedError(closed) from None
        raise


def cancelling() -> bool:
    """Whether the current task was asked to stop."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def retrieve_exception(task: asyncio.Task[Any]) -> None:
    """A done callback for a task nobody may await: its failure is not reported as unretrieved."""
    if not task.cancelled():
        task.exception()
