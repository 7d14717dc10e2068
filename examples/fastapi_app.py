"""An HTTP endpoint that publishes an event to Kafka and answers where it landed.

    pip install 'aioproducer[fastapi]' uvicorn   # the extra brings no server: pick one
    AIOPRODUCER_BOOTSTRAP=127.0.0.1:9092 uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/events -H 'content-type: application/json' \
         -d '{"user": "u-7", "action": "click"}'
"""

import json
import os

from fastapi import FastAPI

from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

TOPIC = os.environ.get("EVENTS_TOPIC", "events")
app = FastAPI(lifespan=producer_lifespan(
    os.environ.get("AIOPRODUCER_BOOTSTRAP", "127.0.0.1:9092"), linger_ms=5))


@app.post("/events")
async def publish(event: dict, producer: ProducerDep) -> dict:
    user = event.get("user")  # the key: one user's events stay in order, in one partition
    md = await producer.send(TOPIC, json.dumps(event).encode(),
                             key=None if user is None else str(user).encode())
    return {"topic": md.topic, "partition": md.partition, "offset": md.offset}
