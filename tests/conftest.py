"""Fixtures: a real broker (embedded Tansu, or AIOPRODUCER_BOOTSTRAP), topics, a fault proxy."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pytest

from aioproducer.testing import EmbeddedBroker
from tests.support.ports import free_port
from tests.support.proxy import FaultProxy


class ExternalCluster:
    """A Kafka cluster the user points the suite at with AIOPRODUCER_BOOTSTRAP."""

    is_embedded = False

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, replication_factor=-1)])
        futures[name].result(30)


@pytest.fixture(scope="session")
def broker():
    bootstrap = os.environ.get("AIOPRODUCER_BOOTSTRAP")
    if bootstrap:
        yield ExternalCluster(bootstrap)
        return
    with EmbeddedBroker() as embedded:
        embedded.is_embedded = True
        yield embedded


@pytest.fixture
def topic_factory(broker):
    def create(partitions: int = 1) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        broker.create_topic(name, partitions)
        return name
    return create


@pytest.fixture
def topic(topic_factory) -> str:
    return topic_factory(1)


@pytest.fixture
def fresh_broker():
    with EmbeddedBroker() as embedded:
        yield embedded


@dataclass
class ProxiedBroker:
    broker: EmbeddedBroker
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.broker.create_topic(name, partitions)


@pytest.fixture
def proxied_broker():
    """A broker of its own that advertises a FaultProxy's address: every client connection
    goes through the proxy. (Embedded only: an external cluster advertises itself.)"""
    proxy_port = free_port()
    with EmbeddedBroker(advertised_port=proxy_port) as embedded:
        with FaultProxy(embedded.port, proxy_port) as proxy:
            yield ProxiedBroker(embedded, proxy)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "both_loops: run the (async) test on the asyncio loop and on uvloop")


def pytest_asyncio_loop_factories(config, item):
    """Tests marked both_loops run once on each loop (pytest-asyncio's loop factories), the
    others on the asyncio loop."""
    import asyncio

    if item.get_closest_marker("both_loops") is None:
        return {"asyncio": asyncio.new_event_loop}
    import uvloop
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
