"""Ports on 127.0.0.1: a free one, for a proxy or broker whose port must be known first, and
a silent one, like the address of a host that is gone."""

from __future__ import annotations

import contextlib
import socket
from typing import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """A port whose connection attempts hang (a dead host's packets are dropped): it listens,
    but its accept queue is full, so the kernel ignores new connection requests."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.socket())
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(3):  # fill the queue
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        yield port
