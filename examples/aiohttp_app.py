"""An aiohttp endpoint that publishes an event to Kafka and answers where it landed.

    pip install '.[aiohttp]'                                  # from a checkout
    pip install "$(echo dist/aioproducer-*.whl)[aiohttp]"     # or a wheel (README)
    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 python examples/aiohttp_app.py
    curl -X POST localhost:8080/events -d '{"user": "u-7", "action": "click"}'
"""

import json
import os

from aiohttp import web

from aioproducer.integrations.aiohttp import PRODUCER, setup_producer

TOPIC = os.environ.get("EVENTS_TOPIC", "events")


async def publish(request: web.Request) -> web.Response:
    try:
        event = await request.json()
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    user = event.get("user")  # the key: one user's events stay in order, in one partition
    md = await request.app[PRODUCER].send(TOPIC, json.dumps(event).encode(),
                                          key=None if user is None else str(user).encode())
    return web.json_response({"topic": md.topic, "partition": md.partition, "offset": md.offset})


def make_app() -> web.Application:
    app = web.Application()
    setup_producer(app, os.environ.get("AIOPRODUCER_BOOTSTRAP", "127.0.0.1:9092"), linger_ms=5)
    app.router.add_post("/events", publish)
    return app


if __name__ == "__main__":
    web.run_app(make_app())
