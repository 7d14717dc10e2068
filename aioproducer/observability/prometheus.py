"""Prometheus for aioproducer (the `prometheus` extra: prometheus-client).

    from aioproducer.observability.prometheus import PrometheusCollector
    producer = Producer("localhost:9092", hooks=[PrometheusCollector()])
    prometheus_client.start_http_server(9100)  # or your framework's /metrics

A collector, not instruments updated as records go: each scrape reads every running
producer's `metrics()` (so a producer pays nothing between scrapes), named as the Java
client's metrics are by the JMX exporter (`kafka_producer_record_send_total`, labels
`client_id` and `topic`), with the producer's two latency histograms in seconds. Give each
producer its own `client_id`: it is what tells their series apart.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, \
    HistogramMetricFamily, Metric

from . import HISTOGRAMS, PRODUCER_METRICS, TOPIC_METRICS, ProducerSet, histogram, readings


class PrometheusCollector(ProducerSet):
    """Registers itself in `registry` (the default one unless given); give it to producers
    as a hook (`hooks=[...]`): it reports those that are running."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY,
                 namespace: str = "kafka_producer") -> None:
        super().__init__(ttl=0.0)  # a scrape reads each producer once anyway
        self._namespace = namespace
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Metric]:
        """No samples at registration (the producers are not running yet)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The metrics of the running producers it is a hook of, read now
        (prometheus_client calls it at each scrape)."""
        measured = self.measure()
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for group, labels in ((TOPIC_METRICS, ["client_id", "topic"]),
                              (PRODUCER_METRICS, ["client_id"])):
            for name, counter, _, text in group:
                # (a counter family names its samples NAME_total itself)
                kind = CounterMetricFamily if counter else GaugeMetricFamily
                families[name] = kind(f"{self._namespace}_{name}", text, labels=labels)
        for producer, metrics in measured:
            for reading in readings(producer, metrics):
                labels = [reading.client_id] if reading.topic is None \
                    else [reading.client_id, reading.topic]
                families[reading.name].add_metric(labels, reading.value)
        yield from families.values()
        for name, text, field in HISTOGRAMS:
            latencies = HistogramMetricFamily(f"{self._namespace}_{name}_seconds", text,
                                              labels=["client_id"])
            for producer, metrics in measured:
                h = histogram(metrics, field)
                cumulative, buckets = 0, []
                for bound, count in zip(h.bounds, h.counts):
                    cumulative += count
                    buckets.append((repr(float(bound)), cumulative))
                buckets.append(("+Inf", h.count))
                latencies.add_metric([producer.config.client_id], buckets, h.sum)
            yield latencies
