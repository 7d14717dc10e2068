"""A Ctrl-C at an exact point of Python code: a KeyboardInterrupt raised where CPython would
raise the one of a SIGINT arriving then. CPython runs signal handlers only where it checks for
them: as a function starts, after a call returns, and where a loop jumps back; never between two
other instructions (nor as a coroutine resumes from an await). So a test can strike each such point of the given
functions in turn (the n-th point reached), and hold the code to what a user's Ctrl-C could do.
"""

from __future__ import annotations

import dis
import sys
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any, Self


def _checks_after(opname: str) -> bool:
    """Whether CPython checks for a signal once `opname` is done (3.11 to 3.13)."""
    return opname.startswith("CALL") or opname in ("JUMP_BACKWARD", "RESUME")


class InterruptAt:
    """`with InterruptAt(functions, n):` raises KeyboardInterrupt at the n-th point (from 1)
    of `functions` (their code, in this thread) where a Ctrl-C could strike; `struck` says
    whether it did (fewer points were reached). Tracing ends with the interrupt."""

    def __init__(self, functions: Iterable[Callable[..., Any]], n: int) -> None:
        self._names: dict[CodeType, dict[int, str]] = {}
        for function in functions:
            code = function.__code__
            self._names[code] = {i.offset: i.opname for i in dis.get_instructions(code)}
        self._n = n
        self.points = 0
        self.struck = False
        self.where = ""  # (the function and line struck, for a failure's message)
        self._last: dict[FrameType, str] = {}

    def __enter__(self) -> Self:
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)
        self._last.clear()

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code not in self._names:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        # A start is a point; a coroutine resumed from an await is not (CPython checks
        # after a plain `yield` only, which these functions do not have).
        self._last[frame] = "" if frame in self._last else "RESUME"
        return self._on_opcode

    def _on_opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "opcode":
            return self._on_opcode
        names = self._names[frame.f_code]
        done, self._last[frame] = self._last.get(frame), names.get(frame.f_lasti, "")
        if done is not None and _checks_after(done):
            self.points += 1
            if self.points == self._n:
                self.struck = True
                self.where = f"{frame.f_code.co_name}, line {frame.f_lineno}, after {done}"
                sys.settrace(None)
                raise KeyboardInterrupt
        return self._on_opcode
