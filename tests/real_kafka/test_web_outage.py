"""The FastAPI and aiohttp examples with a real Apache Kafka node killed (SIGKILL) mid-run
and restarted: unlike the embedded broker, it comes back with its data, so what the app
buffered before and during the outage must all be there, once."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from aioproducer.testing import ApacheKafka
from tests.support.web_outage import outage


@pytest.fixture(scope="module")
def own_kafka() -> Iterator[ApacheKafka]:
    """A node of this module's own: killing the session's would disturb other tests."""
    with ApacheKafka(1) as kafka:
        yield kafka


@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_example_answers_503_in_time_while_its_broker_is_killed(own_kafka, monkeypatch,
                                                                      framework):
    topic = f"web-outage-{framework}"
    own_kafka.create_topic(topic, 3)

    async def go_away() -> None:
        if own_kafka.running(0):
            own_kafka.kill_node(0)

    async def come_back() -> None:
        if not own_kafka.running(0):
            await asyncio.to_thread(own_kafka.start_node, 0)

    await outage(framework, own_kafka.bootstrap, topic, monkeypatch, go_away, come_back,
                 recover_s=60)
