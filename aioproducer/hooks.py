"""Hooks: what a producer tells code of yours as records go through it, for tracing,
metrics and audit (`Producer(..., hooks=[MyHooks()])`).

Subclass `ProducerHooks` and override what you need; only the methods you override are
called, so a hook costs nothing where it says nothing (an instance may also set one to None
to be skipped, say on_send when it was made not to trace). All but `on_send` are called once
per batch or per request, never per record: cheap enough to leave on in production.
`on_send` is the per-record one (for a span per send, or a header on every record); a
producer whose hooks do not override it pays nothing per record.

Every method runs on the producer's event loop, in the middle of its work: return quickly
and do not block. What a hook raises is logged and does not reach the record or the
producer (`on_send` is the exception: its error raises from the send, and the record is not
buffered).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from .serializers import MutableHeaders

if TYPE_CHECKING:
    from ._internal.batch import RecordMetadata
    from .producer import Producer

# Told the outcome of one record: its metadata, or the exception it failed with (a
# cancelled send: asyncio.CancelledError).
DeliveryCallback = Callable[[Optional["RecordMetadata"], Optional[BaseException]], None]


class ProducerHooks:
    """Override any of these; the base class's do nothing and are never called."""

    def on_start(self, producer: Producer[Any, Any]) -> None:
        """The producer started (a hook that reports its `metrics()` keeps it until
        `on_close`). One hook may serve several producers."""

    def on_close(self, producer: Producer[Any, Any]) -> None:
        """The producer closed."""

    def on_send(self, topic: str, key: Any, value: Any,
                headers: MutableHeaders) -> DeliveryCallback | None:
        """A record given to send(), enqueue() or enqueue_many() (or BlockingProducer's
        produce() and produce_many()), before it is serialized and buffered: `key` and
        `value` as given, `headers` a list this hook may change (add a trace context, say)
        that the record then carries. Return a callable to be told this record's outcome,
        or None. enqueue_many() shows each record as it reads it (a producer with such a
        hook takes its records one by one in Python, not in the compiled loop)."""
        return None

    def on_ack(self, topic: str, partition: int, base_offset: int, record_count: int,
               latency_s: float) -> None:
        """A batch was acknowledged: its records are at base_offset onwards (-1 if the
        broker did not say: acks=0). `latency_s`: from its first record's send to now."""

    def on_error(self, topic: str, partition: int, record_count: int,
                 error: BaseException) -> None:
        """A batch failed for good: its records' futures raise `error`."""

    def on_retry(self, topic: str, partition: int, record_count: int,
                 error: BaseException) -> None:
        """A batch is to be sent again after a retriable `error`."""

    def on_throttle(self, node_id: int, throttle_time_ms: int) -> None:
        """A broker asked the producer to hold back for throttle_time_ms (a quota, KIP-219)."""

    def on_request(self, node_id: int, latency_s: float, error: BaseException | None) -> None:
        """A produce request ended: its response came after `latency_s`, or it failed as a
        whole (`error`: the connection was lost, or the request timed out)."""


# The methods a subclass may override, each called only where overridden.
HOOK_METHODS = ("on_start", "on_close", "on_send", "on_ack", "on_error", "on_retry",
                "on_throttle", "on_request")
