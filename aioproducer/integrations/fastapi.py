"""FastAPI: one producer per app, started with the app and closed (flushed) at shutdown.

```py
import asyncio
import json

from fastapi import FastAPI
from aioproducer.integrations.fastapi import ProducerDep, add_unavailable_handler, \
    producer_lifespan, readiness_endpoint

app = FastAPI(lifespan=producer_lifespan("localhost:9092", close_timeout=10, linger_ms=5))
add_unavailable_handler(app)  # a send past its deadline, Kafka unreachable: 503
app.add_api_route("/ready", readiness_endpoint(max_pending_s=2))

@app.post("/events")
async def publish(event: dict, producer: ProducerDep):
    async with asyncio.timeout(2):  # this request's deadline
        md = await producer.send("events", json.dumps(event).encode())
    return {"partition": md.partition, "offset": md.offset}
```

One long-lived producer serves every request: concurrent handlers awaiting `send()` share
its batches, which is where the throughput comes from.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, AsyncIterator, Awaitable, Callable, Sequence

from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.requests import HTTPConnection
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from .._internal.arguments import check_timeout
from ..producer import Producer
from ._web import NOT_UNAVAILABLE, UNAVAILABLE, check_max_pending, names_a_producer, \
    readiness, retry_after, unavailable_body

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
        if type(app.state._state) is dict:  # (Starlette 1.x's items: left alone if that changes)
            object.__setattr__(app.state, "_state", _State(app.state._state))
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


class _State(dict[str, Any]):
    """An app's state items (Starlette's `app.state._state`) where `app.state.producer`, a
    name of the user's guessing, says where the producer is rather than raising a bare
    "'State' object has no attribute 'producer'". (Starlette turns a KeyError from here into
    that bare AttributeError: an AttributeError passes through.) Other missing names keep
    Starlette's own error."""

    def __missing__(self, key: str) -> Any:
        if names_a_producer(key):
            raise AttributeError(
                f"'State' object has no attribute {key!r}: producer_lifespan() keeps the "
                "producer on app.state.aioproducer; a handler takes it as "
                "`producer: ProducerDep` (from aioproducer.integrations.fastapi import "
                "ProducerDep)")
        raise KeyError(key)


def get_producer(connection: HTTPConnection) -> Producer[Any, Any]:
    """The app's producer (a FastAPI dependency), for HTTP and WebSocket endpoints alike."""
    producer: Producer[Any, Any] | None = getattr(connection.app.state, "aioproducer", None)
    if producer is None:
        raise RuntimeError(
            "no producer on this app: its lifespan has not run. Create the app with "
            "FastAPI(lifespan=producer_lifespan(...)); in tests enter the client, `with "
            "TestClient(app) as client:` (TestClient runs the lifespan only then); a mounted "
            "sub-application's lifespan does not run: give it to the outer app")
    return producer


ProducerDep = Annotated[Producer[Any, Any], Depends(get_producer)]
"""Annotate a handler parameter with this to receive the app's producer."""


def add_unavailable_handler(app: FastAPI, *, retry_after_s: int = 1) -> None:
    """Answer 503 Service Unavailable (with Retry-After) instead of a 500 with a traceback
    when a handler raises what says Kafka cannot take the record now: a TimeoutError (the
    request's own deadline, `asyncio.timeout()` around `send()`, ran out; or buffer memory
    stayed full for max_block_ms), a retriable Kafka error (no broker reachable, the delivery
    timed out) or ProducerClosedError (shutting down; not EventLoopEndedError). A record
    whose wait ran out was buffered and is still sent if a broker takes it within
    delivery_timeout_ms: a client that retries after a 503 may write the event twice (give
    events an id). A WebSocket endpoint's connection, once accepted, is closed with code
    1013 (Try Again Later)."""
    headers = retry_after(retry_after_s)

    async def unavailable(connection: HTTPConnection, exc: Exception) -> JSONResponse | None:
        if isinstance(exc, NOT_UNAVAILABLE):
            raise exc
        if isinstance(connection, WebSocket) and \
                connection.application_state is WebSocketState.CONNECTED and \
                connection.client_state is WebSocketState.CONNECTED:
            # Accepted: no HTTP answer can go any more (a server drops the connection
            # instead). Closed with 1013, Try Again Later.
            await connection.close(1013, unavailable_body(exc)["detail"])
            return None
        return JSONResponse(unavailable_body(exc), status_code=503, headers=headers)

    for error in UNAVAILABLE:
        app.add_exception_handler(error, unavailable)  # type: ignore[arg-type]


def readiness_endpoint(max_pending_s: float = 5.0
                       ) -> Callable[[Request], Awaitable[JSONResponse]]:
    """An endpoint for a readiness probe (`app.add_api_route("/ready", ...)`): 200 while the
    producer can deliver, 503 while it cannot (closing, its sender failed, or a record has
    waited over `max_pending_s` for a broker), with the producer's state as JSON."""
    check_max_pending(max_pending_s)

    async def ready(request: Request) -> JSONResponse:
        ok, body = readiness(getattr(request.app.state, "aioproducer", None), max_pending_s)
        return JSONResponse(body, status_code=200 if ok else 503)

    return ready
