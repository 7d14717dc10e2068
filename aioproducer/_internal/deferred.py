"""What send() and enqueue() return when their record is buffered only once it is awaited,
and the report of one dropped without being awaited.

A forgotten `await` in async code gets Python's RuntimeWarning, naming a coroutine of ours;
in a sync `def` web handler (run in a worker thread) calling `producer.send(...)`, the request
answered 200 and the record was lost with nothing but that warning. The call cannot raise:
`asyncio.run_coroutine_threadsafe(producer.send(...), loop)` makes the same call from a
thread, and only hands the result to the loop after it returns. So the loss is said when it
happens, as the producer says other losses: through its loop's exception handler (logged at
ERROR by asyncio's default one), with the topic, the call's place and what to do. The same
for an `enqueue_many()` never awaited, which buffers nothing.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from asyncio import CancelledError
from threading import get_ident
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Generator, Generic, TypeVar

from .._speedups._marks import COROUTINE_MARKS
from .lifecycle import NEW, STARTING, Lifecycle

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


if TYPE_CHECKING:
    _Coroutine = Coroutine[Any, Any, T]
else:  # (to asyncio a coroutine all the same: collections.abc.Coroutine's methods)
    _Coroutine = Generic


class Deferred(_Coroutine[T]):
    """A coroutine to asyncio (awaited, or run by a Task or `run_coroutine_threadsafe()`):
    `coro`, whose record (or enqueue_many()'s records) is buffered when it runs. Collected
    never started, it reports the record lost (`_lost`), with the line of the call when that
    was outside the producer's loop thread (its result may be dropped elsewhere, in another
    thread), else of the frame that dropped it (CPython drops an unawaited call's result at
    its statement), which costs nothing until then.
    """

    __slots__ = ("_coro", "_started", "_verb", "_topic", "_lifecycle", "_called_at")

    def __init__(self, coro: Coroutine[Any, Any, T], verb: str, topic: object,
                 lifecycle: Lifecycle, called_at: str | None = None) -> None:
        self._coro = coro
        self._started = False
        self._verb = verb
        self._topic = topic
        self._lifecycle = lifecycle
        self._called_at = called_at
        if lifecycle.thread is not None and get_ident() != lifecycle.thread:
            self._called_at = _caller()  # (outside a started producer's loop thread)

    def __await__(self) -> Generator[Any, None, T]:
        self._started = True
        return self._coro.__await__()

    def send(self, value: Any) -> Any:
        self._started = True
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        if not self._started and isinstance(args[0], CancelledError):
            # (a task of it cancelled before it ran: the loop's end, say)
            self._lifecycle.count_cancelled_unbuffered()
        self._started = True
        return self._coro.throw(*args)

    def close(self) -> None:
        self._started = True
        self._coro.close()

    def __del__(self) -> None:
        if getattr(self, "_started", True):
            return
        _close_unstarted(self._coro)
        _lost(self._lifecycle, self._message())

    def _message(self) -> str:
        verb = self._verb
        call = f"producer.{verb}({self._topic!r}, ...) at {self._called_at or _caller(3)}"
        many = verb == "enqueue_many"
        lost = "its records were not sent" if many else "the record was not sent"
        if self._called_at is not None:
            args = "topic, records" if many else "topic, value"
            return (f"{call}, called outside the producer's event loop thread (in a sync "
                    f"`def` web handler, say, which runs in a worker thread), was never "
                    f"awaited: {lost}. In a FastAPI or Starlette `def` handler use "
                    f"`anyio.from_thread.run(producer.{verb}, {args})`, or make the handler "
                    "`async def` and await it; from another thread, `asyncio."
                    f"run_coroutine_threadsafe(producer.{verb}(...), loop).result()`; or use "
                    "BlockingProducer")
        if self._lifecycle.state in (NEW, STARTING):  # (awaited, it would have raised so)
            return f"{call} was never awaited, on a producer not started: {lost}. Start it " \
                "first (`await producer.start()`, or `async with Producer(...)`), then " \
                "await the call"
        why = "enqueue_many() buffers nothing until it is awaited" if many else \
            "it was to wait for its topic's metadata, its serializer or buffer memory, " \
            "which it does once awaited"
        return f"{call} was never awaited: {lost} ({why}). Await it, or hand it to " \
            "asyncio.create_task()"


def coroutine_function(function: F) -> F:
    """Mark `function` a coroutine function to inspect and asyncio (see _speedups/_marks.py):
    it returns an awaitable that is to be awaited (send(), enqueue(), enqueue_many())."""
    for attribute, mark in COROUTINE_MARKS.items():
        setattr(function, attribute, mark)
    return function


def _close_unstarted(coro: Coroutine[Any, Any, Any]) -> None:
    """Close a coroutine never started, and those it was given to await (its arguments,
    such as the append it was to finish): closed so, none warns it was never awaited (ours
    says more)."""
    frame = coro.cr_frame if inspect.iscoroutine(coro) and \
        inspect.getcoroutinestate(coro) == inspect.CORO_CREATED else None
    given = [v for v in frame.f_locals.values() if inspect.iscoroutine(v)] if frame else []
    coro.close()
    for inner in given:
        _close_unstarted(inner)


def _caller(depth: int = 2) -> str:
    """file:line of the first frame outside the package, from `depth` frames up."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _lost(lifecycle: Lifecycle, message: str) -> None:
    """Say it through the producer's loop's exception handler (from any thread: a coroutine
    is collected where its last reference goes); without a live loop, as a RuntimeWarning."""
    loop = lifecycle.loop
    if loop is not None and not loop.is_closed():
        try:
            loop.call_soon_threadsafe(loop.call_exception_handler, {"message": message})
            return
        except RuntimeError:  # closed meanwhile
            pass
    warnings.warn(message, RuntimeWarning, stacklevel=2)
