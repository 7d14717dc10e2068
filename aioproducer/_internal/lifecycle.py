"""The producer's lifecycle as a table (h11's `_state.py` style): which state may follow
which. `Lifecycle` changes its state only through `next_state`, so a change the table does
not list is a bug that raises at once instead of leaving a producer half started."""

from __future__ import annotations

import asyncio
import enum
import os
from threading import get_ident
from typing import Any, Callable, Iterable, NoReturn

from ..errors import EventLoopEndedError, ProducerClosedError


class State(enum.Enum):
    NEW = "new"  # not started, or a start that failed or was cancelled
    STARTING = "starting"
    STARTED = "started"
    FAILED = "failed"  # the sender task died: records fail, close() is what is left
    CLOSING = "closing"
    CLOSED = "closed"


NEW, STARTING, STARTED, FAILED, CLOSING, CLOSED = State

ALLOWED: dict[State, frozenset[State]] = {
    NEW: frozenset({STARTING, CLOSED}),
    # A start that fails or is cancelled leaves the producer new; close() may come meanwhile.
    STARTING: frozenset({STARTED, NEW, CLOSED}),
    STARTED: frozenset({CLOSING, FAILED}),
    FAILED: frozenset({CLOSING, CLOSED}),  # (it may fail while close() aborts a transaction)
    CLOSING: frozenset({CLOSED, FAILED}),
    # A transactional start whose init_transactions() failed tore itself down with close(),
    # and is new again (unless the user closed it meanwhile).
    CLOSED: frozenset({NEW}),
}


def next_state(current: State, target: State) -> State:
    """`target`, if the table lets `current` become it."""
    if target not in ALLOWED[current]:
        raise RuntimeError(f"aioproducer bug: the producer went from {current.value!r} to "
                           f"{target.value!r}, which its lifecycle does not allow")
    return target


_PYTEST_LOOPS = (
    ". In pytest-asyncio, a producer fixture of a wider scope than function runs on a loop of "
    "that scope, and each test on a loop of its own: run the tests on the fixture's loop "
    "(`pytestmark = pytest.mark.asyncio(loop_scope=\"session\")` in their module for a "
    "session-scoped fixture), or make the fixture function-scoped")


class Lifecycle:
    """One producer's state (changed only through the table) and the event loop it belongs
    to. Shared by the producer and its record intake, so the verbs and the append path ask
    the same questions of one owner. Slotted: the compiled append path reads `state`,
    `thread` and `loop_running` from their slots, every record."""

    __slots__ = ("cancelled_unbuffered", "closing", "ended_with_loop", "failure", "loop",
                 "loop_running", "pid", "state", "thread")

    def __init__(self) -> None:
        self.state = NEW
        self.failure: BaseException | None = None  # why the sender task died (FAILED)
        self.closing = False  # close() has begun (the state may still be STARTED meanwhile)
        self.loop: asyncio.AbstractEventLoop | None = None  # the one start() ran on
        # The thread it runs in, and whether it is running: per record, "this thread, and its
        # loop running" is the cheap test for "in the producer's loop" (asking for the
        # running loop is a syscall).
        self.thread: int | None = None
        self.loop_running: Callable[[], bool] = lambda: False
        self.pid: int | None = None  # the process: a forked child has the loop's copy only
        # Closed by its loop's end, not by close(): calls then say the loop ended.
        self.ended_with_loop = False
        # Calls cancelled, the producer open, before they buffered their records: waiting
        # for a topic's metadata, or never run (the loop's end cancels fire-and-forget
        # sends to a new topic). Told if the producer ends unclosed.
        self.cancelled_unbuffered = 0

    def count_cancelled_unbuffered(self) -> None:
        """A call was cancelled before it buffered its records (see cancelled_unbuffered)."""
        if self.state is STARTED and not self.closing:
            self.cancelled_unbuffered += 1

    def become(self, state: State) -> None:
        self.state = next_state(self.state, state)

    def bind_to_running_loop(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = get_ident()
        self.loop_running = self.loop.is_running
        self.pid = os.getpid()

    @property
    def forked(self) -> bool:
        """Whether this is a child forked after the producer started (multiprocessing's
        fork start method, a pre-forking server): its loop and sockets are the parent's."""
        return self.pid is not None and os.getpid() != self.pid

    def check_loop(self) -> None:
        """Refuse a call from an event loop other than the producer's (its tasks and futures
        live there: the call would hang or fail obscurely, and from another thread, corrupt
        a batch)."""
        # (None in a child forked inside the loop: asyncio forgets the running loop there)
        if self.loop is not None and (get_ident() != self.thread or
                                      asyncio._get_running_loop() is not self.loop):
            if self.forked:
                raise_forked()
            if self.loop.is_closed():  # (kept from one asyncio.run() or test to the next)
                raise_loop_ended()
            # (a sync web handler's asyncio.run(producer.send(...)), say; in the same thread,
            # most often pytest-asyncio's session fixture used by tests on their own loops)
            thread = _PYTEST_LOOPS if get_ident() == self.thread else (
                "; from another thread, run the call on the producer's loop: "
                "asyncio.run_coroutine_threadsafe(producer.send(...), loop).result(), or "
                "anyio.from_thread.run(producer.send, topic, value) in a sync web handler; or "
                "use BlockingProducer")
            raise RuntimeError(
                "this producer belongs to the event loop that started it and cannot be used "
                "from another one: use one producer per event loop (and close it on its own)"
                + thread)

    def raise_not_started(self) -> NoReturn:
        """The error of a verb that needs a started producer, saying why it is not."""
        if self.forked:  # (closed in the child by the fork: see Producer's _forked_in_child)
            raise_forked()
        if self.failure is not None:
            raise ProducerClosedError(
                f"the producer stopped after an internal failure: {self.failure!r}"
            ) from self.failure
        if self.state in (NEW, STARTING):
            raise ProducerClosedError(
                "the producer is not started: `await producer.start()` (and let it finish) "
                "or use `async with`")
        if self.ended_with_loop:
            raise_loop_ended()
        raise ProducerClosedError("the producer is closed: no more records can be sent")


def raise_loop_ended() -> NoReturn:
    raise EventLoopEndedError(
        "this producer's event loop has ended (asyncio.run() returned, or the loop of the "
        "test that started it closed): it can send nothing more. Make a producer in the loop "
        "that uses it (in pytest, a fixture of the same loop scope as the tests using it; "
        "sync code running asyncio.run() per job, a Celery task's, keeps a BlockingProducer "
        "instead); close() just closes this one")


def raise_forked() -> NoReturn:
    raise ProducerClosedError(
        "this producer was started before os.fork() (multiprocessing's fork start method, a "
        "server's worker processes): its connections and event loop belong to the parent "
        "process. Create and start a new producer in this process (with multiprocessing, "
        "in the function the child runs)")


class CloseDeadline:
    """When close() gives up on what is pending: set by the first close(timeout), brought
    nearer by a later, shorter one, which also moves the wait under way."""

    def __init__(self, timeout: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self.timeout = timeout  # the close(timeout) that set it, for the error to say
        self.at = None if timeout is None else self._loop.time() + timeout
        self._timer: asyncio.Timeout | None = None  # what waits for it now

    def bring_nearer(self, timeout: float | None) -> None:
        if timeout is None:
            return
        at = self._loop.time() + timeout
        if self.at is None or at < self.at:
            self.at, self.timeout = at, timeout
            timer = self._timer
            if timer is not None and not timer.expired():  # (once expired, it cannot move)
                timer.reschedule(at)

    @property
    def passed(self) -> bool:
        return self.at is not None and self._loop.time() >= self.at

    async def wait(self, waits: Iterable[asyncio.Future[Any]]) -> bool:
        """Wait for `waits` until the deadline; whether they all ended."""
        pending = {future for future in waits if not future.done()}
        if not pending:
            return True
        if self.passed:  # (close(timeout=0): not even one loop turn)
            return False
        try:
            async with asyncio.timeout_at(self.at) as self._timer:
                await asyncio.wait(pending)
        except TimeoutError:
            return False
        finally:
            self._timer = None
        return True
