"""The one rule for waiting between tries (KIP-580, as in the Java client): a base doubled
per failure in a row, capped, with ±20% jitter so that clients that failed together do not
retry together."""

from __future__ import annotations

import random


def exponential_backoff(base: float, failures: int, cap: float) -> float:
    """`base` doubled per failure so far, at most `cap`, jittered. Any count of failures: a
    float times 2 ** 1024 would overflow."""
    return min(base * (1 << min(failures, 32)), cap) * random.uniform(0.8, 1.2)


class Backoff:
    """The tries of one thing (a metadata fetch, a coordinator request): `delay` is the wait
    before the next one, `base` until something fails."""

    __slots__ = ("base", "cap", "failures", "delay")

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self.delay = base

    def failed(self) -> float:
        """Count a failure; the wait before the next try."""
        self.delay = exponential_backoff(self.base, self.failures, self.cap)
        self.failures += 1
        return self.delay

    def reset(self) -> None:
        """It worked: the next failure waits `base` again."""
        self.failures = 0
        self.delay = self.base
