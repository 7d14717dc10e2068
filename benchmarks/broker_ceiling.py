"""What the broker itself takes (issue 42): ready-made Produce requests written over raw
sockets as fast as the broker answers them, so that no client's work is in the way. The
requests are aioproducer's own, captured as it writes them (a topic of 6 partitions, keyed
records of --size bytes, acks=1, idempotence off, `--set` overriding a setting), then
replayed: `--depth` requests in flight on each of `--conns` connections, about --mb MB in
all, to a fresh broker each run, the shapes and depths alternating within a round.

    python benchmarks/broker_ceiling.py [--broker embedded|kafka] [--size B ...]
        [--depth N ...] [--conns N ...] [--mb MB] [--rounds N] [--set name=value ...]

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


def capture(broker: Any, size: int, settings: dict[str, int]) -> tuple[bytes, int]:
    """The largest Produce request aioproducer writes for 4 MB of --size records, and its
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
    records = [(b"key-%012d" % i, value) for i in range(max(6, (4 << 20) // size))]
    async with Producer(bootstrap, **{"acks": 1, "linger_ms": 5, "enable_idempotence": False,
                                      **settings}) as producer:
        await (await producer.enqueue_many("capture", records))


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
    args = parser.parse_args()
    settings = {name: int(value) for name, _, value in (s.partition("=") for s in args.set)}
    with EmbeddedBroker() as broker:
        broker.create_topic("capture", 6)
        requests = {size: capture(broker, size, settings) for size in args.size}
    for size, (frame, records) in requests.items():
        print(f"{size} B records, {settings or 'defaults'}: a request of "
              f"{len(frame) / 1e3:.0f} KB, {records} records", flush=True)
    runs: dict[tuple[int, int, int], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for size, (frame, records) in requests.items():
            for conns in args.conns:
                for depth in args.depth:
                    result = one_run(args, frame, records, depth, conns)
                    runs.setdefault((size, conns, depth), []).append(result)
                    print(f"  round {round_ + 1}, {size} B, {conns} conn(s), depth {depth}: "
                          + ", ".join(f"{k} {v:,.2f}" for k, v in result.items())
                          + f", load {os.getloadavg()[0]:.1f}", flush=True)
    print("medians:")
    for (size, conns, depth), results in runs.items():
        print(f"  {size} B, {conns} conn(s), depth {depth}: " + ", ".join(
            f"{k} {statistics.median(r[k] for r in results):,.2f}" for k in results[0]))


if __name__ == "__main__":
    main()
