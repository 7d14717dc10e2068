"""The FastAPI and aiohttp example apps, driven by their real clients, and the Spark writer,
each checked by reading the events back from Kafka."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys

import pytest

from tests.support.readback import consume_all, fetch_raw_batches


@pytest.fixture
def events_topic(broker, topic_factory, monkeypatch):
    topic = topic_factory(3)
    monkeypatch.setenv("AIOPRODUCER_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("EVENTS_TOPIC", topic)
    return topic


def _load(module: str):
    """Import an example fresh, so it reads the environment set by the fixture."""
    return importlib.reload(importlib.import_module(module))


async def test_fastapi_example(broker, events_topic):
    import httpx

    app = _load("examples.fastapi_app").app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            answers = [await client.post("/events", json={"user": f"u{i % 5}", "n": i})
                       for i in range(50)]
    assert all(a.status_code == 200 for a in answers)
    got = consume_all(broker.bootstrap, events_topic, expected=50)
    landed = {(r.partition, r.offset): json.loads(r.value) for r in got}
    for i, answer in enumerate(answers):  # each answer says truly where its event landed
        body = answer.json()
        assert landed[(body["partition"], body["offset"])] == {"user": f"u{i % 5}", "n": i}


async def test_aiohttp_example(broker, events_topic):
    from aiohttp.test_utils import TestClient, TestServer

    app = _load("examples.aiohttp_app").make_app()
    async with TestClient(TestServer(app)) as client:
        answers = []
        for i in range(50):
            response = await client.post("/events", json={"user": f"u{i % 5}", "n": i})
            assert response.status == 200
            answers.append(await response.json())
    got = consume_all(broker.bootstrap, events_topic, expected=50)
    landed = {(r.partition, r.offset): json.loads(r.value) for r in got}
    for i, body in enumerate(answers):
        assert landed[(body["partition"], body["offset"])] == {"user": f"u{i % 5}", "n": i}


needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="PySpark needs a Java runtime (17) on PATH")


@pytest.fixture(scope="module")
def spark():
    pyspark = pytest.importorskip("pyspark", reason="install the spark extra: aioproducer[spark]")
    # Spark's Python workers must run this interpreter (the one with aioproducer installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (pyspark.sql.SparkSession.builder.master("local[2]")
               .appName("aioproducer-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .getOrCreate())
    yield session
    session.stop()


@needs_java
def test_spark_write_dataframe(spark, broker, topic_factory):
    from pyspark.sql import functions as F

    from aioproducer.integrations.spark import write_dataframe

    topic = topic_factory(4)
    rows = 100_000
    df = spark.range(rows).select(
        F.concat(F.lit("k"), (F.col("id") % 100).cast("string")).alias("key"),
        F.col("id"),
    ).repartition(4)
    totals = write_dataframe(df, topic, broker.bootstrap, key="key", value=F.col("id").cast("string"))
    assert (totals.records, totals.failures, totals.partitions) == (rows, 0, 4)
    got = consume_all(broker.bootstrap, topic, expected=rows, timeout=120)
    assert len(got) == rows
    assert sorted(int(r.value) for r in got) == list(range(rows))
    assert all(r.key == b"k%d" % (int(r.value) % 100) for r in got)


@needs_java
def test_spark_exactly_once_commits_each_partition(spark, broker, topic_factory):
    from aioproducer.integrations.spark import write_dataframe

    topic = topic_factory(2)
    df = spark.createDataFrame([{"user": f"u{i}", "n": i} for i in range(1000)]).repartition(3)
    totals = write_dataframe(df, topic, broker.bootstrap, key="user", value_format="json",
                             exactly_once=True, transactional_id_prefix=f"{topic}-job")
    assert totals.records == 1000
    got = consume_all(broker.bootstrap, topic, expected=1000)
    assert sorted(json.loads(r.value)["n"] for r in got) == list(range(1000))
    for partition in (0, 1):  # every partition's data is followed by a COMMIT marker
        batches = fetch_raw_batches(broker.bootstrap, topic, partition)
        assert batches and batches[-1].is_control and batches[-1].control_type == "COMMIT"
        assert all(b.is_transactional for b in batches)
