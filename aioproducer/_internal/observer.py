"""The observer: what each batch and request came to, counted per topic and in histograms
for `Producer.metrics()`, and told to the user's hooks (`aioproducer.hooks`).

Called once per response's acknowledged batches, batch failure, retry, throttle and produce
response, never per record (a record's `on_send` is the intake's), so it costs the hot path
nothing.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any, Callable, Sequence

from ..hooks import HOOK_METHODS, DeliveryCallback, ProducerHooks
from .._speedups import count_acked
from .batch import ProducerBatch, RecordMetadata
from .metrics import LATENCY_BOUNDS_S, Histogram, TopicMetrics

log = logging.getLogger("aioproducer.hooks")  # hooks' and delivery callbacks' errors


class _Counts:
    """One topic's counters (TopicMetrics is their snapshot)."""

    __slots__ = ("records_sent", "records_failed", "batches_sent", "bytes_sent",
                 "records_retried")

    def __init__(self) -> None:
        self.records_sent = self.records_failed = self.batches_sent = 0
        self.bytes_sent = self.records_retried = 0


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS_S) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BOUNDS_S, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> Histogram:
        return Histogram(LATENCY_BOUNDS_S, tuple(self.counts), self.sum, sum(self.counts))


class Window:
    """Count, sum and maximum since the last `take()`: the averages and maxima of the last
    push interval that client telemetry (KIP-714) reports."""

    __slots__ = ("count", "sum", "max")

    def __init__(self) -> None:
        self.count = 0
        self.sum = self.max = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        if value > self.max:
            self.max = value

    def observe_many(self, count: int, total: float, most: float) -> None:
        """`count` values of sum `total` and maximum `most` (a request's batches)."""
        self.count += count
        self.sum += total
        if most > self.max:
            self.max = most

    def take(self) -> tuple[int, float, float]:
        """(count, sum, max) since the last take, and start again."""
        taken = self.count, self.sum, self.max
        self.count = 0
        self.sum = self.max = 0.0
        return taken


def overridden(hooks: Sequence[ProducerHooks], name: str) -> list[Callable[..., Any]]:
    """The bound `name` methods of the hooks that override it (and did not set it to None
    on the instance: a hook's way to say it needs none of these calls after all)."""
    base = getattr(ProducerHooks, name)
    found = []
    for hook in hooks:
        method = getattr(hook, name)
        if method is not None and getattr(method, "__func__", None) is not base:
            found.append(method)
    return found


class Observer:
    """Made by the producer at start(); the accumulator reports outcomes to it, the sender
    retries, throttling and responses."""

    def __init__(self, hooks: Sequence[ProducerHooks]) -> None:
        self._topics: dict[str, _Counts] = {}
        self._request_latency = _Histogram()
        self._record_latency = _Histogram()
        # Since the last telemetry push: produce round trips per broker, batches' time in
        # the accumulator (creation to drain, each send of it), the longest throttle.
        self.node_latency: dict[int, Window] = {}
        self.queue_time = Window()
        self.throttle_max_ms = 0
        self._hooks = {name: overridden(hooks, name) for name in HOOK_METHODS}
        self._on_ack = self._hooks["on_ack"]
        self._on_error = self._hooks["on_error"]
        self._on_retry = self._hooks["on_retry"]
        self._on_throttle = self._hooks["on_throttle"]
        self._on_request = self._hooks["on_request"]

    def started(self, producer: Any) -> None:
        for hook in self._hooks["on_start"]:
            _call(hook, producer)

    def closed(self, producer: Any) -> None:
        for hook in self._hooks["on_close"]:
            _call(hook, producer)

    def _counts(self, topic: str) -> _Counts:
        counts = self._topics.get(topic)
        if counts is None:
            counts = self._topics[topic] = _Counts()
        return counts

    def acked(self, batches: list[ProducerBatch], now: float) -> None:
        """Batches acknowledged (by one response, most often): counted in one call, not one
        per batch, as with 10,000 partitions a batch may hold a single record (the counting
        itself one compiled call, the speed-up's count_acked)."""
        histogram = self._record_latency
        by_topic, total = count_acked(batches, now, LATENCY_BOUNDS_S, histogram.counts)
        histogram.sum += total
        for topic, (records, batch_count, size) in by_topic.items():
            counts = self._counts(topic)
            counts.records_sent += records
            counts.batches_sent += batch_count
            counts.bytes_sent += size
        if self._on_ack:
            for batch in batches:
                for hook in self._on_ack:
                    _call(hook, batch.topic, batch.partition, batch.future.result()[0],
                          batch.writer.count, now - batch.created)

    def failed(self, topic: str, partition: int, record_count: int,
               error: BaseException) -> None:
        self._counts(topic).records_failed += record_count
        for hook in self._on_error:
            _call(hook, topic, partition, record_count, error)

    def retried(self, topic: str, partition: int, record_count: int,
                error: BaseException) -> None:
        self._counts(topic).records_retried += record_count
        for hook in self._on_retry:
            _call(hook, topic, partition, record_count, error)

    def throttled(self, node_id: int, throttle_time_ms: int) -> None:
        self.throttle_max_ms = max(self.throttle_max_ms, throttle_time_ms)
        for hook in self._on_throttle:
            _call(hook, node_id, throttle_time_ms)

    def responded(self, node_id: int, latency_s: float, error: BaseException | None) -> None:
        if error is None:
            self._request_latency.observe(latency_s)
            window = self.node_latency.get(node_id)
            if window is None:
                window = self.node_latency[node_id] = Window()
            window.observe(latency_s)
        for hook in self._on_request:
            _call(hook, node_id, latency_s, error)

    def topics(self) -> dict[str, TopicMetrics]:
        return {topic: TopicMetrics(c.records_sent, c.records_failed, c.batches_sent,
                                    c.bytes_sent, c.records_retried)
                for topic, c in self._topics.items()}

    def request_latency(self) -> Histogram:
        return self._request_latency.snapshot()

    def record_latency(self) -> Histogram:
        return self._record_latency.snapshot()


def _call(hook: Callable[..., Any], *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        log.exception("hook %s raised", getattr(hook, "__qualname__", hook))


def deliver(callback: DeliveryCallback, metadata: RecordMetadata | None,
            exc: BaseException | None) -> None:
    """Tell a delivery callback (an on_send hook's, or BlockingProducer's on_delivery) a
    record's outcome. What it raises is logged: it must not keep the other records'
    callbacks from running."""
    try:
        callback(metadata, exc)
    except Exception:
        log.exception("delivery callback %r raised", callback)


def deliver_each(callbacks: list[DeliveryCallback], metadata: RecordMetadata | None,
                 exc: BaseException | None) -> None:
    for callback in callbacks:
        deliver(callback, metadata, exc)
