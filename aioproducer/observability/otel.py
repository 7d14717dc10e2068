"""OpenTelemetry for aioproducer (the `otel` extra: opentelemetry-api; a configured SDK
exports what it records).

    from aioproducer.observability.otel import OpenTelemetryHooks
    producer = Producer("localhost:9092", hooks=[OpenTelemetryHooks()])

- Metrics: the producer's counters and gauges as observable instruments, read when the
  SDK collects (nothing per record), named as OpenTelemetry's bridge of the Java client
  names them (`kafka.producer.record_send_total`, attributes `client-id` and `topic`);
  its two histograms (`kafka.producer.request_latency`, `kafka.producer.record_latency`,
  seconds) per request and per batch.
- Traces (`trace_sends=True`, the default): a PRODUCER span per record, `send {topic}`,
  from send() until the broker's answer, with the messaging semantic conventions'
  attributes, and its context injected into the record's headers (W3C `traceparent` by
  default: the global propagator's format) so a consumer's span continues the trace. The
  span's parent is the context send() was called in. With it come the conventions'
  per-send metrics `messaging.client.sent.messages` and `messaging.client.operation.duration`.
  A span per record costs what the SDK costs per span (see benchmarks/): for bulk paths
  without tracing, pass `trace_sends=False`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable

from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagators.textmap import Setter
from opentelemetry.trace import SpanKind, Status, StatusCode

from .._version import __version__
from ..hooks import DeliveryCallback
from ..serializers import MutableHeaders
from . import HISTOGRAMS, PRODUCER_METRICS, TOPIC_METRICS, ProducerSet, readings

if TYPE_CHECKING:
    from .._internal.batch import RecordMetadata

_PREFIX = "kafka.producer."
# The messaging conventions' bucket bounds for operation durations, in seconds.
_DURATION_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)


class _HeaderSetter(Setter[MutableHeaders]):
    """Trace context into a record's headers: a name set again replaces the old value."""

    def set(self, carrier: MutableHeaders, key: str, value: str) -> None:
        carrier[:] = [(name, v) for name, v in carrier if name != key]
        carrier.append((key, value.encode()))


_SETTER = _HeaderSetter()


class OpenTelemetryHooks(ProducerSet):
    """Metrics and spans of the producers it is given to (`hooks=[...]`; one instance may
    serve several). `tracer_provider` / `meter_provider`: the global ones unless given."""

    def __init__(self, *, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None,
                 trace_sends: bool = True) -> None:
        super().__init__()
        meter = metrics.get_meter("aioproducer", __version__, meter_provider)
        for name, counter, unit, text in TOPIC_METRICS + PRODUCER_METRICS:
            make = meter.create_observable_counter if counter \
                else meter.create_observable_gauge
            make(_PREFIX + name, [self._observer(name)], unit, text)
        self._request_latency, self._record_latency = (
            meter.create_histogram(_PREFIX + name, "s", text) for name, text, _ in HISTOGRAMS)
        self._trace_sends = trace_sends
        if trace_sends:
            self._tracer = trace.get_tracer("aioproducer", __version__, tracer_provider)
            self._sent = meter.create_counter(
                "messaging.client.sent.messages", "{message}",
                "Messages a producer attempted to send")
            self._duration = meter.create_histogram(
                "messaging.client.operation.duration", "s",
                "Duration of a send, from the call to the broker's answer",
                explicit_bucket_boundaries_advisory=_DURATION_BOUNDS)
        else:  # no per-record hook at all: the producer skips on_send
            self.on_send = None  # type: ignore[assignment]

    def _observer(self, name: str) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for producer, measured in self.measure():
                for reading in readings(producer, measured):
                    if reading.name == name:
                        attributes = {"client-id": reading.client_id}
                        if reading.topic is not None:
                            attributes["topic"] = reading.topic
                        yield Observation(reading.value, attributes)
        return observe

    # -- per batch and request -------------------------------------------------------------

    def on_ack(self, topic: str, partition: int, base_offset: int, record_count: int,
               latency_s: float) -> None:
        """Record the batch's latency in the record-latency histogram, by topic."""
        self._record_latency.record(latency_s, {"topic": topic})

    def on_request(self, node_id: int, latency_s: float, error: BaseException | None) -> None:
        """Record an answered request's latency, by node."""
        if error is None:
            self._request_latency.record(latency_s, {"node-id": str(node_id)})

    # -- per record, with trace_sends ------------------------------------------------------

    def on_send(self, topic: str, key: Any, value: Any,
                headers: MutableHeaders) -> DeliveryCallback | None:
        """Start the record's PRODUCER span, put its trace context in the record's headers,
        and end the span when the record's outcome is known."""
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
        }
        if isinstance(key, str):
            attributes["messaging.kafka.message.key"] = key
        if value is None:
            attributes["messaging.kafka.message.tombstone"] = True
        span = self._tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER,
                                       attributes=attributes)
        propagate.inject(headers, trace.set_span_in_context(span), _SETTER)
        return _SendOutcome(self, span, topic, time.perf_counter())


class _SendOutcome:
    """Ends a record's span, and counts it, when its outcome is known."""

    __slots__ = ("_hooks", "_span", "_topic", "_started")

    def __init__(self, hooks: OpenTelemetryHooks, span: trace.Span, topic: str,
                 started: float) -> None:
        self._hooks, self._span, self._topic, self._started = hooks, span, topic, started

    def __call__(self, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        span, hooks = self._span, self._hooks
        attributes: dict[str, Any] = {"messaging.system": "kafka",
                                      "messaging.operation.name": "send",
                                      "messaging.destination.name": self._topic}
        if metadata is not None:
            attributes["messaging.destination.partition.id"] = str(metadata.partition)
            span.set_attribute("messaging.destination.partition.id", str(metadata.partition))
            if metadata.offset >= 0:
                span.set_attribute("messaging.kafka.offset", metadata.offset)
        if error is not None:
            attributes["error.type"] = type(error).__qualname__
            span.set_attribute("error.type", type(error).__qualname__)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()
        hooks._sent.add(1, attributes)
        hooks._duration.record(time.perf_counter() - self._started, attributes)
