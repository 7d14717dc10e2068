"""Moving a partition's leadership on a real Kafka cluster while its old leader stays up, and
watching what our producer's connections write and read meanwhile (KIP-951).

The move: the partition's replica list is reordered so the chosen replica comes first
(AlterPartitionReassignments, the same replicas: nothing to copy), then a preferred-leader
election (ElectLeaders) makes it the leader. Both with kafka-python's protocol classes on a
plain socket, in well under a second (Kafka's command-line tools take seconds to start)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kafka.protocol.admin import AlterPartitionReassignmentsRequest, ElectLeadersRequest

from aioproducer.client.connection import BrokerConnection
from aioproducer.protocol.framing import Framing
from aioproducer.protocol.messages import ApiKey
from tests.support.raw import call

NOT_LEADER_OR_FOLLOWER = 6
_ELECTION_NOT_NEEDED = 84  # the reordering alone moved the leader
_PREFERRED = 0


def leader_and_replicas(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, list[int]]:
    """The partition's leader and replicas, as librdkafka's admin client reads them (once a
    broker's metadata has them: just after CreateTopics, the broker asked may not yet)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(partition)
        if meta is not None and meta.leader >= 0:
            return meta.leader, list(meta.replicas)
        assert time.monotonic() < deadline, f"{topic}-{partition} has no leader after 30 s"
        time.sleep(0.1)


def move_leader(bootstrap: str, topic: str, partition: int, to: int,
                timeout: float = 30.0) -> None:
    """Make replica `to` the partition's leader (it must be in the ISR), and wait until the
    metadata says so."""
    address = bootstrap.split(",")[0]
    _, replicas = leader_and_replicas(bootstrap, topic, partition)
    order = [to] + [r for r in replicas if r != to]
    req = AlterPartitionReassignmentsRequest
    response = call(address, req(version=0, timeout_ms=int(timeout * 1000), topics=[
        req.ReassignableTopic(version=0, name=topic, partitions=[
            req.ReassignableTopic.ReassignablePartition(version=0, partition_index=partition,
                                                        replicas=order)])]), 0)
    codes = [response.error_code] + [p.error_code for t in response.responses
                                     for p in t.partitions]
    if any(codes):
        raise RuntimeError(f"reordering {topic}-{partition}'s replicas as {order}: {response}")
    elect = ElectLeadersRequest
    response = call(address, elect(version=1, election_type=_PREFERRED, timeout_ms=int(
        timeout * 1000), topic_partitions=[elect.TopicPartitions(
            version=1, topic=topic, partitions=[partition])]), 1)
    codes = [response.error_code] + [r.error_code for t in response.replica_election_results
                                     for r in t.partition_result]
    if any(code not in (0, _ELECTION_NOT_NEEDED) for code in codes):
        raise RuntimeError(f"electing {to} for {topic}-{partition}: {response}")
    deadline = time.monotonic() + timeout
    while leader_and_replicas(bootstrap, topic, partition)[0] != to:
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}-{partition} not led by {to} after {timeout} s")
        time.sleep(0.1)


@dataclass
class WireEvent:
    out: bool  # written (a request) or read (a response)
    address: str  # the broker's host:port
    api_key: ApiKey
    body: Any  # as our encoder took it or our decoder made it (None: a failed request)
    at: float  # time.monotonic()


class WireLog:
    """Every request our connections write and every response they read, in order (the
    writes from the framing as it encodes them, the reads as they are handed over)."""

    def __init__(self) -> None:
        self.events: list[WireEvent] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "WireLog":
        send_request, deliver = Framing.send_request, BrokerConnection._deliver
        log = self

        def logged_send(framing: Framing, api_key: ApiKey, version: int, body: Any,
                        **kwargs: Any) -> tuple[bytes, int]:
            log.events.append(WireEvent(True, framing.peer, api_key, body, time.monotonic()))
            return send_request(framing, api_key, version, body, **kwargs)

        def logged_deliver(conn: BrokerConnection, entry: Any, body: Any,
                           exc: BaseException | None) -> None:
            log.events.append(WireEvent(False, conn.address, entry.api_key, body,
                                        time.monotonic()))
            deliver(conn, entry, body, exc)

        monkeypatch.setattr(Framing, "send_request", logged_send)
        monkeypatch.setattr(BrokerConnection, "_deliver", logged_deliver)
        return self

    def first(self, start: int, match: Any) -> int | None:
        return next((i for i in range(start, len(self.events)) if match(self.events[i])), None)

    def describe(self, start: int, nodes: dict[str, int], topic: str) -> str:
        """The events from `start` on, for a failure's message: a line each (repeats counted)
        saying when, to or from which node, what, and for a produce response the error and
        named leader of each of `topic`'s partitions, for a metadata response their leaders."""
        lines: list[tuple[str, int]] = []
        t0 = self.events[start].at if start < len(self.events) else 0.0
        for e in self.events[start:]:
            line = (f"{'->' if e.out else '<-'} node {nodes.get(e.address, e.address)} "
                    f"{e.api_key.name}{_detail(e, topic)}")
            if lines and lines[-1][0].endswith(line):
                lines[-1] = (lines[-1][0], lines[-1][1] + 1)
            else:
                lines.append((f"{e.at - t0:8.3f} s {line}", 1))
        return "\n".join(f"{line} (x{count})" if count > 1 else line for line, count in lines)


def _detail(event: WireEvent, topic: str) -> str:
    if event.out or event.body is None:
        return " (failed)" if not event.out else ""
    if event.body.get("error_code"):
        return f" error {event.body['error_code']}"
    if event.api_key == ApiKey.PRODUCE:
        return "".join(
            f" p{p['index']}: error {p['error_code']}"
            + (f", leader {named}" if (named := named_leader(event, topic, p["index"]))
               is not None else "")
            for t in event.body["responses"] if t["name"] == topic
            for p in t["partition_responses"])
    if event.api_key == ApiKey.METADATA:
        return "".join(f" p{p['partition_index']}: leader {p['leader_id']}"
                       for t in event.body["topics"] if t["name"] == topic
                       for p in t["partitions"])
    return ""


def named_leader(event: WireEvent, topic: str, partition: int) -> int | None:
    """If `event` is a produce response refusing the partition as NOT_LEADER_OR_FOLLOWER: the
    leader its CurrentLeader names (-1: none). None for any other event."""
    if event.out or event.api_key != ApiKey.PRODUCE or event.body is None:
        return None
    for t in event.body["responses"]:
        for p in t["partition_responses"]:
            if t["name"] == topic and p["index"] == partition \
                    and p["error_code"] == NOT_LEADER_OR_FOLLOWER:
                return int((p.get("current_leader") or {}).get("leader_id", -1))
    return None


def produce_to(event: WireEvent, address: str, topic: str, partition: int) -> bool:
    return event.out and event.api_key == ApiKey.PRODUCE and event.address == address and any(
        t["name"] == topic and any(p["index"] == partition for p in t["partition_data"])
        for t in event.body["topic_data"])
