"""The producer's lifecycle, broker-free: the changes a producer goes through are allowed,
the ones that would leave it half started or reopen it are refused, and what the producer
answers in each state follows from it; the loop it belongs to; close()'s deadline."""

from __future__ import annotations

import asyncio

import pytest

from aioproducer import Producer
from aioproducer._internal.lifecycle import ALLOWED, CloseDeadline, Lifecycle, State, next_state
from aioproducer.errors import ProducerClosedError

# Every path a producer takes (docs/architecture.md, "Who owns which state").
PATHS = [
    ["new", "starting", "started", "closing", "closed"],
    ["new", "starting", "new"],  # a start that failed or was cancelled
    ["new", "starting", "started", "failed", "closed"],  # the sender died
    ["new", "starting", "started", "closing", "failed", "closed"],
    ["new", "starting", "started", "failed", "closing", "closed"],
    ["new", "starting", "started", "closing", "closed", "new"],  # init_transactions() failed
    ["new", "closed"],
    ["new", "starting", "closed"],  # close() while it started
]


@pytest.mark.parametrize("path", PATHS, ids=["-".join(p) for p in PATHS])
def test_every_path_a_producer_takes_is_in_the_table(path):
    state = State(path[0])
    for step in path[1:]:
        state = next_state(state, State(step))
    assert state is State(path[-1])


def test_the_table_lists_only_those_paths():
    used = {(a, b) for path in PATHS for a, b in zip(path, path[1:])}
    assert {(a.value, b.value) for a, targets in ALLOWED.items() for b in targets} == used


@pytest.mark.parametrize("current, target", [("closed", "started"), ("failed", "started"),
                                             ("new", "started"), ("closing", "started"),
                                             ("started", "new"), ("started", "starting")])
def test_a_change_the_table_does_not_list_raises(current, target):
    with pytest.raises(RuntimeError, match="lifecycle does not allow"):
        next_state(State(current), State(target))


async def test_a_new_producer_says_it_is_not_started():
    producer = Producer("127.0.0.1:9")
    assert "new" in repr(producer)
    with pytest.raises(ProducerClosedError, match="not started"):
        await producer.enqueue("t", b"v")
    await producer.close()
    assert "closed" in repr(producer)
    with pytest.raises(ProducerClosedError, match="closed; create a new one"):
        await producer.start()


async def test_a_lifecycle_refuses_another_loop_and_says_why_it_is_not_started():
    lifecycle = Lifecycle()
    lifecycle.check_loop()  # not bound to a loop yet: any caller may ask
    lifecycle.bind_to_running_loop()
    lifecycle.check_loop()
    with pytest.raises(ProducerClosedError, match="not started"):
        lifecycle.raise_not_started()
    lifecycle.failure = ValueError("boom")
    with pytest.raises(ProducerClosedError, match="internal failure: ValueError") as raised:
        lifecycle.raise_not_started()
    assert raised.value.__cause__ is lifecycle.failure

    def elsewhere() -> None:
        asyncio.run(_check(lifecycle))
    with pytest.raises(RuntimeError, match="another one"):
        await asyncio.to_thread(elsewhere)


async def _check(lifecycle: Lifecycle) -> None:
    lifecycle.check_loop()


async def test_a_close_deadline_of_zero_gives_up_without_a_loop_turn():
    deadline = CloseDeadline(0)
    pending = asyncio.get_running_loop().create_future()
    assert deadline.passed
    assert await deadline.wait({pending}) is False
    assert await CloseDeadline(None).wait(set()) is True  # nothing pending: no wait


async def test_a_nearer_close_deadline_ends_the_wait_under_way():
    """A close(timeout=60) waiting, then close(timeout=0.05): the wait ends at the nearer
    deadline; a later, longer timeout does not move it back."""
    loop = asyncio.get_running_loop()
    deadline = CloseDeadline(60)
    never = loop.create_future()
    waiting = asyncio.create_task(deadline.wait({never}))
    await asyncio.sleep(0)  # the wait is under way
    began = loop.time()
    deadline.bring_nearer(0.05)
    deadline.bring_nearer(30)
    deadline.bring_nearer(None)
    assert await asyncio.wait_for(waiting, 5) is False
    assert loop.time() - began < 5 and deadline.timeout == 0.05


async def test_a_close_deadline_wait_says_when_everything_ended():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_later(0.01, done.set_result, None)
    assert await CloseDeadline(10).wait({done}) is True
