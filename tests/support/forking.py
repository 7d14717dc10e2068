"""A producer's process forked inside a running coroutine, the child going on in its copy of
the parent's loop (tests/test_lifecycle.py, and on Apache Kafka tests/real_kafka)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
import warnings

from aioproducer import BlockingProducer, Producer
from aioproducer.client.connection import BrokerConnection
from aioproducer.errors import ProducerClosedError
from tests.support.proxy import FaultProxy


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


async def _fork(producer: Producer, topic: str) -> tuple[int, int]:
    """os.fork() in the running coroutine: the child goes on (_child_goes_on, which never
    returns); the parent gets the child's pid and the read end of its report."""
    report, child_end = os.pipe()
    with warnings.catch_warnings():  # (3.12: pytest-xdist's threads)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(report)
        await _child_goes_on(producer, topic, child_end)
    os.close(child_end)
    return pid, report


def _reap(pid: int, within: float) -> int:
    """Wait up to `within` seconds for the child to exit, then kill it; its exit code
    (-9: killed)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# What fork_amid_sends() sends from the parent, in order.
SENT_BY_THE_PARENT = [b"before"] + [b"lingering %d" % i for i in range(100)] \
    + [b"after %d" % i for i in range(100)]


async def fork_amid_sends(bootstrap: str, topic: str) -> str:
    """A producer with records buffered forks: the child goes on (_child_goes_on),
    the parent sends more and waits for them all; what the child's send raised."""
    async with Producer(bootstrap, linger_ms=300) as producer:
        await producer.send(topic, b"before")
        lingering = [await producer.enqueue(topic, b"lingering %d" % i) for i in range(100)]
        pid, report = await _fork(producer, topic)
        try:
            after = [await producer.enqueue(topic, b"after %d" % i) for i in range(100)]
            await asyncio.wait_for(asyncio.gather(*lingering, *after), 20)
        finally:
            await asyncio.to_thread(_reap, pid, 10)  # (it exits after a second)
        with os.fdopen(report, "rb") as said:
            return said.read().decode()


async def fork_while_connecting(bootstrap: str, proxy: FaultProxy, topic: str) -> tuple[str, int]:
    """A producer forks while its connection to the broker is being opened (`proxy`, which
    every connection goes through, holds the broker's answers): the child goes on
    (_child_goes_on); the parent's record, buffered before the fork, must go out on that
    connection once the answers flow. What the child's send raised, and its exit code."""
    async with Producer(bootstrap, linger_ms=0, acks=1, enable_idempotence=False,
                        request_timeout_ms=60_000) as producer:
        await producer.partitions_for(topic)  # (on the connection it keeps for the broker)
        assert proxy.connections_accepted == 1
        proxy.stall(True)
        proxy.cut_all()  # the next is opened for the record
        try:
            future = await producer.enqueue(topic, b"buffered before the fork")
            deadline = time.monotonic() + 10
            while proxy.connections_accepted < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert proxy.connections_accepted == 2, "no connection to the broker opened"
            pid, report = await _fork(producer, topic)
        finally:
            proxy.stall(False)
        try:
            await asyncio.wait_for(future, 20)
        finally:
            exit_code = await asyncio.to_thread(_reap, pid, 10)  # (it exits after a second)
        with os.fdopen(report, "rb") as said:
            return said.read().decode(), exit_code


class _HeldAsOneLeaves(set):
    """A cluster's `_opening` that holds the first connection to leave it, as it leaves,
    until `forked` is set: a fork from another thread may come at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.leaving: BrokerConnection | None = None
        self.at_the_moment = threading.Event()
        self.forked = threading.Event()

    def discard(self, conn: BrokerConnection) -> None:
        super().discard(conn)
        if self.leaving is None:
            self.leaving = conn
            self.at_the_moment.set()
            self.forked.wait(10)


def fork_as_a_connection_is_handed_over(bootstrap: str, proxy: FaultProxy,
                                        topic: str) -> str:
    """The main thread forks while a BlockingProducer's loop thread hands its new
    connection to the broker over, from `Cluster._opening` to the cluster's connections
    (_HeldAsOneLeaves). The child says whether its copy of that connection's socket is
    still connected to the broker (it holds the parent's connection open while it lives,
    and could read or write it), then exits; the parent sends a record on it."""
    opening = _HeldAsOneLeaves()
    with BlockingProducer(bootstrap, linger_ms=0, acks=1, enable_idempotence=False) \
            as producer:
        producer.partitions_for(topic)  # (on the connection it keeps for the broker)
        producer._producer._cluster._opening = opening  # (read as each one is opened)
        proxy.cut_all()  # the next is opened for the record
        future = producer.produce(topic, b"sent by the parent")
        assert opening.at_the_moment.wait(10), "no connection was opened for the record"
        report, child_end = os.pipe()
        try:
            with warnings.catch_warnings():  # (3.12: the loop's thread)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                said = "?"
                try:
                    fileno = opening.leaving._socket.fileno()  # type: ignore[union-attr]
                    with socket.socket(fileno=os.dup(fileno)) as copy:
                        said = f"connected to {copy.getpeername()}"
                except OSError:  # (ENOTCONN)
                    said = "unconnected"
                except BaseException as exc:
                    said = repr(exc)
                finally:
                    os.write(child_end, said.encode())
                    os._exit(0)
        finally:
            opening.forked.set()
        os.close(child_end)
        _reap(pid, 10)
        future.result(20)
    with os.fdopen(report, "rb") as said:
        return said.read().decode()
