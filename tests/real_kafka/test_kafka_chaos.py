"""Chaos on three real Apache Kafka nodes (replication factor 3, min.insync.replicas=2,
acks=all, unclean leader election off): while an idempotent producer and a transactional one
(each its own topic) stream keyed numbered records, the leader of a partition is killed
(SIGKILL) and restarted, the producers' connections to a leader cut by the kernel (ss -K),
another leader stopped (SIGTERM) and, while it is down, the producers' client id throttled
by a producer_byte_rate quota and their connections cut again, then it is restarted; a
third leader paused (SIGSTOP) longer than request_timeout_ms, and preferred leaders elected.
librdkafka's consumer reads it all back (read_committed for the transactions): nothing
acknowledged is lost, nothing is written twice or out of order, every future ends within
delivery_timeout_ms, each committed transaction is there whole and no aborted one.

Then a rolling restart, the short form (issue 37 item 3): one node
stopped with SIGTERM and started again, then another killed with SIGKILL and started again,
each waited for until it is back in every ISR, while an idempotent producer and a
transactional one stream: no error reaches the application, nothing is lost, duplicated or
reordered, every transaction commits. Each record's wait (enqueue to acknowledgement) is
printed as p50/p99/max, for all records and for those enqueued while a node was down.

KIP-951 on a real leader election: a partition's leadership moves while the old leader
stays up; the producer goes to the new leader named in the refusal, with no metadata request
in between.

Many tasks on uvloop with the default settings: every record once (a timer Handle once made
records land twice).

The soak (10 minutes and more) and the full roll (every node SIGTERM, then every node
SIGKILL) are benchmarks/kafka_soak.py; the figures are printed (`-s`). The three nodes are this module's alone: stopped when it ends."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Callable

import pytest

from aioproducer import Producer

from aioproducer.testing import ApacheKafka, ApacheKafkaUnavailable
from aioproducer.testing.pytest_plugin import REQUIRE_ENV
from aioproducer.protocol.messages import ApiKey
from tests.support.kafka_chaos import (KEYS, SETTINGS, TOPIC_CONFIG, FaultPlan, StreamResult,
                                       check, run_streams, summary, value)
from tests.support.leadership import (WireLog, leader_and_replicas, move_leader, named_leader,
                                      produce_to)
from tests.support.readback import consume_all

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def kafka3():
    """Three Apache Kafka nodes (skipped, or failed under CI, as `apache_kafka` is when
    Java or Maven is missing)."""
    try:
        kafka = ApacheKafka(3).start()
    except ApacheKafkaUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"Apache Kafka is required ({REQUIRE_ENV}=1) but cannot run: {exc}",
                        pytrace=False)
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.mark.slow
async def test_idempotent_and_transactional_streams_through_chaos_on_three_kafka_nodes(kafka3):
    runs, faults = await run_streams(kafka3, FaultPlan.chaos_round)
    for run in runs:
        print("\n" + summary(f"{run.name} chaos", run.result, faults, run.found))
    print("\n".join(faults.log))
    assert faults.kills == 1 and faults.stops == 1 and faults.pauses == 1
    assert faults.elections == 1 and faults.throttles == 1
    assert faults.cuts > 0 or faults.cut_skipped, faults.log
    assert faults.leader_changes >= 3, faults.log
    for run in runs:
        result, found = run.result, run.found
        assert (found.lost, found.duplicates, found.reordered) == ([], 0, 0), run.name
        assert found.unexpected == [], run.name
        assert result.longest_future <= SETTINGS["delivery_timeout_ms"] / 1000, run.name
        assert result.metrics.produce_throttle_time_ms > 0, run.name  # the quota was felt
        if run.name == "transactional":
            assert found.torn_transactions == [] and found.aborted_seen == []
            assert len(result.committed) >= 10 and len(result.aborted) >= 1
        else:
            assert result.failed == [], result.failed[:3]
            assert result.records >= 1000


def _result(transactional: bool, txn_of: dict, acked: set, committed=(), aborted=()):
    sent: dict[int, list[int]] = {k: [] for k in range(KEYS)}
    for key, seq in txn_of:
        sent[key].append(seq)
    return StreamResult(transactional, sent, set(committed), set(aborted), set(), txn_of,
                        acked, [], [], [], [], 0.0)


def test_the_read_back_finds_a_loss_a_duplicate_a_reordering_and_a_torn_transaction(kafka3):
    """The checks above can fail: records written by librdkafka with a gap, a duplicate and
    two swapped, and a transaction's records half there and an aborted one's present, are
    each reported."""
    from confluent_kafka import Producer as RdProducer

    topic, txn_topic = (f"check-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for name in (topic, txn_topic):
        kafka3.create_topic(name, 1, replication_factor=3)
    rd = RdProducer({"bootstrap.servers": kafka3.bootstrap})
    for seq in (0, 2, 1, 1):  # 3 and 4 lost, 1 twice, 2 before 1
        rd.produce(topic, value(0, seq, 1), b"0")
    for seq, txn in ((0, 1), (2, 2)):  # txn 1 lacks seq 1; txn 2 was aborted
        rd.produce(txn_topic, value(0, seq, txn), b"0")
    assert rd.flush(30) == 0

    found = check(kafka3.bootstrap, topic, _result(
        False, {(0, s): 1 for s in range(5)}, {(0, s) for s in range(5)}), timeout=5)
    assert (found.lost, found.duplicates, found.reordered) == ([(0, 3), (0, 4)], 1, 1)
    found = check(kafka3.bootstrap, txn_topic, _result(
        True, {(0, 0): 1, (0, 1): 1, (0, 2): 2}, set(), committed={1}, aborted={2}), timeout=5)
    assert found.lost == [(0, 1)] and found.torn_transactions == [1]
    assert found.aborted_seen == [2] and found.unexpected == [(0, 2)]


def _short_roll(plan: FaultPlan) -> list:
    return [lambda: plan.restart(0, "stop"), lambda: plan.restart(1, "kill")]


@pytest.mark.slow
async def test_rolling_restart_passes_unnoticed_by_both_streams(kafka3):
    runs, faults = await run_streams(kafka3, _short_roll, abort_every=None)
    for run in runs:
        print("\n" + summary(f"{run.name} rolling restart", run.result, faults, run.found))
    print("\n".join(faults.log))
    assert faults.stops == 1 and faults.kills == 1
    for run in runs:
        result, found = run.result, run.found
        assert result.app_errors == [] and result.failed == [], (run.name, result.app_errors,
                                                                 result.failed[:3])
        assert (found.lost, found.duplicates, found.reordered) == ([], 0, 0), run.name
        assert found.unexpected == [], run.name
        if run.name == "transactional":
            assert result.unknown == set() and found.torn_transactions == []
            assert len(result.committed) >= 10
        assert result.records >= 500, run.name


async def test_a_leader_election_redirects_the_producer_without_a_metadata_request(
        kafka3, monkeypatch):
    """KIP-951 on a real election: while an idempotent producer streams to a partition
    (replication factor 3), its leadership moves to another replica and the old leader stays
    up. The old leader refuses the next produce requests NOT_LEADER_OR_FOLLOWER, naming the
    new leader in CurrentLeader; the producer's next produce request for that partition goes
    to the new leader with no Metadata request written in between, well before
    retry_backoff_ms would have let a retry go. librdkafka reads every record once, in
    order."""
    topic = f"kip951-{uuid.uuid4().hex[:8]}"
    kafka3.create_topic(topic, 1, replication_factor=3, config=TOPIC_CONFIG)
    old, replicas = leader_and_replicas(kafka3.bootstrap, topic)
    new = next(r for r in replicas if r != old)
    address = {n: kafka3.bootstrap_for("PLAINTEXT", [n]) for n in range(3)}
    wire = WireLog().install(monkeypatch)
    futures = []
    async with Producer(kafka3.bootstrap, acks="all", linger_ms=2, retry_backoff_ms=5_000,
                        retry_backoff_max_ms=5_000, delivery_timeout_ms=60_000) as producer:
        done = asyncio.Event()

        async def stream() -> None:
            for i in range(200_000):  # ~2 records a millisecond, until told to stop
                futures.append(await producer.enqueue(topic, b"%06d" % i, partition=0))
                if done.is_set():
                    return
                if i % 4 == 3:
                    await asyncio.sleep(0.002)

        writer = asyncio.create_task(stream())
        # The leader moves once the producer streams to it (a record acknowledged), not after
        # a fixed 0.5 s, which did not make sure it did: on a fresh cluster the first
        # InitProducerId was refused COORDINATOR_LOAD_IN_PROGRESS (6 runs of 10 here) and
        # retried after the 5 s retry_backoff_ms, so nothing was produced before the move;
        # and a producer whose first metadata for the topic came after the move (injected: a
        # fetch 1.5 s late) went straight to the new leader, failing as CI did once: "the
        # old leader refused nothing". The stream then goes on until a produce request went
        # to the new leader, not a fixed 0.5 s more. A failure's message holds the wire.
        await _until(lambda: bool(futures) and futures[0].done(), "a record acknowledged")
        started = len(wire.events)
        await asyncio.to_thread(move_leader, kafka3.bootstrap, topic, 0, new)
        await _until(lambda: wire.first(started, lambda e: produce_to(
            e, address[new], topic, 0)) is not None or writer.done(),
            "a produce request to the new leader")
        done.set()
        await writer
        await asyncio.gather(*futures)
        redirects = producer.metrics().leader_redirects
    nodes = {a: n for n, a in address.items()}
    seen = f"old leader {old}, new {new}; from the move on:\n{wire.describe(started, nodes, topic)}"
    refused = wire.first(started, lambda e: e.address == address[old]
                         and named_leader(e, topic, 0) is not None)
    assert refused is not None, f"the old leader refused nothing; {seen}"
    assert named_leader(wire.events[refused], topic, 0) == new, seen  # Kafka named the new one
    moved = wire.first(refused, lambda e: produce_to(e, address[new], topic, 0))
    assert moved is not None, f"nothing was produced to the new leader; {seen}"
    between = wire.events[refused:moved]
    assert [e for e in between if e.out and e.api_key == ApiKey.METADATA] == [], seen
    # Not after the 5 s backoff: within half of it of the old leader's last refusal (the
    # batches in flight behind the first refused one come back first, the old leader's
    # answers to them taking up to 0.5 s on a loaded machine; then a connection to the new
    # leader may have to be opened on a slow node: 1 s was thin for that).
    last = max(i for i in range(refused, moved)
               if named_leader(wire.events[i], topic, 0) is not None)
    assert wire.events[moved].at - wire.events[last].at < 2.5, seen
    assert redirects >= 1
    got = consume_all(kafka3.bootstrap, topic, expected=len(futures))
    assert [r.value for r in got] == [b"%06d" % i for i in range(len(futures))]


async def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        await asyncio.sleep(0.01)


def test_records_sent_from_many_tasks_on_uvloop_land_once(kafka3):
    """The default settings (idempotence on, acks=all) on uvloop, 100 tasks sending 60,000
    keyed records at 15,000 a second to six partitions led by three nodes: each record is
    read back once. A send() that opened a batch while the sender's timer was a uvloop
    Handle due at once appended its record twice (before 2ec9cad: 23 records of 100,000
    twice in a script, 1 of 30,000 in this test; test_blocked_broker.py has the same shape
    on the simulated cluster, where it fails every time)."""
    uvloop = pytest.importorskip("uvloop")
    topic = f"once-{uuid.uuid4().hex[:8]}"
    kafka3.create_topic(topic, 6, replication_factor=3, config=TOPIC_CONFIG)
    records, tasks, rate = 60_000, 100, 15_000

    async def main() -> None:
        async with Producer(kafka3.bootstrap) as producer:
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def worker(index: int) -> None:
                for i in range(records // tasks):
                    n = i * tasks + index
                    delay = start + n / rate - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await asyncio.wait_for(
                        producer.send(topic, b"%d" % n, key=b"key-%d" % (n % 1000)), 60)

            await asyncio.wait_for(asyncio.gather(*(worker(t) for t in range(tasks))), 120)

    uvloop.run(main())
    got = consume_all(kafka3.bootstrap, topic, records, 60)
    values = sorted(int(r.value) for r in got)
    assert values == list(range(records)), \
        f"{len(got)} records read, {len(set(values))} distinct, of {records} sent"
