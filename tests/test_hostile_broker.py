"""What a broken or hostile broker can do to the client through its responses: a huge one
must not freeze the event loop while it is decoded, one that claims more than any cluster
has is refused before it is built, and one over receive_message_max_bytes is refused before
it is buffered. The broker is tests/support/hostile.py's fake (Tansu answers honestly)."""

from __future__ import annotations

import asyncio
import time

import pytest

from aioproducer import Producer
from aioproducer.client.connection import BrokerConnection
from aioproducer.errors import CorruptMessageError
from aioproducer.protocol.messages import ApiKey, decode_response
from tests.support.hostile import METADATA_VERSION, HostileBroker, metadata_body, \
    metadata_body_of_size


async def _connect(broker: HostileBroker, **options) -> BrokerConnection:
    return await BrokerConnection.connect(1, "127.0.0.1", broker.port, client_id="t",
                                          request_timeout=60, connect_timeout=10, **options)


async def test_a_large_response_is_decoded_off_the_event_loop():
    """A 4 MiB Metadata response (100,000 partitions) takes most of a second to decode; in
    data_received that froze the loop (no timer, no other connection) for all of it. Now it
    is decoded in a worker thread, and the loop's callbacks go on meanwhile: the longest gap
    between them is a fraction of the decoding time (the GIL is shared every 5 ms)."""
    body = metadata_body_of_size(4 << 20, topics=40, replicas=3)
    frame = b"\x00\x00\x00\x01\x00" + body
    started = time.perf_counter()
    expected = decode_response(ApiKey.METADATA, METADATA_VERSION, frame)
    decoding = time.perf_counter() - started
    with HostileBroker(body) as broker:
        conn = await _connect(broker)
        gaps: list[float] = []
        stop = False

        async def tick() -> None:
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        try:
            response = await conn.request(ApiKey.METADATA, {"topics": [{"name": "t0"}]})
        finally:
            stop = True
            await ticker
            conn.close()
    assert response == expected and sum(len(t["partitions"]) for t in response["topics"]) > 90_000
    assert max(gaps) < decoding / 4, (max(gaps), decoding)


@pytest.mark.parametrize("topics, partitions, replicas, says", [
    (1, 200_001, 0, "partitions claims 200001 items"),
    (1, 1, 32_768, "replica_nodes claims 32768 items"),
])
async def test_a_response_claiming_more_than_any_cluster_has_is_refused(topics, partitions,
                                                                         replicas, says):
    """More partitions in one topic (or replicas of one partition) than any cluster has:
    a CorruptMessageError at the count, before millions of objects are built, and the
    connection closes (its requests are retried on another)."""
    with HostileBroker(metadata_body(topics, partitions, replicas)) as broker:
        conn = await _connect(broker)
        with pytest.raises(CorruptMessageError, match=says):
            await conn.request(ApiKey.METADATA, {"topics": [{"name": "t0"}]})
        assert conn.closed


async def test_a_response_over_receive_message_max_bytes_is_refused_before_it_is_buffered():
    """The cap is a setting (librdkafka's name and default, 100 MB): over it, start() fails
    with an error that names it, rather than buffering whatever the size prefix claims."""
    with HostileBroker(metadata_body_of_size(2 << 20, topics=1, replicas=3)) as broker:
        producer = Producer(f"127.0.0.1:{broker.port}", receive_message_max_bytes=1 << 20,
                            max_block_ms=5000)
        with pytest.raises(CorruptMessageError, match="receive_message_max_bytes=1048576"):
            await producer.start()
    assert producer.config.receive_message_max_bytes == 1 << 20
    assert Producer("h:1").config.receive_message_max_bytes == 100_000_000


async def test_responses_behind_a_large_one_wait_for_it_in_order():
    """Kafka answers a connection's requests in order, and callers rely on it (a produce
    response after a metadata one): a small response that arrives while a large one before
    it is decoded in a thread is delivered after it, never before."""
    with HostileBroker(metadata_body_of_size(1 << 20, topics=4, replicas=3)) as broker:
        conn = await _connect(broker)
        delivered: list[str] = []
        done = asyncio.get_running_loop().create_future()

        def on(name: str):
            def callback(body, exc) -> None:
                assert exc is None and body is not None
                delivered.append(name)
                if len(delivered) == 3 and not done.done():
                    done.set_result(None)
            return callback

        conn.send(ApiKey.METADATA, {"topics": [{"name": "t0"}]}, on("metadata"))
        conn.send(ApiKey.API_VERSIONS, {}, on("versions"), version=0)
        conn.send(ApiKey.METADATA, {"topics": [{"name": "t0"}]}, on("metadata again"))
        await asyncio.wait_for(done, 30)
        conn.close()
    assert delivered == ["metadata", "versions", "metadata again"]
