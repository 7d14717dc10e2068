"""A process beside the test process that kills the brokers it started when it dies, however
it dies (SIGKILL, `os._exit`, a crashed xdist worker): their finalizers do not run then."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

# Runs in a session of its own: when the test process dies its end of the pipe closes, and
# every process group still registered is killed, and `directory` (if given) removed.
_SCRIPT = """
import os, shutil, signal, sys
pids = set()
for line in sys.stdin:
    try:
        op, pid = line.split()
        (pids.add if op == "+" else pids.discard)(int(pid))
    except ValueError:  # (a line cut short)
        pass
for pid in pids:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
if len(sys.argv) > 1:
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


class Watchdog:
    """Registers the processes to kill: each must lead its own process group
    (`start_new_session=True`), so that what it started goes too."""

    def __init__(self, directory: Path | None) -> None:
        """`directory` is removed when the test process dies (None: none)."""
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, *([str(directory)] if directory else [])],
            stdin=subprocess.PIPE, start_new_session=True, text=True)
        self._lock = threading.Lock()

    def _say(self, line: str) -> None:
        with self._lock:
            stdin = self._process.stdin
            assert stdin is not None
            if not stdin.closed:  # (closed: it has killed what was registered, at exit)
                stdin.write(line + "\n")
                stdin.flush()

    def watch(self, pid: int) -> None:
        self._say(f"+ {pid}")

    def forget(self, pid: int) -> None:
        self._say(f"- {pid}")

    def close(self, timeout: float = 60) -> None:
        """Kill what is still registered (and remove the directory) now, and wait for that."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            # Still removing the data directory on a loaded machine: it ends by itself, and
            # a teardown that raised here lost the caller's results (benchmarks/run.py's).
            pass


_shared: Watchdog | None = None
_shared_lock = threading.Lock()


def shared() -> Watchdog:
    """One watchdog for the process's embedded brokers (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Watchdog(None)
            atexit.register(_shared.close, 5)
        return _shared


def forget_shared(pid: int) -> None:
    """`pid` (stopped) is no longer the shared watchdog's to kill, if there is one."""
    with _shared_lock:
        if _shared is not None:
            _shared.forget(pid)


def _forget_in_child() -> None:
    """A forked child lets go of its parent's watchdog (its copy of the pipe would keep the
    parent's brokers alive after the parent died) and starts its own if it needs one. The
    pipe's descriptor is pointed at /dev/null rather than its file closed, which would write
    what another thread of the parent had half-written at the fork; the lock is new (another
    thread may have held it)."""
    global _shared, _shared_lock
    if _shared is not None and _shared._process.stdin is not None:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, _shared._process.stdin.fileno())
            os.close(devnull)
    _shared = None
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
