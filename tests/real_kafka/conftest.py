"""The real-Kafka tier: one Apache Kafka node (KRaft) for the whole session, started on first
use by aioproducer's pytest plugin (`apache_kafka`), with PLAINTEXT, SASL_PLAINTEXT (PLAIN,
SCRAM-SHA-256/512, OAUTHBEARER) and SSL listeners. Without Java or Maven these tests are
skipped with the reason; under CI=true they fail instead (tests/conftest.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.producer_state import CHECK_INTERVAL

# SASL sessions end after this long and the client must re-authenticate (KIP-368).
REAUTH_MS = 4000


@pytest.fixture(scope="session")
def apache_kafka_options() -> dict[str, Any]:
    # Idle producers' state is checked for expiry every half second (default 10 minutes), so
    # a test that lowers producer.id.expiration.ms sees it dropped (test_recovery.py).
    return {"sasl": True, "tls": True, "reauth_ms": REAUTH_MS, "broker_config": CHECK_INTERVAL}


@pytest.fixture
def make_topic(apache_kafka) -> Callable[..., str]:
    def make(partitions: int = 1, **config: Any) -> str:
        name = f"k-{uuid.uuid4().hex[:12]}"
        apache_kafka.create_topic(name, partitions,
                                  config={k.replace("_", "."): v for k, v in config.items()})
        return name
    return make


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.kafka)
