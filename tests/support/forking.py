"""A producer's process forked inside a running coroutine, the child going on in its copy of
the parent's loop (tests/test_lifecycle.py, and on Apache Kafka tests/real_kafka)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import warnings

from aioproducer import Producer
from aioproducer.errors import ProducerClosedError


async def _child_goes_on(producer: Producer, topic: str, report: int) -> None:
    """A child forked inside the parent's coroutine: it carries on in the parent's loop
    (its copy), where the producer's sender and connections are copies too. It sends (to
    be refused), lets that loop run for a second, and exits, writing what it saw to
    `report`. Nothing of it returns to pytest."""
    said = "sent"
    try:
        await producer.send(topic, b"from the child")
    except ProducerClosedError as error:
        said = f"ProducerClosedError: {error}"
    except Exception as error:
        said = f"{type(error).__name__}: {error}"
    try:
        loop = producer._lifecycle.loop  # (asyncio forgets the running loop in the child)
        assert loop is not None
        later = loop.create_future()
        loop.call_later(1.0, later.set_result, None)
        await later  # the loop's copy runs meanwhile: the sender's, the connections'
    finally:
        os.write(report, said.encode())
        os._exit(0)


def _reap(pid: int, within: float) -> None:
    """Wait up to `within` seconds for the child to exit, then kill it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


# What fork_amid_sends() sends from the parent, in order.
SENT_BY_THE_PARENT = [b"before"] + [b"lingering %d" % i for i in range(100)] \
    + [b"after %d" % i for i in range(100)]


async def fork_amid_sends(bootstrap: str, topic: str) -> str:
    """A producer with records buffered forks: the child goes on (_child_goes_on),
    the parent sends more and waits for them all; what the child's send raised."""
    async with Producer(bootstrap, linger_ms=300) as producer:
        await producer.send(topic, b"before")
        lingering = [await producer.enqueue(topic, b"lingering %d" % i) for i in range(100)]
        report, child_end = os.pipe()
        with warnings.catch_warnings():  # (3.12: pytest-xdist's threads)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(report)
            await _child_goes_on(producer, topic, child_end)
        os.close(child_end)
        try:
            after = [await producer.enqueue(topic, b"after %d" % i) for i in range(100)]
            await asyncio.wait_for(asyncio.gather(*lingering, *after), 20)
        finally:
            await asyncio.to_thread(_reap, pid, 10)  # (it exits after a second)
        with os.fdopen(report, "rb") as said:
            return said.read().decode()
