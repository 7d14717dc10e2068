"""Testing helpers: an embedded Kafka-compatible dev broker, a simulated multi-broker
cluster in front of it (leaders that move, nodes that go down, throttling, TLS and SASL), and
real Apache Kafka nodes (ApacheKafka: Java and Maven)."""

from ._sasl_server import Principal, SaslFailure, unsecured_jwt
from .broker import EmbeddedBrokerError, EmbeddedBroker
from .cluster import Chaos, ClusterStats, Listener, SimulatedCluster
from .kafka import ApacheKafka, ApacheKafkaError, ApacheKafkaUnavailable

__all__ = ["ApacheKafka", "ApacheKafkaError", "ApacheKafkaUnavailable", "Chaos", "ClusterStats",
           "EmbeddedBrokerError", "EmbeddedBroker", "Listener", "Principal", "SaslFailure", "SimulatedCluster", "unsecured_jwt"]
