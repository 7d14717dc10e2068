"""TaskSet, the owner of the producer's tasks: none is lost or outlives close(), and one
failing cancels no other. Broker-free."""

from __future__ import annotations

import asyncio
import gc

import pytest

from aioproducer.client.tasks import TaskSet
from aioproducer.errors import KafkaConnectionError, ProducerClosedError


async def test_a_failing_task_cancels_no_sibling_and_aclose_ends_the_rest():
    tasks = TaskSet()
    ended: list[str] = []

    async def fail() -> None:
        raise ValueError("boom")

    async def wait_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cleaned up")

    failing = tasks.spawn(fail(), "fail")
    waiting = tasks.spawn(wait_forever(), "wait")
    await asyncio.wait({failing}, timeout=1)
    assert isinstance(failing.exception(), ValueError)
    await asyncio.sleep(0.01)
    assert not waiting.done(), "a sibling's failure cancelled it"
    await asyncio.wait_for(tasks.aclose(), 1)
    assert waiting.cancelled() and ended == ["cleaned up"]


async def test_nothing_is_spawned_once_closing_began():
    """A task that tries to start another while aclose() ends it is refused (so aclose()
    cannot be outrun), and so is any spawn afterwards."""
    tasks = TaskSet()

    async def spawns_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            tasks.spawn(asyncio.sleep(10), "late")
            raise

    parent = tasks.spawn(spawns_on_cancel(), "parent")
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.aclose(), 1)
    assert isinstance(parent.exception(), ProducerClosedError)
    with pytest.raises(ProducerClosedError):
        tasks.spawn(asyncio.sleep(0), "after")


async def test_a_failure_nobody_awaits_is_not_reported_as_never_retrieved():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async def fail() -> None:
            raise ValueError("nobody awaits me")

        failing = TaskSet().spawn(fail(), "fail")
        await asyncio.wait({failing})
        del failing
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert not reported


async def test_an_unexpected_failure_of_a_background_task_is_logged(caplog):
    """A task nobody awaits that fails with something no KafkaError (a bug, or a broker's
    input nothing checked: a port of 70000 raised OverflowError in a connect task) is logged
    with its traceback, once; an expected KafkaError is left to its owner."""
    tasks = TaskSet()

    async def fail(exc: BaseException) -> None:
        raise exc

    for task in (tasks.spawn(fail(OverflowError("port must be 0-65535")), "connect-1"),
                 tasks.spawn(fail(KafkaConnectionError("refused")), "connect-2")):
        await asyncio.wait({task})
    await asyncio.sleep(0)
    logged = [r for r in caplog.records if r.name == "aioproducer.client.tasks"]
    assert len(logged) == 1 and "connect-1" in logged[0].getMessage()
    assert logged[0].levelname == "ERROR" and isinstance(logged[0].exc_info[1], OverflowError)
    await tasks.aclose()
