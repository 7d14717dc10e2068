"""The `aioproducer` command.

- `aioproducer broker`: the embedded dev broker in the foreground.
- `aioproducer produce TOPIC`: records from stdin or a file, like `kcat -P`.
- `aioproducer consume TOPIC`: records to stdout, in the formats `produce` reads, like
  kafka-console-consumer (no consumer group: every partition, from its earliest or latest
  offset), so a user can check what landed without another client.
- `aioproducer topic create NAME`: a topic, with its partitions and settings.
- `aioproducer perf`: a load test in the spirit of Kafka's kafka-producer-perf-test.

Producer settings come from `--producer-props KEY=VALUE ...` and/or `--producer.config FILE`
(a Java properties file), with Kafka's dotted names or ours; `consume` and `topic` take the
connection's (TLS, SASL, client.id) from `--command-config FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import signal
import stat
import string
import sys
import time
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, BinaryIO, Callable, \
    Sequence

from ._version import __version__
from .config import _NOT_A_PRODUCERS, ProducerConfig, _setting_names, other_clients_setting
from .errors import (
    InvalidRecordError,
    InvalidTopicError,
    KafkaError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
)
from ._internal.arguments import check_topic_name
from ._internal.batch import RecordFuture
from .client import cluster
from .producer import Producer
from .testing.broker import EmbeddedBrokerError
from .tools.admin import create_topic
from .tools.reader import ConsumedRecord, IsolationLevel, TopicReader


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aioproducer", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"aioproducer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="run the embedded dev broker until Ctrl-C")
    broker.add_argument("--port", type=int, default=9092,
                        help="listen on 127.0.0.1 at this port (default: %(default)s)")

    produce = commands.add_parser("produce", help="produce records read from stdin or a file")
    produce.add_argument("topic")
    produce.add_argument("--file", help="read from this file instead of stdin")
    produce.add_argument("--format", choices=("lines", "json"), default="lines",
                         help="lines: one value per line; json: one object per line with "
                              "value, and optionally key, headers, partition")
    produce.add_argument("--key-separator",
                         help="with lines: split each line into KEY<sep>VALUE at the first sep")
    _add_connection_options(produce, help="default: bootstrap.servers of the producer settings")

    consume = commands.add_parser(
        "consume", help="print a topic's records (no consumer group: all its partitions)")
    consume.add_argument("topic")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at each partition's earliest offset (default: its latest, "
                              "i.e. only records that arrive from now on)")
    consume.add_argument("--max", type=int, metavar="N", help="exit after N records")
    consume.add_argument("--timeout", type=float, metavar="SECONDS",
                         help="exit after SECONDS with no new record, counted from the "
                              "broker's first answer (default: wait for more until Ctrl-C)")
    consume.add_argument("--partition", type=int, metavar="P",
                         help="only this partition (default: all)")
    consume.add_argument("--isolation", choices=("read_uncommitted", "read_committed"),
                         default="read_uncommitted",
                         help="read_committed: only committed transactions' records "
                              "(default: %(default)s)")
    consume.add_argument("--format", choices=("lines", "json"), default="lines",
                         help="lines: one value per line; json: one object per line with "
                              "key, value and headers (as `produce --format json` reads)")
    consume.add_argument("--key-separator",
                         help="with lines: print KEY<sep>VALUE (as `produce --key-separator` "
                              "reads)")
    consume.add_argument("--metadata", action="store_true",
                         help="also print each record's partition, offset and timestamp "
                              "(lines: tab-separated before the record; json: as fields)")
    _add_client_options(consume)

    topic = commands.add_parser("topic", help="manage topics")
    topic_commands = topic.add_subparsers(dest="topic_command", required=True)
    create = topic_commands.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, required=True)
    create.add_argument("--replication-factor", type=int, default=-1,
                        help="copies of each partition (default: the broker's default)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic setting (retention.ms=86400000, ...); may be repeated")
    create.add_argument("--if-not-exists", action="store_true",
                        help="succeed if the topic exists already")
    _add_client_options(create)

    perf = commands.add_parser("perf", help="produce records as fast as asked; report speed")
    perf.add_argument("--topic", default="perf-test", help="default: %(default)s")
    perf.add_argument("--partitions", type=int, default=6,
                      help="partitions of the topic when this command starts its own broker "
                           "(default: %(default)s)")
    perf.add_argument("--num-records", type=int, default=1_000_000,
                      help="default: %(default)s")
    perf.add_argument("--record-size", type=int, default=100,
                      help="bytes of each record's value (random, no key; default: %(default)s)")
    perf.add_argument("--throughput", type=float, default=-1,
                      help="records per second at most (-1: no limit)")
    perf.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_connection_options(perf, help="default: bootstrap.servers of the producer settings, "
                                       "else start an embedded broker")

    args = parser.parse_args(argv)
    if args.command == "consume":
        _check_consume_arguments(consume, args)
    if args.command == "topic":
        _check_create_arguments(create, args)
    if args.command == "perf":
        for option, value, least in (("--num-records", args.num_records, 1),
                                     ("--record-size", args.record_size, 0),
                                     ("--partitions", args.partitions, 1)):
            if value < least:
                perf.error(f"{option} must be at least {least}")
    if args.command == "broker" and not 0 < args.port < 65536:
        broker.error("--port must be from 1 to 65535")
    if args.command == "produce" and args.key_separator is not None:
        if args.format != "lines":
            produce.error("--key-separator applies to --format lines (json lines have \"key\")")
        if not args.key_separator:
            produce.error("--key-separator must not be empty")
    try:
        if args.command == "broker":
            return _run_broker(args.port)
        properties = _properties(args)
        if args.command == "perf":
            # The settings checked before a broker is started for them (its address aside).
            ProducerConfig.from_properties({"bootstrap.servers": "127.0.0.1:9092", **properties})
            return asyncio.run(_perf(args, properties))
        if args.command in ("consume", "topic"):
            if "bootstrap.servers" not in properties:
                (consume if args.command == "consume" else create).error(
                    "no broker to connect to: give --bootstrap-servers HOST:PORT, or "
                    "bootstrap.servers in --command-config")
            config = ProducerConfig.from_properties(properties)
            if args.command == "consume":
                return asyncio.run(_consume(args, config))
            return asyncio.run(_create_topic(args, config))
        if "bootstrap.servers" not in properties:
            produce.error("no broker to produce to: give --bootstrap-servers HOST:PORT, or "
                          "bootstrap.servers in --producer.config or --producer-props")
        return asyncio.run(_produce(args, properties))
    except (KafkaError, ValueError, OSError, EmbeddedBrokerError) as exc:
        print(f"aioproducer {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:  # (SIGTERM's: see _stop_on_sigterm)
        return 128 + signal.SIGTERM


def _add_connection_options(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--bootstrap-servers", help=help)
    parser.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE",
                        type=_key_value,
                        help="producer settings: Kafka names (linger.ms=5) or ours (linger_ms=5)")
    parser.add_argument("--producer.config", dest="producer_config", metavar="FILE",
                        help="a properties file of producer settings")


def _key_value(text: str) -> str:
    """A --producer-props item. The list takes every word after it, the topic too when it
    comes next (`--producer-props acks=1 orders`): argparse then said only that the topic was
    missing."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE (the list takes every word after it: put a topic "
            "before --producer-props)")
    return text


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers",
                        help="default: bootstrap.servers of --command-config")
    parser.add_argument("--command-config", dest="producer_config", metavar="FILE",
                        help="a properties file of client settings (bootstrap.servers, "
                             "security.protocol, ssl.*, sasl.*, client.id, ...)")


# A consumer's settings consume takes as options (it reads with no group: group.id and the
# like are skipped, as for a producer).
_CONSUME_OPTIONS = {"isolation_level": "--isolation",
                    "auto_offset_reset": "--from-beginning (earliest; latest without it)"}


def _properties(args: argparse.Namespace) -> dict[str, str]:
    """The producer settings, dotted; --bootstrap-servers wins over a bootstrap.servers in them."""
    raw: dict[str, str] = {}
    if args.producer_config:
        with open(args.producer_config, encoding="utf-8") as f:
            text = f.read()
        known = _setting_names()
        refused = []
        for number, name, value in read_properties(text, args.producer_config):
            setting = name.replace(".", "_").replace("-", "_")
            if setting in _CONSUME_OPTIONS and args.command == "consume":
                refused.append(f"line {number}: {name} is consume's "
                               f"{_CONSUME_OPTIONS[setting]} here")
                continue
            if setting in known or setting in _NOT_A_PRODUCERS:
                raw[name] = value  # (a consumer's: from_properties() skips it, saying so)
                continue
            # Another client's setting is named; else only the line's number: a line whose
            # separator went missing holds the value in its key (`sasl.passwordhunter2`),
            # and values may be secrets.
            refused.append(f"line {number}: " + (
                other_clients_setting(name) or
                "not a known setting (the line is not shown: it may hold a secret)"))
        if refused:  # all at once: a file is not fixed one run per line
            raise ValueError(f"{args.producer_config} " + f"\n{args.producer_config} ".join(
                refused))
    for prop in getattr(args, "producer_props", ()):
        name, _, value = prop.partition("=")  # (each has one: _key_value)
        raw[name.strip()] = value
    raw = {name.replace("_", ".").replace("-", "."): value for name, value in raw.items()}
    if args.bootstrap_servers:
        raw["bootstrap.servers"] = args.bootstrap_servers
    return raw


_BLANK = " \t\f"  # java.util.Properties' whitespace
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def read_properties(text: str, source: str = "properties") -> list[tuple[int, str, str]]:
    """(line number, key, value) of each entry of a Java properties file, parsed as
    java.util.Properties.load does: `=`, `:` or whitespace between key and value, a line
    ending in an odd number of backslashes continued on the next, backslash escapes (\\uXXXX
    too), `#` and `!` comment lines. The one error (a malformed \\u escape) names the line by
    its number only: its text may be a secret."""
    lines = re.split(r"\r\n|\r|\n", text)
    entries = []
    i = 0
    while i < len(lines):
        number = i + 1
        line = lines[i].lstrip(_BLANK)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continued(line):
            line = line[:-1]
            if i == len(lines):
                break
            line += lines[i].lstrip(_BLANK)
            i += 1
        end = 0
        while end < len(line) and line[end] not in "=:" + _BLANK:
            end += 2 if line[end] == "\\" else 1
        end = min(end, len(line))
        start = end
        separated = start < len(line) and line[start] in "=:"
        start += separated
        while start < len(line):
            if line[start] in "=:" and not separated:
                separated = True
            elif line[start] not in _BLANK:
                break
            start += 1
        try:
            entries.append((number, _unescape(line[:end]), _unescape(line[start:])))
        except ValueError:
            raise ValueError(f"{source} line {number}: a malformed \\uXXXX escape (the line is "
                             "not shown: it may hold a secret)") from None
    return entries


def _continued(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        c = text[i + 1]
        if c == "u":
            digits = text[i + 2:i + 6]
            if len(digits) != 4 or any(d not in string.hexdigits for d in digits):
                raise ValueError("malformed \\uXXXX")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(c, c))
            i += 2
    return "".join(out)


def _run_broker(port: int) -> int:
    """Until SIGINT or SIGTERM (then the broker is stopped), or until the broker exits.

    The signals are blocked so that sigwait, not their default action, takes them and `with`
    stops the broker; blocked only once it runs, as its process would inherit the mask.
    SIGCHLD says the broker process has exited."""
    from .testing import EmbeddedBroker

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # while starting: as Ctrl-C
    signals = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
    with EmbeddedBroker(port=port) as broker:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        if broker.running:
            print(f"embedded Kafka broker (Tansu) at {broker.bootstrap}; Ctrl-C stops it",
                  flush=True)
            if signal.sigwait(signals) != signal.SIGCHLD:
                return 0
        raise broker.exit_error()


# -- produce ------------------------------------------------------------------------------------


def _record(line: bytes, fmt: str, separator: bytes | None) -> dict[str, Any] | None:
    """One input line as enqueue() arguments; None for an empty line."""
    if not line:
        return None
    if fmt == "json":
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(item, dict) or "value" not in item:
            raise ValueError("expected an object with a \"value\"")
        headers = item.get("headers") or []
        if isinstance(headers, dict):
            headers = list(headers.items())
        if not isinstance(headers, list) or any(
                not isinstance(h, (list, tuple)) or len(h) != 2 for h in headers):
            raise ValueError("\"headers\" must be an object or a list of [key, value] pairs")
        return {"value": _encode(item["value"]), "key": _encode(item.get("key")),
                "partition": item.get("partition"),
                "headers": [(str(k), _encode(v)) for k, v in headers]}
    if separator is not None:
        key, found, value = line.partition(separator)
        if not found:
            raise ValueError(f"no key separator {os.fsdecode(separator)!r}")
        return {"value": value, "key": key}
    return {"value": line}


def _encode(value: Any) -> bytes | None:
    """A JSON value as bytes: text as UTF-8 (with the escapes `consume --format json` writes
    for other bytes turned back into them), anything else as its JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return json.dumps(value).encode()


async def _produce(args: argparse.Namespace, properties: dict[str, str]) -> int:
    """Reads bytes and splits lines at b"\\n" only, so values pass through as given.

    However it stops (the end of the input, a bad line, Ctrl-C or SIGTERM), it sends what it
    read, then says how many records were produced and from which line to resume, so that a
    re-run does not produce the first lines twice. Ctrl-C once stops reading; twice, at once."""
    terminated = _stop_on_sigterm()
    said_by_the_library = logging.getLogger(cluster.__name__)
    said_by_the_library.addFilter(_not_said_by_the_cli)
    separator = None if args.key_separator is None else os.fsencode(args.key_separator)
    started = time.perf_counter()
    sent: list[tuple[int, RecordFuture]] = []
    line = 0
    resume: int | None = 1  # the first line not taken yet; None once the input ended
    interrupted = False
    try:
        with open(args.file, "rb") if args.file else contextlib.nullcontext(
                sys.stdin.buffer) as source:
            async with Producer(config=ProducerConfig.from_properties(properties)) as producer:
                try:
                    async with contextlib.aclosing(_lines(source)) as lines:
                        async for text in lines:
                            line += 1
                            try:
                                record = _record(text.removesuffix(b"\n"), args.format,
                                                 separator)
                                if record is not None:
                                    enqueued = producer.enqueue(args.topic, **record)
                                    sent.append((line, await (enqueued if sent else _first(
                                        enqueued, args.topic, producer.config.max_block_ms))))
                            except (InvalidRecordError, RecordTooLargeError, ValueError) as exc:
                                raise ValueError(f"line {line}: {exc}") from exc
                            resume = line + 1
                    resume = None
                except asyncio.CancelledError:  # Ctrl-C: stop reading, send what was read
                    interrupted = True
                    _uncancel()
    finally:
        said_by_the_library.removeFilter(_not_said_by_the_cli)  # (main() may be called again)
        if sent or resume != 1:
            _report(args.topic, sent, time.perf_counter() - started, resume)
    if interrupted:
        return 128 + signal.SIGTERM if terminated() else 130
    return 1 if any(future.exception() for _, future in sent) else 0


def _not_said_by_the_cli(record: logging.LogRecord) -> bool:
    """The library's warning of a topic that does not exist, which `_first` says its own way
    (naming `aioproducer topic create`): not twice."""
    return record.msg is not cluster.MISSING_TOPIC_WARNING


async def _first(enqueued: Awaitable[RecordFuture], topic: str,
                 max_block_ms: int) -> RecordFuture:
    """The first record's enqueue(): it waits for the topic's metadata, up to max.block.ms
    (a minute), which for a topic that does not exist (no auto-creation) passed in silence;
    after 2 s a line on stderr says what it waits for."""
    notice = asyncio.get_running_loop().call_later(2, functools.partial(
        print, f"aioproducer produce: waiting for topic {topic!r} in the cluster's metadata "
        f"(up to max.block.ms={max_block_ms}): does it exist? (aioproducer topic create "
        f"{topic} --partitions N ...)", file=sys.stderr, flush=True))
    try:
        return await enqueued
    finally:
        notice.cancel()


async def _lines(source: BinaryIO) -> AsyncGenerator[bytes, None]:
    """The input's lines. From a pipe, socket or terminal they are awaited without blocking
    the event loop, so what was read is sent meanwhile; a file (or /dev/null) never blocks."""
    fd = source.fileno()
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)):
        for text in source:
            yield text
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), source)
    try:
        while text := await reader.readline():
            yield text
    finally:
        transport.close()
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)  # as the shell that shares it expects


def _stop_on_sigterm() -> Callable[[], bool]:
    """SIGTERM (`timeout`, `kill`, a supervisor stopping it) stops the command as a first
    Ctrl-C does, by cancelling it: its default action ended the process at once, without a
    word, and `produce` lost the lines it had read and not sent yet. A second one ends it at
    once. Returns whether one came."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    came = False

    def stop() -> None:
        nonlocal came
        came = True
        loop.remove_signal_handler(signal.SIGTERM)  # (the default again: a second one kills)
        if task is not None:
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    return lambda: came


def _uncancel() -> None:
    """The cancellation was taken: the task goes on (its count of cancellations drops)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _report(topic: str, sent: list[tuple[int, RecordFuture]], seconds: float,
            stopped_at: int | None) -> None:
    failed = [(line, future.exception() if future.done() else "not acknowledged")
              for line, future in sent if not future.done() or future.exception() is not None]
    print(f"{len(sent) - len(failed)} of {len(sent)} records produced to {topic} "
          f"in {seconds:.2f} s", file=sys.stderr)
    if failed:
        line, error = failed[0]
        print(f"aioproducer produce: {len(failed)} failed; the first, line {line}: {error}",
              file=sys.stderr)
    if stopped_at is not None:
        print(f"aioproducer produce: stopped before line {stopped_at}, which was not "
              f"produced, nor any after it: resume from line {stopped_at} (e.g. "
              f"tail -n +{stopped_at} FILE | aioproducer produce ...)", file=sys.stderr)


# -- consume ------------------------------------------------------------------------------------


def _check_consume_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.max is not None and args.max < 1:
        parser.error("--max must be at least 1")
    if args.timeout is not None and not args.timeout > 0:
        parser.error("--timeout must be more than 0 seconds")
    if args.partition is not None and args.partition < 0:
        parser.error("--partition must be at least 0")
    if args.key_separator is not None:
        if args.format != "lines":
            parser.error("--key-separator applies to --format lines (json lines have \"key\")")
        if not args.key_separator:
            parser.error("--key-separator must not be empty")


async def _consume(args: argparse.Namespace, config: ProducerConfig) -> int:
    """Prints records as they come until --max of them, or --timeout seconds without one;
    then (or on Ctrl-C or SIGTERM) says on stderr how many it printed. A reader that closes
    the pipe (`| head`) ends it quietly, with 0."""
    _stop_on_sigterm()
    separator = None if args.key_separator is None else os.fsencode(args.key_separator)
    out = sys.stdout.buffer
    printed = 0
    loop = asyncio.get_running_loop()
    async with TopicReader(
            config, args.topic, from_beginning=args.from_beginning,
            partitions=None if args.partition is None else [args.partition],
            isolation=IsolationLevel[args.isolation.upper()]) as reader:
        if args.isolation == "read_committed" and reader.cluster.cluster_id == TANSU_CLUSTER_ID:
            print("warning: this broker (Tansu, as the embedded one) does not say which "
                  "transactions were aborted: read_committed hides open transactions but still "
                  "shows aborted records", file=sys.stderr)
        start = "earliest" if args.from_beginning else "latest"
        print(f"reading {args.topic} from the {start} offsets: " + ", ".join(
            f"partition {p} at {offset}" for p, offset in sorted(reader.positions.items())),
            file=sys.stderr, flush=True)
        reader_left = False
        try:
            # --timeout's quiet time counts from the first fetch's answer (or failure): a
            # first answer that is slow to come (a loaded machine) must not end the command
            # before it printed what was there. The first fetch is bounded by the request
            # timeout.
            quiet_until: float | None = None
            while args.max is None or printed < args.max:
                wait = 0.5 if quiet_until is None else min(0.5, quiet_until - loop.time())
                if wait <= 0:
                    break
                try:  # (a broker gone silent must not hold us past --timeout)
                    async with asyncio.timeout_at(quiet_until):
                        records = await reader.fetch(wait)
                except TimeoutError:
                    break
                if args.timeout is not None and (records or quiet_until is None):
                    quiet_until = loop.time() + args.timeout
                for record in records[:None if args.max is None else args.max - printed]:
                    out.write(_printed(record, args.format, separator, args.metadata))
                    printed += 1
                out.flush()
        except BrokenPipeError:  # `consume | head`: the reader has what it wanted
            reader_left = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())  # (no error at exit)
        finally:
            if not reader_left:  # (else no count: the reader got less than the pipe took)
                print(f"{printed} record{'' if printed == 1 else 's'} consumed from "
                      f"{args.topic}", file=sys.stderr)
    return 0


# The cluster id Tansu, the embedded broker, answers with: its Fetch never lists aborted
# transactions (Kafka's does), so a reader cannot drop their records.
TANSU_CLUSTER_ID = "tansu_cluster"


def _printed(record: ConsumedRecord, fmt: str, separator: bytes | None, metadata: bool) -> bytes:
    """A record as one line of `produce`'s input (with `metadata`, plus where it is)."""
    if fmt == "json":
        item: dict[str, Any] = {
            "key": _text(record.key), "value": _text(record.value),
            "headers": [[name, _text(value)] for name, value in record.headers]}
        if metadata:
            item.update(partition=record.partition, offset=record.offset,
                        timestamp=record.timestamp)
        return json.dumps(item).encode() + b"\n"
    line = record.value or b""
    if separator is not None:
        line = (record.key or b"") + separator + line
    if metadata:
        line = f"{record.partition}\t{record.offset}\t{record.timestamp}\t".encode() + line
    return line + b"\n"


def _text(data: bytes | None) -> str | None:
    """Bytes as JSON text: UTF-8, with any other byte kept as an escape (\\udcXX) that
    `produce --format json` turns back into that byte."""
    return None if data is None else data.decode("utf-8", "surrogateescape")


# -- topic --------------------------------------------------------------------------------------


def _check_create_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        check_topic_name(args.name)
    except InvalidTopicError as exc:
        parser.error(str(exc))
    if args.partitions < 1:
        parser.error("--partitions must be at least 1")
    if args.replication_factor < 1 and args.replication_factor != -1:
        parser.error("--replication-factor must be at least 1 (or -1: the broker's default)")
    for setting in args.config:
        name, sep, _ = setting.partition("=")
        if not sep or not name.strip():
            parser.error(f"--config takes KEY=VALUE, not {setting!r}")


async def _create_topic(args: argparse.Namespace, config: ProducerConfig) -> int:
    configs = dict(setting.partition("=")[::2] for setting in args.config)
    try:
        await create_topic(config, args.name, args.partitions,
                           replication_factor=args.replication_factor,
                           configs={name.strip(): value for name, value in configs.items()})
    except TopicAlreadyExistsError:
        if not args.if_not_exists:
            raise
        print(f"topic {args.name} exists already", file=sys.stderr)
        return 0
    print(f"created topic {args.name} with {args.partitions} partitions", file=sys.stderr)
    return 0


# -- perf ---------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _bootstrap(args: argparse.Namespace, properties: dict[str, str]) -> AsyncIterator[str]:
    """The broker the settings name, or else one started for this run."""
    if "bootstrap.servers" in properties:
        yield properties["bootstrap.servers"]
        return
    from .testing import EmbeddedBroker

    async with EmbeddedBroker() as broker:
        broker.create_topic(args.topic, args.partitions)
        if not args.json:
            print(f"started an embedded broker at {broker.bootstrap}", flush=True)
        yield broker.bootstrap


async def _perf(args: argparse.Namespace, properties: dict[str, str]) -> int:
    payload = os.urandom(args.record_size)
    sample_every = max(1, args.num_records // 20_000)
    latencies: list[float] = []
    sampled = []
    async with _bootstrap(args, properties) as bootstrap:
        config = ProducerConfig.from_properties({**properties, "bootstrap.servers": bootstrap})
        async with Producer(config=config) as producer:
            progress = _progress_bar(args.num_records, disable=args.json)
            start = time.perf_counter()
            for i in range(args.num_records):
                if args.throughput > 0:
                    ahead = i / args.throughput - (time.perf_counter() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                handle = await producer.enqueue(args.topic, payload)
                if i % sample_every == 0:
                    sent = time.perf_counter()
                    sampled.append(handle)
                    def done(_: object, t0: float = sent) -> None:
                        latencies.append(time.perf_counter() - t0)
                    handle.add_done_callback(done)
                if i % 1000 == 999:
                    progress.update(1000)
            await producer.flush()
            elapsed = time.perf_counter() - start
            progress.update(args.num_records - progress.n)
            progress.close()
    failures = sum(1 for h in sampled if h.exception() is not None)
    latencies.sort()
    result = {
        "records": args.num_records,
        "seconds": round(elapsed, 3),
        "records_per_s": round(args.num_records / elapsed),
        "mb_per_s": round(args.num_records * args.record_size / elapsed / 1e6, 2),
        **{f"latency_ms_{name}": round(_percentile(latencies, q) * 1000, 2)
           for name, q in (("p50", .5), ("p95", .95), ("p99", .99), ("p99.9", .999), ("max", 1))},
        "sampled_failures": failures,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['records']} records sent, {result['records_per_s']:,} records/s "
              f"({result['mb_per_s']} MB/s), latency ms p50 {result['latency_ms_p50']} "
              f"p95 {result['latency_ms_p95']} p99 {result['latency_ms_p99']} "
              f"p99.9 {result['latency_ms_p99.9']} max {result['latency_ms_max']}")
    return 1 if failures else 0


class _NoProgressBar:
    """What perf updates when tqdm (the `cli` extra) is not installed: nothing shown."""

    n = 0

    def update(self, count: int) -> None:
        self.n += count

    def close(self) -> None:
        pass


def _progress_bar(total: int, disable: bool) -> Any:
    """tqdm's live bar on stderr if the `cli` extra is installed, else none (said once)."""
    try:
        from tqdm import tqdm
    except ImportError:
        if not disable:
            print("(no live progress: pip install 'aioproducer[cli]' for tqdm's bar)",
                  file=sys.stderr, flush=True)
        return _NoProgressBar()
    return tqdm(total=total, unit="rec", unit_scale=True, disable=disable, file=sys.stderr,
                mininterval=0.25)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


if __name__ == "__main__":
    sys.exit(main())
