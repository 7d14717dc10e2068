"""Run a script the way a user would, in a session (process group) of its own, so that when it
runs out of time, or the test does (pytest-timeout), everything it started goes with it: a
Spark driver's JVM, its Python workers, local-cluster's executors. Killing only the script
leaves those behind, still holding CPU and memory. And start a command that a test stops
with Ctrl-C as a terminal starts it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any, Sequence


def run_in_own_group(cmd: Sequence[str], *, timeout: float,
                     **popen: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), but on a timeout
    (or any exception while waiting) the whole process group is killed, then
    TimeoutExpired is raised with the output so far."""
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = process.communicate(timeout=30)
        raise subprocess.TimeoutExpired(process.args, timeout, stdout, stderr) from None
    except BaseException:  # pytest-timeout's failure, a KeyboardInterrupt
        _kill_group(process)
        process.communicate(timeout=30)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL to the group the process leads (its id is the group's: start_new_session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie is dead: one a watchdog started waits for init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start_interruptible(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen(cmd, **popen), with SIGINT's default action in the child, as a
    terminal gives the command it runs in the foreground, whatever this process does with
    SIGINT. A shell without job control (a script, a CI runner) starts its background jobs
    (`./dev test ... &`) with SIGINT ignored; an ignored signal stays ignored through fork
    and exec, down to pytest's workers and their children; Python then installs no
    KeyboardInterrupt handler and asyncio.run() none of its own, so the test's Ctrl-C was
    ignored. A handler of ours is reset to the default in the child by exec, so one is set
    while the child is started (tests run in the main thread, where signal handlers are
    set)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(cmd, **popen)
    finally:
        signal.signal(signal.SIGINT, previous)
