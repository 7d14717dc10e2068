"""The FastAPI and aiohttp example apps, driven by their real clients, and the Spark writer,
each checked by reading the events back from Kafka."""

# No `from __future__ import annotations`: FastAPI reads the annotations of the handlers
# defined inside tests, which as strings it could not resolve.

import contextlib
import importlib
import json
import logging
import shutil
from collections import Counter

import pytest

from tests.support.readback import consume_all, fetch_raw_batches
from tests.support.web_outage import outage


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
            anonymous = await client.post("/events", json={"user": None, "n": 50})
    assert all(a.status_code == 200 for a in [*answers, anonymous])
    got = consume_all(broker.bootstrap, events_topic, expected=51)
    landed = {(r.partition, r.offset): json.loads(r.value) for r in got}
    for i, answer in enumerate(answers):  # each answer says truly where its event landed
        body = answer.json()
        assert landed[(body["partition"], body["offset"])] == {"user": f"u{i % 5}", "n": i}
    assert [r.key for r in got if json.loads(r.value)["user"] is None] == [None]  # not b"None"
    # OpenTelemetry: every event carries its own send span's W3C trace context.
    parents = [dict(r.headers)["traceparent"].split(b"-") for r in got]
    assert all(len(p) == 4 and p[0] == b"00" and len(p[1]) == 32 for p in parents)
    assert len({p[2] for p in parents}) == 51  # a span per send


# TestClient is what runs a lifespan and hands its state to requests, as a server does; this
# Starlette would rather it ran on httpx2, which is not among our test dependencies.
@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_fastapi_lifespan_passes_on_the_user_lifespan_state(broker, topic):
    """producer_lifespan(lifespan=...) hands the state the user's lifespan yields on to the
    server, so handlers see it on request.state (as with FastAPI(lifespan=user_lifespan))."""
    from fastapi import FastAPI, Request
    from fastapi.testclient import TestClient

    from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

    @contextlib.asynccontextmanager
    async def user_lifespan(app: FastAPI):
        await app.state.aioproducer.send(topic, b"started")  # the producer is up first
        yield {"greeting": "hello"}

    app = FastAPI(lifespan=producer_lifespan(broker.bootstrap, lifespan=user_lifespan))

    @app.post("/greet")
    async def greet(request: Request, producer: ProducerDep) -> dict:
        md = await producer.send(topic, request.state.greeting.encode())
        return {"offset": md.offset}

    with TestClient(app) as client:
        answer = client.post("/greet")
    assert answer.status_code == 200
    assert answer.json() == {"offset": 1}
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=2)] == [b"started",
                                                                                   b"hello"]


def test_a_fastapi_handler_asking_app_state_for_the_producer_is_told_the_dependency(broker,
                                                                                   topic):
    """`request.app.state.producer`, the Starlette habit: "'State' object has no attribute
    'producer'" said nothing of where the producer is. The error names ProducerDep; other
    missing names keep Starlette's plain AttributeError."""
    from fastapi import FastAPI, Request
    from fastapi.testclient import TestClient

    from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

    app = FastAPI(lifespan=producer_lifespan(broker.bootstrap, linger_ms=0))
    raised: list[BaseException] = []

    @app.post("/by-state/{name}")
    async def by_state(request: Request, name: str) -> dict:
        try:
            await getattr(request.app.state, name).send(topic, b"lost")
        except AttributeError as exc:
            raised.append(exc)
        return {}

    @app.post("/by-dependency")
    async def by_dependency(producer: ProducerDep) -> dict:
        return {"offset": (await producer.send(topic, b"delivered")).offset}

    with TestClient(app) as client:
        for name in ("producer", "kafka", "db"):
            assert client.post(f"/by-state/{name}").status_code == 200
        assert client.post("/by-dependency").json() == {"offset": 0}
    assert len(raised) == 3, raised
    for exc in raised[:2]:
        assert "producer_lifespan() keeps the producer on app.state.aioproducer" in str(exc) \
            and "`producer: ProducerDep`" in str(exc), str(exc)
    assert str(raised[2]) == "'State' object has no attribute 'db'"
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"delivered"]


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_a_sync_handler_that_calls_send_unawaited_is_told_how_to_send(broker, topic, caplog):
    """A `def` handler runs in a worker thread, where `producer.send(...)` can only return a
    coroutine for the producer's loop: not awaited, the request answered 200 and the record
    was lost with a RuntimeWarning. It is reported at ERROR with the topic, the handler's
    line and what to do; the way it names, `anyio.from_thread.run(producer.send, ...)`,
    sends from a `def` handler."""
    import anyio.from_thread
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

    app = FastAPI(lifespan=producer_lifespan(broker.bootstrap))

    @app.post("/forgotten")
    def forgotten(producer: ProducerDep) -> dict:
        producer.send(topic, b"lost")  # (a sync handler cannot await)
        return {"sent": "supposedly"}

    @app.post("/sent")
    def sent(producer: ProducerDep) -> dict:
        return {"offset": anyio.from_thread.run(producer.send, topic, b"sent").offset}

    caplog.set_level(logging.ERROR, "asyncio")
    with TestClient(app) as client:
        assert client.post("/forgotten").status_code == 200
        answer = client.post("/sent")
    assert answer.status_code == 200 and answer.json() == {"offset": 0}
    reports = [r.getMessage() for r in caplog.records if "never awaited" in r.getMessage()]
    assert len(reports) == 1, reports
    assert f"producer.send({topic!r}, ...) at {__file__}:" in reports[0]
    assert "outside the producer's event loop thread" in reports[0]
    assert "anyio.from_thread.run(producer.send, topic, value)" in reports[0]
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"sent"]


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_background_tasks_send_what_producer_calls_are_given(broker, topic, caplog):
    """`tasks.add_task(producer.send, topic, value)`, as Starlette's docs show for any async
    function: Starlette awaits a coroutine function on the loop, and runs anything else in a
    worker thread. There send() returned a coroutine nobody awaited: the request answered 200
    and the record was lost (reported at ERROR). send, enqueue and enqueue_many are sent,
    after the response, in call order (tests/test_futures.py has the same with hooks, on
    every tested Python)."""
    from fastapi import BackgroundTasks, FastAPI
    from fastapi.testclient import TestClient

    from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

    app = FastAPI(lifespan=producer_lifespan(broker.bootstrap))

    @app.post("/in-background")
    async def in_background(producer: ProducerDep, tasks: BackgroundTasks) -> dict:
        tasks.add_task(producer.send, topic, b"send")
        tasks.add_task(producer.enqueue, topic, b"enqueue")
        tasks.add_task(producer.enqueue_many, topic, [(None, b"enqueue_many")])
        return {}

    caplog.set_level(logging.ERROR, "asyncio")
    with TestClient(app) as client:
        assert client.post("/in-background").status_code == 200
    assert [r.getMessage() for r in caplog.records if "never awaited" in r.getMessage()] == []
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=3)] == \
        [b"send", b"enqueue", b"enqueue_many"]


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_a_websocket_endpoint_takes_the_producer_dependency(broker, topic):
    """`producer: ProducerDep` in a WebSocket endpoint (events streamed in over a socket):
    the dependency took a Request, which FastAPI gives HTTP endpoints only, and the
    connection failed with "get_producer() missing 1 required positional argument"."""
    from fastapi import FastAPI, WebSocket, WebSocketDisconnect
    from fastapi.testclient import TestClient

    from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

    app = FastAPI(lifespan=producer_lifespan(broker.bootstrap))

    @app.websocket("/events")
    async def events(websocket: WebSocket, producer: ProducerDep) -> None:
        await websocket.accept()
        try:
            while True:
                md = await producer.send(topic, await websocket.receive_bytes())
                await websocket.send_text(str(md.offset))
        except WebSocketDisconnect:
            pass

    with TestClient(app) as client, client.websocket_connect("/events") as socket:
        socket.send_bytes(b"over a websocket")
        assert socket.receive_text() == "0"
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == \
        [b"over a websocket"]


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_an_accepted_websocket_whose_send_timed_out_is_closed_try_again_later(broker, topic):
    """add_unavailable_handler() answered a WebSocket endpoint's TimeoutError with an HTTP 503
    on the accepted connection, which no server can send (uvicorn drops the connection): it
    closes it with 1013, Try Again Later, and the reason."""
    import asyncio

    from fastapi import FastAPI, WebSocket
    from fastapi.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from aioproducer.integrations.fastapi import ProducerDep, add_unavailable_handler, \
        producer_lifespan

    app = FastAPI(lifespan=producer_lifespan(broker.bootstrap))
    add_unavailable_handler(app)

    @app.websocket("/events")
    async def events(websocket: WebSocket, producer: ProducerDep) -> None:
        await websocket.accept()
        data = await websocket.receive_bytes()
        async with asyncio.timeout(0):  # (a deadline that has passed: as with a broker away)
            await producer.send(topic, data)

    with TestClient(app) as client, client.websocket_connect("/events") as socket:
        socket.send_bytes(b"late")
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_text()
    assert closed.value.code == 1013
    assert closed.value.reason == "Kafka is unavailable (TimeoutError): try again later"


def _started_on_a_loop_that_ended(bootstrap: str):
    """A producer made and started by asyncio.run() (at import, say), whose loop then ended:
    it can send nothing more, from any loop."""
    import asyncio

    from aioproducer import Producer

    async def start():
        producer = Producer(bootstrap)
        await producer.start()
        return producer

    return asyncio.run(start())


@pytest.mark.filterwarnings("ignore:unclosed <Producer:ResourceWarning")
def test_fastapi_unavailable_handler_leaves_a_producer_of_an_ended_loop_a_server_error(
        broker, topic):
    """add_unavailable_handler() answers an outage with 503, try again later. Since
    EventLoopEndedError became a ProducerClosedError, it answered a producer of an ended
    event loop (started by asyncio.run() at import) so too, for ever and with nothing
    logged, while the readiness probe said ready: that mistake is the server's error, raised
    (a 500, its traceback logged), as before."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from aioproducer.errors import EventLoopEndedError
    from aioproducer.integrations.fastapi import add_unavailable_handler

    producer = _started_on_a_loop_that_ended(broker.bootstrap)
    app = FastAPI()
    add_unavailable_handler(app)

    @app.post("/events")
    async def events() -> dict:
        return {"offset": (await producer.send(topic, b"event")).offset}

    with TestClient(app) as client, pytest.raises(EventLoopEndedError):
        client.post("/events")


@pytest.mark.filterwarnings("ignore:unclosed <Producer:ResourceWarning")
async def test_aiohttp_unavailable_middleware_leaves_a_producer_of_an_ended_loop_an_error(
        broker, topic):
    """As the FastAPI handler's: the middleware answered the ended loop's error with 503."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from aioproducer.integrations.aiohttp import unavailable_middleware

    producer = await asyncio.to_thread(_started_on_a_loop_that_ended, broker.bootstrap)

    async def events(request: web.Request) -> web.Response:
        return web.json_response({"offset": (await producer.send(topic, b"event")).offset})

    app = web.Application(middlewares=[unavailable_middleware()])
    app.router.add_post("/events", events)
    async with TestClient(TestServer(app)) as client:
        response = await client.post("/events")
        assert response.status == 500, await response.text()


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient` is deprecated")
def test_a_test_client_not_entered_is_told_its_lifespan_did_not_run():
    """`TestClient(app)` without `with` runs no lifespan, so no producer: the error says so
    (it said to create the app with producer_lifespan(...), which the user had done)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from aioproducer.integrations.fastapi import ProducerDep, producer_lifespan

    app = FastAPI(lifespan=producer_lifespan("127.0.0.1:9"))

    @app.post("/events")
    async def publish(producer: ProducerDep) -> dict:
        return {"offset": (await producer.send("events", b"e")).offset}

    client = TestClient(app)  # (not entered: the lifespan never runs, no broker is needed)
    with pytest.raises(RuntimeError, match=r"lifespan has not run.*with TestClient\(app\) as"):
        client.post("/events")


@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_close_timeout_bounds_the_shutdown_when_the_broker_went_silent(proxied_broker,
                                                                            framework):
    """A service shutting down while its broker does not answer: with close_timeout the
    shutdown ends then, and the record still waiting fails with ProducerClosedError, instead
    of holding the app for delivery_timeout_ms (2 minutes)."""
    import asyncio

    from aioproducer.errors import ConfigError, ProducerClosedError

    cluster = proxied_broker
    cluster.create_topic("shutdown", 1)
    if framework == "fastapi":
        from fastapi import FastAPI

        from aioproducer.integrations.fastapi import producer_lifespan
        with pytest.raises(ConfigError, match="close_timeout must be None or seconds >= 0"):
            producer_lifespan(cluster.bootstrap, close_timeout=-1)
        app = FastAPI()
        running = producer_lifespan(cluster.bootstrap, close_timeout=0.5, linger_ms=0)(app)
        await running.__aenter__()
        producer, stop = app.state.aioproducer, lambda: running.__aexit__(None, None, None)
    else:
        from aiohttp import web

        from aioproducer.integrations.aiohttp import PRODUCER, setup_producer
        app = web.Application()
        with pytest.raises(ConfigError, match="close_timeout must be None or seconds >= 0"):
            setup_producer(app, cluster.bootstrap, close_timeout="1")
        setup_producer(app, cluster.bootstrap, close_timeout=0.5, linger_ms=0)
        runner = web.AppRunner(app)
        await runner.setup()
        producer, stop = app[PRODUCER], runner.cleanup
    await asyncio.wait_for(producer.send("shutdown", b"before"), 10)
    cluster.proxy.stall(True)
    waiting = await producer.enqueue("shutdown", b"unanswered")
    await asyncio.wait_for(stop(), 10)
    with pytest.raises(ProducerClosedError, match=r"close\(timeout=0\.5\)"):
        await waiting
    cluster.proxy.heal()


async def test_aiohttp_example(broker, events_topic):
    from aiohttp.test_utils import TestClient, TestServer

    app = _load("examples.aiohttp_app").make_app()
    async with TestClient(TestServer(app)) as client:
        answers = []
        for i in range(50):
            response = await client.post("/events", json={"user": f"u{i % 5}", "n": i})
            assert response.status == 200
            answers.append(await response.json())
        assert (await client.post("/events", json={"user": None, "n": 50})).status == 200
        for bad in (b"not json", b"[1, 2]"):  # the client's mistake: 400, not a server error
            response = await client.post("/events", data=bad)
            assert response.status == 400 and "JSON object" in await response.text()
    got = consume_all(broker.bootstrap, events_topic, expected=51)
    landed = {(r.partition, r.offset): json.loads(r.value) for r in got}
    for i, body in enumerate(answers):
        assert landed[(body["partition"], body["offset"])] == {"user": f"u{i % 5}", "n": i}
    assert [r.key for r in got if json.loads(r.value)["user"] is None] == [None]  # not b"None"


async def test_an_aiohttp_handler_asking_for_the_producer_by_a_string_is_told_the_key(
        broker, topic, caplog):
    """`request.app["producer"]`, the habit of aiohttp apps older than AppKey, answered 500
    with a bare `KeyError: 'producer'`: the error now names the typed key to use. A string
    that names no producer still gets aiohttp's plain KeyError."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from aioproducer.integrations.aiohttp import PRODUCER, setup_producer

    async def by_string(request: web.Request) -> web.Response:
        await request.app[request.match_info["key"]].send(topic, b"lost")
        return web.Response()

    async def by_key(request: web.Request) -> web.Response:
        md = await request.app[PRODUCER].send(topic, b"delivered")
        return web.json_response({"offset": md.offset})

    app = web.Application()
    setup_producer(app, broker.bootstrap, linger_ms=0)
    app.router.add_post("/by-string/{key}", by_string)
    app.router.add_post("/by-key", by_key)
    async with TestClient(TestServer(app)) as client:
        for key in ("producer", "kafka_producer", "db"):
            assert (await client.post(f"/by-string/{key}")).status == 500
        assert (await client.post("/by-key")).status == 200
    errors = [r.exc_info[1] for r in caplog.records if r.exc_info is not None]
    assert [type(e) for e in errors] == [KeyError] * 3, errors
    for error in errors[:2]:
        assert "the typed key PRODUCER" in str(error) and \
            "from aioproducer.integrations.aiohttp import PRODUCER" in str(error), str(error)
    assert errors[2].args == ("db",)
    assert [r.value for r in consume_all(broker.bootstrap, topic, expected=1)] == [b"delivered"]


@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_example_answers_503_in_time_while_its_broker_is_gone(proxied_broker,
                                                                    monkeypatch, framework):
    """The broker goes away mid-run, here as the proxy cutting the connections and refusing
    new ones (a restarted embedded broker would come back empty; tests/real_kafka kills and
    restarts a real one): see tests/support/web_outage.py for what must hold."""
    cluster = proxied_broker
    cluster.create_topic("web-outage", 3)

    async def go_away() -> None:
        cluster.proxy.refuse(True)

    async def come_back() -> None:
        cluster.proxy.heal()

    await outage(framework, cluster.bootstrap, "web-outage", monkeypatch, go_away, come_back)


def test_web_helpers_refuse_bad_settings():
    from aiohttp import web
    from fastapi import FastAPI

    from aioproducer.errors import ConfigError
    from aioproducer.integrations import aiohttp as for_aiohttp, fastapi as for_fastapi

    for bad in (-1, None, "5"):
        for readiness in (for_fastapi.readiness_endpoint, for_aiohttp.readiness_handler):
            with pytest.raises(ConfigError, match="max_pending_s must be seconds >= 0"):
                readiness(max_pending_s=bad)
    for bad in (-1, 1.5, "1"):
        with pytest.raises(ConfigError, match="retry_after_s must be whole seconds >= 0"):
            for_fastapi.add_unavailable_handler(FastAPI(), retry_after_s=bad)
        with pytest.raises(ConfigError, match="retry_after_s must be whole seconds >= 0"):
            web.Application(middlewares=[for_aiohttp.unavailable_middleware(retry_after_s=bad)])


needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="PySpark needs a Java runtime (17) on PATH")


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
    assert (totals.records, totals.partitions) == (rows, 4)
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
    # Read from the raw log by kafka-python's batch reader. librdkafka's consumer, run after
    # the rest of the suite on the shared Tansu broker, twice skipped the first batch of a
    # partition (its 155 records were in the log, as the raw batches showed); that is the
    # read-back's trouble, not the producer's.
    batches = {p: fetch_raw_batches(broker.bootstrap, topic, p) for p in (0, 1)}
    values = sorted(json.loads(record[2])["n"] for partition in batches.values()
                    for batch in partition if not batch.is_control for record in batch.records)
    assert values == list(range(1000))
    for partition in batches.values():  # every partition's data is followed by a COMMIT marker
        assert partition and partition[-1].is_control and partition[-1].control_type == "COMMIT"
        assert all(b.is_transactional for b in partition)


_HEADERS_SCHEMA = "value string, headers array<struct<key:string,value:binary>>"


def _rows_with_a_bad_header(spark, bad_row: int, rows: int = 2000):
    """`rows` rows in two Spark partitions (the first half in 0); row `bad_row` has a null
    header name, which the producer refuses when that row is enqueued."""
    data = [(f"r{i}", [(None if i == bad_row else "h", b"x")]) for i in range(rows)]
    return spark.createDataFrame(spark.sparkContext.parallelize(data, 2), _HEADERS_SCHEMA)


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


@needs_java
def test_spark_exactly_once_aborts_a_failed_partition(spark, broker, topic_factory):
    """A task that fails mid-partition aborts its transaction: left open, it would hold back
    read_committed consumers (on Tansu forever: it never times transactions out). Tansu's
    read_committed consumers also see aborted records, so the outcome is read from the raw
    batches: each producer's data must be followed by its COMMIT or ABORT marker."""
    from aioproducer.integrations.spark import SparkWriteError, write_dataframe

    topic = topic_factory(1)
    # Small batches and 9,000 good rows before the bad one, so the failing task has sent
    # some before it reaches it: its transaction's partition must be added (a round trip)
    # before any batch may go, and a task reading Arrow batches gets through 900 rows in a
    # few milliseconds (on the last try of 1,000 rows, one run in three sent none).
    df = _rows_with_a_bad_header(spark, bad_row=19_000, rows=20_000)
    first, second = df.rdd.glom().map(len).collect()  # (parallelize splits 10,240 + 9,760)
    with pytest.raises(SparkWriteError, match="header names must be str") as raised:
        write_dataframe(df, topic, broker.bootstrap, value="value", headers="headers",
                        exactly_once=True, transactional_id_prefix=f"{topic}-job", batch_size=1024)
    assert raised.value.failed_partitions == [1]
    assert (raised.value.not_confirmed, raised.value.rows) == (second, 20_000)
    records: Counter[int] = Counter()
    outcome: dict[int, str | None] = {}  # producer id -> its last marker (None: still open)
    for batch in fetch_raw_batches(broker.bootstrap, topic, 0):
        assert batch.is_transactional
        if batch.is_control:
            outcome[batch.producer_id] = batch.control_type
        else:
            records[batch.producer_id] += len(batch.records)
            outcome[batch.producer_id] = None
    assert len(records) == 2
    assert sorted((outcome[pid], n == first) for pid, n in records.items()) == [
        ("ABORT", False), ("COMMIT", True)]


@needs_java
def test_spark_failure_says_how_many_rows_were_not_confirmed(spark, broker, topic_factory):
    from pyspark.sql import functions as F

    from aioproducer.integrations.spark import SparkWriteError, write_dataframe

    topic = topic_factory(2)
    df = _rows_with_a_bad_header(spark, bad_row=1750)
    with pytest.raises(SparkWriteError) as raised:
        write_dataframe(df, topic, broker.bootstrap, value="value", headers="headers")
    message = str(raised.value)
    assert message.startswith(f"250 of 2000 row(s) not confirmed by Kafka for topic {topic!r}; "
                              "failed Spark partition(s): 1; first error: InvalidRecordError(")
    assert (raised.value.not_confirmed, raised.value.rows) == (250, 2000)
    got = consume_all(broker.bootstrap, topic, expected=1750)
    assert sorted(int(r.value[1:]) for r in got) == list(range(1750))
    assert all(r.headers == [("h", b"x")] for r in got)

    # Every task fails on its first row: all rows of both Spark partitions are reported.
    df = spark.range(100, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    with pytest.raises(SparkWriteError, match=r"^100 of 100 row\(s\) not confirmed .*"
                       r"failed Spark partition\(s\): 0, 1; first error: InvalidTopicError"):
        write_dataframe(df, "bad topic!", broker.bootstrap)


@needs_java
def test_spark_headers_are_read_by_field_name(spark, broker, topic_factory):
    """Header structs are read by field name, not position; string values are sent as UTF-8."""
    from pyspark.sql import functions as F

    from aioproducer.integrations.spark import write_dataframe

    topic = topic_factory(1)
    header = F.struct(F.lit("abc").alias("value"), F.lit("trace").alias("key"))
    no_value = F.struct(F.lit(None).cast("string").alias("value"), F.lit("empty").alias("key"))
    df = spark.range(3).select(
        F.col("id").cast("string").alias("value"),
        F.when(F.col("id") == 0, F.array(header, no_value))
         .when(F.col("id") == 1, F.array().cast("array<struct<value:string,key:string>>"))
         .alias("headers"))
    totals = write_dataframe(df, topic, broker.bootstrap, headers="headers")
    assert totals.records == 3
    got = {r.value: r.headers for r in consume_all(broker.bootstrap, topic, expected=3)}
    assert got == {b"0": [("trace", b"abc"), ("empty", None)], b"1": [], b"2": []}


@needs_java
def test_spark_a_null_header_is_refused_by_name(spark, broker, topic):
    """A null in the headers array: an InvalidRecordError that says so, not a TypeError about
    subscripting None."""
    from aioproducer.integrations.spark import SparkWriteError, write_dataframe

    schema = "value string, h array<struct<key:string,value:binary>>"
    df = spark.createDataFrame([("ok", [("a", b"x")]), ("bad", [None])], schema)
    with pytest.raises(SparkWriteError, match=r"^1 of 2 row\(s\) not confirmed .*first error: "
                       r"InvalidRecordError\(.headers column 'h' holds a null header"):
        write_dataframe(df.coalesce(1), topic, broker.bootstrap, headers="h")
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.value, r.headers) for r in got] == [(b"ok", [("a", b"x")])]


@needs_java
def test_spark_checks_column_types_before_running(spark, broker, topic):
    """A column of a type with no one obvious encoding is refused on the driver, before any
    Spark job runs: not sent in some made-up form, nor failed in every task."""
    from pyspark.sql import functions as F

    from aioproducer.errors import InvalidRecordError
    from aioproducer.integrations.spark import write_dataframe

    ids = spark.range(3)
    struct_value = ids.select(F.struct("id", F.lit("x").alias("s")).alias("value"))
    date_value = ids.select(F.current_date().alias("value"))
    map_headers = ids.select(F.col("id").cast("string").alias("value"),
                             F.create_map(F.lit("trace"), F.lit("abc").cast("binary")).alias("h"))
    jobs = _jobs_run(spark)
    with pytest.raises(InvalidRecordError, match=r"^value column 'value' is "
                       r"struct<id:bigint,s:string>: it must be string or binary.*"
                       r"value_format='json'"):
        write_dataframe(struct_value, topic, broker.bootstrap)
    with pytest.raises(InvalidRecordError, match=r"^value column 'value' is date: it must be"):
        write_dataframe(date_value, topic, broker.bootstrap)
    with pytest.raises(InvalidRecordError, match=r"^key column Column<'id'> is bigint: it must"):
        write_dataframe(ids, topic, broker.bootstrap, key=F.col("id"),
                        value=F.col("id").cast("string"))
    with pytest.raises(InvalidRecordError, match=r"^headers column 'h' is map<string,binary>: "
                       r"it must be array<struct<key:string,value:binary>>"):
        write_dataframe(map_headers, topic, broker.bootstrap, headers="h")
    assert _jobs_run(spark) == jobs
    # The documented way to send a struct: as JSON.
    assert write_dataframe(struct_value, topic, broker.bootstrap, value="value",
                           value_format="json").records == 3
    got = consume_all(broker.bootstrap, topic, expected=3)
    assert sorted(json.loads(r.value)["id"] for r in got) == [0, 1, 2]


@needs_java
def test_spark_checks_settings_before_running(spark, broker, topic):
    from aioproducer.errors import ConfigError
    from aioproducer.integrations.spark import write_dataframe

    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    jobs = _jobs_run(spark)
    with pytest.raises(ConfigError, match="unknown setting 'lingr_ms'; did you mean 'linger_ms'"):
        write_dataframe(df, topic, broker.bootstrap, lingr_ms=5)
    with pytest.raises(ConfigError, match="transactional_id_prefix"):
        write_dataframe(df, topic, broker.bootstrap, transactional_id="mine")
    # Settings that turn idempotence off rule out exactly_once's transactions: said here,
    # not by every task's Producer.
    with pytest.raises(ConfigError, match=r"^exactly_once=True writes each Spark partition in a "
                       r"Kafka transaction, which needs an idempotent producer .*; acks=1 rules "
                       r"that out: drop it, or pass exactly_once=False$"):
        write_dataframe(df, topic, broker.bootstrap, exactly_once=True,
                        transactional_id_prefix=f"{topic}-job", acks=1)
    with pytest.raises(ConfigError, match="; enable_idempotence=False rules that out"):
        write_dataframe(df, topic, broker.bootstrap, exactly_once=True,
                        transactional_id_prefix=f"{topic}-job", enable_idempotence=False)
    assert _jobs_run(spark) == jobs
