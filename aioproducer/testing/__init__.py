"""Testing helpers: an embedded Kafka-compatible dev broker."""

from .broker import EmbeddedBrokerError, EmbeddedBroker

__all__ = ["EmbeddedBrokerError", "EmbeddedBroker"]
