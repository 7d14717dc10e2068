"""What the FastAPI and aiohttp integrations both offer a web service facing a broker that
went away: which errors mean "Kafka cannot take this record now" (answered 503, so clients
retry elsewhere or later instead of seeing a 500), and a readiness check; and which missing
names a handler meant the producer by (to say where it is)."""

from __future__ import annotations

from typing import Any

from ..errors import (
    ConfigError,
    EventLoopEndedError,
    ProducerClosedError,
    RetriableError,
)
from ..producer import Producer

# A per-request deadline around send() ran out (asyncio.timeout, wait_for, anyio's raise
# TimeoutError), or buffer memory stayed full for max_block_ms (BufferExhaustedError is a
# TimeoutError); a broker could not be reached or the delivery timed out (retriable); the
# producer is shutting down.
UNAVAILABLE: tuple[type[Exception], ...] = (TimeoutError, RetriableError,
                                            ProducerClosedError)
# But a producer whose event loop ended (started by asyncio.run() at import, say): no outage,
# the server's mistake, for ever (the readiness probe says ready). Raised: a 500, logged.
NOT_UNAVAILABLE = EventLoopEndedError


def unavailable_body(exc: BaseException) -> dict[str, str]:
    """A 503's body: the error's class, not its text (which names brokers' addresses)."""
    return {"detail": f"Kafka is unavailable ({type(exc).__name__}): try again later"}


def retry_after(seconds: int) -> dict[str, str]:
    if type(seconds) is not int or seconds < 0:
        raise ConfigError(f"retry_after_s must be whole seconds >= 0, not {seconds!r}")
    return {"Retry-After": str(seconds)}


def check_max_pending(max_pending_s: float) -> None:
    if type(max_pending_s) not in (int, float) or not max_pending_s >= 0:
        raise ConfigError(f"max_pending_s must be seconds >= 0, not {max_pending_s!r}")


def readiness(producer: Producer | None, max_pending_s: float) -> tuple[bool, dict[str, Any]]:
    """Whether the app's producer can deliver: started (not closing, its sender alive), and
    no record waiting for its acknowledgement longer than `max_pending_s` (no broker has
    taken one for that long: it is down, or the way to it). With the body to answer."""
    if producer is None:
        return False, {"ready": False, "state": "no producer"}
    metrics = producer.metrics()
    ready = metrics.state == "started" and metrics.oldest_pending_s <= max_pending_s
    return ready, {"ready": ready, "state": metrics.state,
                   "records_pending": metrics.records_pending,
                   "oldest_pending_s": round(metrics.oldest_pending_s, 3),
                   "connections": metrics.connections}


def names_a_producer(name: object) -> bool:
    """Whether a missing app key or attribute a handler asked for (`app["producer"]`,
    `app.state.kafka_producer`) is the producer, looked up by a name of the user's guessing."""
    return isinstance(name, str) and ("producer" in name.lower() or "kafka" in name.lower())
