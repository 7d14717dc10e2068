"""The attributes that make a callable a coroutine function to `inspect.iscoroutinefunction`
(those `inspect.markcoroutinefunction()` sets, Python 3.12+) and to asyncio's own test (3.11,
where Starlette asks it), read off once: set on `Appender` (producer.send, producer.enqueue;
by _c's init where compiled) and on the producer's other verbs, as what a call returns is
awaited. Starlette's BackgroundTasks.add_task(producer.send, ...) then awaits it on the loop:
it ran it in a worker thread, and the record was lost."""

import asyncio.coroutines
import inspect
from typing import Any


def _marked() -> None:
    """Only its attributes are read: what markcoroutinefunction() sets (its mark is asked
    for, not named: 3.13 renamed it)."""


COROUTINE_MARKS: dict[str, Any] = {}
if hasattr(inspect, "markcoroutinefunction"):
    COROUTINE_MARKS.update(vars(inspect.markcoroutinefunction(_marked)))
if hasattr(asyncio.coroutines, "_is_coroutine"):
    COROUTINE_MARKS["_is_coroutine"] = asyncio.coroutines._is_coroutine
