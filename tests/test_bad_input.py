"""Bad input: a typed error with a useful message at the call that caused it, and nothing
already accepted is lost."""

from __future__ import annotations

import asyncio
import datetime
import enum
import json
import logging
import pickle
import re
import threading
import traceback

import pytest

from aioproducer import BlockingProducer, Producer, ProducerConfig
from aioproducer.errors import (
    ConfigError,
    DeliveryTimeoutError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaConnectionError,
    KafkaError,
    ProducerClosedError,
    RecordTooLargeError,
    SerializationError,
    UnknownTopicError,
)
from aioproducer.hooks import ProducerHooks
from aioproducer.testing import EmbeddedBroker
from tests.support.ports import blackhole, free_port
from tests.support.readback import consume_all

# (id, keyword arguments of enqueue beyond the topic, expected exception, text in its message)
BAD_RECORDS = [
    ("str-value", dict(value="text"), InvalidRecordError, "encode"),
    ("int-value", dict(value=42), InvalidRecordError, "value must be bytes"),
    ("dict-value", dict(value={"a": 1}), InvalidRecordError, "value_serializer"),
    ("str-key", dict(value=b"v", key="k"), InvalidRecordError, "key must be bytes"),
    ("float-key", dict(value=b"v", key=1.5), InvalidRecordError, "key"),
    ("headers-dict", dict(value=b"v", headers={"a": b"b"}), InvalidRecordError,
     r"headers.*list\(headers.items\(\)\)"),
    ("headers-str", dict(value=b"v", headers="a=b"), InvalidRecordError, "headers"),
    ("header-str-value", dict(value=b"v", headers=[("a", "b")]), InvalidRecordError,
     r"'a'.*\.encode\(\)"),
    ("header-bytes-name", dict(value=b"v", headers=[(b"a", b"b")]), InvalidRecordError, "str"),
    ("header-not-pair", dict(value=b"v", headers=[("a",)]), InvalidRecordError, "tuple"),
    # (a pair, but a list: told that it must be a tuple, not that it must be a pair)
    ("header-list", dict(value=b"v", headers=[["a", b"b"]]), InvalidRecordError,
     r"\(str, bytes \| None\) tuple"),
    ("partition-too-big", dict(value=b"v", partition=99), InvalidRecordError, "0..1"),
    ("partition-negative", dict(value=b"v", partition=-1), InvalidRecordError, "does not exist"),
    ("partition-str", dict(value=b"v", partition="0"), InvalidRecordError, "int"),
    ("partition-float", dict(value=b"v", partition=1.0), InvalidRecordError, "int"),
    # (a bool has __index__, as numpy's integers do, but True is no partition)
    ("partition-bool", dict(value=b"v", partition=True), InvalidRecordError, "not bool"),
    ("timestamp-negative", dict(value=b"v", timestamp_ms=-5), InvalidRecordError, "timestamp_ms"),
    ("timestamp-str", dict(value=b"v", timestamp_ms="now"), InvalidRecordError, "timestamp_ms"),
    ("timestamp-float", dict(value=b"v", timestamp_ms=1.5), InvalidRecordError, "timestamp_ms"),
    # time.time() and a datetime, as kafka-python and confluent-kafka users give them: said
    # how to make the int of milliseconds
    ("timestamp-time-time", dict(value=b"v", timestamp_ms=1795864672.9257882),
     InvalidRecordError, r"not 1795864672\.9257882: seconds\? int\(time\.time\(\) \* 1000\)"),
    ("timestamp-datetime", dict(value=b"v", timestamp_ms=datetime.datetime(2026, 11, 28)),
     InvalidRecordError, r"int\(when\.timestamp\(\) \* 1000\) for a datetime"),
    ("timestamp-bool", dict(value=b"v", timestamp_ms=True), InvalidRecordError, "timestamp_ms"),
    ("timestamp-over-int64", dict(value=b"v", timestamp_ms=2**63), InvalidRecordError,
     "timestamp_ms"),
    ("header-name-not-utf8", dict(value=b"v", headers=[("\udc80", b"b")]), InvalidRecordError,
     "header name"),
    ("value-over-max-request-size", dict(value=b"x" * 2_000_000), RecordTooLargeError,
     "max_request_size"),
    ("headers-over-max-request-size", dict(value=b"", headers=[("h", b"x" * 1_100_000)]),
     RecordTooLargeError, "max_request_size"),
]

BAD_TOPICS = [
    ("empty", "", InvalidTopicError),
    ("space", "bad name", InvalidTopicError),
    ("slash", "a/b", InvalidTopicError),
    ("dot", ".", InvalidTopicError),
    ("dotdot", "..", InvalidTopicError),
    ("too-long", "t" * 250, InvalidTopicError),
    ("unicode", "tópico", InvalidTopicError),
    ("none", None, InvalidRecordError),
    ("bytes", b"orders", InvalidRecordError),
    ("list", ["orders"], InvalidRecordError),  # unhashable
]


@pytest.fixture
async def producer_with_accepted_records(broker, topic_factory):
    """A producer that already buffered 100 records, which every bad call must leave alone."""
    topic = topic_factory(2)
    async with Producer(broker.bootstrap, linger_ms=50, max_block_ms=2000) as producer:
        handles = [await producer.enqueue(topic, b"good-%d" % i) for i in range(100)]
        yield producer, topic
        await producer.flush()
        assert all(h.result().offset >= 0 for h in handles)
    got = consume_all(broker.bootstrap, topic, expected=100)
    assert sorted(r.value for r in got) == sorted(b"good-%d" % i for i in range(100))


@pytest.mark.parametrize("case", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
async def test_bad_record(producer_with_accepted_records, case):
    producer, topic = producer_with_accepted_records
    _, kwargs, error, text = case
    with pytest.raises(error, match=text):
        await producer.enqueue(topic, **kwargs)
    with pytest.raises(error):
        await producer.send(topic, **kwargs)


@pytest.mark.parametrize("case", BAD_TOPICS, ids=[c[0] for c in BAD_TOPICS])
async def test_bad_topic(producer_with_accepted_records, case):
    producer, _ = producer_with_accepted_records
    _, topic, error = case
    with pytest.raises(error, match="topic"):
        await producer.enqueue(topic, b"v")
    with pytest.raises(error, match="topic"):
        await producer.enqueue_many(topic, [(None, b"v")])


def test_wrong_types_are_also_type_errors():
    assert issubclass(InvalidRecordError, TypeError) or issubclass(InvalidRecordError, ValueError)
    assert issubclass(ConfigError, ValueError)


async def test_unknown_topic(broker):
    async with Producer(broker.bootstrap, allow_auto_create_topics=False,
                        max_block_ms=500) as producer:
        with pytest.raises(UnknownTopicError, match="no-such-topic"):
            await producer.send("no-such-topic", b"v")


async def test_a_send_that_joined_a_wait_for_a_missing_topic_late_waits_its_own_max_block_ms(
        broker):
    """Sends waiting for one topic's metadata share one wait (one fetch); the end of a wait
    begun before a send does not cut that send short: it waits on until its own
    max_block_ms is over, as each send did with a wait of its own, and says max_block_ms
    as set."""
    async with Producer(broker.bootstrap, allow_auto_create_topics=False,
                        max_block_ms=2000) as producer:
        first = asyncio.create_task(producer.send("never-made-late", b"v"))
        await asyncio.sleep(1.0)
        late = asyncio.create_task(producer.send("never-made-late", b"v"))
        with pytest.raises(UnknownTopicError, match="after max_block_ms=2000"):
            await asyncio.wait_for(first, 30)
        assert not late.done()  # (it joined half way: a second of its own is left)
        with pytest.raises(UnknownTopicError, match="after max_block_ms=2000"):
            await asyncio.wait_for(late, 30)


async def test_sends_waiting_for_a_topic_that_does_not_exist_say_so_once(broker, caplog):
    """Sends to a topic that does not exist, none created on request (auto-creation off, as
    on many Kafka clusters) wait max_block_ms (60 s by default) for it: nothing was said
    until each failed with UnknownTopicError (measured on Kafka 4: 60.0 s of silence; the
    Java client logs the UNKNOWN_TOPIC_OR_PARTITION of each metadata answer). Said once, a
    second into the wait, naming the topic, the wait, and what to do."""
    caplog.set_level(logging.WARNING, logger="aioproducer")
    async with Producer(broker.bootstrap, allow_auto_create_topics=False,
                        max_block_ms=2500) as producer:
        failed = await asyncio.gather(*(producer.send("never-made", b"v") for _ in range(10)),
                                      return_exceptions=True)
    assert all(isinstance(error, UnknownTopicError) for error in failed), failed
    said = [r.getMessage() for r in caplog.records if "never-made" in r.getMessage()]
    assert len(said) == 1 and "topic 'never-made' does not exist (UNKNOWN_TOPIC_OR_PARTITION) " \
        "and was not created on request (allow_auto_create_topics=False): records for it wait " \
        "up to max_block_ms=2500 for it to be made, then fail" in said[0], said


async def test_close_does_not_wait_for_sends_to_a_topic_that_does_not_exist(broker, topic):
    """close() lets sends begun before it that wait for their topic's metadata buffer first
    (fire-and-forget to a topic not used yet); one for a topic the cluster says it does not
    have (a typo, auto-creation off) held close() until max_block_ms (60 s by default). It
    fails now with UnknownTopicError, about a second into its wait, and the send beside it
    to a topic that exists is sent."""
    async with Producer(broker.bootstrap, allow_auto_create_topics=False) as producer:
        typo = asyncio.create_task(producer.send("no-such-topic", b"lost"))
        kept = asyncio.create_task(producer.send(topic, b"kept"))
        await asyncio.wait_for(producer.close(), 30)  # (a hang: max_block_ms is 60 s)
    with pytest.raises(UnknownTopicError, match="'no-such-topic' is not in the cluster's "
                       "metadata as the producer closed"):
        await typo
    assert (await kept).offset == 0
    assert [r.value for r in consume_all(broker.bootstrap, topic, 1)] == [b"kept"]


async def test_failing_serializer(broker, topic):
    """A serializer's exception is named by its type: its message often holds the value
    (here an SSN), which must reach no error text, traceback or chained exception."""
    def explode(value):
        raise ValueError(f"{value['ssn']!r} is not an int")

    async with Producer(broker.bootstrap, value_serializer=explode) as producer:
        ssn = "-".join(["123", "45", "6789"])  # (no literal for the traceback's source lines)
        with pytest.raises(SerializationError, match="failed .* with ValueError") as failed:
            await producer.send(topic, {"ssn": ssn})
        shown = "".join(traceback.format_exception(failed.value)) + repr(failed.value)
        assert ssn not in shown
    async with Producer(broker.bootstrap, value_serializer=str) as producer:
        with pytest.raises(SerializationError, match="must return bytes"):
            await producer.send(topic, {"a": 1})
    async with Producer(broker.bootstrap, value_serializer=json.dumps) as producer:
        with pytest.raises(SerializationError, match=r"returned str .* json\.dumps\(v\)\.encode"):
            await producer.send(topic, {"a": 1})  # (json.dumps returns str)


BAD_SETTINGS = [
    ("typo", dict(lingr_ms=5), "linger_ms"),
    ("acks-2", dict(acks=2), "acks"),
    ("acks-float", dict(acks=1.0), "acks"),
    ("acks-bool", dict(acks=True), "acks"),
    ("linger-negative", dict(linger_ms=-1), "linger_ms"),
    ("batch-size-str", dict(batch_size="big"), "batch_size"),
    ("codec", dict(compression_type="brotli"), "compression_type"),
    ("idempotence-acks", dict(enable_idempotence=True, acks=1), "acks"),
    ("idempotence-in-flight", dict(enable_idempotence=True,
                                   max_in_flight_requests_per_connection=6), "in_flight"),
    ("delivery-timeout", dict(delivery_timeout_ms=1000, request_timeout_ms=30000),
     "delivery_timeout_ms"),
    ("bool-as-int", dict(batch_size=True), "batch_size"),
    ("gzip-level", dict(compression_type="gzip", compression_level=42), "between -1 and 9"),
    ("zstd-level", dict(compression_type="zstd", compression_level=23), "between -131072 and 22"),
    ("buffer-below-batch", dict(buffer_memory=1000, batch_size=16384), "buffer_memory"),
]


@pytest.mark.parametrize("case", BAD_SETTINGS, ids=[c[0] for c in BAD_SETTINGS])
def test_bad_settings(case):
    _, settings, name = case
    with pytest.raises(ConfigError, match=name):
        Producer("127.0.0.1:9092", **settings)


def test_a_config_built_directly_is_validated():
    with pytest.raises(ConfigError, match="linger_ms"):
        Producer(config=ProducerConfig("127.0.0.1:9092", linger_ms="soon"))
    with pytest.raises(ConfigError, match="ProducerConfig"):
        Producer(config={"bootstrap_servers": "127.0.0.1:9092"})


async def test_a_config_built_directly_works(broker, topic):
    config = ProducerConfig(broker.bootstrap, acks=1, linger_ms=0)
    async with Producer(config=config) as producer:
        assert producer.config.enable_idempotence is False  # defaulted: acks=1 turns it off
        assert (await producer.send(topic, b"v")).offset >= 0


@pytest.mark.parametrize("bootstrap", ["localhost", "host:port", "", "127.0.0.1:99999"])
def test_malformed_bootstrap(bootstrap):
    with pytest.raises(ConfigError, match="bootstrap_servers"):
        Producer(bootstrap)


def test_confluent_kafkas_dict_of_properties_is_told_where_it_goes():
    """confluent-kafka's habit, Producer({"bootstrap.servers": ...}): the error says how
    settings are given here (it said only that the dict was not "host:port")."""
    with pytest.raises(ConfigError, match=r"not a dict of properties.*from_properties"):
        Producer({"bootstrap.servers": "127.0.0.1:9092", "linger.ms": "5"})


async def test_unreachable_bootstrap_fails_start_clearly():
    port = free_port()
    producer = Producer(f"127.0.0.1:{port}", request_timeout_ms=2000)
    with pytest.raises(KafkaConnectionError, match=f"127.0.0.1:{port}"):
        await asyncio.wait_for(producer.start(), 10)
    with pytest.raises(ProducerClosedError):
        await producer.send("t", b"v")


async def test_a_dead_bootstrap_address_costs_the_connection_setup_timeout(broker, topic,
                                                                        monkeypatch):
    """A bootstrap server whose host is gone (its packets are dropped, so connecting hangs)
    costs socket_connection_setup_timeout_ms (KIP-601), not request_timeout_ms; alone it
    fails start() with an error that says so, and before a live one it is skipped."""
    import aioproducer.client.cluster

    with blackhole() as port:
        producer = Producer(f"127.0.0.1:{port}", socket_connection_setup_timeout_ms=300)
        with pytest.raises(KafkaConnectionError, match=f"127.0.0.1:{port} timed out after 0"):
            await asyncio.wait_for(producer.start(), 10)
        monkeypatch.setattr(aioproducer.client.cluster.random, "shuffle", lambda servers: None)
        async with Producer(f"127.0.0.1:{port},{broker.bootstrap}",
                            socket_connection_setup_timeout_ms=300) as producer:
            metadata = await asyncio.wait_for(producer.send(topic, b"v"), 10)
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"v")]


async def test_the_connection_setup_timeout_doubles_with_each_failure_in_a_row():
    """As in KIP-601: each failed attempt to reach the same broker doubles its connect
    timeout (with jitter), up to socket_connection_setup_timeout_max_ms."""
    from aioproducer.client.cluster import Cluster
    from aioproducer.client.tasks import TaskSet

    with blackhole() as port:
        config = ProducerConfig.from_kwargs(bootstrap_servers=f"127.0.0.1:{port}",
                                            socket_connection_setup_timeout_ms=100,
                                            socket_connection_setup_timeout_max_ms=400)
        tasks = TaskSet()
        cluster = Cluster(config, tasks)
        timeouts = []
        for _ in range(4):
            with pytest.raises(KafkaConnectionError) as failed:
                await asyncio.wait_for(cluster.any_connection(), 5)
            timeouts.append(float(re.search(r"timed out after ([\d.]+) s", str(failed.value))[1]))
        cluster.close()
        await tasks.aclose()
    assert timeouts[0] < timeouts[1] < timeouts[2]  # 0.1, 0.2, 0.4 (+-20%)
    assert timeouts[3] <= 0.5  # at most 0.4 (+20%)


async def _silent_server(reader, writer):
    await reader.read()  # never answers
    writer.close()  # (once the client left: from 3.12.1, the server's wait_closed() waits for it)


async def _http_server(reader, writer):
    await reader.read(100)
    writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("handler", [_silent_server, _http_server], ids=["silent", "not-kafka"])
async def test_a_bad_bootstrap_server_is_skipped_for_the_next(broker, topic, monkeypatch, handler):
    """The first bootstrap server accepts connections but never answers, or is not a Kafka
    broker: start() goes on to the next one in the list instead of failing."""
    import aioproducer.client.cluster

    monkeypatch.setattr(aioproducer.client.cluster.random, "shuffle", lambda servers: None)
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        async with Producer(f"127.0.0.1:{port},{broker.bootstrap}",
                            request_timeout_ms=1000) as producer:
            metadata = await asyncio.wait_for(producer.send(topic, b"v"), 10)
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.offset, r.value) for r in got] == [(metadata.offset, b"v")]


async def test_start_gives_up_on_a_silent_broker_after_max_block_ms():
    """A listener that takes connections and never answers holds start() for max_block_ms,
    as the README says, not for the request_timeout_ms of a single attempt."""
    server = await asyncio.start_server(_silent_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        producer = Producer(f"127.0.0.1:{port}", request_timeout_ms=300, max_block_ms=1500)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(KafkaConnectionError, match="max_block_ms=1500"):
            await asyncio.wait_for(producer.start(), 10)
        assert 1.5 <= loop.time() - began < 5


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b""])
async def test_not_a_kafka_broker(reply):
    async def handle(reader, writer):
        await reader.read(100)
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        producer = Producer(f"127.0.0.1:{port}", request_timeout_ms=2000)
        with pytest.raises(KafkaError, match=f"127.0.0.1:{port}"):
            await asyncio.wait_for(producer.start(), 10)


async def test_calls_on_a_closed_or_unstarted_producer(broker, topic):
    producer = Producer(broker.bootstrap)
    with pytest.raises(ProducerClosedError, match="start"):
        await producer.send(topic, b"v")
    await producer.start()
    await producer.close()
    await producer.close()  # idempotent
    with pytest.raises(ProducerClosedError, match="closed"):
        await producer.enqueue(topic, b"v")
    with pytest.raises(ProducerClosedError):
        await producer.start()
    with pytest.raises(ProducerClosedError, match="closed"):
        await producer.partitions_for(topic)
    with pytest.raises(ProducerClosedError, match="start"):
        await Producer(broker.bootstrap).partitions_for(topic)


def test_a_call_never_awaited_on_a_producer_not_started_says_to_start_it():
    """`producer = Producer(...)`, then `producer.send(...)` with both the start and the
    await forgotten: the record's loss was put down to a wait for the topic's metadata, which
    awaiting would not have done (it raises: not started). It says to start the producer;
    so for enqueue_many(), which said nothing but Python's "coroutine ... never awaited"."""
    producer = Producer("127.0.0.1:9")
    with pytest.warns(RuntimeWarning, match=re.escape(
            "producer.send('orders', ...) at ") + r".*test_bad_input\.py:\d+ was never "
            r"awaited, on a producer not started: the record was not sent\. Start it first"):
        producer.send("orders", b"v")
    with pytest.warns(RuntimeWarning, match=r"producer\.enqueue_many\('orders', \.\.\.\) at "
                      r".* was never awaited, on a producer not started: its records were "
                      r"not sent"):
        producer.enqueue_many("orders", [(None, b"v")])


def test_calls_from_another_event_loop_are_refused(broker, topic):
    """A producer started on one loop, then called from another (a producer shared across
    asyncio.run() calls, or across tests' loops): a clear error, not a hang."""
    producer = Producer(broker.bootstrap)
    own = asyncio.new_event_loop()
    try:
        own.run_until_complete(producer.start())
        own.run_until_complete(producer.send(topic, b"on its own loop"))

        async def elsewhere(call):
            with pytest.raises(RuntimeError, match="another one"):
                await asyncio.wait_for(call(), 5)

        for call in (lambda: producer.send(topic, b"v"), lambda: producer.flush(),
                     lambda: producer.enqueue_many(topic, [(None, b"v")]),
                     lambda: producer.send("not-yet-known", b"v"), lambda: producer.close()):
            asyncio.run(elsewhere(call))
        own.run_until_complete(producer.send(topic, b"still works on its own loop"))
        own.run_until_complete(producer.close())
    finally:
        own.close()
    got = consume_all(broker.bootstrap, topic, expected=2)
    assert [r.value for r in got] == [b"on its own loop", b"still works on its own loop"]


@pytest.mark.parametrize("elsewhere", ["thread", "loop"])
def test_calls_from_another_thread_or_loop_are_refused_before_anything_is_buffered(
        broker, topic, elsewhere):
    """From another thread or loop even a record that fits the open batch is refused before
    it is appended: there it would race the sender or never be sent, and a send() that
    raised would be delivered."""
    producer = Producer(broker.bootstrap, linger_ms=60_000)
    own = asyncio.new_event_loop()
    refused: list[str] = []

    async def from_elsewhere():
        for call in (lambda: producer.send(topic, b"x", partition=0),
                     lambda: producer.enqueue(topic, b"y", partition=0)):
            try:
                await asyncio.wait_for(call(), 5)
            except RuntimeError as exc:
                refused.append(str(exc))

    async def result(handle):
        return await handle

    try:
        own.run_until_complete(producer.start())
        handle = own.run_until_complete(producer.enqueue(topic, b"opens a batch", partition=0))
        if elsewhere == "thread":
            thread = threading.Thread(target=asyncio.run, args=(from_elsewhere(),))
            thread.start()
            thread.join(30)
        else:
            asyncio.run(from_elsewhere())  # this thread's next loop (the producer's is idle)
        assert len(refused) == 2 and all("another one" in text for text in refused), refused
        # From another thread (a sync web handler's asyncio.run()), the way that works.
        assert all(("run_coroutine_threadsafe" in text) == (elsewhere == "thread")
                   for text in refused), refused
        own.run_until_complete(producer.flush())
        assert own.run_until_complete(result(handle)).offset == 0
        own.run_until_complete(producer.close())
    finally:
        own.close()
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [r.value for r in got] == [b"opens a batch"]


async def test_enqueue_many_failing_before_its_first_record_says_so(broker, topic):
    """`accepted` is on whatever enqueue_many raises, also before its first record: a caller
    that resumes from len(accepted) must not meet an AttributeError."""
    async with Producer(broker.bootstrap, allow_auto_create_topics=False,
                        max_block_ms=300) as producer:
        calls = [
            (lambda: producer.enqueue_many("never-created", [(None, b"v")]), UnknownTopicError),
            (lambda: producer.enqueue_many(topic, [(None, b"v")], partition=99),
             InvalidRecordError),
            (lambda: producer.enqueue_many(topic, [(None, b"v")], timestamp_ms="now"),
             InvalidRecordError),
        ]
        for call, error in calls:
            with pytest.raises(error) as caught:
                await call()
            assert len(caught.value.accepted) == 0 and len(await caught.value.accepted) == 0
        waiting = asyncio.create_task(producer.enqueue_many("not-yet", [(None, b"v")]))
        await asyncio.sleep(0.1)  # waiting for the topic's metadata
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError) as caught:
            await waiting
        assert len(caught.value.accepted) == 0
        await producer.send(topic, b"the producer goes on")
    assert [r.value for r in consume_all(broker.bootstrap, topic, 1)] == [b"the producer goes on"]


@pytest.mark.parametrize("timeout", ["5", -1, float("nan"), True])
async def test_flush_with_a_bad_timeout_says_so(broker, timeout):
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(ConfigError, match=r"flush\(timeout"):
            await producer.flush(timeout=timeout)


@pytest.mark.parametrize("timeout", ["5", -1, float("nan"), True])
async def test_close_with_a_bad_timeout_leaves_a_working_close(broker, timeout):
    producer = Producer(broker.bootstrap)
    await producer.start()
    with pytest.raises(ConfigError, match="timeout"):
        await producer.close(timeout=timeout)
    await asyncio.wait_for(producer.close(), 10)
    with pytest.raises(ProducerClosedError, match="closed"):
        await producer.send("t", b"v")


async def test_a_str_subclass_is_its_text_as_a_topic(broker, topic_factory):
    name = topic_factory(2)
    Topic = enum.Enum("Topic", {"ORDERS": name}, type=str)
    async with Producer(broker.bootstrap, linger_ms=0) as producer:
        first = await producer.send(Topic.ORDERS, b"before the metadata is known")
        second = await producer.send(Topic.ORDERS, b"after")
        bulk = await (await producer.enqueue_many(Topic.ORDERS, [(None, b"bulk")]))
        assert await producer.partitions_for(Topic.ORDERS) == {0, 1}
    assert type(first.topic) is str and first.topic == second.topic == bulk[0].topic == name
    got = consume_all(broker.bootstrap, name, expected=3)
    assert sorted(r.value for r in got) == [b"after", b"before the metadata is known", b"bulk"]


class _SeesRecords(ProducerHooks):
    def on_send(self, topic, key, value, headers):
        return None


@pytest.mark.parametrize("hooks", [(), (_SeesRecords(),)], ids=["plain", "on_send-hook"])
async def test_a_call_missing_its_value_names_the_verb_called(broker, topic, hooks):
    """`producer.send(topic)` with the value forgotten was told "RecordIntake.send()
    missing 1 required positional argument: 'value'" (with an on_send hook,
    "RecordIntake._send_told()"): a class the user never met. The TypeError names the verb
    they called, as Python does for any method: so does a misspelt keyword."""
    async with Producer(broker.bootstrap, hooks=hooks) as producer:
        for name in ("send", "enqueue"):
            verb = getattr(producer, name)
            with pytest.raises(TypeError) as missing:
                verb(topic)
            assert str(missing.value) == \
                f"Producer.{name}() missing 1 required positional argument: 'value'"
            with pytest.raises(TypeError) as misspelt:
                verb(topic, b"v", partiton=0)
            assert str(misspelt.value) == \
                f"Producer.{name}() got an unexpected keyword argument 'partiton'"
    with BlockingProducer(broker.bootstrap, hooks=hooks) as blocking:
        for name in ("produce", "send"):
            with pytest.raises(TypeError) as missing:
                getattr(blocking, name)(topic)
            assert str(missing.value) == \
                f"BlockingProducer.{name}() missing 1 required positional argument: 'value'"


class Int64:
    """numpy.int64's part here: an int-like (__index__: int() and operator.index() take
    it) that is not an int."""

    def __init__(self, number: int) -> None:
        self.number = number

    def __index__(self) -> int:
        return self.number


@pytest.mark.parametrize("kind", ["__index__", "numpy"])
async def test_an_int_like_partition_or_timestamp_is_the_int_it_stands_for(broker,
                                                                          topic_factory, kind):
    """A partition or timestamp out of numpy or a pandas column (numpy.int64) was refused:
    "partition must be an int or None, not int64". Every verb takes it as the int it stands
    for, in the compiled common case and on the Python path (a header, the first record
    before the metadata is known), and the metadata holds plain ints."""
    int_like = pytest.importorskip("numpy").int64 if kind == "numpy" else Int64
    topic = topic_factory(3)
    stamp = 1_700_000_000_000
    async with Producer(broker.bootstrap, linger_ms=0) as producer:
        metadata = [
            await producer.send(topic, b"first", partition=int_like(2),
                                timestamp_ms=int_like(stamp)),
            await producer.send(topic, b"sent", partition=int_like(1),
                                timestamp_ms=int_like(stamp + 1)),
            await (await producer.enqueue(topic, b"enqueued", key=b"k", partition=int_like(1),
                                          timestamp_ms=int_like(stamp + 2))),
            await producer.send(topic, b"with a header", partition=int_like(2),
                                timestamp_ms=int_like(stamp + 3), headers=[("h", b"1")]),
            (await (await producer.enqueue_many(topic, [(None, b"bulk")], partition=int_like(0),
                                                timestamp_ms=int_like(stamp + 4))))[0]]
    assert [(m.partition, m.timestamp_ms) for m in metadata] == \
        [(2, stamp), (1, stamp + 1), (1, stamp + 2), (2, stamp + 3), (0, stamp + 4)]
    assert {(type(m.partition), type(m.timestamp_ms)) for m in metadata} == {(int, int)}
    got = consume_all(broker.bootstrap, topic, expected=5)
    assert sorted((r.timestamp_ms, r.partition, r.value) for r in got) == [
        (stamp, 2, b"first"), (stamp + 1, 1, b"sent"), (stamp + 2, 1, b"enqueued"),
        (stamp + 3, 2, b"with a header"), (stamp + 4, 0, b"bulk")]


async def test_enqueue_many_with_a_bad_records_argument(broker, topic):
    values = [b"%d" % i for i in range(25_000)]

    def records():
        yield from ((None, v) for v in values)
        raise ValueError("the source broke")

    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match="iterable"):
            await producer.enqueue_many(topic, None)
        with pytest.raises(InvalidRecordError, match=r"not a dict: pass records\.items\(\)") \
                as caught:  # (iterated, a dict gave its keys: "not bytes (record 0: b'k')")
            await producer.enqueue_many(topic, {b"k": b"v"})
        assert len(caught.value.accepted) == 0
        with pytest.raises(ValueError, match="the source broke") as caught:
            await producer.enqueue_many(topic, records())
        # Every record the generator gave before it raised is buffered, not only the whole
        # chunks of 10,000 read before (20,000 of 25,000 were, and 5,000 read were dropped).
        assert len(await caught.value.accepted) == len(values)
    got = consume_all(broker.bootstrap, topic, expected=len(values))
    assert [r.value for r in got] == values


async def test_enqueue_many_says_how_to_pass_a_dataframe(broker, topic):
    """A pandas DataFrame iterates over its column names: it was refused as "not str (record
    0: 'key')", which names neither the DataFrame nor the fix."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"key": [b"k"], "value": [b"v"]})
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match=r"not a DataFrame .*itertuples") as caught:
            await producer.enqueue_many(topic, frame)
        assert len(caught.value.accepted) == 0
        await (await producer.enqueue_many(
            topic, frame[["key", "value"]].itertuples(index=False, name=None)))
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.key, r.value) for r in got] == [(b"k", b"v")]


@pytest.mark.parametrize("record", [b"v1", "v1", bytearray(b"v1")], ids=repr)
async def test_enqueue_many_refuses_bare_values_of_length_two(broker, topic, record):
    """A value of two bytes or characters unpacks as a (key, value) pair: refused as not a
    pair, not sent as a key and a value of one item each through the serializers."""
    async with Producer(broker.bootstrap, key_serializer=lambda k: str(k).encode(),
                        value_serializer=lambda v: str(v).encode()) as producer:
        with pytest.raises(InvalidRecordError, match=r"\(key, value\) pairs.*record 1") as caught:
            await producer.enqueue_many(topic, [(None, "first"), record])
        assert len(await caught.value.accepted) == 1
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [(r.key, r.value) for r in got] == [(None, b"first")]


@pytest.mark.parametrize("record, says", [
    ({"key": b"k", "value": b"v"}, r"not dict .*make each a tuple"),
    ((b"k", b"v", [("h", b"1")]), r"not tuple .*no headers.*enqueue\(\)"),
], ids=["dict", "with-headers"])
async def test_enqueue_many_says_what_to_do_with_a_dict_or_a_record_with_headers(broker, topic,
                                                                                record, says):
    """Rows as dicts (a database cursor's, a JSON document's) and (key, value, headers)
    triples: a dict unpacked into its two keys was refused as "value must be bytes, not str
    (encode it first...)", naming neither the dict nor the fix."""
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match=r"\(key, value\) pairs, " + says):
            await producer.enqueue_many(topic, [record])


async def test_enqueue_many_names_a_refused_record_by_its_index_in_the_input(broker, topic):
    """The records are taken 10,000 at a time: the index is the input's, not the chunk's."""
    records = [(None, b"v")] * 10_005 + [b"not a pair"]
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError, match=r"record 10005\b") as caught:
            await producer.enqueue_many(topic, records)
        assert len(await caught.value.accepted) == 10_005


def _fails_on(bad: bytes):
    def serialize(value: bytes) -> bytes:
        if value == bad:
            raise ValueError("cannot serialize this one")
        return value
    return serialize


@pytest.mark.parametrize("settings, bad, error, says", [
    ({"max_request_size": 10_000}, (b"k", b"x" * 20_000), RecordTooLargeError,
     "larger than max_request_size"),
    ({}, (b"k", "text"), InvalidRecordError, "value must be bytes"),
    ({}, (1.5, b"v"), InvalidRecordError, "key must be bytes"),
    ({"value_serializer": _fails_on(b"bad")}, (None, b"bad"), SerializationError,
     "value_serializer failed"),
], ids=["too-large", "str-value", "float-key", "serializer"])
async def test_enqueue_many_names_a_record_refused_for_its_size_or_type(broker, topic_factory,
                                                                         settings, bad, error,
                                                                         says):
    """A load that stops on one row of its file says which: a record too large or of the
    wrong type raised its plain message ("a record of 20066 bytes ... is larger than
    max_request_size"), leaving the caller to work the row out from len(accepted)."""
    topic = topic_factory(1)
    records = [(b"k", b"v%d" % i) for i in range(10_005)] + [bad] + [(b"k", b"after")]
    async with Producer(broker.bootstrap, **settings) as producer:
        with pytest.raises(error, match=r"^records\[10005\]: .*" + says) as caught:
            await producer.enqueue_many(topic, records)
        assert len(await caught.value.accepted) == 10_005
    got = consume_all(broker.bootstrap, topic, expected=10_005)
    assert [r.value for r in got] == [v for _, v in records[:10_005]]


def test_produce_many_names_a_record_refused_for_its_size(broker, topic):
    records = [(None, b"v")] * 3 + [(None, b"x" * 20_000)]
    with BlockingProducer(broker.bootstrap, max_request_size=10_000) as producer:
        with pytest.raises(RecordTooLargeError, match=r"^records\[3\]: a record of") as caught:
            producer.produce_many(topic, records)
        assert len(caught.value.accepted.result(30)) == 3


def test_record_errors_name_the_refused_records():
    # Produce v8+ (KIP-467): the broker says which records of a refused batch were invalid.
    # Tansu never sends these, so the message the sender builds from them is checked here.
    from aioproducer._internal.sender import _record_errors

    errors = [{"batch_index": i, "batch_index_error_message": "bad" if i == 3 else None}
              for i in (3, 8, 9, 10, 11, 12, 13)]
    message = _record_errors(errors)
    assert message.startswith("; invalid: record 3 (bad), record 8, record 9")
    assert "record 12" not in message and "and 2 more" in message


async def test_a_timestamp_in_seconds_is_sent_as_given_and_warned_of_once(broker, topic,
                                                                          caplog):
    """`timestamp_ms=int(time.time())` gives seconds: the broker dates the record 1970. It is
    taken, as the Java client takes it, but one WARNING per producer names the argument (the
    common case, a record for a partition with an open batch, was taken by the compiled
    path without a word). A timestamp in ms, or 0, says nothing."""
    import logging
    import time

    caplog.set_level(logging.WARNING, logger="aioproducer")
    seconds = int(time.time())
    for said in range(2):  # (once per producer)
        async with Producer(broker.bootstrap, linger_ms=1000) as producer:
            await producer.enqueue(topic, b"in ms", partition=0, timestamp_ms=seconds * 1000)
            await producer.enqueue(topic, b"at 0", partition=0, timestamp_ms=0)
            assert len(caplog.records) == said
            await producer.enqueue(topic, b"in seconds", partition=0, timestamp_ms=seconds)
            assert len(caplog.records) == said + 1
            await producer.send(topic, b"in seconds, sent", partition=0, timestamp_ms=seconds)
            await producer.enqueue_many(topic, [(None, b"many")], timestamp_ms=seconds)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert warned[0].startswith(f"timestamp_ms={seconds} (topic {topic!r}) is 1970-"), warned[0]
    assert "was it seconds? Give int(time.time() * 1000)" in warned[0]
    got = consume_all(broker.bootstrap, topic, expected=10)
    assert [(r.value, r.timestamp_ms) for r in got[:5]] == [
        (b"in ms", seconds * 1000), (b"at 0", 0), (b"in seconds", seconds),
        (b"in seconds, sent", seconds), (b"many", seconds)]


async def test_a_producer_given_to_another_process_is_refused_saying_what_to_give_instead(
        broker):
    """A producer pickled for a ProcessPoolExecutor or multiprocessing (a careless user's
    `pool.submit(work, producer)`): a TypeError that names the producer and says to give the
    process the settings (a ProducerConfig pickles) and make a producer there. (It said
    "cannot pickle '_asyncio.Future' object", or "Can't pickle local object
    'Lifecycle.__init__.<locals>.<lambda>'" for one not started.)"""
    config = ProducerConfig(bootstrap_servers=broker.bootstrap, linger_ms=5)
    assert pickle.loads(pickle.dumps(config)) == config  # what the message says to give
    unstarted = Producer(config=config)
    async with Producer(config=config) as started:
        for producer in (unstarted, started):
            with pytest.raises(TypeError, match=r"a Producer cannot be pickled: .*ProducerConfig"):
                pickle.dumps(producer)
    blocking = await asyncio.to_thread(BlockingProducer, config=config)
    try:
        with pytest.raises(TypeError, match=r"a BlockingProducer cannot be pickled: .*ProducerCo"):
            pickle.dumps(blocking)
    finally:
        await asyncio.to_thread(blocking.close)


async def test_bootstrap_at_an_http_server_says_what_answered():
    """bootstrap_servers at an HTTP port (a Schema Registry's 8081, a web app): a real HTTP
    server (aiohttp's) answers the ApiVersions request with "HTTP/1.0 400 Bad Request" at
    once, read as a frame of 1213486160 bytes. The error quotes the answer's first line, so
    the user sees an HTTP server answered (it said only "sent a frame of 1213486160 bytes ...
    not a Kafka broker")."""
    from aiohttp import web
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        producer = Producer(f"127.0.0.1:{port}", max_block_ms=10_000)
        with pytest.raises(KafkaConnectionError) as raised:
            await asyncio.wait_for(producer.start(), 15)
    finally:
        await runner.cleanup()
    assert re.search(r"not a Kafka broker: it answered 'HTTP/1\.[01] 400 Bad Request'",
                     str(raised.value)), str(raised.value)


async def test_a_record_whose_leader_cannot_be_reached_says_why_when_it_expires():
    """The broker advertises an address this host cannot reach (Kafka in Docker advertising
    its container's name, the classic first setup): bootstrap works, the leader does not. The
    send() failed after delivery_timeout_ms with "... not acknowledged within
    delivery_timeout_ms=3000 (waited in the buffer)" and no why (a WARNING in the log had it).
    The error now carries the leader's last connection failure."""
    advertised = free_port()  # (nothing listens there)
    with EmbeddedBroker(advertised_port=advertised) as broker:
        broker.create_topic("unreachable", 1)
        async with Producer(f"127.0.0.1:{broker.port}", delivery_timeout_ms=3000,
                            request_timeout_ms=2000, linger_ms=0) as producer:
            with pytest.raises(DeliveryTimeoutError) as raised:
                await asyncio.wait_for(producer.send("unreachable", b"v"), 30)
    said = str(raised.value)
    # (The leader is forgotten once it fails, and the cluster rebootstraps: either way the
    # error names the address that failed and what the broker advertised, and not that no
    # broker could be reached: the bootstrap server answers.)
    assert re.search(
        r"not acknowledged within delivery_timeout_ms=3000 \(waited in the buffer: (its leader, "
        r"broker 111, could not|its leader is not known now; the last broker tried could not) "
        r"be reached: cannot connect to 127\.0\.0\.1:"
        f"{advertised}" r": Connection refused\. It is where broker 111 says it is \(its "
        r"advertised\.listeners\)", said), said
