"""FastAPI: one producer per app, started with the app and closed (flushed) at shutdown.

```py
import json

from fastapi import FastAPI
from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

app = FastAPI(lifespan=producer_lifespan("localhost:9092", linger_ms=5))

@app.post("/events")
async def publish(event: dict, producer: ProducerDep):
    md = await producer.send("events", json.dumps(event).encode())
    return {"partition": md.partition, "offset": md.offset}
```

One long-lived producer serves every request: concurrent handlers awaiting `send()` share
its batches, which is where the throughput comes from.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, AsyncIterator, Callable, Sequence

from fastapi import Depends, FastAPI, Request

from .._internal.arguments import check_timeout
from ..producer import Producer

# A FastAPI lifespan, which may yield a state dict (Starlette copies it into request.state).
Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[Any]]


def producer_lifespan(bootstrap_servers: str | Sequence[str] | None = None, *,
                      lifespan: Lifespan | None = None, close_timeout: float | None = None,
                      **settings: Any) -> Lifespan:
    """A FastAPI `lifespan` that runs a Producer for the app's lifetime (on `app.state`).

    Pass your own lifespan as `lifespan=` to run it inside (the producer is up first and
    closes last, so your startup and shutdown code can use it); the state it yields is
    passed on to the server, so handlers see it on `request.state` as without us.
    `close_timeout` (seconds) bounds the flush at shutdown: records still unacknowledged
    then fail, so a broker that went away cannot hold the app past its grace period."""
    check_timeout("close_timeout", close_timeout)

    @contextlib.asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[Any]:
        producer = Producer(bootstrap_servers, **settings)
        await producer.start()
        app.state.aioproducer = producer
        try:
            if lifespan is None:
                yield None
            else:
                async with lifespan(app) as state:
                    yield state
        finally:
            del app.state.aioproducer
            await producer.close(close_timeout)

    return run


def get_producer(request: Request) -> Producer:
    """The app's producer (a FastAPI dependency)."""
    producer: Producer | None = getattr(request.app.state, "aioproducer", None)
    if producer is None:
        raise RuntimeError(
            "no producer on this app: create it with FastAPI(lifespan=producer_lifespan(...))")
    return producer


ProducerDep = Annotated[Producer, Depends(get_producer)]
"""Annotate a handler parameter with this to receive the app's producer."""
