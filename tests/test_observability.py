"""aioproducer.observability: OpenTelemetry's spans and metrics, and the Prometheus
collector, read back by their own SDK's in-memory readers and parser, and the trace context
read back from the records by librdkafka."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aioproducer import Producer
from aioproducer.errors import RecordTooLargeError
from aioproducer.observability.otel import OpenTelemetryHooks
from aioproducer.observability.prometheus import PrometheusCollector
from tests.support.readback import consume_all


@pytest.fixture
def otel():
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield tracer_provider, meter_provider, spans, reader
    meter_provider.shutdown()
    tracer_provider.shutdown()


def points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    return {metric.name: list(metric.data.data_points)
            for resource in data.resource_metrics for scope in resource.scope_metrics
            for metric in scope.metrics}


async def test_a_span_per_send_and_its_context_in_the_record(broker, topic_factory, otel):
    """Each send is a PRODUCER span, child of the span send() was called in, named and
    attributed by the messaging conventions, with the offset the broker gave; the record
    carries the span's traceparent (read back by librdkafka); a refused record's span says
    why; the Java client's metric names count what was sent, per topic."""
    tracer_provider, meter_provider, spans, reader = otel
    topic = topic_factory(2)
    hooks = OpenTelemetryHooks(tracer_provider=tracer_provider, meter_provider=meter_provider)
    tracer = tracer_provider.get_tracer("the application")
    async with Producer(broker.bootstrap, hooks=[hooks], client_id="traced",
                        key_serializer=str.encode, max_request_size=10_000) as producer:
        with tracer.start_as_current_span("handle request") as parent:
            sent = await asyncio.gather(*(producer.send(topic, b"v%d" % i, key="user-%d" % i)
                                          for i in range(20)))
            with pytest.raises(RecordTooLargeError):
                await producer.send(topic, b"x" * 20_000)
        measured = points(reader)

    finished = [s for s in spans.get_finished_spans() if s.name == f"send {topic}"]
    assert len(finished) == 21
    ok = {(s.attributes["messaging.destination.partition.id"],
           s.attributes["messaging.kafka.offset"]): s for s in finished if s.status.is_ok}
    assert set(ok) == {(str(md.partition), md.offset) for md in sent}
    assert sorted(s.attributes["messaging.kafka.message.key"] for s in ok.values()) == \
        sorted("user-%d" % i for i in range(20))
    for span in finished:
        assert span.kind is SpanKind.PRODUCER
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.attributes["messaging.system"] == "kafka"
        assert span.attributes["messaging.destination.name"] == topic
        assert span.attributes["messaging.operation.name"] == "send"
    [refused] = [s for s in finished if not s.status.is_ok]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.attributes["error.type"] == "RecordTooLargeError"

    stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 20)
    assert len(stored) == 20
    for record in stored:
        span = ok[(str(record.partition), record.offset)]
        context = span.get_span_context()
        assert dict(record.headers)["traceparent"] == \
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}".encode()

    by_topic = {p.attributes.get("topic"): p.value
                for p in measured["kafka.producer.record_send_total"]}
    assert by_topic == {topic: 20}
    assert all(p.attributes["client-id"] == "traced"
               for p in measured["kafka.producer.record_send_total"])
    assert [p.value for p in measured["kafka.producer.buffer_total_bytes"]] == \
        [producer.config.buffer_memory]
    sent_counts: dict = {}
    for p in measured["messaging.client.sent.messages"]:  # (a point per partition too)
        key = p.attributes.get("error.type")
        sent_counts[key] = sent_counts.get(key, 0) + p.value
    assert sent_counts == {None: 20, "RecordTooLargeError": 1}
    assert sum(p.count for p in measured["messaging.client.operation.duration"]) == 21
    assert sum(p.count for p in measured["kafka.producer.request_latency"]) >= 1
    assert sum(p.count for p in measured["kafka.producer.record_latency"]) == \
        producer.metrics().batches_sent


async def test_without_tracing_no_span_and_no_header(broker, topic, otel):
    """trace_sends=False: metrics only; the records carry no trace context."""
    tracer_provider, meter_provider, spans, reader = otel
    hooks = OpenTelemetryHooks(tracer_provider=tracer_provider, meter_provider=meter_provider,
                               trace_sends=False)
    async with Producer(broker.bootstrap, hooks=[hooks]) as producer:
        await asyncio.gather(*(producer.send(topic, b"v%d" % i) for i in range(10)))
        measured = points(reader)
    assert spans.get_finished_spans() == ()
    stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 10)
    assert len(stored) == 10 and all(not record.headers for record in stored)
    assert [p.value for p in measured["kafka.producer.record_send_total"]] == [10]
    assert "messaging.client.sent.messages" not in measured


async def test_prometheus_scrape_reads_each_running_producer(broker, topic_factory):
    """A scrape (prometheus_client's own exposition, read by its parser) shows each running
    producer's per-topic counts and histograms under its client_id; a closed one is gone.
    The scrape runs in another thread, as an exporter's HTTP server does."""
    registry = CollectorRegistry()
    collector = PrometheusCollector(registry)
    topics = [topic_factory(1), topic_factory(1)]
    async with Producer(broker.bootstrap, hooks=[collector], client_id="one") as one, \
            Producer(broker.bootstrap, hooks=[collector], client_id="two") as two:
        await asyncio.gather(*(one.send(topics[0], b"a") for _ in range(7)),
                             *(two.send(topics[1], b"b") for _ in range(5)),
                             *(two.send(topics[0], b"c") for _ in range(3)))
        text = (await asyncio.to_thread(generate_latest, registry)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    sends = {(s.labels["client_id"], s.labels["topic"]): s.value
             for s in families["kafka_producer_record_send"].samples}
    assert sends == {("one", topics[0]): 7, ("two", topics[1]): 5, ("two", topics[0]): 3}
    responses = {s.labels["client_id"]: s.value
                 for s in families["kafka_producer_response"].samples}
    assert set(responses) == {"one", "two"} and min(responses.values()) >= 1
    counts = {s.labels["client_id"]: s.value
              for s in families["kafka_producer_request_latency_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == responses
    assert {s.labels["client_id"]: s.value
            for s in families["kafka_producer_buffer_total_bytes"].samples} == \
        {"one": 33554432, "two": 33554432}
    after = generate_latest(registry).decode()
    assert 'client_id="one"' not in after and 'client_id="two"' not in after


async def test_a_producer_dropped_unclosed_is_not_kept_by_its_exporter(broker, topic):
    """A scraped producer its user forgot (without close()) is collected, and the next scrape
    no longer shows it: the collector's last snapshot does not keep it alive."""
    registry = CollectorRegistry()
    collector = PrometheusCollector(registry)
    producer = Producer(broker.bootstrap, hooks=[collector], client_id="forgotten")
    await producer.start()
    await producer.send(topic, b"a")
    assert 'client_id="forgotten"' in generate_latest(registry).decode()
    collected = weakref.ref(producer)
    with pytest.warns(ResourceWarning, match="unclosed"):
        del producer
        gc.collect()
    assert collected() is None
    assert 'client_id="forgotten"' not in generate_latest(registry).decode()
    await asyncio.sleep(0.1)  # (its parts let go on the loop)


def test_blocking_producer_spans_are_children_of_the_callers(broker, topic, otel):
    """BlockingProducer: the hooks run in the producer's thread, in the calling thread's
    context, so each send's span is the child of the span produce() was called in."""
    from aioproducer import BlockingProducer

    tracer_provider, meter_provider, spans, _ = otel
    hooks = OpenTelemetryHooks(tracer_provider=tracer_provider, meter_provider=meter_provider)
    tracer = tracer_provider.get_tracer("a view")
    with BlockingProducer(broker.bootstrap, hooks=[hooks]) as producer:
        with tracer.start_as_current_span("handle request") as parent:
            futures = [producer.produce(topic, b"v%d" % i) for i in range(10)]
        producer.flush(30)
    assert len([f.result() for f in futures]) == 10
    sends = [s for s in spans.get_finished_spans() if s.name == f"send {topic}"]
    assert len(sends) == 10
    assert {s.parent.span_id for s in sends} == {parent.get_span_context().span_id}
    assert {s.context.trace_id for s in sends} == {parent.get_span_context().trace_id}
