"""Transactions V2 (KIP-890 part 2) when the producer epoch runs out, on Apache Kafka 4.4: the
coordinator bumps the epoch at every EndTxn, and when the epoch reaches Short.MAX_VALUE - 1
(32766) EndTxn answers a new producer id with epoch 0. The producer must take it and number
its next transaction's batches from zero under the new id; read_committed sees every
committed record once and no aborted one.

The epoch is brought near the limit by InitProducerId for the same transactional id, which
bumps it by one each time: 32,765 requests, pipelined on one connection (the broker handles a
connection's requests one after another), take about a minute on a shared 2-core machine.
(The simulated cluster cannot play this: the embedded broker behind it speaks no EndTxn v5
and no transaction.version feature, so its producers run V1 transactions.)"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Iterator

import pytest

from aioproducer import Producer
from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.messages import ApiKey
from aioproducer.testing import ApacheKafka, ApacheKafkaUnavailable
from aioproducer.testing.pytest_plugin import REQUIRE_ENV
from tests.support.readback import consume_all, fetch_raw_batches
from tests.support.transactions import COMMITTED_VALUES, commit_abort_commit

EXHAUSTED = 32766  # Kafka's TransactionMetadata: an epoch at Short.MAX_VALUE - 1 is spent
WINDOW = 500  # InitProducerId requests in flight at once
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 14, 15, 16


@pytest.fixture(scope="module")
def kafka() -> Iterator[ApacheKafka]:
    """A node of this module's own, formatted with transaction.version=2."""
    try:
        cluster = ApacheKafka(transaction_version=2)
        cluster.start()
    except ApacheKafkaUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"Apache Kafka is required but cannot run: {exc}", pytrace=False)
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


async def bump_epoch_to(kafka: ApacheKafka, transactional_id: str, epoch: int) -> int:
    """InitProducerId for `transactional_id` until its epoch is `epoch`; returns the
    producer id."""
    host, _, port = kafka.bootstrap.rpartition(":")
    conn = await BrokerConnection.connect(0, host, int(port), client_id="epoch-bumper",
                                          request_timeout=120, connect_timeout=10)
    body = {"transactional_id": transactional_id, "transaction_timeout_ms": 60000}
    try:
        for _ in range(300):  # FindCoordinator makes the transaction log on first use
            found = await conn.request(ApiKey.FIND_COORDINATOR,
                                       {"key_type": 1, "coordinator_keys": [transactional_id]})
            if found["coordinators"][0]["error_code"]:
                await asyncio.sleep(0.1)
                continue
            first = await conn.request(ApiKey.INIT_PRODUCER_ID, body)
            if first["error_code"] not in (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
                                           COORDINATOR_LOAD_IN_PROGRESS):
                break
            await asyncio.sleep(0.1)
        assert first["error_code"] == 0, first
        producer_id, reached = first["producer_id"], first["producer_epoch"]
        while reached < epoch:
            answers = await asyncio.gather(*(conn.request(ApiKey.INIT_PRODUCER_ID, body)
                                             for _ in range(min(WINDOW, epoch - reached))))
            assert all(a["error_code"] == 0 and a["producer_id"] == producer_id
                       for a in answers), [a for a in answers if a["error_code"]][:3]
            reached = answers[-1]["producer_epoch"]
        assert reached == epoch
        return producer_id
    finally:
        conn.close()


@pytest.mark.slow
async def test_a_spent_epoch_brings_a_new_producer_id_and_the_transactions_go_on(kafka):
    topic = f"ex-{uuid.uuid4().hex[:10]}"
    await asyncio.to_thread(kafka.create_topic, topic, 2)
    tid = f"tid-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    old_id = await bump_epoch_to(kafka, tid, EXHAUSTED - 1)
    print(f"\n{EXHAUSTED - 1} InitProducerId requests in {time.monotonic() - started:.1f} s")
    seen = []
    async with Producer(kafka.bootstrap, transactional_id=tid, linger_ms=5) as producer:
        # Its own InitProducerId took the epoch to the last one that is not spent.
        seen.append((producer.metrics().producer_id, producer.metrics().producer_epoch))
        seen += await commit_abort_commit(producer, topic, lambda: (
            producer.metrics().producer_id, producer.metrics().producer_epoch))
    new_id = seen[1][0]
    assert seen == [(old_id, EXHAUSTED), (new_id, 0), (new_id, 1), (new_id, 2), (new_id, 3)]
    assert new_id != old_id
    got = await asyncio.to_thread(consume_all, kafka.bootstrap, topic, 6, 20,
                                  "read_committed")
    assert sorted(r.value for r in got) == COMMITTED_VALUES
    # The first transaction's batches under the old id at the spent epoch's predecessor,
    # the next ones under the new id, each numbered from zero.
    # Each transaction's markers at the epoch after its own (V2's bump); the spent one's
    # under the old id at Short.MAX_VALUE.
    batches = await asyncio.to_thread(fetch_raw_batches, kafka.bootstrap, topic, 0)
    assert [(b.producer_id, b.producer_epoch, b.base_sequence) for b in batches
            if not b.is_control] == \
        [(old_id, EXHAUSTED, 0), (new_id, 0, 0), (new_id, 1, 0), (new_id, 2, 0)]
    assert [(b.producer_id, b.producer_epoch, b.control_type) for b in batches
            if b.is_control] == \
        [(old_id, EXHAUSTED + 1, "COMMIT"), (new_id, 1, "COMMIT"), (new_id, 2, "ABORT"),
         (new_id, 3, "COMMIT")]
