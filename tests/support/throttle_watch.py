"""KIP-219 seen from the client's side: does a producer write a Produce request to a broker
after it read a throttled response from it, before the throttle ended?

A broker (or the SimulatedCluster) cannot tell: requests the client pipelined before it read
the throttled response reach the broker after the response went out, and are allowed
(`ClusterStats.requests_while_throttled` counts them too). The client's connection can: the
watch wraps `BrokerConnection` (calling through, changing nothing) and notes, per connection,
when a Produce response with throttle_time_ms > 0 (v6+, where the client must hold back) was
handed to the client, and checks every Produce written to that connection against it. It
reads the response itself, not the sender's bookkeeping, so a sender that ignores the throttle
is caught.
"""

from __future__ import annotations

from typing import Any

import pytest

from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.messages import ApiKey


class ThrottleWatch:
    def __init__(self) -> None:
        self.throttles_read = 0  # throttled Produce responses the client read
        self.produce_written = 0
        self.violations: list[str] = []
        self._until: dict[BrokerConnection, float] = {}  # loop time its latest throttle ends

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "ThrottleWatch":
        send, deliver = BrokerConnection.send, BrokerConnection._deliver
        watch = self

        def watched_send(conn: BrokerConnection, api_key: ApiKey, body: Any, on_response: Any,
                         *, version: int | None = None) -> None:
            if api_key == ApiKey.PRODUCE:
                watch.produce_written += 1
                until = watch._until.get(conn)
                now = conn._loop.time()
                if until is not None and now < until:
                    watch.violations.append(
                        f"{conn!r}: a Produce written {(until - now) * 1000:.1f} ms before the "
                        "end of a throttle the client had read")
            send(conn, api_key, body, on_response, version=version)

        def watched_deliver(conn: BrokerConnection, entry: Any, body: Any,
                            exc: BaseException | None) -> None:
            if entry.api_key == ApiKey.PRODUCE and body is not None and \
                    body.get("throttle_time_ms", 0) > 0 and \
                    conn.versions.get(ApiKey.PRODUCE, 0) >= 6:
                watch.throttles_read += 1
                end = conn._loop.time() + body["throttle_time_ms"] / 1000
                watch._until[conn] = max(watch._until.get(conn, 0.0), end)
            deliver(conn, entry, body, exc)

        monkeypatch.setattr(BrokerConnection, "send", watched_send)
        monkeypatch.setattr(BrokerConnection, "_deliver", watched_deliver)
        return self

