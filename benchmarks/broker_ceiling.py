"""What the broker itself takes (issue 42): ready-made Produce requests written over raw
sockets as fast as the broker answers them, so that no client's work is in the way. The
requests are aioproducer's own, captured as it writes them (a topic of 6 partitions, keyed
records of --size bytes, acks=1, idempotence off, `--set` overriding a setting), or with
`--client confluent` librdkafka's (confluent-kafka's defaults but linger 5 ms, acks=1,
idempotence off, as grid.py runs it), taken from the wire by a proxy in front of the embedded
broker; then replayed: `--depth` requests in flight on each of `--conns` connections, about
--mb MB in all, to a fresh broker each run, the clients, shapes and depths alternating within
a round. Each captured request's shape is printed first: per partition its batch's header
fields and its records' framing, to compare the clients' requests byte for byte.
`--client aioproducer:batch_size=1048576` captures ours with that setting (beside the others).

    python benchmarks/broker_ceiling.py [--broker embedded|kafka] [--size B ...]
        [--depth N ...] [--conns N ...] [--mb MB] [--rounds N] [--set name=value ...]
        [--client aioproducer[:name=value,...]|confluent ...]

Prints, per run: MB/s and records/s, the broker's CPU seconds (utime + stime of its
/proc/<pid>/stat) as a share of one core and per MB written, and the writer's own CPU share (a
thread per connection, sendall() and one read per response: a few % of a core).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aioproducer import Producer  # noqa: E402
from aioproducer.protocol import framing  # noqa: E402
from aioproducer.protocol.messages import ApiKey, decode_response  # noqa: E402
from aioproducer.testing import ApacheKafka, EmbeddedBroker  # noqa: E402

# A request frame: size (4), api key (2), version (2), correlation id (4).
_VERSION_AT, _CORRELATION_AT = 6, 8
_COUNT_AT = 57  # a record batch's header: its record count
# What a capture writes: enough for librdkafka's batches to reach their 1 MB (batch.size), as
# they do in a long run, on 6 partitions.
_CAPTURED = 12 << 20


def capture(broker: Any, size: int, settings: dict[str, int]) -> tuple[bytes, int]:
    """The largest Produce request aioproducer writes for 12 MB of --size records, and its
    record count."""
    frames: list[tuple[bytes, int]] = []
    send_request = framing.Framing.send_request

    def keep(self: Any, api_key: ApiKey, version: int, body: Any, **kwargs: Any) -> Any:
        frame, correlation_id = send_request(self, api_key, version, body, **kwargs)
        if api_key == ApiKey.PRODUCE:  # each batch's (header, payload): its count at 57
            records = sum(struct.unpack_from(">i", p["records"][0], _COUNT_AT)[0]
                          for t in body["topic_data"] for p in t["partition_data"])
            frames.append((bytes(frame) if isinstance(frame, (bytes, bytearray)) else
                           b"".join(bytes(part) for part in frame), records))
        return frame, correlation_id

    framing.Framing.send_request = keep  # type: ignore[method-assign]
    try:
        asyncio.run(_produce(broker.bootstrap, size, settings))
    finally:
        framing.Framing.send_request = send_request  # type: ignore[method-assign]
    return max(frames, key=lambda f: len(f[0]))


async def _produce(bootstrap: str, size: int, settings: dict[str, int]) -> None:
    value = os.urandom(size)
    records = [(b"key-%012d" % i, value) for i in range(max(6, _CAPTURED // size))]
    async with Producer(bootstrap, **{"acks": 1, "linger_ms": 5, "enable_idempotence": False,
                                      **settings}) as producer:
        await (await producer.enqueue_many("capture", records))


def capture_confluent(size: int) -> tuple[bytes, int]:
    """The largest Produce request librdkafka writes for 12 MB of --size records, and its
    record count: read off the wire by a proxy that the embedded broker advertises."""
    from confluent_kafka import Producer as ConfluentProducer

    listener = socket.create_server(("127.0.0.1", 0))
    frames: list[bytes] = []
    with EmbeddedBroker(advertised_port=listener.getsockname()[1]) as broker:
        threading.Thread(target=_proxy, args=(listener, broker.port, frames), daemon=True).start()
        broker.create_topic("capture", 6)
        producer = ConfluentProducer({"bootstrap.servers": broker.bootstrap, "acks": 1,
                                      "enable.idempotence": False, "linger.ms": 5})
        value = os.urandom(size)
        for i in range(max(6, _CAPTURED // size)):
            while True:
                try:
                    producer.produce("capture", value, b"key-%012d" % i)
                    break
                except BufferError:
                    producer.poll(0.001)
            producer.poll(0)
        if producer.flush(60):
            raise SystemExit("librdkafka did not deliver the records to capture in 60 s")
    listener.close()
    frame = max(frames, key=len)
    return frame, sum(batch["records"] for batch in batch_shapes(frame))


def _proxy(listener: socket.socket, upstream_port: int, frames: list[bytes]) -> None:
    """Forward each connection to the broker, keeping the Produce requests written up."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # (the listener closed: the capture is over)
            return
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
        threading.Thread(target=_pipe, args=(upstream, client, None), daemon=True).start()
        threading.Thread(target=_pipe, args=(client, upstream, frames), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket, frames: list[bytes] | None) -> None:
    """Copy one direction of a connection; with `frames`, keep the Produce requests in it."""
    pending = bytearray()
    while data := source.recv(1 << 20):
        sink.sendall(data)
        if frames is None:
            continue
        pending += data
        while len(pending) >= 4 and len(pending) >= 4 + (n := struct.unpack_from(">i", pending)[0]):
            if struct.unpack_from(">h", pending, 4)[0] == ApiKey.PRODUCE:
                frames.append(bytes(pending[:4 + n]))
            del pending[:4 + n]
    sink.close()


def _uvarint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value, at = _uvarint(buf, at)
    return (value >> 1) ^ -(value & 1), at


def _skip_tags(buf: bytes, at: int) -> int:
    count, at = _uvarint(buf, at)
    for _ in range(count):
        _, at = _uvarint(buf, at)
        size, at = _uvarint(buf, at)
        at += size
    return at


def batch_shapes(frame: bytes) -> list[dict[str, Any]]:
    """A Produce request frame's record batches (v3-v12), as the fields Kafka's validation
    reads: the batch header's, and what its records' framing says."""
    version = struct.unpack_from(">h", frame, _VERSION_AT)[0]
    flexible = version >= 9

    def count(at: int) -> tuple[int, int]:
        if flexible:
            n, at = _uvarint(frame, at)
            return n - 1, at
        return struct.unpack_from(">i", frame, at)[0], at + 4

    at = 14 + max(struct.unpack_from(">h", frame, 12)[0], 0)  # past the client id
    at = _skip_tags(frame, at) if flexible else at
    n, at = count(at) if flexible else (struct.unpack_from(">h", frame, at)[0], at + 2)
    at += max(n, 0) + 6  # the transactional id, acks and timeout
    shapes = []
    topics, at = count(at)
    for _ in range(topics):
        n, at = count(at) if flexible else (struct.unpack_from(">h", frame, at)[0], at + 2)
        at += n
        partitions, at = count(at)
        for _ in range(partitions):
            (partition,) = struct.unpack_from(">i", frame, at)
            size, at = count(at + 4)
            shapes.append({"partition": partition, "request": len(frame), "version": version,
                           **_batch_shape(frame[at:at + size])})
            at += size
            at = _skip_tags(frame, at) if flexible else at
        at = _skip_tags(frame, at) if flexible else at
    return shapes


def _batch_shape(records: bytes) -> dict[str, Any]:
    (_, length, _, magic, _, attributes, last_delta, first_ts, max_ts, producer_id, _, sequence,
     count) = struct.unpack_from(">qiibIhiqqqhii", records)
    at, deltas, stamps, headers, payload = 61, [], [], set(), 0
    for _ in range(count):
        size, at = _varint(records, at)
        end = at + size
        at += 1  # the record's attributes
        stamp, at = _varint(records, at)
        delta, at = _varint(records, at)
        key, at = _varint(records, at)
        at += max(key, 0)
        value, at = _varint(records, at)
        header_count, _ = _varint(records, at + max(value, 0))
        deltas.append(delta)
        stamps.append(stamp)
        headers.add(header_count)
        payload += max(key, 0) + max(value, 0)
        at = end
    return {"batch": 12 + length, "another batch after it": len(records) > 12 + length,
            "magic": magic,
            "attributes": attributes, "records": count,
            "offset deltas in order": deltas == list(range(count)),
            "last offset delta": last_delta, "max ts - first": max_ts - first_ts,
            "largest ts delta": max(stamps, default=0), "producer id": producer_id,
            "sequence": sequence, "headers": sorted(headers),
            "framing a record": round((12 + length - 61 - payload) / max(count, 1), 1)}


errors: list[Any] = []  # partitions a first response refused, or a request unanswered


def write(address: tuple[str, int], frame: bytes, count: int, depth: int) -> None:
    """Write `frame` `count` times with at most `depth` unanswered; return once all are."""
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    room = threading.Semaphore(depth)
    version = struct.unpack_from(">h", frame, _VERSION_AT)[0]

    def read() -> None:
        stream = sock.makefile("rb", buffering=1 << 20)
        for i in range(count):
            (length,) = struct.unpack(">i", stream.read(4))
            response = stream.read(length)
            if i == 0:  # (an error answered at once would overstate the broker's rate)
                refused = [p for t in decode_response(ApiKey.PRODUCE, version, response)
                           ["responses"] for p in t["partition_responses"] if p["error_code"]]
                if refused:
                    errors.append(refused)
            room.release()

    reader = threading.Thread(target=read)
    reader.start()
    request = bytearray(frame)
    for correlation_id in range(count):
        if not room.acquire(timeout=60):  # (the connection closed, or the broker hangs)
            errors.append(f"no answer to request {correlation_id - depth} in 60 s")
            break
        struct.pack_into(">i", request, _CORRELATION_AT, correlation_id)
        sock.sendall(request)
    reader.join(timeout=120)
    sock.close()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(args: argparse.Namespace, frame: bytes, records: int, depth: int,
            conns: int) -> dict[str, float]:
    with ApacheKafka() if args.broker == "kafka" else EmbeddedBroker() as broker:
        broker.create_topic("capture", 6)
        pid = broker.pid(0) if args.broker == "kafka" else broker.pid
        host, port = broker.bootstrap.rsplit(":", 1)
        count = max(4, args.mb * 10**6 // len(frame) // conns)
        for _ in range(40):  # until the new topic's partitions have their leaders (Kafka)
            errors.clear()
            write((host, int(port)), frame, 1, 1)
            if not errors:
                break
            time.sleep(0.25)
        if args.broker == "kafka":  # the JIT warmed up by a first, untimed pass
            write((host, int(port)), frame, count, depth)
        threads = [threading.Thread(target=write, args=((host, int(port)), frame, count, depth))
                   for _ in range(conns)]
        broker_cpu, mine, start = cpu_seconds(pid), time.process_time(), time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        broker_cpu, mine = cpu_seconds(pid) - broker_cpu, time.process_time() - mine
    if errors:
        raise SystemExit(f"the broker refused the requests: {errors[0]}")
    megabytes = count * conns * len(frame) / 1e6
    return {"MB/s": megabytes / wall, "rec/s": count * conns * records / wall,
            "core": broker_cpu / wall, "ms/MB": broker_cpu / megabytes * 1e3,
            "writer": mine / wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", choices=("embedded", "kafka"), default="embedded")
    parser.add_argument("--size", type=int, nargs="+", default=[1000])
    parser.add_argument("--depth", type=int, nargs="+", default=[5])
    parser.add_argument("--conns", type=int, nargs="+", default=[1])
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--client", nargs="+", default=["aioproducer"],
                        metavar="aioproducer[:name=value,...]|confluent")
    args = parser.parse_args()
    settings = {name: int(value) for name, _, value in (s.partition("=") for s in args.set)}
    requests: dict[tuple[str, int], tuple[bytes, int]] = {}
    for client in args.client:
        for size in args.size:
            if client == "confluent":
                requests[client, size] = capture_confluent(size)
                continue
            name, _, own = client.partition(":")
            if name != "aioproducer":
                parser.error(f"--client {client}: aioproducer[:name=value,...] or confluent")
            with EmbeddedBroker() as broker:
                broker.create_topic("capture", 6)
                requests[client, size] = capture(broker, size, {**settings, **{
                    k: int(v) for k, _, v in (s.partition("=") for s in own.split(",") if s)}})
    for (client, size), (frame, records) in requests.items():
        print(f"{client}, {size} B records, {settings or 'defaults'}: a request of "
              f"{len(frame) / 1e3:.0f} KB, {records} records", flush=True)
        for shape in batch_shapes(frame):
            print("    " + ", ".join(f"{k} {v}" for k, v in shape.items()))
    runs: dict[tuple[str, int, int, int], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        order = list(requests.items())
        for (client, size), (frame, records) in order[round_ % 2::] + order[:round_ % 2]:
            for conns in args.conns:
                for depth in args.depth:
                    result = one_run(args, frame, records, depth, conns)
                    runs.setdefault((client, size, conns, depth), []).append(result)
                    print(f"  round {round_ + 1}, {client}, {size} B, {conns} conn(s), depth "
                          f"{depth}: " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items())
                          + f", load {os.getloadavg()[0]:.1f}", flush=True)
    print("medians:")
    for (client, size, conns, depth), results in runs.items():
        print(f"  {client}, {size} B, {conns} conn(s), depth {depth}: " + ", ".join(
            f"{k} {statistics.median(r[k] for r in results):,.2f}" for k in results[0]))


if __name__ == "__main__":
    main()
