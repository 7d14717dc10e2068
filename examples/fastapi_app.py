"""An HTTP endpoint that publishes an event to Kafka and answers where it landed, traced
with OpenTelemetry: each send is a span, and each event carries its trace context
(`traceparent` header) so the consumer's spans join the same trace.

    pip install 'aioproducer[fastapi,otel]' opentelemetry-sdk uvicorn
    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/events -H 'content-type: application/json' \
         -d '{"user": "u-7", "action": "click"}'
    curl localhost:8000/ready

With the broker gone, a request answers 503 within its deadline (SEND_DEADLINE_S), /ready
says 503 once a record has waited that long, and shutdown ends within CLOSE_TIMEOUT_S. An
event whose request timed out was buffered: it is still sent if the broker is back within
delivery_timeout_ms (2 minutes).
"""

import asyncio
import json
import os

from fastapi import FastAPI
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from aioproducer.integrations.fastapi import ProducerDep, add_unavailable_handler, \
    producer_lifespan, readiness_endpoint
from aioproducer.observability.otel import OpenTelemetryHooks

# OpenTelemetry's SDK, once per process. Give the providers your exporters (OTLP, say:
# TracerProvider(...).add_span_processor(BatchSpanProcessor(OTLPSpanExporter())) and
# MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])), or
# run under `opentelemetry-instrument`, which sets them up from OTEL_* variables; with
# opentelemetry-instrumentation-fastapi each request's span becomes its sends' parent.
if not isinstance(trace.get_tracer_provider(), TracerProvider):
    trace.set_tracer_provider(TracerProvider())
    metrics.set_meter_provider(MeterProvider())

TOPIC = os.environ.get("EVENTS_TOPIC", "events")
SEND_DEADLINE_S = float(os.environ.get("SEND_DEADLINE_S", "2"))  # each request's, for its send
# The shutdown's flush gives up then (records not acknowledged fail): within the server's
# grace period (Kubernetes gives 30 s) even while the broker is away.
CLOSE_TIMEOUT_S = float(os.environ.get("CLOSE_TIMEOUT_S", "10"))
app = FastAPI(lifespan=producer_lifespan(
    os.environ.get("AIOPRODUCER_BOOTSTRAP", "127.0.0.1:9092"), close_timeout=CLOSE_TIMEOUT_S,
    linger_ms=5, hooks=[OpenTelemetryHooks()]))  # spans per send, the Java client's metric names
add_unavailable_handler(app)  # a deadline passed, Kafka unreachable, shutting down: 503
app.add_api_route("/ready", readiness_endpoint(max_pending_s=SEND_DEADLINE_S))


@app.post("/events")
async def publish(event: dict, producer: ProducerDep) -> dict:
    user = event.get("user")  # the key: one user's events stay in order, in one partition
    async with asyncio.timeout(SEND_DEADLINE_S):
        md = await producer.send(TOPIC, json.dumps(event).encode(),
                                 key=None if user is None else str(user).encode())
    return {"topic": md.topic, "partition": md.partition, "offset": md.offset}
