"""aiohttp: one producer per application, through `cleanup_ctx` and a typed `AppKey`.

```py
from aiohttp import web
from aioproducer.integrations.aiohttp import PRODUCER, setup_producer

app = web.Application()
setup_producer(app, "localhost:9092", linger_ms=5)

async def publish(request: web.Request) -> web.Response:
    md = await request.app[PRODUCER].send("events", await request.read())
    return web.json_response({"partition": md.partition, "offset": md.offset})
```
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Sequence

from aiohttp import web

from .._internal.arguments import check_timeout
from ..producer import Producer

PRODUCER: web.AppKey[Producer] = web.AppKey("aioproducer", Producer)
"""Where the application keeps its producer: `request.app[PRODUCER]`."""


def setup_producer(app: web.Application, bootstrap_servers: str | Sequence[str] | None = None,
                   *, close_timeout: float | None = None, **settings: Any) -> None:
    """Start a Producer with the application and close (flush) it at cleanup, for at most
    `close_timeout` seconds if given: records still unacknowledged then fail, so a broker
    that went away cannot hold the app past its grace period."""
    check_timeout("close_timeout", close_timeout)

    async def producer_context(app: web.Application) -> AsyncIterator[None]:
        producer = Producer(bootstrap_servers, **settings)
        await producer.start()
        app[PRODUCER] = producer
        try:
            yield
        finally:
            await producer.close(close_timeout)

    app.cleanup_ctx.append(producer_context)
