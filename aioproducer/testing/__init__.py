"""Testing helpers: an embedded Kafka-compatible dev broker."""

from .broker import BrokerError, EmbeddedBroker

__all__ = ["BrokerError", "EmbeddedBroker"]
