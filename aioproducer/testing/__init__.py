"""Testing helpers: an embedded Kafka-compatible dev broker, and a simulated multi-broker
cluster in front of it (leaders that move, nodes that go down, throttling, TLS and SASL)."""

from .broker import EmbeddedBrokerError, EmbeddedBroker
from .cluster import Chaos, ClusterStats, Listener, SimulatedCluster

__all__ = ["Chaos", "ClusterStats", "EmbeddedBrokerError", "EmbeddedBroker", "Listener",
           "SimulatedCluster"]
