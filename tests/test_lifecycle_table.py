"""The producer's lifecycle table, broker-free: the changes a producer goes through are
allowed, the ones that would leave it half started or reopen it are refused, and what the
producer answers in each state follows from it."""

from __future__ import annotations

import pytest

from aioproducer import Producer
from aioproducer._internal.lifecycle import ALLOWED, State, next_state
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
