"""Testing helpers: an embedded Kafka-compatible dev broker, and a simulated multi-broker
cluster in front of it (leaders that move, nodes that go down, throttling, TLS and SASL)."""

from ._sasl_server import Principal, SaslFailure, unsecured_jwt
from .broker import EmbeddedBrokerError, EmbeddedBroker
from .cluster import Chaos, ClusterStats, Listener, SimulatedCluster

__all__ = ["Chaos", "ClusterStats", "EmbeddedBrokerError", "EmbeddedBroker", "Listener",
           "Principal", "SaslFailure", "SimulatedCluster", "unsecured_jwt"]
