"""The embedded broker (aioproducer.testing.EmbeddedBroker) as users' tests and ours use it:
it goes with the process that started it, however that process ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.processes import alive

_STARTS_BROKERS = """
import os, sys
from aioproducer.testing import EmbeddedBroker
broker = EmbeddedBroker().start()
print(os.getpid(), broker.pid, flush=True)
if sys.argv[1] == "fork" and os.fork() == 0:  # a child that starts a broker of its own
    broker = EmbeddedBroker().start()
    print(os.getpid(), broker.pid, flush=True)
sys.stdin.read()
"""


def _killed_and_gone(process: int, broker: int) -> bool:
    """SIGKILL to `process` (as a crashed or timed-out test worker dies: no finalizer runs);
    whether `broker` is gone within 15 s."""
    os.kill(process, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alive(broker):
        time.sleep(0.1)
    return not alive(broker)


@pytest.mark.parametrize("how", ["alone", "fork"])
def test_no_broker_outlives_a_killed_process_that_started_it(how):
    """With `fork`, the parent is killed while its forked child lives on: the parent's broker
    goes at once, the child's when the child is killed."""
    if how == "fork" and not hasattr(os, "fork"):
        pytest.skip("Windows has no os.fork()")
    starter = subprocess.Popen([sys.executable, "-c", _STARTS_BROKERS, how],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    started: list[tuple[int, int]] = []
    try:
        assert starter.stdout is not None
        for _ in range(2 if how == "fork" else 1):
            line = starter.stdout.readline()
            assert line, "no broker started"
            process, broker = map(int, line.split())
            started.append((process, broker))
            assert alive(broker)
        for process, broker in started:
            assert _killed_and_gone(process, broker), \
                f"the embedded broker outlived the process that started it ({how})"
    finally:
        for _, broker in started:
            if alive(broker):
                os.kill(broker, signal.SIGKILL)
        if starter.poll() is None:
            os.killpg(starter.pid, signal.SIGKILL)
        starter.wait(10)
        for pipe in (starter.stdin, starter.stdout):
            if pipe is not None:
                pipe.close()
