"""A log line that repeats at most once per interval: an outage must not flood the log."""

from __future__ import annotations

import logging
import time


class LogEvery:
    """Log the first time at once, then at most once per `seconds`, saying how many were
    left out in between."""

    def __init__(self, logger: logging.Logger, level: int, seconds: float) -> None:
        self._logger = logger
        self._level = level
        self._seconds = seconds
        self._last = float("-inf")
        self.left_out = 0  # since the last line

    def __call__(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self._seconds:
            self.left_out += 1
            return
        if self.left_out:
            message += f" ({self.left_out} more like it in the last {now - self._last:.0f} s)"
        self._logger.log(self._level, message, *args)
        self._last, self.left_out = now, 0

    def quiet(self) -> bool:
        """Whether nothing was logged yet, or since reset()."""
        return self._last == float("-inf")

    def reset(self) -> None:
        self._last, self.left_out = float("-inf"), 0
