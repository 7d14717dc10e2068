"""OpenTelemetry's MetricsData (opentelemetry-proto's metrics/v1/metrics.proto), written by
hand: the few messages a KIP-714 push carries (resource attributes, gauges and sums of one
data point each, string attributes), nothing else.

A protobuf runtime for a few hundred bytes every few minutes would be the core package's
largest dependency (its only ones are crc32c, lz4 and anyio): this is the wire format's
four rules (varints, tags, length prefixes, fixed64) and the field numbers of the .proto.
tests/test_telemetry.py parses what this writes with opentelemetry-proto's generated classes.
"""

from __future__ import annotations

import struct
from typing import Iterable, Mapping, NamedTuple, Sequence

from .primitives import encode_uvarint

# AggregationTemporality of a Sum.
DELTA = 1
CUMULATIVE = 2

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")


class Sample(NamedTuple):
    """One metric's value now. A "sum" is a monotonic counter (delta or cumulative, as the
    subscription says); a "gauge" a value as it is (an average or maximum over the last
    interval, a level)."""

    name: str
    kind: str  # "gauge" or "sum"
    value: float
    attributes: tuple[tuple[str, str], ...] = ()


class Point(NamedTuple):
    """A Sample ready to encode: its value as pushed (a delta for a delta sum) and its
    times in nanoseconds since the epoch (start: where a sum's count began)."""

    sample: Sample
    value: float
    start_ns: int
    time_ns: int


def _key(field: int, wire_type: int) -> bytes:
    return encode_uvarint(field << 3 | wire_type)


def _message(field: int, body: bytes) -> bytes:
    return _key(field, 2) + encode_uvarint(len(body)) + body


def _string(field: int, text: str) -> bytes:
    return _message(field, text.encode())


def _key_value(key: str, value: str) -> bytes:
    """KeyValue{key=1, value=2: AnyValue{string_value=1}}."""
    return _string(1, key) + _message(2, _string(1, value))


def _data_point(point: Point) -> bytes:
    """NumberDataPoint{start_time_unix_nano=2, time_unix_nano=3 (fixed64), as_double=4,
    attributes=7}."""
    body = [_key(2, 1), _FIXED64.pack(point.start_ns), _key(3, 1), _FIXED64.pack(point.time_ns),
            _key(4, 1), _DOUBLE.pack(point.value)]
    body.extend(_message(7, _key_value(k, v)) for k, v in point.sample.attributes)
    return b"".join(body)


def _metric(point: Point, temporality: int) -> bytes:
    """Metric{name=1, gauge=5: Gauge{data_points=1}, sum=7: Sum{data_points=1,
    aggregation_temporality=2, is_monotonic=3}}."""
    data = _message(1, _data_point(point))
    if point.sample.kind == "sum":
        body = _message(7, data + _key(2, 0) + encode_uvarint(temporality) + _key(3, 0) + b"\x01")
    else:
        body = _message(5, data)
    return _string(1, point.sample.name) + body


def encode_metrics_data(resource: Mapping[str, str], points: Sequence[Point],
                        temporality: int) -> bytes:
    """MetricsData{resource_metrics=1: ResourceMetrics{resource=1: Resource{attributes=1},
    scope_metrics=2: ScopeMetrics{metrics=2}}}: one resource, one scope, every point."""
    attributes = b"".join(_message(1, _key_value(k, v)) for k, v in resource.items())
    metrics = b"".join(_message(2, _metric(point, temporality)) for point in points)
    resource_metrics = _message(1, attributes) + _message(2, metrics)
    return _message(1, resource_metrics)


def selected(samples: Iterable[Sample], requested: Sequence[str]) -> list[Sample]:
    """The samples a subscription's requested_metrics ask for: names starting with one of
    its prefixes; [] none; ["*"] (or a lone "", as KIP-714 says) all."""
    if not requested:
        return []
    if list(requested) in (["*"], [""]):
        return list(samples)
    prefixes = tuple(requested)
    return [s for s in samples if s.name.startswith(prefixes)]
