"""The memory bound of the producer: `buffer_memory` bytes shared by all open batches.

The Java client keeps a free list of `batch.size` ByteBuffers because allocating direct
memory is costly there. In CPython a cleared bytearray hands its memory back to the
allocator (which already recycles blocks), so a free list would save nothing. What this pool
keeps from the Java design is what users rely on: the bound, and a FIFO-fair wait for memory
limited by `max_block_ms`.

Each waiter has its own wake-up signal, as each Java waiter has its own `Condition`: only the
head of the queue is woken when memory comes back, so a release costs O(1) however many tasks
wait (no thundering herd), and the head gathers freed memory until it has enough, so a large
request is not starved by a stream of small ones. (An `asyncio.Event` per waiter rather than
an `asyncio.Condition`: a Condition must have its lock held to be notified, and memory is
released from synchronous response callbacks.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from ..errors import BufferExhaustedError


class _Waiter:
    __slots__ = ("size", "gathered", "wakeup")

    def __init__(self, size: int) -> None:
        self.size = size
        self.gathered = 0
        self.wakeup = asyncio.Event()


class BufferPool:
    """Accounts for the bytes held by batches; `reserve` waits, FIFO, when they run out."""

    def __init__(self, total_memory: int) -> None:
        self.total_memory = total_memory
        self.available = total_memory
        self._waiters: deque[_Waiter] = deque()
        self._closed: Callable[[], BaseException] | None = None  # makes the error, once closed

    @property
    def queued(self) -> int:
        """How many callers wait for memory (the accumulator then sends batches at once)."""
        return len(self._waiters)

    def try_reserve(self, size: int) -> bool:
        """Reserve without waiting; fails when memory is short or others already wait."""
        if self._waiters or size > self.available:
            return False
        self.available -= size
        return True

    async def reserve(self, size: int, timeout: float) -> None:
        """Reserve `size` bytes, waiting at most `timeout` seconds behind earlier waiters."""
        if size > self.total_memory:
            raise BufferExhaustedError(
                f"a batch of {size} bytes can never fit in buffer_memory={self.total_memory}: "
                "raise buffer_memory or send smaller records"
            )
        if self.try_reserve(size):
            return
        if self._closed is not None:
            raise self._closed()
        waiter = _Waiter(size)
        self._waiters.append(waiter)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                if self._closed is not None:
                    raise self._closed()
                if waiter is self._waiters[0]:
                    take = min(self.available, size - waiter.gathered)
                    self.available -= take
                    waiter.gathered += take
                    if waiter.gathered == size:
                        return
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise BufferExhaustedError(
                        f"waited {timeout * 1000:.0f} ms (max_block_ms) for {size} bytes of "
                        f"buffer memory ({self.available} of {self.total_memory} free): the "
                        "broker is not keeping up or is unreachable; slow down, or raise "
                        "buffer_memory or max_block_ms"
                    )
                waiter.wakeup.clear()
                # A timer instead of asyncio.wait_for, which (before Python 3.12) can swallow
                # a cancellation that arrives as the wait completes.
                timer = loop.call_later(remaining, waiter.wakeup.set)
                try:
                    await waiter.wakeup.wait()
                finally:
                    timer.cancel()
        except BaseException:
            # Timed out or cancelled: give back what was gathered so nothing leaks.
            self.available += waiter.gathered
            raise
        finally:
            was_head = self._waiters[0] is waiter
            self._waiters.remove(waiter)
            if was_head:
                self._wake_head()

    def close(self, error: Callable[[], BaseException]) -> None:
        """Fail every waiter now, and every later wait, with `error()`."""
        self._closed = error
        for waiter in self._waiters:
            waiter.wakeup.set()

    def release(self, size: int) -> None:
        """Return the memory of a finished batch and wake the first waiter."""
        self.available += size
        self._wake_head()

    def _wake_head(self) -> None:
        if self._waiters and self.available > 0:
            self._waiters[0].wakeup.set()
