"""Client telemetry (KIP-714) on Apache Kafka 4.4: a one-node cluster with a telemetry
receiver of our own (plugins/TelemetryDump.java, compiled here with javac against Kafka's
jars, a metric reporter on the broker's class path) that writes every payload it gets to a
file; the payloads are read with opentelemetry-proto. Client-metrics subscriptions are made
with Kafka's ConfigCommand (kafka-configs), one per test, matched by client id, at
interval.ms=100, the least Kafka allows."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from aioproducer import Producer
from aioproducer.testing import ApacheKafka, ApacheKafkaUnavailable
from aioproducer.testing.pytest_plugin import REQUIRE_ENV

PLUGIN = Path(__file__).parent / "plugins" / "TelemetryDump.java"
CONFIG_COMMAND = "org.apache.kafka.tools.ConfigCommand"
P = "org.apache.kafka.producer."


@dataclass
class Push:
    client_id: str
    instance_id: str
    terminating: bool
    interval_ms: int
    metrics: dict[str, list[tuple[str, float, dict[str, str], int, int]]]
    # name -> [(kind, value, attributes, temporality (0 for a gauge), time_unix_nano)]
    resource: dict[str, str]


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Apache Kafka is required but cannot run: {reason}", pytrace=False)
    pytest.skip(f"Apache Kafka cannot run here: {reason}")


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """One Kafka 4.4 node with the receiver (skipped without Java, javac or Maven, failed
    under AIOPRODUCER_REQUIRE_KAFKA=1, as the plugin's apache_kafka)."""
    work = tmp_path_factory.mktemp("telemetry")
    dump = work / "pushes.tsv"
    dump.touch()
    try:
        cluster = ApacheKafka(broker_config={
            "metric.reporters": "aioproducertest.TelemetryDump",
            "aioproducer.telemetry.file": dump}, classpath=[work / "classes"])
    except ApacheKafkaUnavailable as exc:
        _unavailable(str(exc))
    javac = shutil.which("javac")
    if javac is None:
        _unavailable("the telemetry receiver is compiled with javac: install a JDK")
    subprocess.run([javac, "--release", "17", "-cp", f"{cluster.libs}/*", "-d",
                    str(work / "classes"), str(PLUGIN)], check=True, timeout=120,
                   capture_output=True)
    try:
        cluster.start()
    except ApacheKafkaUnavailable as exc:
        _unavailable(str(exc))
    cluster.dump = dump  # type: ignore[attr-defined]
    try:
        yield cluster
    finally:
        cluster.stop()


def subscribe(kafka: ApacheKafka, clients: str, metrics: str, interval_ms: int = 100) -> None:
    """A client-metrics subscription named after `clients` (a client id regex), with
    kafka-configs; then waits until the broker describes it (it applies it from the metadata
    log)."""
    name = "sub-" + uuid.uuid5(uuid.NAMESPACE_DNS, clients).hex[:8]
    settings = kafka.directory / f"{name}-{time.monotonic_ns()}.properties"  # type: ignore
    settings.write_text(f"metrics={metrics}\ninterval.ms={interval_ms}\n"
                        f"match=client_id={clients}\n")
    common = ["--bootstrap-server", kafka.bootstrap, "--entity-type", "client-metrics",
              "--entity-name", name]
    kafka.run_tool(CONFIG_COMMAND, *common, "--alter", "--add-config-file", str(settings))
    for _ in range(10):
        if f"interval.ms={interval_ms}" in kafka.run_tool(CONFIG_COMMAND, *common, "--describe"):
            return
        time.sleep(0.5)
    raise AssertionError(f"the broker does not describe subscription {name}")


def pushes(kafka: ApacheKafka, client_id: str) -> list[Push]:
    found = []
    dump = kafka.dump.read_text()  # type: ignore[attr-defined]
    # Whole lines only: the broker may be appending one (a file read is not atomic with a
    # write: the reader can see its first page only).
    for line in dump[:dump.rfind("\n") + 1].splitlines():
        client, instance, terminating, interval, data = line.split("\t")
        if client != client_id:
            continue
        parsed = metrics_pb2.MetricsData.FromString(base64.b64decode(data))
        metrics: dict[str, list[tuple[str, float, dict[str, str], int, int]]] = {}
        attributes: dict[str, str] = {}
        for resource in parsed.resource_metrics:
            attributes.update((a.key, a.value.string_value) for a in resource.resource.attributes)
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    body = getattr(metric, kind)
                    temporality = body.aggregation_temporality if kind == "sum" else 0
                    for point in body.data_points:
                        metrics.setdefault(metric.name, []).append((
                            kind, point.as_double,
                            {a.key: a.value.string_value for a in point.attributes},
                            temporality, point.time_unix_nano))
        found.append(Push(client, instance, terminating == "true", int(interval), metrics,
                          attributes))
    return found


async def _produce_for(producer: Producer, topic: str, seconds: float) -> int:
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await producer.send(topic, b"r%d" % sent)
        sent += 1
        await asyncio.sleep(0.02)
    return sent


async def test_pushes_the_subscribed_metrics_at_its_interval_and_a_last_one_at_close(kafka):
    """The broker's receiver gets the Java producer's metrics by their names, with values
    that follow what the producer did, every ~100 ms as the subscription says (not the
    default 5 minutes), and close() ends with one push marked terminating."""
    await asyncio.to_thread(subscribe, kafka, "telemetry-all-.*", P)
    topic = f"k-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic)
    producer = Producer(kafka.bootstrap, client_id="telemetry-all-1", linger_ms=0)
    async with producer:
        sent = await _produce_for(producer, topic, 2.0)
    assert producer.metrics().records_sent == sent
    got = pushes(kafka, "telemetry-all-1")
    assert len(got) >= 6, [p.metrics.keys() for p in got]  # ~2 s at 100 ms, the first jittered
    assert [p.terminating for p in got] == [False] * (len(got) - 1) + [True]
    assert len({p.instance_id for p in got}) == 1 and \
        got[0].instance_id != "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's zero UUID, base64
    assert {p.interval_ms for p in got} == {100}
    names = set().union(*(p.metrics for p in got))
    assert {P + "node.request.latency.avg", P + "node.request.latency.max",
            P + "request.latency.avg", P + "record.queue.time.avg", P + "record.queue.time.max",
            P + "produce.throttle.time.avg", P + "produce.throttle.time.max",
            P + "connection.creation.rate", P + "connection.creation.total"} <= names
    assert all(name.startswith(P) for name in names)
    latencies = [(value, attributes) for p in got
                 for _, value, attributes, _, _ in p.metrics.get(P + "node.request.latency.avg", [])]
    assert latencies and all(0 < value < 5000 and attributes == {"node_id": "node-0"}
                             for value, attributes in latencies)
    # Kafka asks for delta temporality: the pushed deltas add up to the connections made.
    creations = [point for p in got for point in p.metrics[P + "connection.creation.total"]]
    assert all(kind == "sum" and temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
               for kind, _, _, temporality, _ in creations)
    assert sum(value for _, value, _, _, _ in creations) >= 1
    times = sorted(p.metrics[P + "connection.creation.total"][0][4] for p in got[:-1])
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert gaps[len(gaps) // 2] < 1e9  # median gap under a second (the interval is 100 ms)


async def test_a_transactional_producer_says_its_transactional_id(kafka):
    """KIP-714's resource attribute of a producer (the broker adds the client id)."""
    await asyncio.to_thread(subscribe, kafka, "telemetry-tx-.*", P)
    topic = f"k-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic)
    async with Producer(kafka.bootstrap, client_id="telemetry-tx-1",
                        transactional_id="telemetry-tx", linger_ms=0) as producer:
        async with producer.transaction():
            await producer.send(topic, b"in a transaction")
        deadline = time.monotonic() + 10
        while not pushes(kafka, "telemetry-tx-1") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    got = pushes(kafka, "telemetry-tx-1")
    assert got and got[-1].terminating
    assert all(push.resource == {"transactional_id": "telemetry-tx"} for push in got)


async def test_a_changed_subscription_is_fetched_again(kafka):
    """The operator changes what the subscription asks for while the producer pushes: the
    broker refuses the old subscription id (UNKNOWN_SUBSCRIPTION_ID), the producer fetches
    the new one and pushes what it asks for from then on."""
    await asyncio.to_thread(subscribe, kafka, "telemetry-change-.*", P + "node.")
    topic = f"k-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic)
    async with Producer(kafka.bootstrap, client_id="telemetry-change-1", linger_ms=0) as p:
        await _produce_for(p, topic, 1.0)
        before = len(pushes(kafka, "telemetry-change-1"))
        assert before >= 2
        await asyncio.to_thread(subscribe, kafka, "telemetry-change-.*", P + "connection.")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(
                P + "connection.count" in push.metrics
                for push in pushes(kafka, "telemetry-change-1")):
            await _produce_for(p, topic, 0.2)
    got = pushes(kafka, "telemetry-change-1")
    assert all(set(push.metrics) == {P + "node.request.latency.avg", P + "node.request.latency.max"}
               or not push.metrics for push in got[:before])
    switched = next(i for i, push in enumerate(got) if P + "connection.count" in push.metrics)
    assert all(name.startswith(P + "connection.") for push in got[switched:]
               for name in push.metrics)


async def test_a_receiver_error_stops_pushing_and_fails_no_send(kafka, caplog):
    """The broker answers INVALID_RECORD when its receiver fails: the producer pushes no
    more (said once in the log, as a warning), and every record still goes through."""
    await asyncio.to_thread(subscribe, kafka, "telemetry-poison-.*", P)
    topic = f"k-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic)
    with caplog.at_level(logging.WARNING, "aioproducer"):
        async with Producer(kafka.bootstrap, client_id="telemetry-poison-1", linger_ms=0) as p:
            sent = await _produce_for(p, topic, 1.5)
        assert p.metrics().records_sent == sent and p.metrics().records_failed == 0
    assert len(pushes(kafka, "telemetry-poison-1")) == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "aioproducer.client.telemetry"]
    assert len(warnings) == 1 and "client telemetry stopped" in warnings[0] and \
        "INVALID_RECORD" in warnings[0], warnings


async def test_nothing_is_pushed_unasked_or_when_turned_off(kafka):
    """A producer no subscription matches gets an empty one and pushes nothing, not even at
    close; one with enable_metrics_push=False pushes nothing though one matches."""
    await asyncio.to_thread(subscribe, kafka, "telemetry-off-.*", P)
    topic = f"k-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic)
    unasked = Producer(kafka.bootstrap, client_id="telemetry-unasked-1", linger_ms=0)
    off = Producer(kafka.bootstrap, client_id="telemetry-off-1", linger_ms=0,
                   enable_metrics_push=False)
    async with unasked, off:
        await asyncio.gather(_produce_for(unasked, topic, 1.0), _produce_for(off, topic, 1.0))
    assert pushes(kafka, "telemetry-unasked-1") == [] == pushes(kafka, "telemetry-off-1")
    assert unasked.metrics().records_sent > 0 and off.metrics().records_sent > 0


async def test_close_waits_for_the_last_push_no_longer_than_its_timeout(kafka):
    """A broker that stopped answering (SIGSTOP) is sent the terminating push, but
    close(timeout=1) returns after about a second, not request_timeout_ms (30 s) later."""
    await asyncio.to_thread(subscribe, kafka, "telemetry-hang-.*", P)
    topic = f"k-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic)
    producer = Producer(kafka.bootstrap, client_id="telemetry-hang-1", linger_ms=0)
    await producer.start()
    try:
        await _produce_for(producer, topic, 0.5)
        telemetry = producer._telemetry
        assert telemetry is not None
        # A subscription, and the last push due when the node stops. A push answered just
        # before SIGSTOP is read after it: refused (as one of a subscription changed
        # meanwhile is), it makes the producer fetch the subscription again, and close() has
        # no push to send (it returned in 1-5 ms in two loaded CI runs). So the node stops,
        # the answers already sent are read, and if no push is due then, it goes on and the
        # test tries again.
        for _attempt in range(5):
            deadline = time.monotonic() + 10
            while not (pushes(kafka, "telemetry-hang-1") and telemetry._push_due) and \
                    time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert pushes(kafka, "telemetry-hang-1") and telemetry._push_due
            kafka.pause_node(0)
            await asyncio.sleep(0.3)
            if telemetry._push_due:
                break
            kafka.resume_node(0)
        try:
            # (stopped: the broker answered a push with an error that ends telemetry.)
            assert telemetry._push_due and not telemetry._stopped, (
                "no push due at close after five tries", telemetry._stopped,
                telemetry._warned, telemetry.subscription)
            started = time.monotonic()
            await producer.close(timeout=1.0)
            elapsed = time.monotonic() - started
        finally:
            kafka.resume_node(0)
    finally:
        await producer.close()
    assert 0.9 < elapsed < 3, elapsed
