"""Adapters from a producer's hooks and metrics to monitoring systems: `otel`
(OpenTelemetry: metrics, a span per send, trace context in the record's headers) and
`prometheus` (a collector). Each is an optional extra; this module needs neither.

Both read `Producer.metrics()` when their system collects (nothing per record), under the
Java client's metric names, so dashboards made for Java producers read ours.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from typing import TYPE_CHECKING, Iterator

from .._internal.metrics import Histogram, ProducerMetrics
from ..hooks import ProducerHooks

if TYPE_CHECKING:
    from ..producer import Producer


@dataclasses.dataclass(frozen=True)
class Reading:
    """One value of a producer's, as a metric: `name` is the Java client's metric name
    (as OpenTelemetry's bridge of the Java client spells it, under `kafka.producer.`)."""

    name: str
    counter: bool  # only grows (else a gauge)
    unit: str
    description: str
    value: float
    client_id: str
    topic: str | None = None  # per-topic metrics


# (name, counter, unit, description) of each per-topic reading, then each per-producer one.
TOPIC_METRICS = (
    ("record_send_total", True, "{record}", "Records acknowledged by the broker"),
    ("record_error_total", True, "{record}", "Records that failed for good"),
    ("record_retry_total", True, "{record}", "Records sent again after a retriable error"),
    ("byte_total", True, "By", "Bytes of acknowledged records (uncompressed batches)"),
)
PRODUCER_METRICS = (
    ("request_total", True, "{request}", "Produce requests written"),
    ("response_total", True, "{response}", "Produce responses received"),
    ("outgoing_byte_total", True, "By", "Bytes of record batches written, retries included"),
    ("batch_split_total", True, "{batch}", "Batches the broker refused as too large, split"),
    ("request_latency_avg", False, "ms", "Mean produce round trip since start"),
    ("produce_throttle_time_max", False, "ms", "Longest throttle a broker asked for"),
    ("requests_in_flight", False, "{request}", "Produce requests awaiting a response"),
    ("connection_count", False, "{connection}", "Open broker connections"),
    ("buffer_available_bytes", False, "By", "Buffer memory not held by batches"),
    ("buffer_total_bytes", False, "By", "buffer_memory"),
    ("waiting_threads", False, "{record}", "Sends waiting for buffer memory"),
    ("records_pending", False, "{record}", "Records accepted and not yet acknowledged or failed"),
)


class ProducerSet(ProducerHooks):
    """A hook that keeps the producers it serves while they run (weakly), and measures
    them: at most once per `ttl` seconds, as an exporter asks once per instrument and one
    snapshot per collection is enough."""

    def __init__(self, ttl: float = 0.5) -> None:
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()
        self._lock = threading.Lock()  # exporters collect in threads of their own
        self._ttl = ttl
        self._taken = -float("inf")
        # Weakly too: a producer dropped unclosed is collected, not kept by the last snapshot.
        self._measured: list[tuple[weakref.ref[Producer], ProducerMetrics]] = []

    def on_start(self, producer: Producer) -> None:
        with self._lock:
            self._producers.add(producer)

    def on_close(self, producer: Producer) -> None:
        with self._lock:
            self._producers.discard(producer)
            self._measured = [m for m in self._measured if m[0]() is not producer]

    def measure(self) -> list[tuple[Producer, ProducerMetrics]]:
        """Each running producer with its metrics (one that cannot answer now is left out:
        closed meanwhile, or its loop blocked)."""
        with self._lock:
            now = time.monotonic()
            if now - self._taken > self._ttl:
                measured = []
                for producer in list(self._producers):
                    try:
                        measured.append((weakref.ref(producer), producer.metrics()))
                    except Exception:
                        continue
                self._measured, self._taken = measured, now
            return [(alive, metrics) for ref, metrics in self._measured
                    if (alive := ref()) is not None]


def readings(producer: Producer, metrics: ProducerMetrics) -> Iterator[Reading]:
    """A producer's metrics as Readings (per topic, then per producer)."""
    client_id = producer.config.client_id
    for topic, counts in metrics.topics.items():
        per_topic = (counts.records_sent, counts.records_failed, counts.records_retried,
                     counts.bytes_sent)
        for (name, counter, unit, text), count in zip(TOPIC_METRICS, per_topic):
            yield Reading(name, counter, unit, text, count, client_id, topic)
    values: tuple[float, ...] = (
        metrics.produce_requests, metrics.produce_responses, metrics.bytes_sent,
        metrics.splits, metrics.produce_latency_avg_s * 1000,
        metrics.produce_throttle_time_max_ms, metrics.requests_in_flight, metrics.connections,
        metrics.buffer_memory_available, producer.config.buffer_memory,
        metrics.waiting_for_memory, metrics.records_pending)
    for (name, counter, unit, text), value in zip(PRODUCER_METRICS, values):
        yield Reading(name, counter, unit, text, value, client_id)


# The histograms a producer keeps: (name, what it measures, its ProducerMetrics field).
HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("request_latency", "Produce request round trips", "produce_latency_histogram"),
    ("record_latency", "Time from send() to acknowledgement (each batch's first record)",
     "record_latency_histogram"),
)


def histogram(metrics: ProducerMetrics, field: str) -> Histogram:
    value = getattr(metrics, field)
    assert isinstance(value, Histogram)
    return value
