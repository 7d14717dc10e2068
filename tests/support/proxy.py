"""FaultProxy: a TCP proxy between client and broker that breaks things on request.

It runs its own event loop in a thread, so it keeps forwarding while a test's loop is busy
and works from sync tests as well. Faults: cut every connection now, cut after N more bytes
(mid-frame), stall responses, refuse connections (broker "down"), send garbage, throttle.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from typing import Any


class FaultProxy:
    def __init__(self, upstream_port: int, listen_port: int,
                 tls: ssl.SSLContext | None = None) -> None:
        self.upstream_port = upstream_port
        self._tls = tls  # terminate TLS here: clients speak TLS, the broker plain TCP
        self.port = listen_port
        self.connections_accepted = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._stalled = False
        self._refusing = False
        self._cut_after: tuple[int, str] | None = None
        self._rate: float | None = None
        self._split: int | None = None

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._call(self._start_server())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._shutdown(), timeout=2)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(2)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults (callable from any thread) --------------------------------------------------

    def cut_all(self) -> None:
        self._loop.call_soon_threadsafe(self._abort_all)

    def cut_after(self, n_bytes: int, direction: str = "up") -> None:
        """Abort the connection that next forwards `n_bytes` more in that direction
        ("up": client to broker, "down": broker to client)."""
        self._cut_after = (n_bytes, direction)

    def stall(self, on: bool) -> None:
        self._stalled = on

    def refuse(self, on: bool, cut: bool = True) -> None:
        """Refuse new connections (the broker is down); `cut=False` leaves the open ones up
        until they fail (a partition their sockets have not noticed yet)."""
        self._refusing = on
        if on and cut:
            self.cut_all()

    def send_garbage(self) -> None:
        def send() -> None:
            for client, _ in list(self._pairs):
                client.write(os.urandom(64))
        self._loop.call_soon_threadsafe(send)

    def split(self, n_bytes: int | None) -> None:
        """Forward what the broker sends gathered for 2 ms, then cut in pieces of `n_bytes`,
        each written on its own (None: as it comes): the client reads frames cut anywhere, the
        end of one with the start of the next, or several whole ones in one read."""
        self._split = n_bytes

    def throttle(self, bytes_per_s: float | None) -> None:
        self._rate = bytes_per_s

    # -- inside the proxy's loop -----------------------------------------------------------

    def _call(self, coroutine: Any, timeout: float = 5) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start_server(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port,
                                                  ssl=self._tls)

    async def _shutdown(self) -> None:
        self._abort_all()
        if self._server is not None:
            self._server.close()

    def _abort_all(self) -> None:
        for client, upstream in list(self._pairs):
            client.transport.abort()
            upstream.transport.abort()
            self.cuts += 1
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections_accepted += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)
        await asyncio.gather(self._pipe(reader, up_writer, "up", pair),
                             self._pipe(up_reader, writer, "down", pair),
                             return_exceptions=True)
        self._pairs.discard(pair)
        writer.transport.abort()
        up_writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str, pair: tuple) -> None:
        while True:
            if direction == "down" and self._split:
                await asyncio.sleep(0.002)  # the read below takes all that came meanwhile
            data = await reader.read(65536)
            if not data:
                break
            while self._stalled and direction == "down" and pair in self._pairs:
                await asyncio.sleep(0.01)
            cut = self._cut_after
            if cut is not None and cut[1] == direction:
                if len(data) >= cut[0]:
                    self._cut_after = None
                    writer.write(data[:cut[0]])
                    self.cuts += 1
                    self._pairs.discard(pair)
                    pair[0].transport.abort()
                    pair[1].transport.abort()
                    return
                self._cut_after = (cut[0] - len(data), direction)
            if self._rate:
                await asyncio.sleep(len(data) / self._rate)
            if pair not in self._pairs:
                return
            step = self._split if direction == "down" and self._split else len(data)
            for start in range(0, len(data), step):
                writer.write(data[start:start + step])
                await writer.drain()
                if step < len(data):
                    await asyncio.sleep(0.0005)  # the client's read takes this piece alone
