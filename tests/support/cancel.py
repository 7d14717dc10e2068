"""The ways a caller's block gets cut short, for tests that run a producer call under each.

asyncio's timeout cancels the task once (edge-triggered). anyio's cancel scopes, in which
Starlette and FastAPI run handlers, cancel every await in the scope again and again until
the scope exits (level-triggered): cleanup that awaits inside one is cancelled too unless it
protects itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import anyio
import pytest

WAYS = ["asyncio.timeout", "anyio.fail_after", "anyio.move_on_after", "CancelScope.cancel"]


@contextlib.asynccontextmanager
async def cut_short(way: str, seconds: float) -> AsyncIterator[None]:
    """Run the block under `way`, which cuts it short after `seconds`; fails the test if the
    block ended before (it would prove nothing)."""
    if way == "asyncio.timeout":
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(seconds):
                yield
    elif way == "anyio.fail_after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(seconds):
                yield
    else:
        with anyio.move_on_after(seconds) if way == "anyio.move_on_after" else \
                anyio.CancelScope() as scope:
            if way == "CancelScope.cancel":
                asyncio.get_running_loop().call_later(seconds, scope.cancel)
            yield
        assert scope.cancelled_caught, f"the block ended before {way} cut it short"


def producer_tasks() -> list[str]:
    """The names of the producers' tasks (all named aioproducer-...) still running."""
    return [task.get_name() for task in asyncio.all_tasks()
            if task.get_name().startswith("aioproducer-") and not task.done()]
