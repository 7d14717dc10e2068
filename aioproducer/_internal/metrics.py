"""What a producer has done and what it holds now, for monitoring: `Producer.metrics()`.

Counted per batch and per request, never per record, so keeping them costs the hot path
nothing; the state now is read when a snapshot is taken.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

# The histograms' bucket upper bounds, in seconds: 1 ms to 2 min, about three per decade.
LATENCY_BOUNDS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                    10.0, 30.0, 120.0)


@dataclasses.dataclass(frozen=True)
class Histogram:
    """A latency histogram, as Prometheus and OpenTelemetry keep them: `counts[i]` is how
    many observations were at most `bounds[i]` seconds and above the bound before it; the
    last count is of those above every bound."""

    bounds: tuple[float, ...] = LATENCY_BOUNDS_S
    counts: tuple[int, ...] = (0,) * (len(LATENCY_BOUNDS_S) + 1)
    sum: float = 0.0  # of the observations, in seconds
    count: int = 0

    def quantile(self, q: float) -> float:
        """An upper bound of the q-quantile (0 < q <= 1): the bound of the bucket it falls
        in (inf above the last bound; 0.0 with no observation)."""
        if not 0 < q <= 1:
            raise ValueError(f"q must be in (0, 1], not {q!r}")
        if not self.count:
            return 0.0
        rank, seen = q * self.count, 0
        for bound, count in zip(self.bounds, self.counts):
            seen += count
            if seen >= rank:
                return bound
        return float("inf")


@dataclasses.dataclass(frozen=True)
class TopicMetrics:
    """One topic's counters in a ProducerMetrics snapshot (final outcomes, as the totals)."""

    records_sent: int = 0
    records_failed: int = 0
    batches_sent: int = 0
    bytes_sent: int = 0  # of the acknowledged batches' records, uncompressed
    records_retried: int = 0  # records sent again (a batch's, each time it is retried)


@dataclasses.dataclass(frozen=True)
class ProducerMetrics:
    """A snapshot. The counters run from start() and only grow (as Prometheus counters): a
    rate is the difference of two snapshots over the time between them. The fields from
    state on are the state when the snapshot was taken."""

    records_sent: int = 0  # acknowledged by the broker
    records_failed: int = 0  # failed for good (delivery timeout, a non-retriable error, close)
    batches_sent: int = 0  # acknowledged: records_sent / batches_sent is the records per batch
    bytes_sent: int = 0  # of record batches written, as on the wire (compressed), retries too
    produce_requests: int = 0  # written
    produce_responses: int = 0  # received, each taking ...
    produce_latency_s: float = 0.0  # ... this long in total from write to response
    retries: int = 0  # batches sent again after a retriable error
    splits: int = 0  # batches the broker refused as too large, sent again in halves
    produce_throttle_time_ms: int = 0  # quota throttling the brokers asked for, summed (KIP-219)
    produce_throttle_time_max_ms: int = 0  # ... and the longest
    leader_redirects: int = 0  # batches sent on to a new leader a produce response named (KIP-951)
    reauthentications: int = 0  # SASL sessions renewed on open connections (KIP-368)
    # times the producer went back to bootstrap_servers for metadata (KIP-899, KIP-1102)
    rebootstraps: int = 0
    # The producer's state: "new", "starting", "started", "failed" (its sender died),
    # "closing" or "closed".
    state: str = "new"
    records_pending: int = 0  # accepted, neither acknowledged nor failed yet
    oldest_pending_s: float = 0.0  # how long the oldest of them has waited: grows in an outage
    requests_in_flight: int = 0  # Produce requests awaiting their response
    connections: int = 0  # open broker connections
    buffer_memory_available: int = 0  # bytes of buffer_memory not held by batches
    waiting_for_memory: int = 0  # sends and enqueues waiting for buffer_memory
    producer_id: int = -1  # idempotent or transactional: the broker's id for us (-1: none yet)
    producer_epoch: int = -1
    transaction_state: str = ""  # transactional: "ready", "in transaction", "aborting", ...
    # transactional: the protocol of the current (or last) transaction, 2 for Transactions
    # V2 (KIP-890), else 1; 0 before the first
    transaction_version: int = 0
    # the cluster's finalized features (KIP-584) from ApiVersions, by name: their levels
    finalized_features: Mapping[str, int] = dataclasses.field(default_factory=dict)
    topics: Mapping[str, TopicMetrics] = dataclasses.field(default_factory=dict)  # by name
    # Produce requests' round trips, and records' time from send() to acknowledgement (a
    # batch's first record's, one observation per batch).
    produce_latency_histogram: Histogram = Histogram()
    record_latency_histogram: Histogram = Histogram()

    @property
    def produce_latency_avg_s(self) -> float:
        """The mean round trip of a Produce request since start() (0.0 before any)."""
        return self.produce_latency_s / self.produce_responses if self.produce_responses else 0.0
