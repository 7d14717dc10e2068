"""Tests through aioproducer.testing.SimulatedCluster need the embedded broker."""

from __future__ import annotations

import pytest

# Why such a test is skipped when AIOPRODUCER_BOOTSTRAP names a Kafka of the user's: the
# simulated nodes forward every request to one broker that must answer for every partition
# whichever node they say leads it; a real cluster's brokers each lead only their own, and
# would refuse what the simulation routes to them. Never skipped in CI (embedded broker).
EXTERNAL_KAFKA = ("AIOPRODUCER_BOOTSTRAP names an external Kafka: the simulated cluster needs "
                  "the embedded broker, which answers for every partition whichever simulated "
                  "node leads it")


def require_embedded(broker) -> None:
    """Skip the calling test unless `broker` is the embedded one (see EXTERNAL_KAFKA)."""
    if not broker.is_embedded:
        pytest.skip(EXTERNAL_KAFKA)
