"""SimulatedCluster: several Kafka brokers, for tests, in front of one real broker.

Production clusters have several brokers whose leaders move, that go down and come back,
throttle clients and ask them to authenticate; the embedded broker is one node that leads
everything. The cluster puts N nodes (node ids 1..N, each its own port on 127.0.0.1) in front
of it. Every client connection to a node gets its own connection to the real broker and its
requests are forwarded, but the answers are the cluster's: Metadata lists the nodes and spreads
partition leadership across them, FindCoordinator spreads the coordinators, and a node answers
a Produce for a partition it does not lead as a real broker does, with NOT_LEADER_OR_FOLLOWER
and (Produce v10+) the new leader's id, epoch and address (KIP-951). Record batches pass
through untouched, so what a client writes is stored by the real broker as written.

Faults on command (thread-safe, from sync or async tests): move a partition's leader, stop
and start a node, slow a node, throttle it (KIP-219), fail requests with any error code, cut
connections, ask clients to rebootstrap (KIP-1102), or a seeded `chaos()` schedule of all of
these. Each listener may require TLS and
SASL (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER), with session lifetimes (KIP-368).

The cluster runs its own event loop in a daemon thread, so it keeps serving while a test's
loop is busy, and it stops itself after `lifetime` seconds (a forgotten one ends). Topics and
data live in the real broker; Fetch, ListOffsets and the transaction requests are forwarded as
they are (any node serves them).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib.util
import logging
import random
import ssl
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, Mapping, NamedTuple, Sequence, TypeVar

from ..errors import ConfigError, CorruptMessageError
from . import _wire as wire
from ._sasl_server import (OAuthBearerExchange, PlainExchange, Principal, SaslExchange,
                           SaslFailure, ScramCredentials, ScramExchange, TokenValidator,
                           unsecured_jwt)
from .broker import EmbeddedBroker, EmbeddedBrokerError

log = logging.getLogger(__name__)

T = TypeVar("T")
PartitionKey = tuple[str, int]

HOST = "127.0.0.1"
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_NOT_AVAILABLE = 15
REBOOTSTRAP_REQUIRED = 129
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
UNKNOWN_SERVER_ERROR = -1
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class Listener:
    """What a client must do to talk to the nodes on one port each: TLS (a server-side
    SSLContext) and/or SASL with these mechanisms. `users` maps user names to passwords
    (PLAIN, SCRAM); `oauth_validator` judges an OAUTHBEARER token (default: an unsecured JWT
    that has not expired) and returns its Principal or raises SaslFailure. With
    `session_lifetime_ms` a node closes a connection that sends a request after its session
    expired without re-authenticating (KIP-368)."""

    tls: ssl.SSLContext | None = None
    sasl_mechanisms: Sequence[str] = ()
    users: Mapping[str, str] = field(default_factory=dict, repr=False)
    oauth_validator: TokenValidator = unsecured_jwt
    session_lifetime_ms: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.sasl_mechanisms) - set(SASL_MECHANISMS)
        if unknown:
            raise ConfigError(f"unknown SASL mechanisms {sorted(unknown)}: the cluster offers "
                             f"{', '.join(SASL_MECHANISMS)}")
        object.__setattr__(self, "sasl_mechanisms", tuple(self.sasl_mechanisms))
        if any(m.startswith("SCRAM") for m in self.sasl_mechanisms) and \
                importlib.util.find_spec("scramp") is None:
            raise ConfigError("the cluster's SCRAM is scramp's: pip install "
                              "'aioproducer[testing]' (or scramp)")

    @property
    def security_protocol(self) -> str:
        """The client's `security_protocol` for this listener."""
        sasl = "SASL_" if self.sasl_mechanisms else ""
        return f"{sasl}SSL" if self.tls else f"{sasl}PLAINTEXT" if sasl else "PLAINTEXT"


@dataclass
class ClusterStats:
    """What the cluster saw and did, for a test to check or report."""

    connections: int = 0
    requests: int = 0
    produce_requests: int = 0
    not_leader: int = 0  # partitions answered NOT_LEADER_OR_FOLLOWER
    leader_moves: int = 0
    node_stops: int = 0
    node_starts: int = 0
    cuts: int = 0  # client connections cut
    throttled_responses: int = 0
    # read after a throttled response went out, before its throttle ended (KIP-219). This
    # counts requests a client pipelined before it could read that response too, which
    # KIP-219 allows: a node cannot tell them from ones written after. Whether a client
    # held back is for a check on the client's side (tests/test_chaos.py).
    requests_while_throttled: int = 0
    injected_errors: int = 0
    authentications: int = 0
    authentication_failures: int = 0
    expired_sessions: int = 0
    # a request other than SaslAuthenticate between SaslHandshake and the exchange's end,
    # first or re-authentication (KIP-368): the node closed the connection, as Kafka does
    requests_during_authentication: int = 0
    rebootstraps_required: int = 0  # Metadata answers with REBOOTSTRAP_REQUIRED (KIP-1102)


@dataclass
class _Partition:
    leader: int  # -1: none
    epoch: int
    replicas: list[int]


class _Fault(NamedTuple):
    error_code: int
    times: int


class _Node:
    def __init__(self, node_id: int, rack: str | None) -> None:
        self.node_id = node_id
        self.rack = rack
        self.ports: dict[str, int] = {}
        self.servers: list[asyncio.Server] = []
        self.up = False
        self.delay = 0.0  # seconds added to each response
        self.throttle_ms = 0
        self.connections: set[_Connection] = set()


class SimulatedCluster:
    """`nodes` Kafka brokers on 127.0.0.1 in front of one real broker.

        with SimulatedCluster(nodes=3) as cluster:
            producer = Producer(bootstrap_servers=cluster.bootstrap_servers)

    `upstream`: the real broker, an EmbeddedBroker or a "host:port" (default: an embedded
    broker of its own, stopped with the cluster). `listeners`: name to Listener, each node
    listening once per listener; Metadata advertises the listener a client came in on
    (`bootstrap(name)`; `bootstrap_servers` is the first's). `racks`: each node's rack.
    `lifetime`: seconds after which the cluster stops itself. `cluster_id`: the id Metadata
    answers give (default: the real broker's), so that two clusters in front of one broker
    can be told apart as two Kafka clusters would be.
    """

    def __init__(self, nodes: int = 3, *, upstream: EmbeddedBroker | str | None = None,
                 listeners: Mapping[str, Listener] | None = None,
                 racks: Sequence[str | None] | None = None,
                 lifetime: float = 900.0, cluster_id: str | None = None) -> None:
        if nodes < 1:
            raise ConfigError(f"a cluster needs at least one node, not {nodes}")
        if racks is not None and len(racks) != nodes:
            raise ConfigError(f"racks names {len(racks)} racks for {nodes} nodes")
        self._listeners = dict(listeners or {"PLAINTEXT": Listener()})
        if not self._listeners:
            raise ConfigError("a cluster needs at least one listener")
        self._upstream_spec = upstream
        self._broker: EmbeddedBroker | None = upstream if isinstance(upstream, EmbeddedBroker) \
            else None
        self._owns_broker = upstream is None
        self._upstream = ("", 0)
        self._nodes = {i: _Node(i, racks[i - 1] if racks else None) for i in range(1, nodes + 1)}
        self._partitions: dict[PartitionKey, _Partition] = {}
        self._topic_ids: dict[str, uuid.UUID] = {}  # recreated topics' new ids
        self._faults: dict[int | PartitionKey, _Fault] = {}
        self._rebootstrap_asks: dict[int | None, int] = {}  # node (None: any) -> answers left
        self._cluster_id = cluster_id
        self._scram = {name: ScramCredentials(listener.users)
                       for name, listener in self._listeners.items()}
        self._stats = ClusterStats()
        self._lifetime = lifetime
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="SimulatedCluster", daemon=True)
        self._chaos: set[Chaos] = set()
        self._expired = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> "SimulatedCluster":
        """Start the embedded broker (unless given one or an upstream address), the loop's
        thread and the nodes' listeners, within `timeout` s. Does nothing if started; a
        stopped cluster cannot start again."""
        if self._thread.is_alive():
            return self
        if self._loop.is_closed() or self._expired:
            raise EmbeddedBrokerError("a stopped SimulatedCluster cannot start again: make a "
                                      "new one")
        if self._owns_broker:
            self._broker = EmbeddedBroker().start(timeout)
        if self._broker is not None:
            self._upstream = (HOST, self._broker.port)
        else:
            host, _, port = str(self._upstream_spec).rpartition(":")
            self._upstream = (host or HOST, int(port))
        self._thread.start()
        try:
            self._call(self._start_nodes(), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the nodes (cutting their connections), the loop's thread, and the embedded
        broker if the cluster started it. Safe to call twice, or after the lifetime ended."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._shutdown(), 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()
        if self._owns_broker and self._broker is not None:
            self._broker.stop()

    def __enter__(self) -> "SimulatedCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "SimulatedCluster":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        state = "running" if self._thread.is_alive() else "stopped"
        nodes = ", ".join(f"{n.node_id}{'' if n.up else ' (down)'}" for n in self._nodes.values())
        return f"<SimulatedCluster nodes {nodes} at {self.bootstrap_servers or '-'} {state}>"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._end_tasks_left()
        if self._expired and self._owns_broker and self._broker is not None:
            self._broker.stop()

    def _end_tasks_left(self) -> None:
        """Cancel the tasks the stopped loop holds and run them to their end (for a second at
        most), as asyncio.run() does: a connection accepted as the nodes closed gets its
        handler's task (`_accept`) in the loop's last turns, unbegun when it stops; dropped
        with the loop, Python warned that the coroutine was never awaited."""
        left = asyncio.all_tasks(self._loop)
        for task in left:
            task.cancel()
        if left:
            self._loop.run_until_complete(asyncio.wait(left, timeout=1))

    def _expire(self) -> None:
        log.warning("SimulatedCluster at %s stopped itself: its lifetime of %s s ended",
                    self.bootstrap_servers, self._lifetime)
        self._expired = True
        task = self._loop.create_task(self._shutdown())
        task.add_done_callback(lambda _: self._loop.stop())

    async def _start_nodes(self) -> None:
        for node in self._nodes.values():
            await self._listen(node)
        self._loop.call_later(self._lifetime, self._expire)

    async def _listen(self, node: _Node) -> None:
        for name, listener in self._listeners.items():
            server = await asyncio.start_server(functools.partial(self._accept, node, name),
                                                HOST, node.ports.get(name, 0), ssl=listener.tls)
            node.ports[name] = server.sockets[0].getsockname()[1]
            node.servers.append(server)
        node.up = True

    async def _shutdown(self) -> None:
        for chaos in list(self._chaos):
            await chaos._cancel()  # first: it would bring a node it stopped back up
        for node in self._nodes.values():
            self._close_node(node)
        tasks = [c.task for n in self._nodes.values() for c in n.connections if c.task]
        if tasks:
            await asyncio.wait(tasks, timeout=1)

    def _close_node(self, node: _Node) -> None:
        node.up = False
        for server in node.servers:
            server.close()
        node.servers.clear()
        for connection in list(node.connections):
            connection.abort()

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 5) -> T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("SimulatedCluster's commands are for tests' threads, not its own")
        if not self._thread.is_alive():
            coroutine.close()
            raise EmbeddedBrokerError("the simulated cluster is not running (not started, "
                                      "stopped, or its lifetime ended)")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _run_in_loop(self, function: Callable[[], T]) -> T:
        async def run() -> T:
            return function()
        return self._call(run())

    # -- addresses ---------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """The nodes' addresses on the first listener, comma-separated."""
        return self.bootstrap(next(iter(self._listeners)))

    def bootstrap(self, listener: str) -> str:
        """The nodes' addresses on one listener, comma-separated."""
        self._listener(listener)
        return ",".join(f"{HOST}:{node.ports[listener]}" for node in self._nodes.values()
                        if listener in node.ports)

    def address(self, node_id: int, listener: str | None = None) -> str:
        """One node's address (on the first listener unless named)."""
        name = self._listener(listener or next(iter(self._listeners)))
        return f"{HOST}:{self._node(node_id).ports[name]}"

    def _listener(self, name: str) -> str:
        if name not in self._listeners:
            raise ConfigError(f"no listener {name!r}: the listeners are {list(self._listeners)}")
        return name

    @property
    def node_ids(self) -> list[int]:
        return list(self._nodes)

    @property
    def stats(self) -> ClusterStats:
        """A copy of the counters as they are now."""
        return copy.copy(self._stats)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic on the real broker (an embedded one: a plain address is not ours to
        administer; there Metadata requests create topics as the broker allows)."""
        if self._broker is None:
            raise EmbeddedBrokerError("create_topic needs an embedded upstream broker; this "
                                      f"cluster forwards to {self._upstream_spec}")
        self._broker.create_topic(name, partitions)

    # -- commands ----------------------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> int:
        """The partition's leader node (-1: none), as Metadata tells clients."""
        return self._run_in_loop(lambda: self._partition(topic, partition).leader)

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch, bumped by each leader change."""
        return self._run_in_loop(lambda: self._partition(topic, partition).epoch)

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> int:
        """Make another node (`to`, or the next live replica) the leader and bump the leader
        epoch; the old leader answers NOT_LEADER_OR_FOLLOWER from now on. Returns the new
        leader."""
        if to is not None:
            self._node(to)
        return self._run_in_loop(lambda: self._move_leader(topic, partition, to))

    def recreate_topic(self, topic: str) -> None:
        """As if `topic` were deleted and made again under its name: Metadata gives it a new
        id (KIP-516), and each of its partitions known so far is led by the next live node at
        leader epoch 0. (Its records stay in the real broker.)"""
        def recreate() -> None:
            self._topic_ids[topic] = uuid.uuid4()
            for (name, index), partition in self._partitions.items():
                if name == topic:
                    self._move_leader(topic, index, None)
                    partition.epoch = 0
        self._run_in_loop(recreate)

    def stop_node(self, node_id: int, reelect: bool = True) -> None:
        """Take a node down: it refuses connections and its open ones are cut. Its partitions
        get new leaders, or with reelect=False none (leader -1, LEADER_NOT_AVAILABLE) until it
        comes back."""
        node = self._node(node_id)

        async def stop() -> None:
            self._stop_node(node, reelect)
        self._call(stop())

    def start_node(self, node_id: int) -> None:
        """Bring a node back on its ports; partitions left without a leader get it back."""
        node = self._node(node_id)
        self._call(self._start_node(node))

    def move_node(self, node_id: int) -> str:
        """Bring a node up at a new address (new ports on every listener), as a broker
        restarted on another host: its connections are cut, its old ports refuse, and
        Metadata and produce responses' NodeEndpoints name the new address. Partitions left
        without a leader get it back, as with start_node. Returns its new address (on the
        first listener)."""
        node = self._node(node_id)

        async def move() -> None:
            self._stop_node(node, reelect=True)
            node.ports.clear()
            await self._start_node(node)
        self._call(move())
        return self.address(node_id)

    def slow(self, node_id: int, seconds: float) -> None:
        """Delay each of the node's responses by `seconds` (0: no more)."""
        node = self._node(node_id)
        self._run_in_loop(lambda: setattr(node, "delay", max(0.0, seconds)))

    def throttle(self, node_id: int, ms: int) -> None:
        """Tell the node's Produce clients to hold back `ms` (throttle_time_ms, 0: stop), and
        do not read from a connection until its throttle ends, as a broker over quota does
        (KIP-219). Requests read meanwhile count in `stats.requests_while_throttled`,
        including those the client wrote before it could read the throttled response."""
        node = self._node(node_id)
        self._run_in_loop(lambda: setattr(node, "throttle_ms", max(0, ms)))

    def fail(self, target: int | PartitionKey, error_code: int, times: int = 1) -> None:
        """Answer the next `times` Produce requests to node `target`, or the next `times`
        produce attempts for the partition `target` (topic, partition) on any node, with
        `error_code` instead of forwarding them (retriable or fatal, as the code is)."""
        if isinstance(target, int):
            self._node(target)
        if times < 1:
            raise ConfigError(f"times must be at least 1, not {times}")
        self._run_in_loop(lambda: self._faults.__setitem__(target, _Fault(error_code, times)))

    def require_rebootstrap(self, node_id: int | None = None, times: int = 1) -> None:
        """Answer the next `times` Metadata requests of version 13 or later (to node
        `node_id`, or to any) with the top-level error REBOOTSTRAP_REQUIRED (KIP-1102), no
        brokers and no topics: the client should forget the brokers it knows and ask its
        bootstrap servers again. (Apache Kafka 4.4 itself never sends this in a Metadata
        answer; the error is there for brokers to come.)"""
        if node_id is not None:
            self._node(node_id)
        if times < 1:
            raise ConfigError(f"times must be at least 1, not {times}")
        self._run_in_loop(lambda: self._rebootstrap_asks.__setitem__(node_id, times))

    def cut(self, node_id: int) -> None:
        """Cut every client connection the node has open now (it stays up)."""
        node = self._node(node_id)
        self._run_in_loop(lambda: self._cut(node))

    def chaos(self, *, seed: int, duration: float = 10.0, move_every: float = 0.3,
              down_every: float | None = 2.0, down_for: float = 0.5,
              throttle_chance: float = 0.1, throttle_ms: tuple[int, int] = (20, 200),
              cut_chance: float = 0.05) -> "Chaos":
        """A seeded schedule of faults for `duration` seconds: every `move_every` s a random
        known partition's leader moves; every `down_every` s a node goes down for `down_for`
        s (its partitions re-elected); each step may throttle a node for that step or cut
        a node's connections. It ends by itself, or with `stop()`; what it did counts in
        `stats`."""
        chaos = Chaos(self, random.Random(seed), duration, move_every, down_every, down_for,
                      throttle_chance, throttle_ms, cut_chance)

        async def begin() -> None:
            chaos.task = self._loop.create_task(chaos.run())
            self._chaos.add(chaos)
            chaos.task.add_done_callback(lambda _: self._chaos.discard(chaos))
            chaos.task.add_done_callback(lambda _: chaos._ended.set())
        self._call(begin())
        return chaos

    def _node(self, node_id: int) -> _Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise ConfigError(f"no node {node_id}: the nodes are {list(self._nodes)}") from None

    # -- state (in the loop's thread only) ---------------------------------------------------

    def _live(self) -> list[_Node]:
        return [node for node in self._nodes.values() if node.up]

    def _partition(self, topic: str, index: int) -> _Partition:
        """A partition's placement, made when first seen: leaders spread over the nodes by a
        stable hash of the topic, up to three replicas in node order after the leader."""
        key = (topic, index)
        if key not in self._partitions:
            ids = list(self._nodes)
            first = (zlib.crc32(topic.encode()) + index) % len(ids)
            replicas = [ids[(first + i) % len(ids)] for i in range(min(3, len(ids)))]
            live = [r for r in replicas if self._nodes[r].up]
            self._partitions[key] = _Partition(live[0] if live else -1, 0, replicas)
        return self._partitions[key]

    def _move_leader(self, topic: str, index: int, to: int | None) -> int:
        partition = self._partition(topic, index)
        if to is None:
            ids = list(self._nodes)
            start = ids.index(partition.leader) + 1 if partition.leader in ids else 0
            ring = ids[start:] + ids[:start]
            candidates = [i for i in ring if i in partition.replicas and self._nodes[i].up
                          and i != partition.leader] or \
                         [i for i in ring if self._nodes[i].up and i != partition.leader]
            if not candidates:
                raise EmbeddedBrokerError(f"no live node to lead {topic}-{index}")
            to = candidates[0]
        elif not self._nodes[to].up:
            raise EmbeddedBrokerError(f"node {to} is down: it cannot lead {topic}-{index}")
        self._elect(partition, to)
        self._stats.leader_moves += 1
        return to

    def _elect(self, partition: _Partition, leader: int) -> None:
        if leader >= 0 and leader not in partition.replicas:
            partition.replicas[-1] = leader
        partition.leader = leader
        partition.epoch += 1

    def _stop_node(self, node: _Node, reelect: bool) -> None:
        if not node.up:
            return
        self._close_node(node)
        self._stats.node_stops += 1
        for partition in self._partitions.values():
            if partition.leader == node.node_id:
                live = [r for r in partition.replicas if self._nodes[r].up]
                self._elect(partition, live[0] if reelect and live else -1)

    async def _start_node(self, node: _Node) -> None:
        if node.up:
            return
        await self._listen(node)
        self._stats.node_starts += 1
        for partition in self._partitions.values():
            if partition.leader == -1 and node.node_id in partition.replicas:
                self._elect(partition, node.node_id)

    def _cut(self, node: _Node) -> None:
        for connection in list(node.connections):
            connection.abort()
            self._stats.cuts += 1

    def _take_fault(self, target: int | PartitionKey) -> int | None:
        fault = self._faults.get(target)
        if fault is None:
            return None
        if fault.times > 1:
            self._faults[target] = fault._replace(times=fault.times - 1)
        else:
            del self._faults[target]
        self._stats.injected_errors += 1
        return fault.error_code

    def _take_rebootstrap(self, node_id: int) -> bool:
        for target in (node_id, None):
            left = self._rebootstrap_asks.get(target)
            if left:
                if left > 1:
                    self._rebootstrap_asks[target] = left - 1
                else:
                    del self._rebootstrap_asks[target]
                self._stats.rebootstraps_required += 1
                return True
        return False

    def _coordinator(self, key: str) -> _Node | None:
        ids = list(self._nodes)
        first = zlib.crc32(key.encode()) % len(ids)
        for i in range(len(ids)):
            node = self._nodes[ids[(first + i) % len(ids)]]
            if node.up:
                return node
        return None

    def _endpoint(self, node: _Node, listener: str) -> dict[str, Any]:
        return {"node_id": node.node_id, "host": HOST, "port": node.ports[listener],
                "rack": node.rack}

    async def _accept(self, node: _Node, listener: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        if not node.up:
            writer.transport.abort()
            return
        self._stats.connections += 1
        connection = _Connection(self, node, listener, reader, writer)
        node.connections.add(connection)
        connection.task = asyncio.current_task()
        try:
            await connection.serve()
        finally:
            node.connections.discard(connection)


class _Reply(NamedTuple):
    frame: bytes
    throttle_ms: int = 0
    then_close: bool = False


class _Close(Exception):
    """End the client connection (as a broker does on a protocol or authentication error)."""


class _Connection:
    """One client connection to a node, with its own connection to the real broker. Requests
    are handled in order as they come (forwarded ones are written upstream at once, so
    pipelining works); each gets a reply task, and the replies are written in request order."""

    def __init__(self, cluster: SimulatedCluster, node: _Node, listener_name: str,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.cluster = cluster
        self.node = node
        self.listener_name = listener_name
        self.listener = cluster._listeners[listener_name]
        self.stats = cluster._stats
        self.reader = reader
        self.writer = writer
        self.task: asyncio.Task[Any] | None = None
        self.loop = asyncio.get_running_loop()
        self.replies: asyncio.Queue[tuple[float, asyncio.Future[_Reply | None]]] = \
            asyncio.Queue()
        self.upstream: asyncio.StreamWriter | None = None
        self.awaiting: dict[int, asyncio.Future[bytes] | None] = {}  # upstream correlation id
        self.next_upstream_id = 0
        self.muted_until = 0.0
        self.authenticated = not self.listener.sasl_mechanisms
        self.sasl: SaslExchange | None = None
        self.bare_sasl = False  # after SaslHandshake v0, tokens come as bare frames
        self.session_ends: float | None = None

    def abort(self) -> None:
        self.writer.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()

    async def serve(self) -> None:
        helpers: list[asyncio.Task[None]] = []
        try:
            host, port = self.cluster._upstream
            upstream_reader, self.upstream = await asyncio.wait_for(
                asyncio.open_connection(host, port), 5)
            helpers = [self.loop.create_task(self._write_replies()),
                       self.loop.create_task(self._read_upstream(upstream_reader))]
            while True:
                frame = await _read_frame(self.reader)
                if self.loop.time() < self.muted_until:
                    self.stats.requests_while_throttled += 1
                    await asyncio.sleep(self.muted_until - self.loop.time())
                self._handle(frame)
        except (_Close, OSError, EOFError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                struct.error, ValueError, CorruptMessageError):
            pass  # the client went, or broke the protocol: end as a broker would
        finally:
            self.abort()
            for helper in helpers:
                helper.cancel()
            for waiter in self.awaiting.values():
                if waiter is not None:
                    waiter.cancel()

    async def _write_replies(self) -> None:
        try:
            while True:
                ready_at, pending = await self.replies.get()
                reply = await pending
                if reply is None:
                    continue
                if ready_at > self.loop.time():
                    await asyncio.sleep(ready_at - self.loop.time())
                if reply.throttle_ms:  # from before the write: the client cannot read it
                    # sooner, so its throttle never ends before this one (counted after the
                    # drain, a node thread that lost the CPU meanwhile counted a request the
                    # client held for its whole throttle: CI, at load)
                    self.muted_until = self.loop.time() + reply.throttle_ms / 1000
                self.writer.write(reply.frame)
                await self.writer.drain()
                if reply.then_close:
                    break
        except (OSError, asyncio.CancelledError, ValueError):
            pass  # the connection ended
        except Exception:  # a reply the cluster could not make: say so, and hang up
            log.exception("SimulatedCluster node %d could not answer a request",
                          self.node.node_id)
        finally:
            self.abort()

    async def _read_upstream(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                frame = await _read_frame(reader)
                (upstream_id,) = struct.unpack_from(">i", frame)
                waiter = self.awaiting.pop(upstream_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(frame)
        except (OSError, EOFError, asyncio.IncompleteReadError):
            pass
        finally:
            self.abort()  # the real broker went: so does the client's connection

    # -- requests ----------------------------------------------------------------------------

    def _handle(self, frame: bytes) -> None:
        if self.bare_sasl:
            self._bare_sasl_token(frame)
            return
        header = wire.read_request_header(frame)
        self.stats.requests += 1
        api = header.api_key
        sasl_request = api in (wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE)
        if self.sasl is not None and api != wire.SASL_AUTHENTICATE:
            # Kafka's authenticator takes only SaslAuthenticate until the exchange it began
            # with SaslHandshake ends, and closes the connection on anything else ("Unexpected
            # Kafka request of type ... during SASL authentication").
            self.stats.requests_during_authentication += 1
            log.warning("SimulatedCluster node %d: API key %d arrived during a SASL exchange: "
                        "closing the connection", self.node.node_id, api)
            raise _Close()
        if self.session_ends is not None and self.loop.time() > self.session_ends \
                and not sasl_request:
            self.stats.expired_sessions += 1
            log.warning("SimulatedCluster node %d: API key %d read %.3f s after its SASL session "
                        "ended: closing the connection", self.node.node_id, api,
                        self.loop.time() - self.session_ends)
            raise _Close()
        if not self.authenticated and not sasl_request and api != wire.API_VERSIONS:
            raise _Close()  # Kafka: an unexpected request before SASL ends the connection
        if api == wire.PRODUCE:
            self._produce(header, frame)
        elif api == wire.METADATA:
            self._reply(self._forward(
                header, frame, wire.METADATA_RESPONSE,
                lambda body: self._rewrite_metadata(body, header.api_version)))
        elif api == wire.FIND_COORDINATOR:
            request = wire.decode(FIND_COORDINATOR_REQUEST, frame, header.api_version,
                                  header.is_flexible, header.body_offset)
            self._reply(self._forward(header, frame, wire.FIND_COORDINATOR_RESPONSE,
                                      lambda body: self._rewrite_coordinator(body, request)))
        elif api == wire.API_VERSIONS:
            self._reply(self._forward(header, frame, wire.API_VERSIONS_RESPONSE,
                                      self._rewrite_api_versions))
        elif api == wire.SASL_HANDSHAKE:
            self._sasl_handshake(header, frame)
        elif api == wire.SASL_AUTHENTICATE:
            self._sasl_authenticate(header, frame)
        else:
            self._reply(self._forward(header, frame))

    def _reply(self, reply: Awaitable[_Reply | None] | _Reply) -> None:
        if isinstance(reply, _Reply):
            future: asyncio.Future[_Reply | None] = self.loop.create_future()
            future.set_result(reply)
        else:
            future = asyncio.ensure_future(reply)
        self.replies.put_nowait((self.loop.time() + self.node.delay, future))

    def _send_upstream(self, frame: bytes, discard: bool = False) -> asyncio.Future[bytes]:
        """Write a request to the real broker under a correlation id of ours (the client's
        may repeat across its connections; ours are this connection's own)."""
        upstream_id = self.next_upstream_id
        self.next_upstream_id += 1
        waiter: asyncio.Future[bytes] = self.loop.create_future()
        self.awaiting[upstream_id] = None if discard else waiter
        assert self.upstream is not None
        self.upstream.write(struct.pack(">i", len(frame)) + frame[:4]
                            + struct.pack(">i", upstream_id) + frame[8:])
        return waiter

    async def _forward(self, header: wire.RequestHeader, frame: bytes,
                       schema: tuple[wire.Field, ...] = (),
                       rewrite: Callable[[dict[str, Any]], None] | None = None) -> _Reply:
        """Forward a request; the response gets the client's correlation id back and, with a
        `rewrite`, is decoded by `schema`, changed and encoded again. A version above what
        the real broker speaks (wire.ABOVE_UPSTREAM) goes to it one below."""
        api, version = header.api_key, header.api_version
        upstream_version = version
        if version >= wire.ABOVE_UPSTREAM.get(api, 99):
            upstream_version = wire.ABOVE_UPSTREAM[api] - 1
            frame = frame[:2] + struct.pack(">h", upstream_version) + frame[4:]
        response = await self._send_upstream(frame)
        if rewrite is None:
            return _Reply(struct.pack(">ii", len(response), header.correlation_id)
                          + response[4:])
        offset = wire.response_body_offset(api, upstream_version, response)
        is_flexible = wire.flexible(api, version)
        if api == wire.API_VERSIONS and struct.unpack_from(">h", response, offset)[0]:
            # An error (say, a version the broker does not know) is answered in v0: as it is.
            return _Reply(struct.pack(">ii", len(response), header.correlation_id)
                          + response[4:])
        body = wire.decode(schema, response, upstream_version,
                           wire.flexible(api, upstream_version), offset)
        rewrite(body)
        return _Reply(wire.response_frame(api, version, header.correlation_id,
                                          wire.encode(schema, body, version, is_flexible)))

    # -- rewriting the real broker's answers -------------------------------------------------

    def _rewrite_metadata(self, body: dict[str, Any], version: int) -> None:
        cluster = self.cluster
        if cluster._cluster_id is not None:
            body["cluster_id"] = cluster._cluster_id
        body["error_code"] = 0
        if version >= 13 and cluster._take_rebootstrap(self.node.node_id):
            body.update(error_code=REBOOTSTRAP_REQUIRED, brokers=[], topics=[],
                        controller_id=-1)
            return
        live = cluster._live()
        body["brokers"] = [cluster._endpoint(node, self.listener_name) for node in live]
        body["controller_id"] = live[0].node_id if live else -1
        for topic in body["topics"]:
            if topic["error_code"] or topic["name"] is None:
                continue
            if version >= 10 and topic["name"] in cluster._topic_ids:
                topic["topic_id"] = cluster._topic_ids[topic["name"]]
            for entry in topic["partitions"]:
                partition = cluster._partition(topic["name"], entry["partition_index"])
                entry.update(
                    leader_id=partition.leader, leader_epoch=partition.epoch,
                    replica_nodes=list(partition.replicas),
                    isr_nodes=[r for r in partition.replicas if cluster._nodes[r].up],
                    offline_replicas=[r for r in partition.replicas if not cluster._nodes[r].up])
                if partition.leader < 0:
                    entry["error_code"] = LEADER_NOT_AVAILABLE

    def _rewrite_coordinator(self, body: dict[str, Any], request: dict[str, Any]) -> None:
        if "coordinators" in body:
            for entry in body["coordinators"]:
                if not entry["error_code"]:
                    self._place_coordinator(entry, entry["key"])
        elif not body["error_code"]:
            self._place_coordinator(body, request["key"])

    def _place_coordinator(self, entry: dict[str, Any], key: str) -> None:
        node = self.cluster._coordinator(key)
        if node is None:
            entry.update(error_code=COORDINATOR_NOT_AVAILABLE, node_id=-1, host="", port=-1,
                         error_message="no node is up")
        else:
            entry.update(self.cluster._endpoint(node, self.listener_name))
            del entry["rack"]

    def _rewrite_api_versions(self, body: dict[str, Any]) -> None:
        """Offer no version the cluster cannot rewrite, and SASL where the listener asks."""
        offered = {entry["api_key"]: entry for entry in body["api_keys"]}
        if self.listener.sasl_mechanisms:
            for api in (wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE):
                offered.setdefault(api, {"api_key": api, "min_version": 0, "max_version": 0})
        for api, highest in wire.HIGHEST.items():
            if api in offered:
                # (what the cluster speaks above the real broker, it offers whatever that has)
                above = offered[api]["max_version"] >= wire.ABOVE_UPSTREAM.get(api, 99) - 1
                offered[api]["max_version"] = highest if api in (
                    wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE) or above else \
                    min(offered[api]["max_version"], highest)
        body["api_keys"] = sorted(offered.values(), key=lambda entry: entry["api_key"])

    # -- Produce -----------------------------------------------------------------------------

    def _produce(self, header: wire.RequestHeader, frame: bytes) -> None:
        """Forward the partitions this node leads (in a request of their own when some are
        not); answer the others NOT_LEADER_OR_FOLLOWER, or with an injected error."""
        self.stats.produce_requests += 1
        version, is_flexible = header.api_version, header.is_flexible
        request = wire.decode(wire.PRODUCE_REQUEST, frame, version, is_flexible,
                              header.body_offset)
        node_error = self.cluster._take_fault(self.node.node_id)
        answered: dict[PartitionKey, dict[str, Any]] = {}
        kept = []
        for topic in request["topic_data"]:
            mine = [p for p in topic["partition_data"]
                    if self._leads(topic["name"], p["index"], node_error, answered)]
            if mine:
                kept.append({"name": topic["name"], "partition_data": mine})
        acks_zero = request["acks"] == 0
        upstream = None
        if kept and not answered:
            upstream = self._send_upstream(frame, discard=acks_zero)
        elif kept:
            body = wire.encode(wire.PRODUCE_REQUEST, {**request, "topic_data": kept}, version,
                               is_flexible)
            upstream = self._send_upstream(frame[:header.body_offset] + body, discard=acks_zero)
        if not acks_zero:  # Kafka does not answer acks=0
            self._reply(self._produce_response(header, request, answered, upstream))

    def _leads(self, topic: str, index: int, node_error: int | None,
               answered: dict[PartitionKey, dict[str, Any]]) -> bool:
        error = node_error if node_error is not None else self.cluster._take_fault((topic, index))
        if error is not None:
            answered[topic, index] = _partition_error(index, error)
            return False
        partition = self.cluster._partition(topic, index)
        if partition.leader == self.node.node_id:
            return True
        self.stats.not_leader += 1
        answer = _partition_error(index, NOT_LEADER_OR_FOLLOWER)
        if partition.leader >= 0:
            answer["current_leader"] = {"leader_id": partition.leader,
                                        "leader_epoch": partition.epoch}
        answered[topic, index] = answer
        return False

    async def _produce_response(self, header: wire.RequestHeader, request: dict[str, Any],
                                answered: dict[PartitionKey, dict[str, Any]],
                                upstream: asyncio.Future[bytes] | None) -> _Reply:
        version, is_flexible = header.api_version, header.is_flexible
        if upstream is not None:
            response = await upstream
            body = wire.decode(wire.PRODUCE_RESPONSE, response, version, is_flexible,
                               wire.response_body_offset(wire.PRODUCE, version, response))
            for topic in body["responses"]:
                for entry in topic["partition_responses"]:
                    answered.setdefault((topic["name"], entry["index"]), entry)
        leaders: set[int] = set()
        responses = []
        for topic in request["topic_data"]:
            entries = []
            for p in topic["partition_data"]:
                entry = answered.get((topic["name"], p["index"])) or \
                    _partition_error(p["index"], UNKNOWN_SERVER_ERROR)
                if entry.get("current_leader"):
                    leaders.add(entry["current_leader"]["leader_id"])
                entries.append(entry)
            responses.append({"name": topic["name"], "partition_responses": entries})
        throttle_ms = self.node.throttle_ms
        if throttle_ms:
            self.stats.throttled_responses += 1
        endpoints = [self.cluster._endpoint(self.cluster._nodes[i], self.listener_name)
                     for i in sorted(leaders) if self.cluster._nodes[i].up]
        out = {"responses": responses, "throttle_time_ms": throttle_ms,
               "node_endpoints": endpoints or None}
        return _Reply(wire.response_frame(wire.PRODUCE, version, header.correlation_id,
                                          wire.encode(wire.PRODUCE_RESPONSE, out, version,
                                                      is_flexible)), throttle_ms)

    # -- SASL --------------------------------------------------------------------------------

    def _sasl_handshake(self, header: wire.RequestHeader, frame: bytes) -> None:
        version = header.api_version
        mechanism = wire.decode(wire.SASL_HANDSHAKE_REQUEST, frame, version, False,
                                header.body_offset)["mechanism"]
        offered = self.listener.sasl_mechanisms
        reauthenticating = self.authenticated and bool(offered)
        if reauthenticating and version == 0:
            raise _Close()  # re-authentication needs SaslAuthenticate (KIP-368)
        error = 0
        if mechanism in offered:
            self.sasl = self._exchange(mechanism)
            self.bare_sasl = version == 0
        else:
            error = UNSUPPORTED_SASL_MECHANISM if offered else ILLEGAL_SASL_STATE
        body = {"error_code": error, "mechanisms": list(offered)}
        self._reply(_Reply(wire.response_frame(
            wire.SASL_HANDSHAKE, version, header.correlation_id,
            wire.encode(wire.SASL_HANDSHAKE_RESPONSE, body, version, False))))

    def _exchange(self, mechanism: str) -> SaslExchange:
        if mechanism == "PLAIN":
            return PlainExchange(self.listener.users)
        if mechanism == "OAUTHBEARER":
            return OAuthBearerExchange(self.listener.oauth_validator)
        return ScramExchange(mechanism, self.cluster._scram[self.listener_name].lookup(mechanism))

    def _sasl_step(self, token: bytes) -> tuple[bytes, int]:
        """The server's answer and, once authenticated, the session's lifetime in ms (0:
        none). Raises SaslFailure."""
        if self.sasl is None:
            raise SaslFailure("SaslAuthenticate before SaslHandshake")
        try:
            answer = self.sasl.step(token)
        except SaslFailure:
            self.stats.authentication_failures += 1
            self.sasl = None
            raise
        principal = self.sasl.principal
        if principal is None:
            return answer, 0
        self.sasl = None
        self.authenticated = True
        self.stats.authentications += 1
        lifetime_ms = self._session_lifetime_ms(principal)
        self.session_ends = self.loop.time() + lifetime_ms / 1000 if lifetime_ms else None
        return answer, lifetime_ms

    def _session_lifetime_ms(self, principal: Principal) -> int:
        limits = [self.listener.session_lifetime_ms] if self.listener.session_lifetime_ms else []
        if principal.expires_at is not None:
            limits.append(max(1, int((principal.expires_at - time.time()) * 1000)))
        return min(limits) if limits else 0

    def _sasl_authenticate(self, header: wire.RequestHeader, frame: bytes) -> None:
        version, is_flexible = header.api_version, header.is_flexible
        token = wire.decode(wire.SASL_AUTHENTICATE_REQUEST, frame, version, is_flexible,
                            header.body_offset)["auth_bytes"]
        body: dict[str, Any]
        try:
            answer, lifetime_ms = self._sasl_step(token)
            body = {"error_code": 0, "error_message": None, "auth_bytes": answer,
                    "session_lifetime_ms": lifetime_ms}
            failed = False
        except SaslFailure as exc:
            code = ILLEGAL_SASL_STATE if "before SaslHandshake" in str(exc) \
                else SASL_AUTHENTICATION_FAILED
            body = {"error_code": code, "error_message": str(exc), "auth_bytes": b"",
                    "session_lifetime_ms": 0}
            failed = True
        self._reply(_Reply(wire.response_frame(
            wire.SASL_AUTHENTICATE, version, header.correlation_id,
            wire.encode(wire.SASL_AUTHENTICATE_RESPONSE, body, version, is_flexible)),
            then_close=failed))

    def _bare_sasl_token(self, token: bytes) -> None:
        """After SaslHandshake v0 the tokens travel as bare frames; a failure closes."""
        try:
            answer, _ = self._sasl_step(token)
        except SaslFailure:
            raise _Close() from None
        if self.authenticated:
            self.bare_sasl = False
        self._reply(_Reply(struct.pack(">i", len(answer)) + answer))


FIND_COORDINATOR_REQUEST = (
    wire.Field("key", "string", (0, 3)),
    wire.Field("key_type", "int8", (1, 99)),
    wire.Field("coordinator_keys", "[string]", (4, 99)),
)


def _partition_error(index: int, error_code: int) -> dict[str, Any]:
    return {"index": index, "error_code": error_code, "base_offset": -1,
            "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [],
            "error_message": None}


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 <= size <= 512 * 1024 * 1024:
        raise ValueError(f"a frame of {size} bytes")
    return await reader.readexactly(size)


class Chaos:
    """A running chaos schedule (see SimulatedCluster.chaos); `stop()` ends it and undoes
    what is still in force (a node down, a throttle)."""

    def __init__(self, cluster: SimulatedCluster, rng: random.Random, duration: float,
                 move_every: float, down_every: float | None, down_for: float,
                 throttle_chance: float, throttle_ms: tuple[int, int],
                 cut_chance: float) -> None:
        self._cluster = cluster
        self._rng = rng
        self._settings = (duration, move_every, down_every, down_for, throttle_chance,
                          throttle_ms, cut_chance)
        self.task: asyncio.Task[None] | None = None
        self._ended = threading.Event()

    def stop(self) -> None:
        """End the schedule, undoing what is still in force."""
        if self.task is not None and not self.task.done():
            cluster = self._cluster
            with contextlib.suppress(Exception):
                cluster._call(self._cancel())

    async def _cancel(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    @property
    def running(self) -> bool:
        """Whether the schedule is still under way."""
        return self.task is not None and not self.task.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the schedule ends (at most `timeout` s); True if it did."""
        return self._ended.wait(timeout)

    def __enter__(self) -> "Chaos":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def run(self) -> None:
        cluster, rng = self._cluster, self._rng
        duration, move_every, down_every, down_for, throttle_chance, throttle_ms, cut_chance = \
            self._settings
        loop = asyncio.get_running_loop()
        end = loop.time() + duration
        next_down = loop.time() + (down_every or 0)
        down: _Node | None = None
        up_at = 0.0
        throttled: _Node | None = None
        try:
            while loop.time() < end:
                await asyncio.sleep(move_every)
                now = loop.time()
                if throttled is not None:
                    throttled.throttle_ms = 0
                    throttled = None
                known = sorted(cluster._partitions)
                if known:
                    with contextlib.suppress(EmbeddedBrokerError):
                        cluster._move_leader(*rng.choice(known), None)
                if down is not None and now >= up_at:
                    await cluster._start_node(down)
                    down, next_down = None, now + (down_every or 0)
                elif down is None and down_every and now >= next_down and \
                        len(cluster._live()) > 1:
                    down = rng.choice(cluster._live())
                    cluster._stop_node(down, reelect=True)
                    up_at = now + down_for
                if rng.random() < throttle_chance and cluster._live():
                    throttled = rng.choice(cluster._live())
                    throttled.throttle_ms = rng.randint(*throttle_ms)
                if rng.random() < cut_chance and cluster._live():
                    cluster._cut(rng.choice(cluster._live()))
        finally:
            if throttled is not None:
                throttled.throttle_ms = 0
            if down is not None:
                await cluster._start_node(down)


__all__ = ["Chaos", "ClusterStats", "Listener", "SimulatedCluster"]
