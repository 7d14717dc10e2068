"""aiohttp: one producer per application, through `cleanup_ctx` and a typed `AppKey`.

```py
import asyncio

from aiohttp import web
from aioproducer.integrations.aiohttp import PRODUCER, readiness_handler, \
    setup_producer, unavailable_middleware

app = web.Application(middlewares=[unavailable_middleware()])  # deadline passed: 503
setup_producer(app, "localhost:9092", close_timeout=10, linger_ms=5)
app.router.add_get("/ready", readiness_handler(max_pending_s=2))

async def publish(request: web.Request) -> web.Response:
    async with asyncio.timeout(2):  # this request's deadline
        md = await request.app[PRODUCER].send("events", await request.read())
    return web.json_response({"partition": md.partition, "offset": md.offset})

app.router.add_post("/events", publish)
```
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .._internal.arguments import check_timeout
from ..producer import Producer
from ._web import NOT_UNAVAILABLE, UNAVAILABLE, check_max_pending, names_a_producer, \
    readiness, retry_after, unavailable_body

PRODUCER: web.AppKey[Producer[Any, Any]] = web.AppKey("aioproducer", Producer)
"""Where the application keeps its producer: `request.app[PRODUCER]`."""


def setup_producer(app: web.Application, bootstrap_servers: str | Sequence[str] | None = None,
                   *, close_timeout: float | None = None, **settings: Any) -> None:
    """Start a Producer with the application and close (flush) it at cleanup, for at most
    `close_timeout` seconds if given: records still unacknowledged then fail, so a broker
    that went away cannot hold the app past its grace period."""
    check_timeout("close_timeout", close_timeout)
    if type(app._state) is dict:  # (aiohttp 3.14's items: left alone if that changes)
        app._state = _State(app._state)

    async def producer_context(app: web.Application) -> AsyncIterator[None]:
        producer = Producer(bootstrap_servers, **settings)
        await producer.start()
        app[PRODUCER] = producer
        try:
            yield
        finally:
            await producer.close(close_timeout)

    app.cleanup_ctx.append(producer_context)


class _State(dict[Any, Any]):
    """An application's items (aiohttp's `app._state`) where `app["producer"]`, a string key
    as aiohttp apps used before AppKey, says which key holds the producer rather than raising
    a bare `KeyError: 'producer'`. Other missing keys raise aiohttp's plain KeyError."""

    def __missing__(self, key: object) -> Any:
        if names_a_producer(key):
            raise KeyError(f"{key!r}: setup_producer() keeps the producer under the typed key "
                           "PRODUCER: `from aioproducer.integrations.aiohttp import PRODUCER`, "
                           "then `request.app[PRODUCER]`")
        raise KeyError(key)


def unavailable_middleware(*, retry_after_s: int = 1) -> Middleware:
    """A middleware that answers 503 Service Unavailable (with Retry-After) instead of a 500
    when a handler raises what says Kafka cannot take the record now: a TimeoutError (the
    request's own deadline, `asyncio.timeout()` around `send()`, ran out; or buffer memory
    stayed full for max_block_ms), a retriable Kafka error (no broker reachable, the delivery
    timed out) or ProducerClosedError (shutting down; not EventLoopEndedError). A record
    whose wait ran out was buffered and is still sent if a broker takes it within
    delivery_timeout_ms: a client that retries after a 503 may write the event twice (give
    events an id). Not for a WebSocket handler once its WebSocketResponse is prepared (no
    HTTP answer can go then): there catch the error and `await ws.close(code=1013)` (Try
    Again Later)."""
    headers = retry_after(retry_after_s)

    @web.middleware
    async def unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except UNAVAILABLE as exc:
            if isinstance(exc, NOT_UNAVAILABLE):
                raise
            return web.json_response(unavailable_body(exc), status=503, headers=headers)

    return unavailable


def readiness_handler(max_pending_s: float = 5.0
                      ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler for a readiness probe (`app.router.add_get("/ready", ...)`): 200 while the
    producer can deliver, 503 while it cannot (closing, its sender failed, or a record has
    waited over `max_pending_s` for a broker), with the producer's state as JSON."""
    check_max_pending(max_pending_s)

    async def ready(request: web.Request) -> web.Response:
        ok, body = readiness(request.app.get(PRODUCER), max_pending_s)
        return web.json_response(body, status=200 if ok else 503)

    return ready
