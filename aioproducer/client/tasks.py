"""Who owns the producer's tasks, and awaiting them from callers that may be cancelled.

No task without a responsible parent (trio's rule): the producer makes one TaskSet when it
starts and hands it to whoever spawns (the cluster, the transaction manager, itself); close()
awaits it, so no task outlives close(). A task's failure is recorded on the task (its owner
reads it, or it is retrieved so asyncio does not log it as lost); it cancels no sibling.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

from ..errors import ProducerClosedError

T = TypeVar("T")


class TaskSet:
    """The tasks of one producer: kept until they end, cancelled and awaited by aclose()."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coroutine: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        if self.closed:
            coroutine.close()
            raise ProducerClosedError("the producer is closed")
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        retrieve_exception(task)

    def cancel(self) -> None:
        """Cancel the tasks still running without waiting (their producer was collected:
        nobody is left to wait); they end a loop turn or two later."""
        self.closed = True
        for task in self._tasks:
            task.cancel()

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
