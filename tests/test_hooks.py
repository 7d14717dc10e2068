"""Hooks (aioproducer.hooks): what they are told agrees with what the broker stored, as read
back by librdkafka; a hook's own failure never costs a record; per-topic metrics and the
latency histograms count what happened."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid

import pytest

from aioproducer import BlockingProducer, Producer, RecordMetadata, accepted
from aioproducer.errors import ConfigError, InvalidRecordError, NotEnoughReplicasError, \
    TopicAuthorizationFailedError
from aioproducer.hooks import ProducerHooks
from tests.support.readback import consume_all


class Recorder(ProducerHooks):
    """Every call, in order; on_send adds a header naming the record's place in the calls."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object, object]] = []
        self.outcomes: list[tuple[int, RecordMetadata | None, BaseException | None]] = []
        self.acks: list[tuple[str, int, int, int, float]] = []
        self.errors: list[tuple[str, int, int, BaseException]] = []
        self.retries: list[tuple[str, int, int, BaseException]] = []
        self.throttles: list[tuple[int, int]] = []
        self.requests: list[tuple[int, float, BaseException | None]] = []

    def on_send(self, topic, key, value, headers):
        number = len(self.sent)
        self.sent.append((topic, key, value))
        headers.append(("hooked", b"%d" % number))
        return lambda metadata, exc: self.outcomes.append((number, metadata, exc))

    def on_ack(self, topic, partition, base_offset, record_count, latency_s):
        self.acks.append((topic, partition, base_offset, record_count, latency_s))

    def on_error(self, topic, partition, record_count, error):
        self.errors.append((topic, partition, record_count, error))

    def on_retry(self, topic, partition, record_count, error):
        self.retries.append((topic, partition, record_count, error))

    def on_throttle(self, node_id, throttle_time_ms):
        self.throttles.append((node_id, throttle_time_ms))

    def on_request(self, node_id, latency_s, error):
        self.requests.append((node_id, latency_s, error))


async def test_hooks_see_every_record_and_batch_as_the_broker_stored_them(broker, topic_factory):
    """on_send sees each record of send(), enqueue(), gather and enqueue_many(); the header
    it adds arrives; each record's outcome is its metadata; the acknowledged batches cover
    every record at the offsets the broker gave; per-topic counts and histograms add up."""
    topic = topic_factory(2)
    hooks = Recorder()
    async with Producer(broker.bootstrap, hooks=[hooks], linger_ms=5) as producer:
        first = await producer.send(topic, b"sent", key=b"a", headers=[("mine", b"1")])
        futures = [await producer.enqueue(topic, b"enqueued-%d" % i, key=b"k%d" % i)
                   for i in range(50)]
        gathered = await asyncio.gather(*(producer.send(topic, b"gathered-%d" % i)
                                          for i in range(50)))
        enqueued = await asyncio.gather(*futures)
        bulk = await producer.enqueue_many(topic, [(None, b"bulk-%d" % i) for i in range(100)])
        await bulk
        metrics = producer.metrics()
    assert len(hooks.sent) == 201
    assert hooks.sent[0] == (topic, b"a", b"sent")
    assert hooks.sent[101:] == [(topic, None, b"bulk-%d" % i) for i in range(100)]
    told = {number: metadata for number, metadata, exc in hooks.outcomes if exc is None}
    assert len(hooks.outcomes) == len(told) == 201
    assert told[0] == first and [told[1 + i] for i in range(50)] == enqueued
    assert sorted(told[51 + i] for i in range(50)) == sorted(gathered)
    assert [told[101 + i] for i in range(100)] == list(bulk.result())

    stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 201)
    assert len(stored) == 201
    by_place = {(r.partition, r.offset): r for r in stored}
    for number, metadata in told.items():
        record = by_place[(metadata.partition, metadata.offset)]
        assert dict(record.headers)["hooked"] == b"%d" % number
    assert dict(by_place[(first.partition, first.offset)].headers) == \
        {"mine": b"1", "hooked": b"0"}
    # The acknowledged batches hold every record once, where the broker put them.
    acked = {(partition, base + i) for t, partition, base, count, _ in hooks.acks
             for i in range(count)}
    assert sum(count for *_, count, _ in hooks.acks) == 201 and acked == set(by_place)
    assert all(t == topic and latency > 0 for t, _, _, _, latency in hooks.acks)
    assert hooks.errors == hooks.retries == hooks.throttles == []
    assert len(hooks.requests) == metrics.produce_responses and \
        all(exc is None and latency > 0 for _, latency, exc in hooks.requests)

    per_topic = metrics.topics[topic]
    assert (per_topic.records_sent, per_topic.records_failed, per_topic.records_retried) == (201, 0, 0)
    assert per_topic.batches_sent == len(hooks.acks) == metrics.batches_sent
    assert metrics.record_latency_histogram.count == len(hooks.acks)
    assert metrics.produce_latency_histogram.count == metrics.produce_responses
    assert sum(metrics.produce_latency_histogram.counts) == metrics.produce_responses
    assert metrics.record_latency_histogram.quantile(0.5) >= 0.001  # lingered 5 ms


async def test_a_failing_hook_costs_no_record(broker, topic, caplog):
    """A hook that raises in on_ack or in its delivery callback is logged; the records are
    delivered all the same. One that raises in on_send refuses that record (the send raises
    its error and nothing is buffered), and the producer goes on."""

    class Faulty(ProducerHooks):
        def on_send(self, topic, key, value, headers):
            if value == b"refused":
                raise ValueError("no tracing context for this one")
            return lambda metadata, exc: 1 / 0

        def on_ack(self, topic, partition, base_offset, record_count, latency_s):
            raise RuntimeError("the metrics backend is down")

    caplog.set_level(logging.ERROR, "aioproducer")
    async with Producer(broker.bootstrap, hooks=[Faulty()]) as producer:
        with pytest.raises(ValueError, match="no tracing context"):
            await producer.send(topic, b"refused")
        with pytest.raises(ValueError, match="no tracing context"):
            await producer.enqueue(topic, b"refused")
        sent = await asyncio.gather(*(producer.send(topic, b"kept-%d" % i) for i in range(20)))
    assert len(sent) == 20
    stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 20)
    assert sorted(r.value for r in stored) == sorted(b"kept-%d" % i for i in range(20))
    messages = [r.getMessage() for r in caplog.records]
    assert any("on_ack raised" in m for m in messages)
    assert any("delivery callback" in m for m in messages)


async def test_a_header_a_hook_added_wrongly_is_said_to_be_the_hook_s(broker, topic):
    """An on_send hook that adds a str header value (a trace id as text): the record is
    refused, saying the header came from the hook. The message named the header alone, and
    the user looked for it in their own send() call, which had none. The hooks that asked
    to be told are told the refusal, as of any refusal at the call."""
    told: list[BaseException | None] = []

    class Tracing(ProducerHooks):
        def on_send(self, topic, key, value, headers):
            headers.append(("traceparent", "00-4bf92f3577b34da6-01"))
            return lambda metadata, exc: told.append(exc)

    async with Producer(broker.bootstrap, hooks=[Tracing()]) as producer:
        for verb in (producer.send, producer.enqueue):
            with pytest.raises(InvalidRecordError) as refused:
                await verb(topic, b"v")
            assert str(refused.value) == (
                "header 'traceparent' must have a bytes or None value, not str (encode it: "
                ".encode()) (added by the on_send hook of Tracing)")
            assert told.pop() is refused.value and not told
    with BlockingProducer(broker.bootstrap, hooks=[Tracing()]) as blocking:
        assert "added by the on_send hook of Tracing" in str(
            blocking.produce(topic, b"v").exception(10))


async def test_hooks_told_of_retries_errors_and_throttling(cluster):
    """Through the simulated cluster: a retriable refusal reaches on_retry, then the batch's
    ack; a fatal one reaches on_error and the record's callback; a throttle reaches
    on_throttle with the broker's figure; the per-topic counts agree."""
    topic = f"observed-{uuid.uuid4().hex[:10]}"  # (the session's broker is shared)
    cluster.create_topic(topic, 1)
    leader = cluster.leader(topic, 0)
    hooks = Recorder()
    async with Producer(cluster.bootstrap_servers, hooks=[hooks], linger_ms=0,
                        retry_backoff_ms=20) as producer:
        await producer.send(topic, b"warm-up")
        cluster.fail((topic, 0), NotEnoughReplicasError.error_code)
        retried = await asyncio.wait_for(producer.send(topic, b"retried"), 20)
        cluster.fail((topic, 0), TopicAuthorizationFailedError.error_code)
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(producer.send(topic, b"refused"), 20)
        cluster.throttle(leader, 50)
        await asyncio.wait_for(producer.send(topic, b"throttled"), 20)
        cluster.throttle(leader, 0)
        metrics = producer.metrics()
    assert [(t, p, n, type(e)) for t, p, n, e in hooks.retries] == \
        [(topic, 0, 1, NotEnoughReplicasError)]
    assert [(t, p, n, type(e)) for t, p, n, e in hooks.errors] == \
        [(topic, 0, 1, TopicAuthorizationFailedError)]
    assert (leader, 50) in hooks.throttles
    outcomes = {hooks.sent[number][2]: (metadata, exc) for number, metadata, exc in hooks.outcomes}
    assert outcomes[b"retried"] == (retried, None)
    assert outcomes[b"refused"][0] is None and \
        isinstance(outcomes[b"refused"][1], TopicAuthorizationFailedError)
    per_topic = metrics.topics[topic]
    assert (per_topic.records_sent, per_topic.records_failed, per_topic.records_retried) == (3, 1, 1)
    stored = await asyncio.to_thread(consume_all, cluster.bootstrap_servers, topic, 3)
    assert [r.value for r in stored] == [b"warm-up", b"retried", b"throttled"]


async def test_enqueue_many_shows_each_record_to_on_send_as_enqueue_does(broker, topic):
    """enqueue_many()'s records reach on_send one by one as the call reads them: the header
    a hook adds arrives, each is told its outcome; a record refused midway is told its error
    and the call raises it with the records before accepted; a hook that raises refuses its
    record the same way."""

    class Refusing(Recorder):
        def on_send(self, topic, key, value, headers):
            if value == b"untraceable":
                raise LookupError("no trace context")
            return super().on_send(topic, key, value, headers)

    hooks = Refusing()
    async with Producer(broker.bootstrap, hooks=[hooks], linger_ms=5) as producer:
        with pytest.raises(InvalidRecordError) as refused:
            await producer.enqueue_many(topic, [(b"k", b"a"), (b"k", "a str"), (b"k", b"c")])
        with pytest.raises(LookupError) as hook_raised:
            await producer.enqueue_many(topic, [(None, b"d"), (None, b"untraceable")])
        bulk = await producer.enqueue_many(topic, ((b"k%d" % i, b"v%d" % i)
                                                   for i in range(20_000)))
        first, second, third = await asyncio.gather(
            accepted(refused.value), accepted(hook_raised.value), bulk)
    assert (len(first), len(second), len(third)) == (1, 1, 20_000)
    assert [value for _, _, value in hooks.sent] == \
        [b"a", "a str", b"d"] + [b"v%d" % i for i in range(20_000)]
    outcomes = {number: (metadata, exc) for number, metadata, exc in hooks.outcomes}
    assert outcomes[0] == (first[0], None) and outcomes[2] == (second[0], None)
    assert outcomes[1][0] is None and isinstance(outcomes[1][1], InvalidRecordError)
    assert [outcomes[3 + i] for i in range(20_000)] == [(md, None) for md in third]
    stored = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 20_002)
    assert sorted(dict(r.headers)["hooked"] for r in stored) == \
        sorted(b"%d" % n for n in [0, 2, *range(3, 20_003)])


def test_produce_many_shows_records_to_on_send_in_the_callers_context(broker, topic):
    """As produce() does: the hook runs in the producer's thread, in the calling thread's
    context (an OpenTelemetry span there is its parent)."""
    request = contextvars.ContextVar("request", default="none")

    class Traced(Recorder):
        def on_send(self, topic, key, value, headers):
            headers.append(("request", request.get().encode()))
            return super().on_send(topic, key, value, headers)

    hooks = Traced()
    with BlockingProducer(broker.bootstrap, hooks=[hooks]) as producer:
        request.set("r-42")
        bulk = producer.produce_many(topic, [(None, b"v%d" % i) for i in range(30)])
        producer.flush(30)
    assert sorted(md for _, md, _ in hooks.outcomes) == sorted(bulk.result())
    stored = consume_all(broker.bootstrap, topic, 30)
    assert [dict(r.headers)["request"] for r in stored] == [b"r-42"] * 30


def test_blocking_producer_shows_records_to_the_hooks(broker, topic):
    """BlockingProducer.produce(): on_send's header arrives, and both its delivery callback
    and the caller's on_delivery are told."""
    hooks = Recorder()
    delivered: list[RecordMetadata] = []
    with BlockingProducer(broker.bootstrap, hooks=[hooks]) as producer:
        futures = [producer.produce(topic, b"v%d" % i,
                                    on_delivery=lambda md, exc: delivered.append(md))
                   for i in range(30)]
        producer.flush(30)
    assert [f.result() for f in futures] == sorted(delivered, key=lambda md: md.offset)
    assert sorted((md.offset for _, md, _ in hooks.outcomes)) == \
        sorted(md.offset for md in delivered)
    stored = consume_all(broker.bootstrap, topic, 30)
    assert sorted(dict(r.headers)["hooked"] for r in stored) == \
        sorted(b"%d" % i for i in range(30))


@pytest.mark.parametrize("hooks", [ProducerHooks(), [object()], "tracing"])
def test_hooks_setting_is_checked(hooks):
    with pytest.raises(ConfigError, match="hooks must be a list of"):
        Producer("localhost:9092", hooks=hooks)


def test_histogram_quantiles_name_the_bucket_they_fall_in():
    """ProducerMetrics' histograms: counts per bucket, quantile = the bound of its bucket."""
    from aioproducer._internal.metrics import Histogram

    bounds = (0.001, 0.01, 0.1)
    histogram = Histogram(bounds, (50, 40, 9, 1), 1.5, 100)
    assert histogram.quantile(0.5) == 0.001
    assert histogram.quantile(0.9) == 0.01
    assert histogram.quantile(0.99) == 0.1
    assert histogram.quantile(1.0) == float("inf")  # one above every bound
    assert Histogram().quantile(0.99) == 0.0  # nothing observed
    with pytest.raises(ValueError):
        histogram.quantile(0)


def test_only_overridden_hooks_are_called():
    """A hook's methods are called only where its class overrides them, and not where the
    instance set one to None."""
    from aioproducer._internal.observer import overridden

    class AcksOnly(ProducerHooks):
        def on_ack(self, *args):
            pass

    class Untraced(Recorder):
        def __init__(self):
            super().__init__()
            self.on_send = None

    hooks = [AcksOnly(), Untraced(), ProducerHooks()]
    assert len(overridden(hooks, "on_ack")) == 2
    assert len(overridden(hooks, "on_send")) == 0
    assert len(overridden(hooks, "on_error")) == 1


@pytest.mark.parametrize("call", ["send", "send, topic not yet known", "enqueue",
                                  "enqueue, topic not yet known"])
async def test_a_caller_that_stops_following_its_record_leaves_the_hook_told_its_outcome(
        broker, topic_factory, call):
    """The first Ctrl-C in an asyncio.run() script cancels its main task (asyncio.Runner's
    SIGINT handler: no KeyboardInterrupt in the middle of a call), as asyncio.timeout or a
    client gone cancel a handler: a record buffered by then is still sent. The on_send hook,
    which sees every record as confluent-kafka's on_delivery does, must be told that it was
    written, and where: it was told CancelledError, the caller's future's outcome."""
    topic = topic_factory(1)
    recorder = Recorder()
    async with Producer(broker.bootstrap, linger_ms=60_000, hooks=[recorder]) as producer:
        if not call.endswith("not yet known"):
            await producer.partitions_for(topic)
        if call.startswith("send"):
            following = asyncio.ensure_future(producer.send(topic, b"v"))
        else:
            following = await producer.enqueue(topic, b"v")
        for _ in range(1000):  # until it is buffered (bounded: 10 s)
            if producer.metrics().records_pending:
                break
            await asyncio.sleep(0.01)
        assert producer.metrics().records_pending == 1
        following.cancel()  # as asyncio.run() does to its main task on Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await following
        await asyncio.wait_for(producer.flush(), 20)
    got = consume_all(broker.bootstrap, topic, expected=1)
    assert [r.value for r in got] == [b"v"]
    assert [(number, exc) for number, _, exc in recorder.outcomes] == [(0, None)]
    assert recorder.outcomes[0][1].offset == got[0].offset
