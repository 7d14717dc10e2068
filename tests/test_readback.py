"""consume_all (tests/support/readback.py), with which most tests read back what they wrote:
a record it misses fails a test as if the producer had lost it. It reads every partition
from offset 0, all of those the topic was created with, and says what it got from each
when it ends short."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer as LibrdkafkaProducer

from tests.support.readback import consume_all, created_with


def _write(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    producer = LibrdkafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, b"p%d-%d" % (partition, i), partition=partition)
    assert producer.flush(20) == 0


def test_it_reads_from_offset_0_where_list_offsets_names_a_later_batch(proxied_broker):
    """Tansu 0.6 answers ListOffsets EARLIEST with the batch stored first in time, which is
    not the first batch where producers write a partition at once (two Spark tasks): a
    read from librdkafka's OFFSET_BEGINNING started there, and missed the records before
    (CI, twice: 1,506 of 2,000 records read, from offset 494 on; 1,000 of 1,750). Here
    every ListOffsets answer names offset 5: every record is still read, from offset 0."""
    from kafka.protocol.consumer import ListOffsetsResponse

    topic = f"t-{uuid.uuid4().hex[:12]}"
    proxied_broker.create_topic(topic, 2)
    created_with(topic, 2)
    _write(proxied_broker.bootstrap, topic, {0: 10, 1: 10})

    def later(response):
        for answer in response.topics[0].partitions:
            answer.offset = 5
        return response
    proxied_broker.proxy.rewrite_responses(ListOffsetsResponse, later)
    got = consume_all(proxied_broker.bootstrap, topic, expected=20, timeout=5)
    assert sorted((r.partition, r.offset) for r in got) == \
        [(p, o) for p in (0, 1) for o in range(10)]


def test_it_reads_every_partition_the_topic_was_created_with(broker, topic_factory):
    """The partition count comes from the topic's creation (or the caller); Metadata that
    names another count fails the read, saying so, instead of reading fewer partitions."""
    topic = topic_factory(2)
    _write(broker.bootstrap, topic, {0: 1, 1: 1})
    assert sorted(r.partition for r in consume_all(broker.bootstrap, topic, 2)) == [0, 1]
    with pytest.raises(AssertionError, match=rf"^{topic}: created with 3 partition\(s\), "
                       r"Metadata names \[0, 1\]"):
        consume_all(broker.bootstrap, topic, 2, partitions=3)


def test_a_short_read_says_what_each_partition_gave(broker, topic_factory, capsys):
    """A read that ends short prints, per partition, what it got and the high watermark a
    plain Fetch reports: a partition that gave nothing while the broker holds records is
    told apart from records never stored."""
    topic = topic_factory(2)
    _write(broker.bootstrap, topic, {0: 3})
    got = consume_all(broker.bootstrap, topic, expected=5, timeout=1)
    assert len(got) == 3
    said = capsys.readouterr().err
    assert f"consume_all({topic!r}): 3 of 5 record(s)" in said, said
    assert "partition 0: 3 record(s) from offset 0; high watermark 3 by Fetch" in said, said
    assert "partition 1: 0 record(s) (nothing); high watermark 0 by Fetch" in said, said
