"""`aioproducer consume` and `aioproducer topic create`, run as a user runs them, and the read
path under them (RecordBatch decoding, Fetch), held to what librdkafka wrote."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Producer as LibrdkafkaProducer
from confluent_kafka.admin import AdminClient

from aioproducer.config import ProducerConfig
from aioproducer.protocol.compression import Codec
from aioproducer.protocol.records import read_batches, visible_records
from aioproducer.tools.reader import TopicReader
from tests.support.ports import free_port
from tests.support.processes import start_interruptible
from tests.support.readback import _fetch_v4, consume_all, fetch_until
_FETCH = 1  # (its API key, as the proxy records requests written)

# What librdkafka writes: headers (duplicate names, a null value, bytes), null and empty keys
# and values.
RECORDS = [
    (b"k0", b"v0", [("h", b"1"), ("h", b"2")]),
    (None, b"no key", []),
    (b"k2", None, [("nothing", None)]),
    (b"", b"", [("bytes", b"\x00\xff")]),
    (b"\xff\xfe", b"\x00\x80 not utf-8", []),
]


def cli(*args: str, stdin: str | bytes = "", timeout: float = 45) -> subprocess.CompletedProcess:
    """`python -m aioproducer ...`; text in and out, or bytes when stdin is bytes."""
    return subprocess.run([sys.executable, "-m", "aioproducer", *args], input=stdin,
                          capture_output=True, text=isinstance(stdin, str), timeout=timeout)


def librdkafka_produce(bootstrap: str, topic: str, records, partition: int = 0,
                       **settings: object) -> None:
    producer = LibrdkafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, **settings})
    for key, value, headers in records:
        producer.produce(topic, value=value, key=key, headers=headers, partition=partition)
    assert producer.flush(20) == 0


def _headers(headers) -> list:
    return [(name, value) for name, value in headers]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_the_reader_decodes_what_librdkafka_wrote(broker, topic, codec):
    librdkafka_produce(broker.bootstrap, topic, RECORDS * 3, **{"compression.type": codec})
    _, raw = _fetch_v4(broker.bootstrap, topic, 0, 0)
    assert {batch.codec for batch in read_batches(raw)} == {Codec[codec.upper()]}

    config = ProducerConfig.from_properties({"bootstrap.servers": broker.bootstrap})
    got = []
    async with TopicReader(config, topic, from_beginning=True) as reader:
        got += await fetch_until(reader, len(RECORDS) * 3)
    assert [(r.offset, r.key, r.value, _headers(r.headers)) for r in got] == \
        [(offset, key, value, headers)
         for offset, (key, value, headers) in enumerate(RECORDS * 3)]
    assert reader.positions == {0: len(RECORDS) * 3}


async def test_the_reader_from_the_beginning_starts_at_offset_0(proxied_broker):
    """Tansu 0.6 answers ListOffsets EARLIEST with the batch stored first in time, which is
    not the first batch where producers write a partition at once: `consume
    --from-beginning` started there and skipped the records before. Here every ListOffsets
    answer names offset 5: the reader still reads from offset 0."""
    from kafka.protocol.consumer import ListOffsetsResponse

    topic = f"t-{uuid.uuid4().hex[:12]}"
    proxied_broker.create_topic(topic, 1)
    librdkafka_produce(proxied_broker.bootstrap, topic, RECORDS * 2)

    def later(response):
        for answer in response.topics[0].partitions:
            answer.offset = 5
        return response
    proxied_broker.proxy.rewrite_responses(ListOffsetsResponse, later)
    config = ProducerConfig.from_properties({"bootstrap.servers": proxied_broker.bootstrap})
    got = []
    async with TopicReader(config, topic, from_beginning=True) as reader:
        got += await fetch_until(reader, len(RECORDS) * 2)
    assert [(r.offset, r.key, r.value) for r in got] == \
        [(offset, key, value) for offset, (key, value, _) in enumerate(RECORDS * 2)]


def test_consume_prints_what_librdkafka_wrote_as_json_lines(broker, topic):
    librdkafka_produce(broker.bootstrap, topic, RECORDS, **{"compression.type": "zstd"})
    done = cli("consume", topic, "--bootstrap-servers", broker.bootstrap, "--from-beginning",
               "--max", str(len(RECORDS)), "--format", "json", "--metadata")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]

    def text(data: bytes | None) -> str | None:
        return None if data is None else data.decode("utf-8", "surrogateescape")

    assert [(line["partition"], line["offset"]) for line in lines] == \
        [(0, offset) for offset in range(len(RECORDS))]
    assert [(line["key"], line["value"], line["headers"]) for line in lines] == \
        [(text(key), text(value), [[name, text(v)] for name, v in headers])
         for key, value, headers in RECORDS]
    assert f"{len(RECORDS)} records consumed from {topic}" in done.stderr


def test_produce_then_consume_round_trips(broker, topic_factory):
    """What consume prints, produce takes back: lines with keys, and json lines with
    headers, null keys and values, and bytes that are not UTF-8."""
    lines_topic, copy = topic_factory(1), topic_factory(1)
    text = "k1:one\nk2:two\n:no key\nk4:a:b\n"
    assert cli("produce", lines_topic, "--bootstrap-servers", broker.bootstrap,
               "--key-separator", ":", stdin=text).returncode == 0
    done = cli("consume", lines_topic, "--bootstrap-servers", broker.bootstrap,
               "--from-beginning", "--max", "4", "--key-separator", ":")
    assert (done.returncode, done.stdout) == (0, text), done.stderr

    source = topic_factory(1)
    librdkafka_produce(broker.bootstrap, source, RECORDS)
    printed = cli("consume", source, "--bootstrap-servers", broker.bootstrap,
                  "--from-beginning", "--max", str(len(RECORDS)), "--format", "json")
    assert printed.returncode == 0, printed.stderr
    done = cli("produce", copy, "--bootstrap-servers", broker.bootstrap, "--format", "json",
               stdin=printed.stdout)
    assert done.returncode == 0, done.stderr
    got = consume_all(broker.bootstrap, copy, expected=len(RECORDS))
    assert [(r.key, r.value, r.headers) for r in got] == [
        (key, value, headers) for key, value, headers in RECORDS]


def test_consume_without_from_beginning_prints_only_new_records(broker, topic):
    librdkafka_produce(broker.bootstrap, topic, [(None, b"old", [])] * 3)
    consume = subprocess.Popen(
        [sys.executable, "-m", "aioproducer", "consume", topic, "--bootstrap-servers",
         broker.bootstrap, "--max", "2", "--timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        started = consume.stderr.readline().decode()
        assert f"reading {topic} from the latest offsets: partition 0 at 3" in started, started
        librdkafka_produce(broker.bootstrap, topic, [(None, b"new 1", []), (None, b"new 2", [])])
        out, err = consume.communicate(timeout=30)
    finally:
        if consume.poll() is None:
            consume.kill()
            consume.wait(10)
        consume.stdout.close()  # (communicate() closed them, unless an assertion came first)
        consume.stderr.close()
    assert (consume.returncode, out) == (0, b"new 1\nnew 2\n"), err


def test_consume_into_a_pipe_its_reader_closes_early_ends_quietly(broker, topic):
    """`aioproducer consume TOPIC | head -3`: the reader takes 3 lines and closes the pipe.
    consume ends with 0 and says nothing more, as Unix tools do: what the reader got is not
    what was written into the pipe (its buffer holds many records more). It said "1006
    records consumed" though the reader had 3. (2 MB of records: more than a pipe holds,
    so consume is still writing when the reader leaves.)"""
    filler = b" " + b"x" * 1000
    librdkafka_produce(broker.bootstrap, topic, [(None, b"record %d" % i + filler, [])
                                                 for i in range(2000)])
    consume = subprocess.Popen(
        [sys.executable, "-m", "aioproducer", "consume", topic, "--bootstrap-servers",
         broker.bootstrap, "--from-beginning", "--timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = [consume.stdout.readline() for _ in range(3)]
        consume.stdout.close()  # (as head exits)
        err = consume.stderr.read().decode()
        consume.wait(30)
    finally:
        if consume.poll() is None:
            consume.kill()
            consume.wait(10)
        consume.stdout.close()
        consume.stderr.close()
    assert lines == [b"record %d%s\n" % (i, filler) for i in range(3)]
    assert consume.returncode == 0, err
    assert err.splitlines() == [f"reading {topic} from the earliest offsets: partition 0 at 0"]


def test_consume_stops_after_max_or_timeout_and_reads_one_partition(broker, topic_factory):
    topic = topic_factory(3)
    for partition in range(3):
        librdkafka_produce(broker.bootstrap, topic,
                           [(None, f"p{partition}-{i}".encode(), []) for i in range(3)],
                           partition=partition)
    done = cli("consume", topic, "--bootstrap-servers", broker.bootstrap, "--from-beginning",
               "--partition", "1", "--timeout", "1", "--metadata")
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]  # partition offset time value
    assert [(p, o, v) for p, o, _, v in rows] == [("1", str(i), f"p1-{i}") for i in range(3)]
    done = cli("consume", topic, "--bootstrap-servers", broker.bootstrap, "--from-beginning",
               "--max", "4")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 4 and "4 records consumed" in done.stderr


def test_consume_skips_transaction_markers_and_read_committed_hides_open_transactions(
        broker, topic):
    producer = LibrdkafkaProducer({"bootstrap.servers": broker.bootstrap,
                                   "transactional.id": f"cli-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(20)
    producer.begin_transaction()
    for value in (b"committed 1", b"committed 2"):
        producer.produce(topic, value, partition=0)
    producer.commit_transaction(20)
    producer.begin_transaction()
    producer.produce(topic, b"still open", partition=0)
    assert producer.flush(20) == 0
    try:
        uncommitted = cli("consume", topic, "--bootstrap-servers", broker.bootstrap,
                          "--from-beginning", "--timeout", "1")
        committed = cli("consume", topic, "--bootstrap-servers", broker.bootstrap,
                        "--from-beginning", "--timeout", "1", "--isolation", "read_committed")
    finally:
        producer.abort_transaction(20)
    # The COMMIT marker at offset 2 is no record: it is not printed.
    assert uncommitted.stdout == "committed 1\ncommitted 2\nstill open\n", uncommitted.stderr
    assert committed.stdout == "committed 1\ncommitted 2\n", committed.stderr


def test_read_committed_on_the_embedded_broker_warns_once_that_aborts_show(broker, topic):
    """Tansu's Fetch never lists aborted transactions: read_committed cannot hide their
    records there, and consume says so, once; on Kafka it says nothing."""
    producer = LibrdkafkaProducer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, b"v")
    assert producer.flush(20) == 0
    done = cli("consume", topic, "--bootstrap-servers", broker.bootstrap, "--from-beginning",
               "--timeout", "1", "--isolation", "read_committed")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("still shows aborted records") == (1 if broker.is_embedded else 0)
    plain = cli("consume", topic, "--bootstrap-servers", broker.bootstrap, "--from-beginning",
                "--timeout", "1")
    assert "aborted" not in plain.stderr


def test_read_committed_drops_aborted_transactions_as_a_fetch_lists_them(broker, topic):
    """Tansu's Fetch never lists aborted transactions (tansu.md), so this feeds the decoder
    the list Kafka would send, over the batches librdkafka wrote: one producer commits a
    transaction, aborts the next, then commits a third."""
    producer = LibrdkafkaProducer({"bootstrap.servers": broker.bootstrap,
                                   "transactional.id": f"cli-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(20)
    for values, commit in (((b"a1", b"a2"), True), ((b"b1", b"b2"), False), ((b"c1",), True)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, partition=0)
        producer.flush(20)
        (producer.commit_transaction if commit else producer.abort_transaction)(20)
    _, raw = _fetch_v4(broker.bootstrap, topic, 0, 0)
    batches = read_batches(raw)
    assert [b.control_type for b in batches if b.is_control] == ["COMMIT", "ABORT", "COMMIT"]
    [aborted_first] = [r.offset for b in batches for r in b.records if r.value == b"b1"]
    producer_id = batches[0].producer_id

    assert [r.value for r in visible_records(batches, [(producer_id, aborted_first)])] == \
        [b"a1", b"a2", b"c1"]
    assert [r.value for r in visible_records(batches)] == [b"a1", b"a2", b"b1", b"b2", b"c1"]


def test_consume_of_a_topic_that_does_not_exist_says_so_and_creates_nothing(broker):
    name = f"t-{uuid.uuid4().hex[:12]}"
    for _ in range(2):  # the second run finds no topic either: the first created none
        done = cli("consume", name, "--bootstrap-servers", broker.bootstrap, "--timeout", "1")
        assert done.returncode == 1
        assert f"topic {name!r} does not exist" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_produce_to_a_topic_that_does_not_exist_says_what_it_waits_for(broker):
    """On a cluster that creates no topics, the first record waits max.block.ms (a minute by
    default) for the topic's metadata: that passed in silence, then the error came. After 2 s
    a line says what it waits for (the same on Kafka 4.4 with auto.create.topics.enable=false:
    60.2 s of silence before)."""
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    done = cli("produce", topic, "--bootstrap-servers", broker.bootstrap, "--producer-props",
               "allow.auto.create.topics=false", "max.block.ms=4000", stdin="hello\n")
    assert done.returncode == 1
    said = done.stderr.splitlines()
    assert said[0] == (f"aioproducer produce: waiting for topic '{topic}' in the cluster's "
                       "metadata (up to max.block.ms=4000): does it exist? (aioproducer topic "
                       f"create {topic} --partitions N ...)"), done.stderr
    assert f"topic '{topic}' is not in the cluster's metadata after max_block_ms=4000" in \
        done.stderr


def test_consume_of_a_partition_that_does_not_exist_says_which_there_are(broker, topic):
    done = cli("consume", topic, "--bootstrap-servers", broker.bootstrap, "--partition", "3")
    assert done.returncode == 1
    assert f"topic {topic!r} has partitions 0 to 0: there is no partition 3" in done.stderr


def test_consume_from_an_unreachable_broker_fails_with_the_reason():
    port = free_port()
    done = cli("consume", "t", "--bootstrap-servers", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_consume_stops_on_ctrl_c_and_says_how_many(broker, topic):
    librdkafka_produce(broker.bootstrap, topic, [(None, b"one", [])])
    consume = start_interruptible(
        [sys.executable, "-m", "aioproducer", "consume", topic, "--bootstrap-servers",
         broker.bootstrap, "--from-beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert b"reading" in consume.stderr.readline()
        assert consume.stdout.readline() == b"one\n"
        consume.send_signal(signal.SIGINT)
        assert consume.wait(20) == 130
        assert b"1 record consumed" in consume.stderr.read()
    finally:
        if consume.poll() is None:
            consume.kill()
            consume.wait(10)
        consume.stdout.close()
        consume.stderr.close()


def test_topic_create_makes_the_partitions_asked_for(broker):
    name = f"t-{uuid.uuid4().hex[:12]}"
    done = cli("topic", "create", name, "--partitions", "3", "--bootstrap-servers",
               broker.bootstrap, "--config", "retention.ms=86400000")
    assert done.returncode == 0, done.stderr
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(name, timeout=10)
    assert sorted(metadata.topics[name].partitions) == [0, 1, 2]
    librdkafka_produce(broker.bootstrap, name, [(None, b"to the last", [])], partition=2)
    done = cli("consume", name, "--bootstrap-servers", broker.bootstrap, "--from-beginning",
               "--max", "1", "--metadata")
    assert done.stdout.split("\t")[0] == "2" and done.stdout.endswith("\tto the last\n")


def test_topic_create_of_a_topic_that_exists_fails_unless_asked_not_to(broker, topic):
    done = cli("topic", "create", topic, "--partitions", "1", "--bootstrap-servers",
               broker.bootstrap)
    assert done.returncode == 1 and f"topic {topic!r} already exists" in done.stderr
    done = cli("topic", "create", topic, "--partitions", "1", "--if-not-exists",
               "--bootstrap-servers", broker.bootstrap)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args, says", [
    (("consume", "t", "--max", "0"), "--max must be at least 1"),
    (("consume", "t", "--timeout", "0"), "--timeout must be more than 0 seconds"),
    (("consume", "t", "--partition", "-1"), "--partition must be at least 0"),
    (("consume", "t", "--format", "json", "--key-separator", ":"),
     "--key-separator applies to --format lines"),
    (("consume", "t", "--isolation", "committed"), "invalid choice: 'committed'"),
    (("consume", "t"), "no broker to connect to"),
    (("topic", "create", "t", "--partitions", "0"), "--partitions must be at least 1"),
    (("topic", "create", "t"), "the following arguments are required: --partitions"),
    (("topic", "create", "a b", "--partitions", "1"), "invalid topic name 'a b'"),
    (("topic", "create", "t", "--partitions", "1", "--replication-factor", "0"),
     "--replication-factor must be at least 1"),
    (("topic", "create", "t", "--partitions", "1", "--config", "retention.ms"),
     "--config takes KEY=VALUE, not 'retention.ms'"),
    (("topic",), "the following arguments are required: topic_command"),
])
def test_bad_arguments_are_refused_before_connecting(args, says):
    connect = () if args in (("consume", "t"), ("topic",)) else \
        ("--bootstrap-servers", "127.0.0.1:1")
    done = cli(*args, *connect)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


async def test_the_reader_goes_on_after_its_connection_is_cut(proxied_broker, caplog):
    """Each record once and in order, across a lost connection (retried after a backoff,
    with a warning)."""
    topic = f"t-{uuid.uuid4().hex[:12]}"
    proxied_broker.create_topic(topic, 1)
    librdkafka_produce(proxied_broker.bootstrap, topic, [(None, b"before %d" % i, [])
                                                         for i in range(3)])
    config = ProducerConfig.from_properties({"bootstrap.servers": proxied_broker.bootstrap})
    got = []
    async with TopicReader(config, topic, from_beginning=True) as reader:
        got += await fetch_until(reader, 3, max_wait=0.2)
        proxied_broker.proxy.cut_all()
        librdkafka_produce(proxied_broker.bootstrap, topic, [(None, b"after %d" % i, [])
                                                             for i in range(3)])
        got += await fetch_until(reader, 6 - len(got), max_wait=0.2, rounds=40)
    assert [(r.offset, r.value) for r in got] == \
        [(i, b"before %d" % i) for i in range(3)] + [(3 + i, b"after %d" % i) for i in range(3)]
    assert f"reading {topic}: " in caplog.text and "(retrying)" in caplog.text


async def test_the_reader_waits_for_a_leader_not_ready_yet(proxied_broker, caplog):
    """Just after a topic grows, Kafka may answer ListOffsets with NOT_LEADER_OR_FOLLOWER
    for a partition whose leader is not ready (seen at 10,000 partitions): the reader
    retries it after fresh metadata, with a warning, and reads every record written after
    it started. (A read from the latest offset: one from the beginning asks no ListOffsets.)"""
    from kafka.protocol.consumer import ListOffsetsResponse

    topic = f"t-{uuid.uuid4().hex[:12]}"
    proxied_broker.create_topic(topic, 2)
    refused: list[int] = []

    def not_ready(response):
        if len(refused) >= 2:
            return None
        refused.append(1)
        for answer in response.topics[0].partitions:
            if answer.partition_index == 1:
                answer.error_code = 6  # NOT_LEADER_OR_FOLLOWER
        return response
    proxied_broker.proxy.rewrite_responses(ListOffsetsResponse, not_ready)
    config = ProducerConfig.from_properties({"bootstrap.servers": proxied_broker.bootstrap})
    got = []
    async with TopicReader(config, topic) as reader:
        for partition in (0, 1):
            librdkafka_produce(proxied_broker.bootstrap, topic,
                               [(None, b"v%d" % partition, [])], partition=partition)
        got += await fetch_until(reader, 2, max_wait=0.2)
    assert len(refused) == 2
    assert sorted((r.partition, r.value) for r in got) == [(0, b"v0"), (1, b"v1")]
    assert "NOT_LEADER_OR_FOLLOWER" in caplog.text and "(retrying)" in caplog.text


def test_consume_timeout_holds_when_the_broker_goes_silent(proxied_broker):
    """--timeout ends the command even while a Fetch waits for a broker that stopped
    answering (whose request timeout, 30 s, is far longer), once it answered a first one."""
    topic = f"t-{uuid.uuid4().hex[:12]}"
    proxied_broker.create_topic(topic, 1)
    proxy = proxied_broker.proxy
    consume = subprocess.Popen(
        [sys.executable, "-m", "aioproducer", "consume", topic, "--bootstrap-servers",
         proxied_broker.bootstrap, "--timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert b"reading" in consume.stderr.readline()
        deadline = time.monotonic() + 20
        while sum(key == _FETCH for key, _ in proxy.written) < 2 and \
                time.monotonic() < deadline:  # (the second is written once the first is answered)
            time.sleep(0.01)
        proxy.stall(True)
        assert consume.wait(20) == 0  # (less than the request timeout)
        assert b"0 records consumed" in consume.stderr.read()
    finally:
        proxy.stall(False)
        if consume.poll() is None:
            consume.kill()
            consume.wait(10)
        consume.stdout.close()
        consume.stderr.close()


# A properties file as Java reads it (checked against java.util.Properties.load): every
# separator, continuations, escapes and both comment characters.
JAVA_PROPERTIES = (
    "a=1\n  b : 2  \nc 3\nd\\ e=4\\\n   continued\\\\\nf=x\\\\\\\n  y\n# comment \\\n! bang\n"
    "g=\\u0041\\t\\q\nh:=:v\ni   =  \nj\nk\\:z=1\nl\\=m:2\n  \\\n  n=3\n"
    "sasl.password hunter2:SECRET\nlast=end\\\n")
JAVA_READS = {"a": "1", "b": "2  ", "c": "3", "d e": "4continued\\", "f": "x\\y", "g": "A\tq",
              "h": "=:v", "i": "", "j": "", "k:z": "1", "l=m": "2", "n": "3",
              "sasl.password": "hunter2:SECRET", "last": "end"}


def test_properties_files_are_read_as_java_reads_them():
    from aioproducer.cli import read_properties
    assert {key: value for _, key, value in read_properties(JAVA_PROPERTIES)} == JAVA_READS


def test_properties_agree_with_java_itself(tmp_path):
    """The same file through java.util.Properties (a single-file Java program)."""
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java to compare with")
    source = tmp_path / "Load.java"
    source.write_text(
        "import java.io.*; import java.util.*;\n"
        "public class Load { public static void main(String[] a) throws Exception {\n"
        "  Properties p = new Properties();\n"
        "  p.load(new InputStreamReader(new FileInputStream(a[0]), \"UTF-8\"));\n"
        "  for (String k : p.stringPropertyNames()) System.out.print(k + \"\\0\" + "
        "p.getProperty(k) + \"\\0\");\n}}\n")
    (tmp_path / "t.properties").write_text(JAVA_PROPERTIES)
    done = subprocess.run([java, str(source), str(tmp_path / "t.properties")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fields = done.stdout.split("\0")[:-1]
    assert dict(zip(fields[::2], fields[1::2])) == JAVA_READS


SECRET = "hunter2-SECRET"


@pytest.mark.parametrize("content, line", [
    (f"linger.ms=5\n{SECRET}\n", 2),  # no separator: the whole line is a key
    (f"sasl.password{SECRET}\n", 1),  # the separator forgotten
    (f"# c\nsasl.jaas.config=a \\\n  {SECRET} \\\n  \\u00zz\n", 2),  # a broken \\u escape
])
@pytest.mark.parametrize("command", [
    ("produce", "t", "--producer.config"),
    ("consume", "t", "--command-config"),
    ("topic", "create", "t", "--partitions", "1", "--command-config"),
])
def test_a_bad_properties_line_is_named_by_its_number_never_its_text(tmp_path, content, line,
                                                                     command):
    path = tmp_path / "client.properties"
    path.write_text(content)
    done = cli(*command, str(path), "--bootstrap-servers", "127.0.0.1:1")
    assert done.returncode == 1 and f"line {line}" in done.stderr, done.stderr
    assert "SECRET" not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_a_client_properties_file_shared_with_consumers_works_and_other_clients_names_are_told(
        broker, tmp_path):
    """The client.properties every client shares (a consumer's and Schema Registry's lines
    in it): they are skipped with one warning, as librdkafka does, and the records are sent.
    Lines of other clients' settings are refused by line number with the name and what to
    do, all at once, never a value; a key not known anywhere stays unshown. It refused the
    first such line with "line 3: not a known setting" and nothing more."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    broker.create_topic(name, 1)
    path = tmp_path / "client.properties"
    path.write_text(f"bootstrap.servers={broker.bootstrap}\nacks=all\n"
                    "session.timeout.ms=45000\ngroup.id=orders\n"
                    "schema.registry.url=https://sr.example\n")
    done = cli("produce", name, "--producer.config", str(path), stdin="one\ntwo\n")
    assert done.returncode == 0, done.stderr
    assert "ignoring session.timeout.ms, group.id, schema.registry.url" in done.stderr
    assert [r.value for r in consume_all(broker.bootstrap, name, 2)] == [b"one", b"two"]
    path.write_text(f"bootstrap.servers={broker.bootstrap}\n"
                    f"sasl.jaas.config=PlainLoginModule required password='{SECRET}';\n"
                    f"client.dns.lookup=use_all_dns_ips\nsasl.password{SECRET}\n")
    done = cli("produce", name, "--producer.config", str(path), stdin="x\n")
    assert done.returncode == 1, done.stderr
    assert "line 2: unknown setting 'sasl.jaas.config': not needed (the JAAS line's username " \
        "and password go in sasl.username and sasl.password)" in done.stderr, done.stderr
    assert "line 3: unknown setting 'client.dns.lookup': not needed" in done.stderr, done.stderr
    assert "line 4: not a known setting (the line is not shown" in done.stderr, done.stderr
    assert "SECRET" not in done.stderr + done.stdout
    # (consume reads: a consumer's isolation.level and auto.offset.reset are not skipped
    # there, but pointed to its options)
    path.write_text(f"bootstrap.servers={broker.bootstrap}\nisolation.level=read_committed\n"
                    "auto.offset.reset=earliest\n")
    done = cli("consume", name, "--command-config", str(path), "--from-beginning", "--max", "1")
    assert done.returncode == 1 and "line 2: isolation.level is consume's --isolation here" \
        in done.stderr, done.stderr
    assert "line 3: auto.offset.reset is consume's --from-beginning (earliest; latest without " \
        "it) here" in done.stderr, done.stderr


def test_properties_with_java_separators_work_for_every_command(broker, tmp_path):
    """`key value` and `key: value` lines, a value continued over lines, and a password
    holding `:` (which was cut at it, and shown in the error)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    path = tmp_path / "client.properties"
    host, port = broker.bootstrap.split(",")[0].rsplit(":", 1)
    path.write_text(f"bootstrap.servers {host}:\\\n    {port}\nclient.id: cli-test\n"
                    "linger.ms 5\n")
    done = cli("topic", "create", name, "--partitions", "1", "--command-config", str(path))
    assert done.returncode == 0, done.stderr
    done = cli("produce", name, "--producer.config", str(path), stdin="one\ntwo\n")
    assert done.returncode == 0, done.stderr
    done = cli("consume", name, "--command-config", str(path), "--from-beginning", "--max", "2")
    assert done.returncode == 0 and done.stdout == "one\ntwo\n", done.stderr
    path.write_text(f"bootstrap.servers={broker.bootstrap}\nsasl.password   pass:{SECRET}\n")
    done = cli("produce", name, "--producer.config", str(path), stdin="x\n")
    # The password is read whole (and, without SASL, refused as a setting that would be
    # ignored): never cut at its `:` into an unknown setting that shows part of it.
    assert "SECRET" not in done.stderr and "unknown setting" not in done.stderr, done.stderr


def test_perf_runs_without_tqdm(broker):
    """tqdm is the `cli` extra, not a dependency of the producer: without it, perf prints
    its summary (and says where the live bar comes from) instead of an ImportError."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    blocked = ("import sys; sys.modules['tqdm'] = None; from aioproducer.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", blocked, "perf", "--topic", name,
                           "--num-records", "3000", "--bootstrap-servers", broker.bootstrap],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "3000 records sent" in done.stdout and "aioproducer[cli]" in done.stderr


def test_the_package_does_not_need_tqdm():
    from importlib.metadata import requires
    core = [r for r in requires("aioproducer") or [] if "extra ==" not in r]
    assert not [r for r in core if r.startswith("tqdm")]


def test_consume_timeout_counts_from_the_first_fetch_s_answer(proxied_broker):
    """A first Fetch answered late (a loaded machine, a broker busy starting) must not end
    `consume --timeout 1` before it printed what was there: its quiet time began before the
    first fetch, and the command exited with "0 records consumed" while the broker held
    three. Here the proxy holds the first Fetch answer for 2 s."""
    from kafka.protocol.consumer import FetchResponse

    topic = f"t-{uuid.uuid4().hex[:12]}"
    proxied_broker.create_topic(topic, 1)
    values = [f"record {i}" for i in range(3)]
    librdkafka_produce(proxied_broker.bootstrap, topic,
                       [(None, value.encode(), []) for value in values])
    held = []

    def slow_first(response):
        if not held:
            held.append(response)
            time.sleep(2)  # (the proxy's own thread: this connection's answers wait)
        return None  # forwarded as it came
    proxied_broker.proxy.rewrite_responses(FetchResponse, slow_first)
    done = cli("consume", topic, "--bootstrap-servers", proxied_broker.bootstrap,
               "--from-beginning", "--timeout", "1")
    assert held, "no Fetch answered"
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == values
    assert "3 records consumed" in done.stderr
