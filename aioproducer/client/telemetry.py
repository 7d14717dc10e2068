"""Client telemetry (KIP-714): the producer's metrics pushed to a broker that asks for them.

A broker advertises GetTelemetrySubscriptions and PushTelemetry in ApiVersions only when its
operator installed a telemetry plugin; without them (older Kafka, the embedded broker) this
sends nothing. Otherwise, on one broker (the least loaded open connection, kept while it
stays open): get the subscription (the zero UUID first, then the client instance id the
broker assigned), then push what its requested_metrics prefixes select, every
push_interval_ms (the first push after each subscription at 0.5-1.5 times that, so that
clients started together spread out), delta or cumulative sums as it says, compressed with
the first codec it accepts, within telemetry_max_bytes. close() sends a last push with
Terminating set, bounded by close()'s timeout.

Nothing here touches a record or can fail one: each error the broker answers is logged once,
then pushing backs off or stops, as the Java client's ClientTelemetryReporter does.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from typing import Any, Callable, Mapping, NamedTuple

from ..errors import KafkaError, error_for_code
from ..protocol.compression import Codec, compress
from ..protocol.messages import ApiKey
from ..protocol.otlp import CUMULATIVE, DELTA, Point, Sample, encode_metrics_data, selected
from .cluster import Cluster
from .connection import BrokerConnection
from .tasks import TaskSet

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 300.0  # KIP-714's default push interval; also the wait without a broker
_NO_CONNECTION_S = 5.0  # no broker connection open yet: look again this soon
_ZERO = bytes(16)  # a client instance id (a uuid, 16 bytes) not assigned
_CODECS = frozenset(codec.value for codec in Codec)
# What the broker's error codes make the client do (KIP-714; the Java client's table).
_REFETCH = frozenset((117, 76))  # UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE
_WAIT = frozenset((118, 89))  # TELEMETRY_TOO_LARGE, THROTTLING_QUOTA_EXCEEDED
# INVALID_REQUEST, INVALID_RECORD, UNSUPPORTED_VERSION and any other code: stop pushing.


class Subscription(NamedTuple):
    id: int
    interval_s: float
    codec: Codec
    max_bytes: int
    delta: bool
    requested: tuple[str, ...]


def _speaks_telemetry(conn: BrokerConnection) -> bool:
    ranges = conn.broker_ranges
    return ApiKey.GET_TELEMETRY_SUBSCRIPTIONS in ranges and ApiKey.PUSH_TELEMETRY in ranges


class ClientTelemetry:
    """The subscription and pushes of one producer: `start()` spawns the task, `stop()`
    ends it and starts the terminating push (its caller bounds the wait)."""

    def __init__(self, cluster: Cluster, tasks: TaskSet, collect: Callable[[], list[Sample]],
                 resource: Mapping[str, str], name: str) -> None:
        self._cluster = cluster
        self._tasks = tasks
        self._collect = collect
        self._resource = dict(resource)
        self._name = name
        self.instance_id = _ZERO  # the broker assigns it
        self.subscription: Subscription | None = None
        self._push_due = False  # False: (re)fetch the subscription next
        self._conn: BrokerConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._warned: set[str] = set()
        # Delta temporality: the sums' values at the last push, and when that was.
        self._started_ns = self._last_push_ns = time.time_ns()
        self._last_sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.pushes = 0  # answered without error, for tests and diagnostics

    def start(self) -> None:
        self._task = self._tasks.spawn(self._run(), f"aioproducer-telemetry-{self._name}")

    def stop(self) -> asyncio.Task[None] | None:
        """Stop pushing; start the terminating push if a subscription asked for metrics and
        a broker that speaks telemetry is connected. Its task, or None."""
        if self._task is not None:
            self._task.cancel()
        if self._stopped or not self._push_due or self.subscription is None:
            self._stopped = True
            return None
        self._stopped = True
        conn = self._connection()
        if conn is None:
            return None
        return self._tasks.spawn(self._final_push(conn, self.subscription),
                                 f"aioproducer-telemetry-final-{self._name}")

    async def _run(self) -> None:
        delay = 0.0
        while not self._cluster.closed:
            if delay > 0:
                await self._cluster.pause(delay)
                if self._cluster.closed:
                    return
            try:
                next_delay = await self._step()
            except KafkaError as exc:  # the connection failed or timed out: again later
                self._warn_once(type(exc).__name__, "client telemetry request failed (%s); "
                                "trying again later", exc, level=logging.INFO)
                self._push_due = False
                self._conn = None
                next_delay = self._interval()
            except Exception:  # a bug: never let it reach a record
                log.exception("client telemetry stopped by an unexpected error")
                next_delay = None
            if next_delay is None:
                self._stopped = True
                return
            delay = next_delay

    def _interval(self) -> float:
        return self.subscription.interval_s if self.subscription is not None \
            else DEFAULT_INTERVAL_S

    def _connection(self) -> BrokerConnection | None:
        """The broker telemetry goes to: the one it went to while its connection is open,
        else the least loaded open connection to a broker that speaks telemetry."""
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        candidates = [c for c in self._cluster.open_connections() if _speaks_telemetry(c)]
        if not candidates:
            return None
        if conn is not None:  # another broker now: ask it for the subscription first
            self._push_due = False
        self._conn = conn = min(candidates, key=lambda c: c.in_flight_produce)
        return conn

    async def _step(self) -> float | None:
        """One request; the seconds until the next, or None to stop."""
        conn = self._connection()
        if conn is None:
            return _NO_CONNECTION_S if not self._cluster.open_connections() \
                else DEFAULT_INTERVAL_S
        if not self._push_due:
            return await self._subscribe(conn)
        assert self.subscription is not None
        response = await conn.request(ApiKey.PUSH_TELEMETRY,
                                      self._push_body(self.subscription, terminating=False))
        if response["error_code"]:
            return self._on_error(response["error_code"], "PushTelemetry")
        self.pushes += 1
        return self.subscription.interval_s

    async def _subscribe(self, conn: BrokerConnection) -> float | None:
        response = await conn.request(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS,
                                      {"client_instance_id": self.instance_id})
        if response["error_code"]:
            return self._on_error(response["error_code"], "GetTelemetrySubscriptions")
        if response["client_instance_id"] != _ZERO:
            self.instance_id = response["client_instance_id"]
        if self.instance_id == _ZERO:
            self._warn_once("no-id", "client telemetry stopped: the broker assigned no "
                            "client instance id")
            return None
        # The broker lists them in its order of preference (all four are ours).
        codec = next((Codec(c) for c in response["accepted_compression_types"]
                      if c in _CODECS), Codec.NONE)
        interval_ms = response["push_interval_ms"]
        delta = response["delta_temporality"]
        if self.subscription is not None and self.subscription.delta != delta:
            self._last_sums.clear()
        self.subscription = Subscription(
            response["subscription_id"],
            # (at least Kafka's least interval.ms, 100: no request loop for a broken broker)
            max(interval_ms, 100) / 1000 if interval_ms > 0 else DEFAULT_INTERVAL_S, codec,
            response["telemetry_max_bytes"], delta, tuple(response["requested_metrics"]))
        log.debug("client telemetry: instance %s, subscription %r",
                  uuid.UUID(bytes=self.instance_id), self.subscription)
        if not self.subscription.requested:  # nothing asked for: ask again after the interval
            return self.subscription.interval_s
        self._push_due = True
        return self.subscription.interval_s * random.uniform(0.5, 1.5)

    def _on_error(self, code: int, request: str) -> float | None:
        error = error_for_code(code, request)
        if code in _REFETCH:
            log.debug("client telemetry: %s, fetching the subscription again", error)
            self._push_due = False
            # At once after a push; after the interval if the fetch itself was refused (no
            # request per round trip to a broker that keeps saying so).
            return 0.0 if request == "PushTelemetry" else self._interval()
        if code in _WAIT:
            self._warn_once(str(code), "client telemetry: %s; pushing again after the interval",
                            error, level=logging.INFO)
            return self._interval()
        self._warn_once(str(code), "client telemetry stopped: %s", error)
        return None

    def _warn_once(self, key: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, message, *args)

    def _push_body(self, subscription: Subscription, terminating: bool) -> dict[str, Any]:
        return {"client_instance_id": self.instance_id, "subscription_id": subscription.id,
                "terminating": terminating, "compression_type": subscription.codec,
                "metrics": self._payload(subscription)}

    def _payload(self, subscription: Subscription) -> bytes:
        """The selected samples as MetricsData, compressed; halved until it fits in
        telemetry_max_bytes (logged once when it does not)."""
        now_ns = time.time_ns()
        points = []
        for sample in selected(self._collect(), subscription.requested):
            if sample.kind != "sum":
                points.append(Point(sample, sample.value, 0, now_ns))
            elif not subscription.delta:
                points.append(Point(sample, sample.value, self._started_ns, now_ns))
            else:
                key = (sample.name, sample.attributes)
                last = self._last_sums.get(key)
                self._last_sums[key] = sample.value
                points.append(Point(sample, sample.value - (last or 0.0),
                                    self._started_ns if last is None else self._last_push_ns,
                                    now_ns))
        self._last_push_ns = now_ns
        temporality = DELTA if subscription.delta else CUMULATIVE
        while True:
            data = encode_metrics_data(self._resource, points, temporality)
            if subscription.codec != Codec.NONE:
                data = compress(subscription.codec, data)
            if len(data) <= subscription.max_bytes or not points:
                return data
            self._warn_once("too-large", "client telemetry: %d metrics take %d bytes, over the "
                            "broker's telemetry_max_bytes=%d: pushing fewer", len(points),
                            len(data), subscription.max_bytes)
            points = points[:len(points) // 2]

    async def _final_push(self, conn: BrokerConnection, subscription: Subscription) -> None:
        try:
            response = await conn.request(ApiKey.PUSH_TELEMETRY,
                                          self._push_body(subscription, terminating=True))
        except KafkaError as exc:
            log.debug("client telemetry: the terminating push failed: %s", exc)
            return
        if response["error_code"]:
            log.debug("client telemetry: the terminating push was refused: %s",
                      error_for_code(response["error_code"], "PushTelemetry"))
        else:
            self.pushes += 1
