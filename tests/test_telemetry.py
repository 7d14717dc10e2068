"""Client telemetry (KIP-714) without a broker that speaks it: the OTLP bytes we write, read
by opentelemetry-proto's generated classes (code we did not write); what a subscription's
prefixes select; delta and cumulative sums; telemetry_max_bytes; and on the embedded broker,
which does not advertise the APIs, and with enable_metrics_push=False: nothing is sent and
nothing breaks. tests/real_kafka/test_telemetry.py pushes to Apache Kafka."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from aioproducer import Producer, ProducerConfig
from aioproducer.client.cluster import Cluster
from aioproducer.client.tasks import TaskSet
from aioproducer.client.telemetry import ClientTelemetry, Subscription
from aioproducer.errors import ConfigError
from aioproducer.protocol.compression import Codec, decompress
from aioproducer.protocol.otlp import CUMULATIVE, DELTA, Point, Sample, encode_metrics_data, \
    selected

TEMPORALITY = metrics_pb2.AggregationTemporality


def test_metrics_data_is_read_by_opentelemetry_proto() -> None:
    """Gauges with attributes and monotonic sums, one resource with its attributes, times in
    nanoseconds: every field as opentelemetry-proto reads it."""
    latency = Sample("org.apache.kafka.producer.node.request.latency.avg", "gauge", 1.25,
                     (("node_id", "node-1"), ("é", "ü")))
    total = Sample("org.apache.kafka.producer.connection.creation.total", "sum", 3)
    points = [Point(latency, 1.25, 0, 1_700_000_000_123_456_789),
              Point(total, 2.0, 1_600_000_000_000_000_000, 1_700_000_000_000_000_001)]
    for temporality, expected in ((DELTA, TEMPORALITY.AGGREGATION_TEMPORALITY_DELTA),
                                  (CUMULATIVE, TEMPORALITY.AGGREGATION_TEMPORALITY_CUMULATIVE)):
        data = metrics_pb2.MetricsData.FromString(
            encode_metrics_data({"transactional_id": "tx-1"}, points, temporality))
        [resource_metrics] = data.resource_metrics
        assert [(a.key, a.value.string_value) for a in resource_metrics.resource.attributes] \
            == [("transactional_id", "tx-1")]
        [scope] = resource_metrics.scope_metrics
        gauge, counter = scope.metrics
        assert gauge.name == latency.name and gauge.WhichOneof("data") == "gauge"
        [point] = gauge.gauge.data_points
        assert point.as_double == 1.25 and point.time_unix_nano == 1_700_000_000_123_456_789
        assert [(a.key, a.value.string_value) for a in point.attributes] == \
            [("node_id", "node-1"), ("é", "ü")]
        assert counter.name == total.name and counter.WhichOneof("data") == "sum"
        assert counter.sum.is_monotonic and counter.sum.aggregation_temporality == expected
        [point] = counter.sum.data_points
        assert (point.as_double, point.start_time_unix_nano, point.time_unix_nano) == \
            (2.0, 1_600_000_000_000_000_000, 1_700_000_000_000_000_001)
    empty = metrics_pb2.MetricsData.FromString(encode_metrics_data({}, [], DELTA))
    assert len(empty.resource_metrics) == 1 and not empty.resource_metrics[0].scope_metrics[0].metrics


def test_requested_metrics_select_by_prefix() -> None:
    """KIP-714: an empty list asks for nothing, "*" (or a lone "") for everything, else the
    names starting with one of the prefixes."""
    samples = [Sample("org.apache.kafka.producer.a.b", "gauge", 1),
               Sample("org.apache.kafka.producer.c", "sum", 2),
               Sample("org.apache.kafka.other", "gauge", 3)]
    assert selected(samples, []) == []
    assert selected(samples, ["*"]) == samples == selected(samples, [""])
    assert selected(samples, ["org.apache.kafka.producer.a", "org.apache.kafka.other"]) == \
        [samples[0], samples[2]]
    assert selected(samples, ["org.apache.kafka.producer.a.b.c"]) == []


def _parsed(data: bytes, codec: Codec) -> dict[str, tuple[str, float, int]]:
    """name -> (kind, value, start time) of a payload."""
    parsed = metrics_pb2.MetricsData.FromString(decompress(codec, data))
    found = {}
    for metric in parsed.resource_metrics[0].scope_metrics[0].metrics:
        kind = metric.WhichOneof("data")
        [point] = getattr(metric, kind).data_points
        found[metric.name] = (kind, point.as_double, point.start_time_unix_nano)
    return found


async def test_sums_are_deltas_or_cumulative_as_the_subscription_says() -> None:
    """Delta temporality pushes what a counter grew by since the last push, starting where
    that push ended; cumulative the total since start; gauges as they are; compressed with
    the codec the subscription chose."""
    counter = [10.0]
    tasks = TaskSet()
    cluster = Cluster(ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9"), tasks)
    telemetry = ClientTelemetry(
        cluster, tasks, lambda: [Sample("p.total", "sum", counter[0]),
                                 Sample("p.level", "gauge", counter[0] / 2)], {}, "t")
    delta = Subscription(1, 1.0, Codec.ZSTD, 1 << 20, True, ("p.",))
    first = _parsed(telemetry._payload(delta), Codec.ZSTD)
    counter[0] = 25.0
    second = _parsed(telemetry._payload(delta), Codec.ZSTD)
    assert first["p.total"][:2] == ("sum", 10.0) and second["p.total"][:2] == ("sum", 15.0)
    assert second["p.total"][2] > first["p.total"][2] > 0  # the second starts after the first
    assert second["p.level"][:2] == ("gauge", 12.5)
    cumulative = Subscription(1, 1.0, Codec.GZIP, 1 << 20, False, ("*",))
    assert _parsed(telemetry._payload(cumulative), Codec.GZIP)["p.total"][:2] == ("sum", 25.0)
    cluster.close()
    await tasks.aclose()


async def test_a_payload_over_telemetry_max_bytes_is_cut_to_fit(caplog) -> None:
    """The broker refuses a push over its telemetry_max_bytes: fewer metrics go instead,
    said once in the log."""
    tasks = TaskSet()
    cluster = Cluster(ProducerConfig.from_kwargs(bootstrap_servers="127.0.0.1:9"), tasks)
    samples = [Sample(f"p.metric.{i:03d}", "gauge", i) for i in range(64)]
    telemetry = ClientTelemetry(cluster, tasks, lambda: samples, {}, "t")
    whole = len(telemetry._payload(Subscription(1, 1.0, Codec.NONE, 1 << 20, True, ("*",))))
    small = Subscription(1, 1.0, Codec.NONE, whole // 3, True, ("*",))
    with caplog.at_level(logging.WARNING, "aioproducer.client.telemetry"):
        for _ in range(2):
            data = telemetry._payload(small)
            assert len(data) <= whole // 3
            assert 0 < len(_parsed(data, Codec.NONE)) < 64
    assert len([r for r in caplog.records if "telemetry_max_bytes" in r.getMessage()]) == 1
    cluster.close()
    await tasks.aclose()


def test_enable_metrics_push_is_a_validated_setting() -> None:
    assert ProducerConfig.from_kwargs(bootstrap_servers="h:1").enable_metrics_push is True
    assert ProducerConfig.from_properties({"bootstrap.servers": "h:1",
                                           "enable.metrics.push": "false"}
                                          ).enable_metrics_push is False
    with pytest.raises(ConfigError, match="enable_metrics_push must be True or False"):
        ProducerConfig.from_kwargs(bootstrap_servers="h:1", enable_metrics_push="yes")


@pytest.mark.parametrize("enabled", [True, False])
async def test_a_broker_without_telemetry_gets_none(broker, topic, caplog, enabled) -> None:
    """The embedded broker advertises GetTelemetrySubscriptions but not PushTelemetry (and
    closes the connection of a client that sends an API it lacks): the producer, which pushes
    only to a broker with both, sends no telemetry request, on by default or off, and its
    records and its close() go as always."""
    if not getattr(broker, "is_embedded", False):
        pytest.skip("about a broker without KIP-714 (the embedded one)")
    with caplog.at_level(logging.DEBUG, "aioproducer"):
        async with Producer(broker.bootstrap, enable_metrics_push=enabled, linger_ms=0) as p:
            for i in range(20):
                await p.send(topic, b"%d" % i)
            telemetry = p._telemetry
            assert (telemetry is not None) is enabled
            connections = p.metrics().connections
        metrics = p.metrics()
    assert metrics.records_sent == 20 and metrics.records_failed == 0 and connections == 1
    if telemetry is not None:
        assert telemetry.subscription is None and telemetry.pushes == 0
    assert not [r for r in caplog.records if "telemetry" in r.name or "closed" in r.getMessage()]
