"""An aiohttp endpoint that publishes an event to Kafka and answers where it landed.

    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 python examples/aiohttp_app.py
    curl -X POST localhost:8080/events -d '{"user": "u-7", "action": "click"}'
    curl localhost:8080/ready

With the broker gone, a request answers 503 within its deadline (SEND_DEADLINE_S), /ready
says 503 once a record has waited that long, and shutdown ends within CLOSE_TIMEOUT_S. An
event whose request timed out was buffered: it is still sent if the broker is back within
delivery_timeout_ms (2 minutes).
"""

import asyncio
import json
import os

from aiohttp import web

from aioproducer.integrations.aiohttp import PRODUCER, readiness_handler, setup_producer, \
    unavailable_middleware

TOPIC = os.environ.get("EVENTS_TOPIC", "events")
SEND_DEADLINE_S = float(os.environ.get("SEND_DEADLINE_S", "2"))  # each request's, for its send
# The shutdown's flush gives up then (records not acknowledged fail): within the server's
# grace period (Kubernetes gives 30 s) even while the broker is away.
CLOSE_TIMEOUT_S = float(os.environ.get("CLOSE_TIMEOUT_S", "10"))


async def publish(request: web.Request) -> web.Response:
    try:
        event = await request.json()
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    user = event.get("user")  # the key: one user's events stay in order, in one partition
    async with asyncio.timeout(SEND_DEADLINE_S):
        md = await request.app[PRODUCER].send(TOPIC, json.dumps(event).encode(),
                                              key=None if user is None else str(user).encode())
    return web.json_response({"topic": md.topic, "partition": md.partition, "offset": md.offset})


def make_app() -> web.Application:
    # A deadline passed, Kafka unreachable, shutting down: 503, not a 500.
    app = web.Application(middlewares=[unavailable_middleware()])
    setup_producer(app, os.environ.get("AIOPRODUCER_BOOTSTRAP", "127.0.0.1:9092"),
                   close_timeout=CLOSE_TIMEOUT_S, linger_ms=5)
    app.router.add_post("/events", publish)
    app.router.add_get("/ready", readiness_handler(max_pending_s=SEND_DEADLINE_S))
    return app


if __name__ == "__main__":
    web.run_app(make_app())
