"""KIP-219 seen from the client's side: does a producer write any request to a broker after it
read a throttled response from it, before the throttle ended?

A broker (or the SimulatedCluster) cannot tell: requests the client pipelined before it read
the throttled response reach the broker after the response went out, and are allowed
(`ClusterStats.requests_while_throttled` counts them too). The client's connection can: the
watch wraps `BrokerConnection._handle` and `_deliver` and the framing that encodes each request
as it is written (calling through, changing nothing), notes per connection when a response with
throttle_time_ms > 0 from a broker that speaks Produce v6 (where the client must hold back)
was read (its throttle counted from when the client began handling it), and checks every request written to that connection against it.
It reads the responses and the writes themselves, not the client's bookkeeping, so a client
that ignores the throttle is caught.
"""

from __future__ import annotations

from typing import Any

import pytest

from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.framing import Framing
from aioproducer.protocol.messages import ApiKey


class ThrottleWatch:
    def __init__(self) -> None:
        self.throttles_read = 0  # throttled responses the client read
        self.written: dict[ApiKey, int] = {}  # requests written, by kind
        self.violations: list[str] = []
        # Per connection (by its framing, which writes its requests): when its latest
        # throttle ends, in loop time, and the connection.
        self._until: dict[Framing, tuple[float, BrokerConnection]] = {}
        self._read_at: dict[BrokerConnection, float] = {}  # when it began handling responses

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "ThrottleWatch":
        send_request, handle = Framing.send_request, BrokerConnection._handle
        deliver = BrokerConnection._deliver
        watch = self

        def watched_send_request(framing: Framing, api_key: ApiKey, version: int, body: Any,
                                 **kwargs: Any) -> tuple[bytes, int]:
            watch.written[api_key] = watch.written.get(api_key, 0) + 1
            until, conn = watch._until.get(framing, (None, None))
            if until is not None and conn is not None:
                now = conn._loop.time()
                if now < until:
                    watch.violations.append(
                        f"{conn!r}: a {api_key.name} request written {(until - now) * 1000:.1f} "
                        "ms before the end of a throttle the client had read")
            return send_request(framing, api_key, version, body, **kwargs)

        def watched_handle(conn: BrokerConnection, responses: Any) -> None:
            watch._read_at[conn] = conn._loop.time()
            handle(conn, responses)

        def watched_deliver(conn: BrokerConnection, entry: Any, body: Any,
                            exc: BaseException | None) -> None:
            if body is not None and body.get("throttle_time_ms", 0) > 0 and \
                    conn.broker_ranges.get(ApiKey.PRODUCE, (0, 0))[1] >= 6:
                watch.throttles_read += 1
                end = watch._read_at[conn] + body["throttle_time_ms"] / 1000
                earlier = watch._until.get(conn._framing, (0.0, conn))[0]
                watch._until[conn._framing] = (max(earlier, end), conn)
            deliver(conn, entry, body, exc)

        monkeypatch.setattr(Framing, "send_request", watched_send_request)
        monkeypatch.setattr(BrokerConnection, "_handle", watched_handle)
        monkeypatch.setattr(BrokerConnection, "_deliver", watched_deliver)
        return self
