"""A Ctrl-C at an exact point of Python code: a KeyboardInterrupt raised where CPython would
raise the one of a SIGINT arriving then. CPython runs signal handlers only where it checks for
them: as a function starts, as a call returns (the exception then comes from the call, which
did its work), and where a loop jumps back; never between two other instructions (nor as a
coroutine resumes from an await, nor as `with` enters: __enter__ is not called by a call
instruction). So a test can strike each such point of the given functions
in turn (the n-th point reached), and hold the code to what a user's Ctrl-C could do.
"""

from __future__ import annotations

import bisect
import dis
import inspect
import sys
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any, Self

# A callee of these kinds returns by suspending, or by ending an await: no check there.
_SUSPENDING = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | \
    inspect.CO_ITERABLE_COROUTINE


class InterruptAt:
    """`with InterruptAt(functions, n):` raises KeyboardInterrupt at the n-th point (from 1)
    of `functions` (their code, in this thread) where a Ctrl-C could strike; `struck` says
    whether it did (fewer points were reached), `where` names the place. Calls' returns are
    struck from a profile function (the call raises, having done its work), a function's
    start and a loop's jump back from a trace function. Both end with the interrupt."""

    def __init__(self, functions: Iterable[Callable[..., Any]], n: int) -> None:
        self._jumps: dict[CodeType, set[int]] = {}
        # Each instruction's offset and whether it is a call (not `with`'s __enter__: no check).
        self._instructions: dict[CodeType, tuple[list[int], list[bool]]] = {}
        for function in functions:
            code = function.__code__
            instructions = list(dis.get_instructions(code))
            self._jumps[code] = {i.offset for i in instructions if i.opname == "JUMP_BACKWARD"}
            self._instructions[code] = ([i.offset for i in instructions],
                                        [i.opname.startswith("CALL") for i in instructions])
        self._n = n
        self.points = 0
        self.struck = False
        self.where = ""
        self._started: set[FrameType] = set()

    def __enter__(self) -> Self:
        sys.settrace(self._on_call)
        sys.setprofile(self._on_profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        sys.setprofile(None)
        self._started.clear()

    def _point(self, frame: FrameType, what: str) -> None:
        self.points += 1
        if self.points == self._n:
            self.struck = True
            self.where = f"{frame.f_code.co_name}, line {frame.f_lineno}, {what}"
            sys.settrace(None)
            sys.setprofile(None)
            raise KeyboardInterrupt

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code not in self._jumps:
            return None
        if frame not in self._started:  # (not a coroutine resumed from an await)
            self._started.add(frame)
            self._point(frame, "as it starts")
        if self._jumps[frame.f_code]:
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            return self._on_opcode
        return None

    def _on_opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode" and frame.f_lasti in self._jumps[frame.f_code]:
            self._point(frame, "as its loop jumps back")
        return self._on_opcode

    def _on_profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and self._calling(frame):
            self._point(frame, f"as {getattr(arg, '__qualname__', arg)}() returns")
        elif event == "return" and not frame.f_code.co_flags & _SUSPENDING:
            caller = frame.f_back
            if caller is not None and self._calling(caller):
                self._point(caller, f"as {frame.f_code.co_qualname}() returns")

    def _calling(self, frame: FrameType) -> bool:
        """Whether `frame` is of the functions given, at a call instruction (f_lasti may be
        past it, on its inline cache)."""
        listed = self._instructions.get(frame.f_code)
        if listed is None:
            return False
        offsets, calls = listed
        return calls[bisect.bisect_right(offsets, frame.f_lasti) - 1]
