"""Reading a topic back, for `aioproducer consume`: Fetch from each partition's leader, from
its earliest or its latest offset, with no consumer group (nothing joined, nothing
committed). The producer never reads; this small read path lets a user check what landed
without another client.

Where a partition ends: ListOffsets LATEST should say, but not every broker answers it
right (Tansu answers the last batch's base offset + 1), while the high watermark (with
read_committed, the last stable offset) in a Fetch response is right everywhere. So the
latest offset is ListOffsets LATEST confirmed by a Fetch from there: on Kafka the two
agree and the Fetch returns no records; on Tansu it returns at most the last batch.

Where it starts, from the beginning: offset 0, not ListOffsets EARLIEST, which Tansu answers
with the batch stored first in time (with two producers writing a partition at once, not
the lowest offset); a log that starts later (retention, DeleteRecords) answers the Fetch
OFFSET_OUT_OF_RANGE, and then EARLIEST says where it starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from typing import Any, Iterable, Sequence

from ..client.backoff import Backoff
from ..client.cluster import Cluster
from ..client.ratelimit import LogEvery
from ..client.tasks import TaskSet
from ..config import ProducerConfig
from ..errors import (
    KafkaConnectionError,
    KafkaError,
    LeaderNotAvailableError,
    OffsetOutOfRangeError,
    UnknownTopicError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from ..protocol.messages import ApiKey
from ..protocol.records import Headers, read_batches, visible_records

log = logging.getLogger(__name__)

_EARLIEST, _LATEST = -2, -1  # ListOffsets' timestamps that mean the log's start and end
_MAX_FETCH_BYTES = 50 << 20  # the Java consumer's fetch.max.bytes
_MAX_BATCH_BYTES = 1 << 30  # a partition's limit grows to hold its largest batch, up to this


class IsolationLevel(enum.IntEnum):
    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumedRecord:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


class TopicReader:
    """Reads `topic`'s partitions (all, or those given) from their earliest offsets
    (`from_beginning`) or their latest, like `kafka-console-consumer` with `assign()`.
    Records come in offset order within a partition, without transaction markers::

        async with TopicReader(config, "orders", from_beginning=True) as reader:
            records = await reader.fetch(max_wait=0.5)
    """

    def __init__(self, config: ProducerConfig, topic: str, *,
                 partitions: Sequence[int] | None = None, from_beginning: bool = False,
                 isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
                 partition_max_bytes: int = 1 << 20) -> None:
        # Reading must not create the topic it reads (Metadata's auto-creation).
        self._config = dataclasses.replace(config, allow_auto_create_topics=False)
        self.topic = topic
        self._wanted = partitions
        self._from_beginning = from_beginning
        self._isolation = isolation
        self._partition_max_bytes = partition_max_bytes
        # What a Fetch may ask for: its response must stay under receive_message_max_bytes
        # (headers and framing besides the records: 64 KiB of room is plenty for one topic).
        self._fetch_budget = max(config.receive_message_max_bytes - (1 << 16), 1 << 15)
        self._max_bytes: dict[int, int] = {}  # per partition, grown for a larger batch
        self.positions: dict[int, int] = {}  # partition -> the next offset to read
        self._tasks = TaskSet()
        self._cluster: Cluster | None = None
        self._backoff = Backoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000)
        self._failing = LogEvery(log, logging.WARNING, 30)

    async def __aenter__(self) -> TopicReader:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def cluster(self) -> Cluster:
        assert self._cluster is not None, "start() the reader first"
        return self._cluster

    async def start(self) -> None:
        """Find the topic's leaders and where each partition starts; raise
        UnknownTopicOrPartitionError for a topic or partition that does not exist, and
        KafkaConnectionError when no broker answers."""
        self._cluster = Cluster(self._config, self._tasks)
        count = await self._partition_count()
        for partition in self._wanted or ():
            if not 0 <= partition < count:
                raise UnknownTopicOrPartitionError(
                    f"topic {self.topic!r} has partitions 0 to {count - 1}: there is no "
                    f"partition {partition}")
        partitions = list(self._wanted if self._wanted is not None else range(count))
        self._max_bytes = dict.fromkeys(partitions, self._partition_max_bytes)
        self.positions = await self._start_offsets(partitions)

    async def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
        await self._tasks.aclose()

    async def _partition_count(self) -> int:
        cluster = self.cluster
        cluster.want([self.topic])
        await cluster.refresh()
        info = cluster.topics.get(self.topic)
        if info is not None and isinstance(info.error, UnknownTopicError):
            # Answered at once: a reader has nothing to wait for (a producer may wait for
            # a topic being created).
            raise UnknownTopicOrPartitionError(
                f"topic {self.topic!r} does not exist: create it (aioproducer topic create), "
                "or check its name")
        info = await cluster.topic(self.topic, self._config.max_block_ms / 1000)
        return len(info.leaders)

    async def _start_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        if self._from_beginning:  # (see the module's docstring)
            return dict.fromkeys(partitions, 0)
        listed = await self._list_offsets(partitions, _LATEST)
        ends: dict[int, int] = {}
        for _ in range(5):  # (a broker may leave out a partition it has nothing of)
            asked = {p: offset for p, offset in listed.items() if p not in ends}
            if not asked:
                break
            # min_bytes 0: Kafka answers at once; Tansu answers nothing without a wait.
            for partition, answer in (await self._fetch_at(asked, 100, min_bytes=0)).items():
                error = _error(answer, f"Fetch from {self.topic}-{partition}")
                if error is not None:
                    raise error
                ends[partition] = self._end(answer)
        if len(ends) < len(listed):
            raise KafkaConnectionError(
                f"the leaders of topic {self.topic!r} did not say where partitions "
                f"{sorted(set(listed) - set(ends))} end")
        return ends

    def _end(self, answer: dict[str, Any]) -> int:
        """The offset after the last record a consumer at our isolation level may read."""
        if self._isolation == IsolationLevel.READ_COMMITTED and answer["last_stable_offset"] >= 0:
            return int(answer["last_stable_offset"])
        return int(answer["high_watermark"])

    def _by_leader(self, partitions: Iterable[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for partition in partitions:
            leader = self.cluster.leader_for(self.topic, partition)
            if leader < 0:
                raise LeaderNotAvailableError(
                    f"partition {partition} of topic {self.topic!r} has no leader now")
            groups.setdefault(leader, []).append(partition)
        return groups

    async def _list_offsets(self, partitions: Iterable[int], timestamp: int) -> dict[int, int]:
        """Each partition's offset at `timestamp`; what a retry may mend (a partition's
        leader not ready yet, as just after a topic grows on Kafka) is retried, after a
        backoff and fresh metadata, for up to max_block_ms."""
        offsets: dict[int, int] = {}
        asked = list(partitions)
        deadline = asyncio.get_running_loop().time() + self._config.max_block_ms / 1000
        while asked:
            failed: dict[int, KafkaError] = {}
            for leader, group in self._by_leader(asked).items():
                conn = await self.cluster.connection(leader)
                response = await conn.request(ApiKey.LIST_OFFSETS, {
                    "isolation_level": self._isolation,
                    "topics": [{"name": self.topic, "partitions": [
                        {"partition_index": p, "timestamp": timestamp} for p in group]}]})
                for topic in response["topics"]:
                    for answer in topic["partitions"]:
                        partition = answer["partition_index"]
                        error = _error(answer, f"ListOffsets of {self.topic}-{partition}")
                        if error is None:
                            offsets[partition] = answer["offset"]
                        else:
                            failed[partition] = error
            if not failed:
                break
            error = next(iter(failed.values()))
            if asyncio.get_running_loop().time() >= deadline:
                raise error
            await self._retry_later(error)  # (raises what a retry cannot mend)
            asked = list(failed)
        return offsets

    async def _fetch_at(self, offsets: dict[int, int], max_wait_ms: int,
                        min_bytes: int = 1) -> dict[int, dict[str, Any]]:
        """One Fetch per leader, all at once: each partition's answer."""
        max_bytes = min(_MAX_FETCH_BYTES, self._fetch_budget)

        async def from_leader(leader: int, group: list[int]) -> dict[str, Any]:
            conn = await self.cluster.connection(leader)
            return await conn.request(ApiKey.FETCH, {
                "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes,
                "isolation_level": self._isolation,
                "topics": [{"topic": self.topic, "partitions": [
                    {"partition": p, "fetch_offset": offsets[p],
                     "partition_max_bytes": self._max_bytes[p]} for p in group]}]})

        leaders = self._by_leader(offsets)
        try:
            async with asyncio.TaskGroup() as group:
                requests = [group.create_task(from_leader(leader, partitions))
                            for leader, partitions in leaders.items()]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None  # (the others were cancelled)
        answers = {}
        for request in requests:
            response = request.result()
            if response["error_code"]:
                raise error_for_code(response["error_code"], f"Fetch from {self.topic}")
            for topic in response["responses"]:
                for answer in topic["partitions"]:
                    answers[answer["partition_index"]] = answer
        return answers

    async def fetch(self, max_wait: float) -> list[ConsumedRecord]:
        """The records that arrive within `max_wait` seconds (the broker answers as soon as
        there are any), advancing each partition's position past them. What a retry may
        mend (a leader moved, a connection lost) is retried in the next call, after a
        backoff; other errors are raised."""
        try:
            answers = await self._fetch_at(self.positions, max_wait_ms=int(max_wait * 1000))
        except KafkaError as failed:
            await self._retry_later(failed)
            return []
        records: list[ConsumedRecord] = []
        for partition, answer in answers.items():
            error = _error(answer, f"Fetch from {self.topic}-{partition}")
            if isinstance(error, OffsetOutOfRangeError):  # deleted before we read it
                self.positions.update(await self._list_offsets([partition], _EARLIEST)
                                      if self._from_beginning
                                      else await self._start_offsets([partition]))
            elif error is not None:
                await self._retry_later(error)
            else:
                self._take(partition, answer, records)
        return records

    async def _retry_later(self, error: BaseException) -> None:
        if not isinstance(error, KafkaError) or not (error.retriable or error.refresh_metadata):
            raise error
        self._failing("reading %s: %s (retrying)", self.topic, error)
        # (want(), not just a refresh: a cluster forgets topics idle for metadata_max_idle_ms,
        # and a reader's fetches do not count as use)
        self.cluster.want([self.topic])
        await asyncio.sleep(self._backoff.failed())
        try:
            await self.cluster.refresh()
        except KafkaError as failed:  # (the next fetch tries again)
            if not failed.retriable:
                raise

    def _take(self, partition: int, answer: dict[str, Any], out: list[ConsumedRecord]) -> None:
        self._backoff.reset()
        data = answer["records"]
        if not data:
            return
        batches = read_batches(data)
        if not batches:  # its next batch is larger than we asked for (brokers before KIP-74)
            self._max_bytes[partition] = min(self._max_bytes[partition] * 2, _MAX_BATCH_BYTES,
                                             self._fetch_budget)
            return
        aborted: tuple[tuple[int, int], ...] = ()
        if self._isolation == IsolationLevel.READ_COMMITTED:
            aborted = tuple((a["producer_id"], a["first_offset"])
                            for a in answer["aborted_transactions"] or ())
        position = self.positions[partition]
        # A Fetch starts at the batch holding the offset asked for: skip what came before.
        out.extend(ConsumedRecord(partition, r.offset, r.timestamp, r.key, r.value, r.headers)
                   for r in visible_records(batches, aborted) if r.offset >= position)
        last = batches[-1]
        self.positions[partition] = max(position, last.base_offset + last.last_offset_delta + 1)


def _error(answer: dict[str, Any], what: str) -> KafkaError | None:
    code = answer["error_code"]
    return error_for_code(code, what) if code else None
