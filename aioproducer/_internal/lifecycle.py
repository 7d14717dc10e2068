"""The producer's lifecycle as a table (h11's `_state.py` style): which state may follow
which. `Producer` changes its state only through `next_state`, so a change the table does
not list is a bug that raises at once instead of leaving a producer half started."""

from __future__ import annotations

import enum


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
