"""What the producer pushes as client telemetry (KIP-714): the Java producer's metrics, by
the names it pushes them under, for those the producer keeps already (counted per batch and
per request, never per record; read here once per push interval).

Averages and maxima are over the interval since the last push (the Java client's are over
its sample windows, 30 s each); times in milliseconds, as Java's."""

from __future__ import annotations

import asyncio

from ..client.cluster import Cluster
from ..config import ProducerConfig
from ..protocol.otlp import Sample
from .accumulator import RecordAccumulator
from .observer import Observer, Window
from .sender import Sender

PREFIX = "org.apache.kafka.producer."


class TelemetrySamples:
    """Called once per push: the samples now (see the module's docstring)."""

    def __init__(self, config: ProducerConfig, cluster: Cluster, accumulator: RecordAccumulator,
                 sender: Sender, observer: Observer) -> None:
        self._config = config
        self._cluster = cluster
        self._accumulator = accumulator
        self._sender = sender
        self._observer = observer
        self._loop = asyncio.get_running_loop()
        self._last_at = self._loop.time()
        self._last_connections = 0
        self._last_responses = 0
        self._last_throttle_ms = 0

    def __call__(self) -> list[Sample]:
        now = self._loop.time()
        elapsed = max(now - self._last_at, 1e-3)
        cluster, sender, observer = self._cluster, self._sender, self._observer
        created = cluster.connections_created
        new_connections = created - self._last_connections
        responses = sender.responses - self._last_responses
        throttle_ms = sender.throttle_time_ms - self._last_throttle_ms
        throttle_max, observer.throttle_max_ms = observer.throttle_max_ms, 0
        self._last_at, self._last_connections = now, created
        self._last_responses, self._last_throttle_ms = sender.responses, sender.throttle_time_ms
        retried = sum(t.records_retried for t in observer.topics().values())
        samples = [
            Sample(PREFIX + "connection.creation.rate", "gauge", new_connections / elapsed),
            Sample(PREFIX + "connection.creation.total", "sum", created),
            Sample(PREFIX + "connection.count", "gauge", len(cluster.open_connections())),
            # Per Produce response, 0 for one not throttled, as Java's sensor records them.
            Sample(PREFIX + "produce.throttle.time.avg", "gauge",
                   throttle_ms / responses if responses else 0.0),
            Sample(PREFIX + "produce.throttle.time.max", "gauge", throttle_max),
            Sample(PREFIX + "record.error.total", "sum", self._accumulator.records_failed),
            Sample(PREFIX + "record.retry.total", "sum", retried),
            Sample(PREFIX + "batch.split.total", "sum", sender.splits),
            Sample(PREFIX + "buffer.total.bytes", "gauge", self._config.buffer_memory),
            Sample(PREFIX + "buffer.available.bytes", "gauge", self._accumulator.memory_available),
        ]
        samples += _avg_max(PREFIX + "record.queue.time", observer.queue_time, ())
        everyone = Window()
        for node_id, window in sorted(observer.node_latency.items()):
            count, total, most = window.take()
            if count:
                samples += _avg_max(PREFIX + "node.request.latency", (count, total, most),
                                    (("node_id", f"node-{node_id}"),))
                everyone.count += count
                everyone.sum += total
                everyone.max = max(everyone.max, most)
        samples += _avg_max(PREFIX + "request.latency", everyone, ())
        return samples


def _avg_max(name: str, window: Window | tuple[int, float, float],
             attributes: tuple[tuple[str, str], ...]) -> list[Sample]:
    """name.avg and name.max in milliseconds, of a window of seconds (taken from it), if
    anything was observed since the last push."""
    count, total, most = window.take() if isinstance(window, Window) else window
    if not count:
        return []
    return [Sample(name + ".avg", "gauge", total / count * 1000, attributes),
            Sample(name + ".max", "gauge", most * 1000, attributes)]
