"""A broker that stops reading: the producer's buffered bytes stay bounded and enqueue()
waits for memory; once it reads again every record accepted arrives."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aioproducer import Producer
from aioproducer.errors import BufferExhaustedError
from tests.support.proxy import FaultProxy

MAX_REQUEST_SIZE = 256 * 1024
MAX_BLOCK_MS = 1000
_MOST_BYTES = 64 * 1024 * 1024  # far beyond what the kernel's socket buffers take


async def fill_a_broker_that_stops_reading(bootstrap: str, proxy: FaultProxy, topic: str,
                                           max_request_size: int = MAX_REQUEST_SIZE,
                                           **config: Any) -> list[bytes]:
    """Enqueue 1 KB records (acks=0 unless `config` says) while the proxy reads nothing,
    until enqueue() raises BufferExhaustedError (at most 64 MB); then let it read again and
    close. Returns the values accepted, in order. Asserts the connection's write buffer never
    held more than its high-water mark (max_request_size) plus one request."""
    config = {"acks": 0, "enable_idempotence": False, "linger_ms": 5, "batch_size": 64 * 1024,
              "buffer_memory": 2 * 1024 * 1024, **config}
    producer = Producer(bootstrap, max_request_size=max_request_size,
                        max_block_ms=MAX_BLOCK_MS, **config)
    await producer.start()
    try:
        accepted = [b"first"]
        handles = [await producer.enqueue(topic, accepted[0])]
        await asyncio.wait_for(handles[0], 10)
        assert producer._cluster is not None
        [conn] = producer._cluster.open_connections()
        transport = conn._transport
        assert transport is not None
        proxy.stop_reading(True)
        most_buffered = 0
        for i in range(_MOST_BYTES // 1000):
            value = b"%08d" % i + bytes(992)
            started = time.monotonic()
            try:
                handles.append(await producer.enqueue(topic, value))
            except BufferExhaustedError:
                waited = time.monotonic() - started
                break
            accepted.append(value)
            most_buffered = max(most_buffered, transport.get_write_buffer_size())
            if i % 64 == 0:
                await asyncio.sleep(0)  # the sender's turn, as a producing service gives it
        else:
            raise AssertionError(
                f"enqueue() never waited: {len(accepted) - 1} records of 1 KB accepted while "
                f"the broker read nothing; {transport.get_write_buffer_size()} bytes buffered "
                "in the connection's transport, outside buffer_memory")
        assert waited >= MAX_BLOCK_MS / 1000 * 0.9, f"BufferExhaustedError after {waited:.2f} s"
        # (a request: up to max_request_size of batches, and its headers)
        assert most_buffered <= 2 * max_request_size + 4096, \
            f"{most_buffered} bytes buffered in the transport, over the high-water mark " \
            f"({max_request_size}) plus a request"
        proxy.stop_reading(False)
        await asyncio.wait_for(asyncio.gather(*handles), 30)
    finally:
        proxy.stop_reading(False)
        await asyncio.wait_for(producer.close(), 30)
    return accepted
