"""FaultProxy: a TCP proxy between client and broker that breaks things on request.

It runs its own event loop in a thread, so it keeps forwarding while a test's loop is busy
and works from sync tests as well. Faults: cut every connection now, cut after N more bytes
(mid-frame), stall responses, refuse connections (broker "down"), send garbage, throttle,
a broker's size limit on record batches (which Tansu does not have), answers changed
(error codes Tansu never sends, an older broker's ApiVersions), Produce requests lost on the
way (answered here, never forwarded, the connection kept), commits refused (EndTxn
answered here with an error, so the broker keeps the transaction open), and fronting a real broker
(its Metadata and FindCoordinator answers name the proxy, so every connection comes here),
and a broker that stops reading requests (the client's writes back up into its buffers).
"""

from __future__ import annotations

import asyncio
import collections
import os
import ssl
import struct
import threading
from typing import Any, Callable

from kafka.protocol.producer import EndTxnRequest, EndTxnResponse, ProduceRequest, \
    ProduceResponse

_PRODUCE = 0
_METADATA = 3
_END_TXN = 26
_MESSAGE_TOO_LARGE = 10
_NOT_ENOUGH_REPLICAS = 19
Rewrite = Callable[[Any], Any]  # a decoded response -> the one to send instead, or None


class FaultProxy:
    def __init__(self, upstream_port: int = 0, listen_port: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        """`listen_port` 0: one the kernel picks when start() binds it (`port`), held from
        then on; a port found free and bound later can be taken meanwhile (CI: "address
        already in use"). `upstream_port` may be set after start(), before a client
        connects: a broker that advertises the proxy's port starts after it."""
        self.upstream_port = upstream_port
        self._tls = tls  # terminate TLS here: clients speak TLS, the broker plain TCP
        self.port = listen_port
        self.connections_accepted = 0
        self.connections_refused = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._handlers: set[asyncio.Task] = set()  # one per client connection
        self._stalled = False
        self._not_reading = False
        self._refusing = False
        self._cut_after: tuple[int, str] | None = None
        self._rate: float | None = None
        self._split: int | None = None
        self._message_max_bytes: int | None = None
        self._rewrites: dict[int, tuple[Any, Rewrite]] = {}
        self.refused_batches = 0
        self.rewritten = 0  # responses changed by a rewrite function
        # lose_produce(): [Produce requests still to forward, then how many to lose, the
        # error code to answer them with]; None: lose nothing.
        self._lose: list[int] | None = None
        self.lost: list[tuple[str, int]] = []  # (topic, partition) of each batch lost
        # Topic names by id, from the Metadata answers it forwarded: Produce v13+ names
        # topics by id only (KIP-516).
        self.topic_names: dict[Any, str] = {}
        self._refused_commits: int | None = None  # refuse_commits()' error code
        self.commits_refused = 0
        # Each request a client wrote, as it came (frame by frame: with front(), rewrites...):
        # its api key, and those of the requests before it on its connection still unanswered.
        self.written: list[tuple[int, list[int]]] = []

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._call(self._start_server())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._shutdown(), timeout=2)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(2)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults (callable from any thread) --------------------------------------------------

    def cut_all(self) -> None:
        self._loop.call_soon_threadsafe(self._abort_all)

    def cut_after(self, n_bytes: int, direction: str = "up") -> None:
        """Abort the connection that next forwards `n_bytes` more in that direction
        ("up": client to broker, "down": broker to client)."""
        self._cut_after = (n_bytes, direction)

    def stall(self, on: bool) -> None:
        self._stalled = on

    def stop_reading(self, on: bool) -> None:
        """Read nothing more from the clients (a broker too slow to take requests): what
        they write fills the kernel's socket buffers, then their own."""
        self._not_reading = on

    def refuse(self, on: bool, cut: bool = True) -> None:
        """Refuse new connections (the broker is down); `cut=False` leaves the open ones up
        until they fail (a partition their sockets have not noticed yet)."""
        self._refusing = on
        if on and cut:
            self.cut_all()

    def heal(self) -> None:
        """End the passing faults: stalled responses, refused connections, and a cut_after()
        not yet triggered (which would otherwise cut whichever connection comes next, a
        test's read-back included)."""
        self._stalled = self._refusing = False
        self._cut_after = None

    def send_garbage(self) -> None:
        def send() -> None:
            for client, _ in list(self._pairs):
                client.write(os.urandom(64))
        self._loop.call_soon_threadsafe(send)

    def split(self, n_bytes: int | None) -> None:
        """Forward what the broker sends gathered for 2 ms, then cut in pieces of `n_bytes`,
        each written on its own (None: as it comes): the client reads frames cut anywhere, the
        end of one with the start of the next, or several whole ones in one read."""
        self._split = n_bytes

    def throttle(self, bytes_per_s: float | None) -> None:
        self._rate = bytes_per_s

    def message_max_bytes(self, limit: int | None) -> None:
        """Act as a broker whose message.max.bytes is `limit`: a Produce request's record
        batch larger than that is not forwarded, and its partition is answered with
        MESSAGE_TOO_LARGE (the others go through). Applies to connections made afterwards.
        Requests are decoded and responses re-encoded with kafka-python, not our codec."""
        self._message_max_bytes = limit

    def rewrite_responses(self, response_cls: Any, rewrite: Rewrite | None) -> None:
        """Act as a broker that answers one kind of request differently: its responses are
        decoded by kafka-python (a `response_cls`, at the request's version) and passed to
        `rewrite`, which returns the response to send instead (of any version: an old broker
        answers an ApiVersions request it cannot read in v0), or None to forward it as it
        came. Applies to connections made afterwards; of the other faults, only stall() and
        cut_all() apply to them (they are forwarded frame by frame, not byte by byte)."""
        if rewrite is None:
            self._rewrites.pop(response_cls.API_KEY, None)
        else:
            self._rewrites[response_cls.API_KEY] = (response_cls, rewrite)

    def lose_produce(self, count: int = 1, after: int = 0,
                     error_code: int = _NOT_ENOUGH_REPLICAS) -> None:
        """Lose `count` Produce requests, after the next `after` ones (counted over every
        connection): the broker never sees them, the connection stays up, and the proxy
        answers each itself with `error_code` for every partition (by default
        NOT_ENOUGH_REPLICAS: refused unwritten, as a leader does while its ISR is short),
        while the requests behind it go through. Each answer keeps its request's place in
        the connection's order, held until the broker answers a later request (so that one
        was on the wire before the client read the answer) or for 1 s. Applies to
        connections made afterwards (forwarded frame by frame, as rewrite_responses); not
        for acks=0, whose requests get no answer."""
        self._lose = [after, count, error_code]

    def refuse_commits(self, error_code: int | None) -> None:
        """Answer every EndTxn that commits with `error_code` here, never forwarded (the
        broker keeps the transaction open); aborts go through. None: forward them all.
        Applies to connections made afterwards (forwarded frame by frame)."""
        self._refused_commits = error_code

    def front(self) -> None:
        """Front the broker: its Metadata and FindCoordinator answers name this proxy where
        they name the broker's port, so a client bootstrapped here makes every connection
        here (the broker advertises its own address). For one broker: others named keep
        their addresses. Applies to connections made afterwards."""
        from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

        def here(entries: Any) -> None:
            for entry in entries:
                if entry.port == self.upstream_port:
                    entry.host, entry.port = "127.0.0.1", self.port

        def metadata(response: Any) -> Any:
            here(response.brokers)
            return response

        def coordinator(response: Any) -> Any:
            here(response.coordinators if response.version >= 4 else [response])
            return response

        self.rewrite_responses(MetadataResponse, metadata)
        self.rewrite_responses(FindCoordinatorResponse, coordinator)

    # -- inside the proxy's loop -----------------------------------------------------------

    def _call(self, coroutine: Any, timeout: float = 5) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start_server(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port,
                                                  ssl=self._tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        self._abort_all()
        if self._server is not None:
            self._server.close()
        if self._handlers:  # let them see their connections end, or the loop stops on them
            await asyncio.wait(self._handlers, timeout=1)

    def _abort_all(self) -> None:
        for client, upstream in list(self._pairs):
            client.transport.abort()
            upstream.transport.abort()
            self.cuts += 1
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            self.connections_refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections_accepted += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)
        if self._message_max_bytes is not None or self._rewrites or self._lose is not None \
                or self._refused_commits is not None:
            rewrites = dict(self._rewrites)
            asked: dict[int, tuple[int, int, list[tuple[Any, int]]]] = {}
            order = _Order(writer)
            pipes = (self._requests(reader, up_writer, self._message_max_bytes, rewrites, asked,
                                    order),
                     self._responses(up_reader, writer, rewrites, asked, order))
        else:
            pipes = (self._pipe(reader, up_writer, "up", pair),
                     self._pipe(up_reader, writer, "down", pair))
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pairs.discard(pair)
        writer.transport.abort()
        up_writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str, pair: tuple) -> None:
        while True:
            if direction == "down" and self._split:
                await asyncio.sleep(0.002)  # the read below takes all that came meanwhile
            while self._not_reading and direction == "up" and pair in self._pairs:
                await asyncio.sleep(0.01)
            data = await reader.read(65536)
            if not data:
                break
            while self._stalled and direction == "down" and pair in self._pairs:
                await asyncio.sleep(0.01)
            cut = self._cut_after
            if cut is not None and cut[1] == direction:
                if len(data) >= cut[0]:
                    self._cut_after = None
                    writer.write(data[:cut[0]])
                    self.cuts += 1
                    self._pairs.discard(pair)
                    pair[0].transport.abort()
                    pair[1].transport.abort()
                    return
                self._cut_after = (cut[0] - len(data), direction)
            if self._rate:
                await asyncio.sleep(len(data) / self._rate)
            if pair not in self._pairs:
                return
            step = self._split if direction == "down" and self._split else len(data)
            for start in range(0, len(data), step):
                writer.write(data[start:start + step])
                await writer.drain()
                if step < len(data):
                    await asyncio.sleep(0.0005)  # the client's read takes this piece alone

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        limit: int | None, rewrites: dict[int, tuple[Any, Rewrite]],
                        asked: dict[int, tuple[int, int, list[tuple[Any, int]]]],
                        order: "_Order") -> None:
        """Client to broker, frame by frame: take batches over `limit` out of Produce
        requests, note by correlation id which responses to change (api key, version,
        partitions to answer with MESSAGE_TOO_LARGE), and lose the requests lose_produce()
        says (answered here)."""
        while True:
            frame = await _read_frame(reader)
            api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 4)
            lost_code = self._losing() if api_key == _PRODUCE else None
            if lost_code is not None:
                self._answer_lost(frame, version, correlation_id, lost_code, order)
                continue
            if api_key == _END_TXN and self._refused_commits is not None and \
                    EndTxnRequest.decode(frame[4:], version=version, header=True).committed:
                self.commits_refused += 1
                response = EndTxnResponse(version=version, throttle_time_ms=0,
                                          error_code=self._refused_commits)
                response.with_header(correlation_id=correlation_id)
                body = response.encode(header=True)
                order.own[correlation_id] = struct.pack(">i", len(body)) + body
                order.due.add(correlation_id)
                order.write_own()  # (now, unless an older request is still unanswered)
                continue
            self.written.append((api_key, [order.api_keys[c] for c in order.outstanding]))
            order.outstanding.append(correlation_id)
            order.api_keys[correlation_id] = api_key
            if api_key == _METADATA:
                order.metadata_versions[correlation_id] = version
            too_large: list[tuple[Any, int]] = []
            if api_key == _PRODUCE and limit is not None:
                request = ProduceRequest.decode(frame[4:], version=version, header=True)
                for topic in request.topic_data:
                    kept = []
                    for partition in topic.partition_data:
                        if partition.records is not None and len(partition.records) > limit:
                            too_large.append((topic.name or topic.topic_id, partition.index))
                        else:
                            kept.append(partition)
                    topic.partition_data = kept
                if too_large:
                    self.refused_batches += len(too_large)
                    body = request.encode(header=True)
                    frame = struct.pack(">i", len(body)) + body
            if too_large or api_key in rewrites:
                asked[correlation_id] = (api_key, version, too_large)
            writer.write(frame)
            await writer.drain()

    def _name(self, topic: Any) -> str:
        """A Produce request's topic's name (at v13+ looked up by its id)."""
        return topic.name or self.topic_names.get(topic.topic_id, str(topic.topic_id))

    def _learn_topic_names(self, frame: bytes, version: int) -> None:
        from kafka.protocol.metadata import MetadataResponse

        response = MetadataResponse.decode(frame[4:], version=version, header=True)
        for topic in response.topics:
            if getattr(topic, "topic_id", None) is not None and topic.name:
                self.topic_names[topic.topic_id] = topic.name

    def _losing(self) -> int | None:
        """The error code to answer this Produce request with, if lose_produce() takes it
        (counted here); None: forward it."""
        lose = self._lose
        if lose is None:
            return None
        if lose[0] > 0:
            lose[0] -= 1
            return None
        lose[1] -= 1
        if lose[1] == 0:
            self._lose = None
        return lose[2]

    def _answer_lost(self, frame: bytes, version: int, correlation_id: int, code: int,
                     order: "_Order") -> None:
        """The proxy's own answer to a Produce request it did not forward, held in its place."""
        request = ProduceRequest.decode(frame[4:], version=version, header=True)
        topic_cls = ProduceResponse.TopicProduceResponse
        partition_cls = topic_cls.PartitionProduceResponse
        responses = []
        for topic in request.topic_data:
            partitions = []
            for partition in topic.partition_data:
                self.lost.append((self._name(topic), partition.index))
                partitions.append(partition_cls(
                    version=version, index=partition.index, error_code=code, base_offset=-1,
                    log_append_time_ms=-1, log_start_offset=-1, record_errors=[],
                    error_message=None))
            responses.append(topic_cls(version=version, name=topic.name, topic_id=topic.topic_id,
                                       partition_responses=partitions))
        response = ProduceResponse(version=version, responses=responses, throttle_time_ms=0)
        response.with_header(correlation_id=correlation_id)
        body = response.encode(header=True)
        order.own[correlation_id] = struct.pack(">i", len(body)) + body

        def due() -> None:
            order.due.add(correlation_id)
            order.write_own()
        asyncio.get_running_loop().call_later(1.0, due)

    async def _responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         rewrites: dict[int, tuple[Any, Rewrite]],
                         asked: dict[int, tuple[int, int, list[tuple[Any, int]]]],
                         order: "_Order") -> None:
        """Broker to client: add the refused partitions to their Produce responses, pass
        the responses to rewrite through their functions, and put the proxy's own answers
        (to lost requests) in their places."""
        topic_cls = ProduceResponse.TopicProduceResponse
        partition_cls = topic_cls.PartitionProduceResponse
        while True:
            frame = await _read_frame(reader)
            while self._stalled:
                await asyncio.sleep(0.01)
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            metadata_version = order.metadata_versions.pop(correlation_id, None)
            if metadata_version is not None:
                self._learn_topic_names(frame, metadata_version)
            if order.outstanding and order.outstanding[0] == correlation_id:
                del order.api_keys[order.outstanding.popleft()]
            order.write_own(before=correlation_id)
            if correlation_id in asked:
                api_key, version, too_large = asked.pop(correlation_id)
                response_cls, rewrite = rewrites.get(api_key, (ProduceResponse, None))
                response = response_cls.decode(frame[4:], version=version, header=True)
                for name, index in too_large:  # (at v13+ `name` is the topic's id)
                    named = {"topic_id": name} if version >= 13 else {"name": name}
                    response.responses.append(topic_cls(
                        version=version, **named, partition_responses=[partition_cls(
                            version=version, index=index, error_code=_MESSAGE_TOO_LARGE,
                            base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                            record_errors=[], error_message=None)]))
                replaced = rewrite(response) if rewrite is not None else None
                if replaced is not None:
                    self.rewritten += 1
                    response = replaced
                    response.with_header(correlation_id=correlation_id)
                if too_large or replaced is not None:
                    body = response.encode(header=True)
                    frame = struct.pack(">i", len(body)) + body
            writer.write(frame)
            order.write_own()  # (answers now due that only this one held back)
            await writer.drain()


class _Order:
    """One proxied connection's requests the broker has yet to answer, oldest first, and the
    proxy's own answers to requests it lost (correlation id -> frame): each is written in
    its request's place, before the broker's answer to a later request, or once it is due
    (held long enough) and nothing older is unanswered."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.outstanding: collections.deque[int] = collections.deque()
        self.api_keys: dict[int, int] = {}  # of the outstanding requests
        self.metadata_versions: dict[int, int] = {}  # of the outstanding Metadata requests
        self.own: dict[int, bytes] = {}
        self.due: set[int] = set()

    def write_own(self, before: int | None = None) -> None:
        """Before the broker's answer to request `before`: the held answers to older
        requests. Otherwise: those due, up to the first request still unanswered."""
        for correlation_id in sorted(self.own):
            if before is not None:
                if correlation_id > before:
                    return
            elif correlation_id not in self.due or \
                    (self.outstanding and self.outstanding[0] < correlation_id):
                return  # (in order: none after it either)
            self.client.write(self.own.pop(correlation_id))
            self.due.discard(correlation_id)


def refuse_producer_ids(error_code: int) -> Rewrite:
    """A rewrite for InitProducerIdResponse: every answer is `error_code`, without an id."""
    def refuse(response: Any) -> Any:
        response.error_code, response.producer_id, response.producer_epoch = error_code, -1, -1
        return response
    return refuse


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One size-prefixed Kafka frame, prefix included (IncompleteReadError at the end)."""
    size = await reader.readexactly(4)
    return size + await reader.readexactly(struct.unpack(">i", size)[0])
