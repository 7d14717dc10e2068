"""What the producer knows of the cluster: brokers, partition leaders, and a connection each.

Metadata is fetched for the topics the producer has used (in the last `metadata_max_idle_ms`),
refreshed when an error says it is stale (unknown topic, no leader, not leader) and when older
than `metadata_max_age_ms`.
Concurrent refresh requests share one in-flight fetch. Connections are opened on demand, at
most one per broker, with exponential backoff after failures; the sender asks without
waiting (`ready_connection`) and is woken when a connection comes up.

Rebootstrap (KIP-899, KIP-1102; `metadata_recovery_strategy="rebootstrap"`): the brokers a
metadata answer named are forgotten, their connections closed, and metadata is asked of
`bootstrap_servers` again (their names resolved anew, as at every connection) when every
known broker failed to connect, when none has given metadata for
`metadata_recovery_rebootstrap_trigger_ms` while metadata was wanted (they take connections
but never answer, say), or when a broker answers REBOOTSTRAP_REQUIRED. The cluster id is kept:
a bootstrap address that now leads to another cluster is refused.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
import random
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Mapping

from ..config import ProducerConfig, ssl_context_for
from ..errors import (
    AuthenticationError,
    CorruptMessageError,
    InconsistentClusterIdError,
    InvalidTopicError,
    KafkaConnectionError,
    KafkaError,
    ProducerClosedError,
    RebootstrapRequiredError,
    RequestTimeoutError,
    TopicAuthorizationFailedError,
    UnknownTopicError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from ..protocol.messages import ApiKey
from ..protocol.sasl import OAuthBearer, SaslMechanism
from ..protocol.sasl import mechanism as sasl_mechanism
from .backoff import Backoff, exponential_backoff
from .connection import BrokerConnection
from .ratelimit import LogEvery
from .tasks import TaskSet, shielded

log = logging.getLogger(__name__)
_REBOOTSTRAP_LOG_S = 10.0  # a rebootstrap WARNING at most this often (the rest at DEBUG)

# Errors that make a topic unusable at once, however long we wait.
_HARD_TOPIC_ERRORS = (InvalidTopicError, TopicAuthorizationFailedError)


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int

    @classmethod
    def from_response(cls, node_id: int, host: str, port: int) -> "Broker":
        """A broker a response names (Metadata, a produce response's NodeEndpoints,
        FindCoordinator), its address checked: a port out of range, a NUL or a 300-character
        label made the connect task fail with OverflowError, ValueError or UnicodeError."""
        problem = address_problem(host, port)
        if problem is not None:
            raise CorruptMessageError(f"the broker names broker {node_id} at an address no "
                                      f"client can connect to: {problem}")
        return cls(node_id, host, port)


def address_problem(host: str, port: int) -> str | None:
    """Why (host, port) cannot be connected to, or None: a port of 1-65535, and a host that
    is an IP address or a DNS name (labels of 1-63 characters, IDNA, 253 at most)."""
    if not 0 < port < 65536:
        return f"port {port} is not 1-65535"
    if not host or any(ord(c) < 0x20 or c == "\x7f" for c in host):
        return "the host is empty or holds control characters"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        name = host.encode("idna")
    except UnicodeError:
        return "the host is not a DNS name (an empty label, one over 63 characters, or not IDNA)"
    if len(name.rstrip(b".")) > 253:
        return "the host is longer than a DNS name may be (253)"
    return None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """Leaders of a topic's partitions (-1: none now) and their leader epochs (-1: unknown);
    `error` set when the topic is unusable. `topic_id` (KIP-516, Metadata v10+: its 16 bytes;
    None: not given) names the topic in Produce v13+; while the topic is unusable it is the
    last id seen, so that its recreation is noticed."""

    name: str
    leaders: tuple[int, ...]
    error: KafkaError | None = None
    epochs: tuple[int, ...] = ()
    topic_id: bytes | None = None


class _Backoff:
    """A broker's reconnect backoff: its failures in a row, the address they were at, and
    what the last one said."""

    __slots__ = ("failures", "not_before", "address", "error")

    def __init__(self) -> None:
        self.failures = 0
        self.not_before = 0.0
        self.address: tuple[str, int] | None = None
        self.error = ""


# What `Cluster._say_missing` logs (the CLI, which says it its own way, leaves it out).
MISSING_TOPIC_WARNING = (
    "topic %r does not exist (UNKNOWN_TOPIC_OR_PARTITION) and was not created on request "
    "(allow_auto_create_topics=%s%s): records for it wait up to max_block_ms=%.0f for it to be "
    "made, then fail. Create it, or check its name")


class Cluster:
    """Metadata and one connection per broker; shared by the producer and its sender."""

    # `topics` in a slot: the compiled append path (the speed-up's Appender) reads it at the
    # slot's offset, every record (a lookup by name was a twentieth of an enqueue()).
    __slots__ = ("__dict__", "__weakref__", "topics")

    def __init__(self, config: ProducerConfig, tasks: TaskSet) -> None:
        self._config = config
        self._tasks = tasks  # the producer's: what this spawns, the producer's close() awaits
        # Wired by whoever puts the parts together: wakes the sender (a connection came up or
        # leaders moved); asked before an idle topic is forgotten (False while records for it
        # are pending).
        self.on_change: Callable[[], None] = lambda: None
        self.release_topic: Callable[[str], bool] = lambda topic: True
        self._refresh_failed = LogEvery(log, logging.WARNING, 30)  # an outage's, every 30 s
        self._bad_address = LogEvery(log, logging.WARNING, 30)
        self._not_recovering = LogEvery(log, logging.WARNING, 30)  # metadata_recovery "none"
        self._refused = LogEvery(log, logging.WARNING, 30)  # another cluster's metadata
        self._said_missing: set[str] = set()  # topics said not to exist (`_say_missing`)
        # When each topic was last produced to (a new batch; the accumulator writes it too).
        self.touched: dict[str, float] = {}
        self._loop = asyncio.get_running_loop()
        self.brokers: dict[int, Broker] = {}
        self.controller_id = -1  # where CreateTopics goes (aioproducer topic create)
        self.cluster_id: str | None = None  # the first metadata's; later answers must agree
        # The cluster's finalized features (KIP-584), from the ApiVersions answer with the
        # highest epoch so far: name -> level (transaction.version decides Transactions V2).
        self.finalized_features: dict[str, int] = {}
        self.features_epoch = -1
        self.topics: dict[str, TopicInfo] = {}
        # close() has begun: a topic still unknown to the cluster a second into a wait for it
        # (said missing) is given up at once, not waited for until max_block_ms.
        self.closing = False
        # When Metadata last showed a topic under a new id (deleted and made again; loop time).
        self.recreated: dict[str, float] = {}
        self._wanted: set[str] = set()
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Task[BrokerConnection]] = {}
        self._opening: set[BrokerConnection] = set()  # theirs, while BrokerConnection.connect()
        self._backoff: dict[int, _Backoff] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._updated_at = float("-inf")
        self._attempted_at = float("-inf")
        # Between fetches while stale: retry_backoff_ms, doubled by each failed fetch up to
        # retry_backoff_max_ms, so an outage is not knocked on 10 times a second.
        self._refresh_backoff = Backoff(config.retry_backoff_ms / 1000,
                                        config.retry_backoff_max_ms / 1000)
        self._stale = True
        self.reauthentications = 0  # for metrics (KIP-368)
        self.rebootstraps = 0  # for metrics (KIP-899, KIP-1102)
        self._rebootstraps_said = (-_REBOOTSTRAP_LOG_S, 0)  # (last logged at, since)
        # Bumped by each rebootstrap: a connection begun before one is not kept after it.
        self._generation = 0
        # KIP-1102: when the first fetch since the last metadata answer began (None: none is
        # waited for), and the timer that rebootstraps if none has come trigger_ms later.
        self._unanswered_since: float | None = None
        self._rebootstrap_timer: asyncio.TimerHandle | None = None
        # KIP-1242: whether connections to the brokers metadata named ask them to check that
        # they are that broker of this cluster: once a broker showed it speaks ApiVersions v5.
        self._check_where = config.metadata_cluster_check_enable and \
            config.metadata_recovery_strategy == "rebootstrap"
        self._brokers_check_where = False
        self.connections_created = 0  # for client telemetry (KIP-714)
        self._closed: asyncio.Future[None] = self._loop.create_future()  # done at close()
        self._ssl_context = ssl_context_for(config)
        # Bootstrap servers get negative ids, as in the Java client, until metadata names them.
        self._bootstrap = [Broker(-1 - i, host, port)
                           for i, (host, port) in enumerate(config.bootstrap_addresses)]

    # -- metadata --------------------------------------------------------------------------

    def leader_for(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        if info is None or partition >= len(info.leaders):
            return -1
        return info.leaders[partition]

    def update_leader(self, topic: str, partition: int, leader: Mapping[str, int],
                      endpoints: Iterable[Mapping[str, Any]], refused_by: int) -> bool:
        """Take the new leader a produce response from broker `refused_by` named (KIP-951:
        `leader` is its CurrentLeader, `endpoints` its NodeEndpoints), unless what we know is
        newer (by leader epoch). True if the partition is led by that broker at that epoch
        now, whether this answer moved it or an earlier one did (several batches in flight
        to the old leader are refused for the same move, and each may go to the new one at
        once), so the batch need not wait for a metadata refresh. False for a stale answer:
        an older epoch, another leader at the same epoch, or the refusing broker itself."""
        info = self.topics.get(topic)
        node_id, epoch = leader["leader_id"], leader["leader_epoch"]
        if info is None or info.error is not None or not 0 <= partition < len(info.leaders) \
                or node_id < 0 or epoch < 0 or node_id == refused_by:
            return False
        known = info.epochs[partition] if partition < len(info.epochs) else -1
        if known > epoch:
            return False
        if known == epoch:  # this move is known already (or a conflicting answer)
            return info.leaders[partition] == node_id
        # Its address as the response names it, over what we knew (a node that moved
        # hosts), as Java's Metadata.updatePartitionLeadership takes NodeEndpoints.
        endpoint = next((e for e in endpoints if e["node_id"] == node_id), None)
        if endpoint is not None:
            try:
                broker = Broker.from_response(node_id, endpoint["host"], endpoint["port"])
            except CorruptMessageError as exc:
                self._bad_address("%s: ignored", exc)
            else:
                if self.brokers.get(node_id) != broker:
                    self.brokers = {**self.brokers, node_id: broker}
                    self._forget_backoff_elsewhere(broker)
        if node_id not in self.brokers:
            return False
        leaders = list(info.leaders)
        epochs = list(info.epochs) if len(info.epochs) == len(leaders) else [-1] * len(leaders)
        leaders[partition], epochs[partition] = node_id, epoch
        self.topics[topic] = TopicInfo(topic, tuple(leaders), epochs=tuple(epochs),
                                       topic_id=info.topic_id)
        return True

    def _forget_backoff_elsewhere(self, broker: Broker) -> None:
        """A response names `broker` at an address other than the one its reconnect backoff
        (kept by node id, across rebootstraps) was for: nothing failed there, connect now."""
        backoff = self._backoff.get(broker.node_id)
        if backoff is not None and backoff.address != (broker.host, broker.port):
            del self._backoff[broker.node_id]

    def touch(self, topic: str) -> None:
        """`topic` is being produced to: keep its metadata (see metadata_max_idle_ms)."""
        self.touched[topic] = self._loop.time()

    def _forget_idle_topics(self) -> None:
        """Stop fetching metadata for topics nothing was produced to for metadata_max_idle_ms
        (the Java client's rule, KIP-526), so a service that writes to many short-lived
        topics does not fetch all of them for ever."""
        cutoff = self._loop.time() - self._config.metadata_max_idle_ms / 1000
        for topic in [t for t, used in self.touched.items() if used < cutoff]:
            if self.release_topic(topic):
                del self.touched[topic]
                self._wanted.discard(topic)
                self.topics.pop(topic, None)

    def request_update(self) -> None:
        """Mark metadata stale (an error said so); the sender refreshes it soon."""
        self._stale = True

    def want(self, topics: Iterable[str]) -> None:
        """Batches wait for these topics' leaders: fetch their metadata soon (again, if it
        was forgotten as idle while their records waited for buffer memory)."""
        for topic in topics:
            self._wanted.add(topic)
            self.touch(topic)
        self._stale = True

    def maybe_refresh(self, now: float) -> float:
        """Start a fetch if metadata is stale or old (not sooner than retry_backoff_ms after
        the last attempt); return the seconds until the next one is due."""
        if self._refresh is not None and not self._refresh.done():
            return float("inf")  # its end wakes the sender
        due = self._attempted_at + self._refresh_backoff.delay
        if not self._stale:  # (metadata_max_age_ms may be 0: still no more often than that)
            due = max(due, self._updated_at + self._config.metadata_max_age_ms / 1000)
        if now < due:
            return due - now
        self.refresh()
        return float("inf")

    def refresh(self) -> asyncio.Task[None]:
        """Start a metadata fetch unless one is running; await the task to wait for it."""
        if self._refresh is None or self._refresh.done():
            self._attempted_at = self._loop.time()
            if self._unanswered_since is None:
                self._unanswered_since = self._attempted_at
                self._arm_rebootstrap_timer()
            self._refresh = self._tasks.spawn(
                self._fetch_metadata(), f"aioproducer-metadata-{self._config.client_id}")
            self._refresh.add_done_callback(partial(self._refresh_done, self._generation))
        return self._refresh

    def _refresh_done(self, generation: int, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            # Not the first fetch's failure (it fails start()), nor one a rebootstrap cut
            # short (its WARNING said why); another cluster's answer has a line of its own,
            # not lost among an outage's.
            if self._updated_at != float("-inf") and generation == self._generation:
                said = self._refused if isinstance(exc, InconsistentClusterIdError) \
                    else self._refresh_failed
                said("metadata refresh failed: %s", exc)
            self._refresh_backoff.failed()
        elif not task.cancelled() and not (self._refresh_failed.quiet() and self._refused.quiet()):
            log.warning("metadata refresh works again")
            self._refresh_failed.reset()
            self._refused.reset()
        self.on_change()

    async def topic(self, topic: str, timeout: float, deadline: float | None = None
                    ) -> TopicInfo:
        """Metadata for `topic`, fetching it (with retries) for at most `timeout` seconds, or
        until `deadline` (loop time: that of a wait begun `timeout` before)."""
        info = self.topics.get(topic)
        if info is not None and info.error is None and info.leaders:
            return info
        self._wanted.add(topic)
        self.touch(topic)
        if deadline is None:
            deadline = self._loop.time() + timeout
        backoff = Backoff(self._config.retry_backoff_ms / 1000,
                          self._config.retry_backoff_max_ms / 1000)
        last_error: BaseException | None = None
        answered = False  # whether a fetch got the cluster's answer
        while True:
            if self.closed:
                raise ProducerClosedError(
                    f"the producer was closed while it fetched metadata for topic {topic!r}")
            refresh = self.refresh()
            # No longer than max_block_ms: a fetch stuck on a silent broker goes on alone.
            # (asyncio.wait, unlike wait_for on 3.11, never loses the caller's cancellation.)
            done, _ = await asyncio.wait({refresh}, timeout=max(deadline - self._loop.time(), 0))
            if not done:
                break
            if refresh.cancelled():  # by close(): said at the top of the loop
                continue
            exc = refresh.exception()
            if exc is not None and (not isinstance(exc, KafkaError) or exc.fatal or
                                    isinstance(exc, InconsistentClusterIdError)):
                raise exc  # (a failed TLS handshake, say)
            # Looked up after a failed fetch too: another's (the sender's) may have brought it
            # meanwhile. Against a broker advertising an address this client cannot reach,
            # the fetches alternate (bootstrap_servers answer, the broker named fails and
            # sends the next back to them), and this one's were all the failing ones.
            info = self.topics.get(topic)
            if info is not None and info.error is None and info.leaders:
                return info
            if exc is not None:
                last_error = exc
            else:
                answered = True
                if info is not None and isinstance(info.error, _HARD_TOPIC_ERRORS):
                    raise info.error
                last_error = info.error if info is not None else None
                if isinstance(last_error, UnknownTopicOrPartitionError) and \
                        self._loop.time() >= deadline - timeout + 1:
                    self._say_missing(topic, timeout)
                    if self.closing:  # (close() waits for sends to buffer, not for this)
                        break
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            await self.pause(min(backoff.failed(), remaining))
        if not answered or isinstance(last_error, (KafkaConnectionError, RequestTimeoutError)):
            raise KafkaConnectionError(
                f"could not fetch metadata for topic {topic!r} within max_block_ms="
                f"{timeout * 1000:.0f}: " + (str(last_error) if last_error else
                                             "no answer yet (the fetch goes on: a later send "
                                             "may find the topic)")
            ) from last_error
        waited = "as the producer closed (close() waits for no topic that does not exist)" \
            if self.closing else f"after max_block_ms={timeout * 1000:.0f}"
        raise UnknownTopicError(
            f"topic {topic!r} is not in the cluster's metadata {waited}"
            + (f" ({last_error})" if last_error else "") + ": create it first, or check its name")

    def _say_missing(self, topic: str, timeout: float) -> None:
        """A topic still unknown to the cluster a second into a send's wait for it (not one
        just created, whose metadata may lag): said once, as records may wait max_block_ms
        (60 s by default) before they fail. The Java client logs the error of each metadata
        answer."""
        if topic in self._said_missing:
            return
        self._said_missing.add(topic)
        log.warning(MISSING_TOPIC_WARNING, topic, self._config.allow_auto_create_topics,
                    "; the brokers' auto.create.topics.enable may be off"
                    if self._config.allow_auto_create_topics else "", timeout * 1000)

    async def _fetch_metadata(self) -> None:
        self._forget_idle_topics()
        conn = await self.any_connection()
        topics = sorted(self._wanted | self.topics.keys())
        response = await conn.request(ApiKey.METADATA, {
            "topics": [{"name": t} for t in topics],
            "allow_auto_topic_creation": self._config.allow_auto_create_topics,
        })
        error_code = response.get("error_code", 0)  # (Metadata v13+)
        if error_code:
            exc = error_for_code(error_code, f"metadata from {conn.address}")
            if isinstance(exc, RebootstrapRequiredError):
                self._rebootstrap(f"{conn.address} answered REBOOTSTRAP_REQUIRED")
            raise exc
        cluster_id = response.get("cluster_id")
        if cluster_id and self.cluster_id and cluster_id != self.cluster_id:
            # After every known broker failed, the bootstrap servers led somewhere else
            # (a DNS name moved to another cluster): its partitions are not ours to write.
            conn.close()
            raise InconsistentClusterIdError(
                f"{conn.address} belongs to Kafka cluster {cluster_id!r}, not {self.cluster_id!r} "
                "that this producer started with: its metadata is refused (check "
                "bootstrap_servers)")
        self.cluster_id = self.cluster_id or cluster_id
        brokers = {}
        for b in response["brokers"]:
            try:
                brokers[b["node_id"]] = Broker.from_response(b["node_id"], b["host"], b["port"])
            except CorruptMessageError as exc:  # its partitions have no leader we can reach
                self._bad_address("%s: ignored", exc)
        self.brokers = brokers
        for broker in brokers.values():
            self._forget_backoff_elsewhere(broker)
        self.controller_id = response["controller_id"]
        topics_info: dict[str, TopicInfo] = {}
        for t in response["topics"]:
            name = t["name"]
            known = self.topics.get(name)
            if t["error_code"]:
                topics_info[name] = TopicInfo(name, (), error_for_code(
                    t["error_code"], f"metadata for topic {name!r}"),
                    topic_id=known.topic_id if known is not None else None)
                continue
            topic_id = t.get("topic_id")
            if topic_id == bytes(16):  # (none given)
                topic_id = None
            if known is not None and known.topic_id is not None and topic_id is not None \
                    and known.topic_id != topic_id:
                # Deleted and made again under the same name. Its partitions' leader epochs
                # start again: the old ones must not win over the new topic's (below).
                log.warning("topic %r was deleted and recreated (its id was %s, now %s): its "
                            "records not yet written go to the new topic", name,
                            uuid.UUID(bytes=known.topic_id), uuid.UUID(bytes=topic_id))
                self.recreated[name] = self._loop.time()
                known = None
            leaders = [-1] * len(t["partitions"])
            epochs = [-1] * len(t["partitions"])
            for p in t["partitions"]:
                index, leader = p["partition_index"], p["leader_id"]
                epoch = p.get("leader_epoch", -1)
                if index >= len(leaders):
                    continue
                if known is not None and index < len(known.epochs) and \
                        known.epochs[index] > epoch >= 0 and known.leaders[index] in self.brokers:
                    # A produce response named a newer leader (KIP-951) than this answer,
                    # which a broker behind the change gave: stale metadata never wins.
                    leader, epoch = known.leaders[index], known.epochs[index]
                # A leader missing from the brokers listed cannot be reached: taken as none
                # (the sender asks again, as the Java client does), not waited for until
                # metadata_max_age_ms.
                if leader in self.brokers:
                    leaders[index], epochs[index] = leader, epoch
            topics_info[name] = TopicInfo(name, tuple(leaders), epochs=tuple(epochs),
                                          topic_id=topic_id)
        self.topics = topics_info
        self._updated_at = self._loop.time()
        self._stale = False
        self._refresh_backoff.reset()
        self._unanswered_since = None
        if self._rebootstrap_timer is not None:
            self._rebootstrap_timer.cancel()
            self._rebootstrap_timer = None
        self._adopt_bootstrap_connections()

    # -- rebootstrap (KIP-899, KIP-1102) -----------------------------------------------------

    def _arm_rebootstrap_timer(self) -> None:
        if self._config.metadata_recovery_strategy != "rebootstrap" or self.closed:
            return
        if self._rebootstrap_timer is not None:
            self._rebootstrap_timer.cancel()
        assert self._unanswered_since is not None
        self._rebootstrap_timer = self._loop.call_at(
            self._unanswered_since + self._config.metadata_recovery_rebootstrap_trigger_ms / 1000,
            self._rebootstrap_due)

    def _rebootstrap_due(self) -> None:
        """No metadata for metadata_recovery_rebootstrap_trigger_ms though it was asked for."""
        self._rebootstrap_timer = None
        if self.closed or self._unanswered_since is None:
            return
        waited_ms = (self._loop.time() - self._unanswered_since) * 1000
        if self.brokers:
            self._rebootstrap(f"no broker has given metadata for {waited_ms:.0f} ms "
                              f"(metadata_recovery_rebootstrap_trigger_ms="
                              f"{self._config.metadata_recovery_rebootstrap_trigger_ms})")
        else:  # the bootstrap servers are being asked already (resolved anew at each try)
            self._unanswered_since = self._loop.time()
            self._arm_rebootstrap_timer()

    def _rebootstrap(self, reason: str) -> None:
        """Forget the brokers metadata named, close their connections and give up connecting
        to them, and ask bootstrap_servers for metadata next (with the "none" strategy, only
        say why not). Records keep their place: batches in flight on the closed connections
        are retried in order, and every partition waits for the new metadata's leader."""
        if self._config.metadata_recovery_strategy != "rebootstrap":
            self._not_recovering("%s; metadata_recovery_strategy='none': asking the known "
                                 "brokers again", reason)
            return
        self.rebootstraps += 1
        # Said once per _REBOOTSTRAP_LOG_S at most: brokers that advertise an address this
        # client cannot reach send it back to bootstrap_servers several times a second.
        now, (said_at, unsaid) = self._loop.time(), self._rebootstraps_said
        if now - said_at >= _REBOOTSTRAP_LOG_S:
            log.warning("rebootstrapping from bootstrap_servers %s: %s%s",
                        ",".join(f"{host}:{port}"
                                 for host, port in self._config.bootstrap_addresses),
                        reason, f" ({unsaid} more time(s) since the last such line)"
                        if unsaid else "")
            self._rebootstraps_said = (now, 0)
        else:
            self._rebootstraps_said = (said_at, unsaid + 1)
            log.debug("rebootstrapping again: %s", reason)
        self._generation += 1
        self.brokers = {}
        self.topics = {name: TopicInfo(name, (-1,) * len(info.leaders), info.error, info.epochs,
                                       info.topic_id)
                       for name, info in self.topics.items()}
        for node_id in [n for n in self._connecting if n >= 0]:
            task = self._connecting.pop(node_id)
            if task is not asyncio.current_task():  # (one that asked for this ends itself)
                task.cancel()  # (its waiters get a KafkaConnectionError)
        # The brokers' reconnect backoffs stay, growing (the Java client keys them by node
        # id too): the bootstrap servers may name the same addresses again. Started afresh,
        # a broker advertising an address this client cannot reach sent it back to
        # bootstrap_servers for metadata ~5 times a second.
        for conn in list(self._connections.values()):
            # (_connection_closed marks the metadata stale and wakes the sender)
            conn.close(KafkaConnectionError(f"connection to {conn.address} closed: the "
                                            "producer rebootstrapped"))
        self._stale = True
        self._refresh_backoff.reset()
        self._unanswered_since = self._loop.time()
        self._arm_rebootstrap_timer()
        self.on_change()

    def _adopt_bootstrap_connections(self) -> None:
        """A bootstrap connection to an address metadata names becomes that broker's."""
        by_address = {(b.host, b.port): b.node_id for b in self.brokers.values()}
        for node_id, conn in list(self._connections.items()):
            if node_id < 0:
                real = by_address.get((conn.host, conn.port))
                del self._connections[node_id]
                if real is not None and real not in self._connections:
                    conn.node_id = real
                    self._connections[real] = conn
                    self._backoff.pop(real, None)  # it is reachable after all
                elif not conn.closed:
                    conn.on_close = None  # ours to close: no broker was lost
                    conn.close()

    async def any_connection(self, deadline: float = float("inf")) -> BrokerConnection:
        """A connection to any broker: an open one if there is one, else the first that answers.
        A wait for a reconnect backoff ends by `deadline` (loop time): a caller bound by
        max_block_ms then gets the connection error in time."""
        if not self.open_connections():
            # Every one failed lately: wait for the first to be due, as the Java client's
            # leastLoadedNode does, not knock in a loop (retry_backoff_ms=0 is no backoff).
            due = min(self.backoff_remaining(broker.node_id) for broker in self._candidates())
            wait = min(due, deadline - self._loop.time())
            if wait > 0:
                await self.pause(wait)  # (then, closed, connection() raises)
        for conn in self._connections.values():
            if not conn.closed:
                return conn
        candidates = self._candidates()  # (as they are after the wait)
        random.shuffle(candidates)
        # Those that failed lately (a silent one costs a connect timeout) last, as the Java
        # client's leastLoadedNode does.
        candidates.sort(key=lambda broker: self.backoff_remaining(broker.node_id) > 0)
        errors: list[str] = []
        timeouts: list[RequestTimeoutError] = []
        generation = self._generation
        for broker in candidates:
            if self._generation != generation:  # the others are forgotten too
                break
            try:
                return await self.connection(broker.node_id, broker)
            except KafkaError as exc:
                # One that never answers (RequestTimeoutError) or is not a Kafka broker
                # (CorruptMessageError) must not keep us from the next; a failed TLS or SASL
                # handshake (fatal) would fail on every broker alike, and so would any once
                # the producer is closed.
                if exc.fatal or isinstance(exc, ProducerClosedError):
                    raise
                errors.append(str(exc))
                if isinstance(exc, RequestTimeoutError):
                    timeouts.append(exc)
        if self.brokers and self._generation == generation:
            # Every known broker failed (KIP-899): start over from the bootstrap list.
            self._rebootstrap("no broker the metadata named could be reached: "
                              + "; ".join(errors))
        # Caused by a timeout when every one took connections but never answered: start()
        # asks again until max_block_ms (a broker still starting up, say).
        raise KafkaConnectionError("no broker reachable: " + "; ".join(errors)) \
            from (timeouts[-1] if timeouts and len(timeouts) == len(errors) else None)

    def _candidates(self) -> list[Broker]:
        return list(self.brokers.values()) or list(self._bootstrap)

    # -- connections -----------------------------------------------------------------------

    def unreachable_leader(self, topic: str, partition: int) -> str | None:
        """Why the partition's leader cannot be connected to now (its last connect's error),
        or None: a record that expires waiting for it says why. A leader that failed is
        forgotten until the metadata names it again (-1): then the latest failure says why (it
        names its address), and whether every broker (or bootstrap server) failed."""
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.leaders):
            return None
        leader = info.leaders[partition]
        failing = {node_id: backoff for node_id, backoff in self._backoff.items()
                   if backoff.failures and self.connected(node_id) is None}
        if leader >= 0:
            backoff = failing.get(leader)
            return None if backoff is None else \
                f"its leader, broker {leader}, could not be reached: {backoff.error}"
        if not failing:
            return None
        _, error = max((backoff.not_before, backoff.error) for backoff in failing.values())
        # (while rebootstrapping no broker is known: the bootstrap servers are the ones tried)
        known = list(self.brokers) or [broker.node_id for broker in self._bootstrap]
        if all(node_id in failing for node_id in known):
            return f"no broker could be reached: {error}"
        return f"its leader is not known now; the last broker tried could not be reached: {error}"

    def connected(self, node_id: int) -> BrokerConnection | None:
        """The connection to `node_id` if it is up (starting none)."""
        conn = self._connections.get(node_id)
        return conn if conn is not None and not conn.closed else None

    def ready_connection(self, node_id: int) -> BrokerConnection | None:
        """The connection to `node_id` if it is up; otherwise start connecting and say None
        (None at once for -1, no leader: not a bootstrap server's connection, whose ids are
        negative too)."""
        if node_id < 0:
            return None
        conn = self.connected(node_id)
        if conn is not None:
            return conn
        if node_id not in self._connecting and not self.closed:
            backoff = self._backoff.get(node_id)
            if backoff is None or backoff.not_before <= self._loop.time():
                self._tasks.spawn(self.connection(node_id), f"aioproducer-connect-{node_id}")
        return None

    @property
    def closed(self) -> bool:
        return self._closed.done()

    def barriers(self) -> dict[asyncio.Future[dict[str, Any]], BrokerConnection]:
        """A barrier (BrokerConnection.barrier) on each connection written a request that gets
        no response (acks=0 Produce) since its last one, done once the broker has handled
        them: such a request is done once written, and closing the connections at once
        dropped those the broker had not read yet (1,480 records of 2,000)."""
        return {conn.barrier(): conn for conn in self._connections.values()
                if conn.written_unanswered and not conn.closed}

    async def pause(self, seconds: float) -> None:
        """Wait `seconds` between retries, or less: until close()."""
        await asyncio.wait({self._closed}, timeout=seconds)

    def open_connections(self) -> list[BrokerConnection]:
        return [conn for conn in self._connections.values() if not conn.closed]

    def backoff_remaining(self, node_id: int) -> float:
        backoff = self._backoff.get(node_id)
        return 0.0 if backoff is None else max(0.0, backoff.not_before - self._loop.time())

    async def connection(self, node_id: int, broker: Broker | None = None) -> BrokerConnection:
        """Connect to `node_id` (once, however many callers ask at the same time)."""
        conn = self._connections.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        if self.closed:
            raise ProducerClosedError("the producer is closed")
        task = self._connecting.get(node_id)
        if task is None:
            target = broker or self.brokers.get(node_id)
            if target is None:
                raise KafkaConnectionError(f"broker {node_id} is not in the metadata")
            task = self._tasks.spawn(self._open(target), f"aioproducer-open-{target.node_id}")
            self._connecting[node_id] = task
        try:
            return await shielded(task, f"the producer was closed while it connected to "
                                        f"broker {node_id}")
        except ProducerClosedError:
            if self.closed:
                raise
            raise KafkaConnectionError(f"connecting to broker {node_id} was given up: the "
                                       "producer rebootstrapped") from None

    async def _open(self, broker: Broker) -> BrokerConnection:
        config = self._config
        generation = self._generation
        check = self._check_where and self._brokers_check_where and broker.node_id >= 0
        try:
            sasl = await self._sasl_mechanism()
            conn = await BrokerConnection.connect(
                broker.node_id, broker.host, broker.port, client_id=config.client_id,
                request_timeout=config.request_timeout_ms / 1000,
                connect_timeout=self._setup_timeout(broker.node_id),
                ssl_context=self._ssl_context, sasl=sasl,
                max_response_bytes=config.receive_message_max_bytes,
                max_request_size=config.max_request_size,
                expected_cluster_id=self.cluster_id if check else None,
                opening=self._opening)
        except KafkaError as exc:
            if self._generation != generation:  # forgotten meanwhile: no backoff to keep
                raise
            failures = self._backoff.get(broker.node_id, _Backoff()).failures
            if isinstance(exc, RebootstrapRequiredError):
                # The address metadata gave leads to another broker or cluster (KIP-1242).
                self._rebootstrap(str(exc))
            # A node that cannot be reached may have lost its partitions, though the metadata
            # named it: ask again (on Kafka the controller moves leaders only once the dead
            # broker's session times out, seconds after the first refresh that followed the
            # lost connection). The Java client does the same. (After a rebootstrap the
            # backoff stays: the bootstrap servers may name that address again.)
            # (The sender is woken now for that, and again when the backoff ends.)
            self._stale = True
            backoff = self._backoff.setdefault(broker.node_id, _Backoff())
            backoff.address = (broker.host, broker.port)
            backoff.error = str(exc)
            delay = exponential_backoff(config.reconnect_backoff_ms / 1000, failures,
                                        config.reconnect_backoff_max_ms / 1000)
            backoff.failures = failures + 1
            backoff.not_before = self._loop.time() + delay
            self.on_change()
            self._loop.call_later(delay, self.on_change)
            raise
        finally:
            if self._connecting.get(broker.node_id) is asyncio.current_task():
                del self._connecting[broker.node_id]
        try:  # (it leaves _opening only once in _connections: a fork finds it in one)
            if self.closed:
                conn.close()
                raise ProducerClosedError("the producer is closed")
            if self._generation != generation and broker.node_id >= 0:
                conn.close()
                raise KafkaConnectionError(f"{conn.address}: connected after the producer "
                                           "rebootstrapped, and no longer known")
            self._backoff.pop(broker.node_id, None)
            self._brokers_check_where = self._brokers_check_where or \
                conn.broker_ranges.get(ApiKey.API_VERSIONS, (0, 0))[1] >= 5
            self.connections_created += 1
            conn.on_close = self._connection_closed
            conn.on_resume = self._connection_writable
            conn.on_reauthentication_due = self._reauthenticate_soon
            self._connections[broker.node_id] = conn
        finally:
            self._opening.discard(conn)
        if conn.features_epoch >= self.features_epoch:  # the newest a broker told (KIP-584)
            self.features_epoch, self.finalized_features = \
                conn.features_epoch, conn.finalized_features
        self._schedule_reauthentication(conn)
        self.on_change()
        return conn

    async def _sasl_mechanism(self) -> SaslMechanism | None:
        """A fresh exchange for one authentication (an OAUTHBEARER token asked of the
        provider each time, so it may be a new one); None without SASL."""
        config = self._config
        if not config.security_protocol.startswith("SASL"):
            return None
        if config.sasl_mechanism != "OAUTHBEARER":
            return sasl_mechanism(config.sasl_mechanism, config.sasl_username or "",
                                  config.sasl_password or "")
        provider = config.sasl_oauth_token_provider
        get_token = getattr(provider, "token", provider)
        failed: type[BaseException] | None = None
        try:
            token = get_token()
            if inspect.isawaitable(token):
                token = await token
            extensions = getattr(provider, "extensions", None)
            extras = extensions() if callable(extensions) else None
        except Exception as exc:
            failed = type(exc)
        if failed is not None:
            # Raised outside the except block: the provider's exception is neither the cause
            # nor the context of ours, so no traceback or log shows its message, which may
            # hold the credentials it used (a client secret, a signed URL). Its type and the
            # provider's name say where to look.
            raise AuthenticationError(
                f"the OAUTHBEARER token provider {_provider_name(provider)} failed with "
                f"{_qualified(failed)} (its message is not shown: it may hold credentials; "
                "call the provider yourself to see it)")
        if not isinstance(token, str):
            raise AuthenticationError(f"the OAUTHBEARER token provider returned "
                                      f"{type(token).__name__}, not a str")
        return OAuthBearer(token, extras)

    def _schedule_reauthentication(self, conn: BrokerConnection) -> None:
        """KIP-368: a broker that limits SASL sessions (connections.max.reauth.ms) closes a
        connection whose session ran out. Authenticate again at 85-95% of the lifetime, as
        the Java client does, spread so that connections do not all do it at once; the
        connection begins it (calling `_reauthenticate_soon`) and holds its requests."""
        if conn.session_lifetime_ms > 0:
            delay = conn.session_lifetime_ms / 1000 * random.uniform(0.85, 0.95)
            conn.reauthenticate_at(self._loop.time() + delay)

    def _reauthenticate_soon(self, conn: BrokerConnection) -> None:
        if not self.closed:  # (closed, it closed its connections: they call this no more)
            self._tasks.spawn(self._reauthenticate(conn),
                              f"aioproducer-reauthenticate-{conn.node_id}")

    async def _reauthenticate(self, conn: BrokerConnection) -> None:
        """Ask for a fresh exchange (a new token), then authenticate again on the same
        connection, which holds every request sent meanwhile (the sender's produce requests
        too: it drains nothing for it) until that ends; on failure, close it (its records are
        retried on a new one)."""
        try:
            mechanism = await self._sasl_mechanism()
            assert mechanism is not None
            if conn.closed:
                return
            await conn.reauthenticate(mechanism)
        except KafkaError as exc:
            log.warning("re-authenticating with %s failed: %s", conn.address, exc)
            conn.close(exc if exc.fatal else None)
            return
        finally:
            self.on_change()
        if conn.closed:
            return
        self.reauthentications += 1
        self._schedule_reauthentication(conn)

    def _setup_timeout(self, node_id: int) -> float:
        """Seconds to connect to a broker (KIP-601): a dead address, whose packets are dropped,
        costs socket_connection_setup_timeout_ms, doubled for each failure in a row to reach
        it up to the _max_ms, not request_timeout_ms each time."""
        config = self._config
        backoff = self._backoff.get(node_id)
        return exponential_backoff(config.socket_connection_setup_timeout_ms / 1000,
                                   backoff.failures if backoff is not None else 0,
                                   config.socket_connection_setup_timeout_max_ms / 1000)

    def _connection_writable(self) -> None:
        """A connection's write buffer drained (it was paused): the sender may write to it."""
        self.on_change()

    def _connection_closed(self, conn: BrokerConnection, exc: KafkaError) -> None:
        if self._connections.get(conn.node_id) is conn:
            del self._connections[conn.node_id]
        if not self.closed:
            log.info("%r closed: %s", conn, exc)
            self._stale = True  # leaders may have moved
            self.on_change()

    def close(self) -> None:
        """Close the connections and stop fetching and connecting (the tasks' owner awaits
        them)."""
        if not self._closed.done():
            self._closed.set_result(None)
        if self._rebootstrap_timer is not None:
            self._rebootstrap_timer.cancel()
        for task in (*self._connecting.values(), self._refresh):
            if task is not None:
                task.cancel()
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()

    def close_in_forked_child(self, loop_runs_here: bool) -> None:
        """close(), in a child forked after the producer started: the connections' sockets
        are the parent's (see BrokerConnection.close_in_forked_child). Unless its loop's
        thread is this one (`loop_runs_here`), only their descriptors are let go of."""
        for conn in [*self._connections.values(), *self._opening]:
            conn.close_in_forked_child(loop_runs_here)
        if loop_runs_here:
            self.close()



def _provider_name(provider: Any) -> str:
    """A token provider's class or function name, never its repr (which may show secrets)."""
    if inspect.isfunction(provider) or inspect.ismethod(provider):
        return _qualified(provider)
    return _qualified(type(provider))


def _qualified(thing: Any) -> str:
    module = getattr(thing, "__module__", None)
    name = getattr(thing, "__qualname__", type(thing).__qualname__)
    return name if module in (None, "builtins") else f"{module}.{name}"
