"""One multiplexed connection per broker: an asyncio loop around `protocol.framing`.

Requests of every kind share the socket: each gets a correlation id (from the framing) and a
callback, and the response is handed to it straight from the socket's data callback, without
a loop turn in between (so a produce response reaches the tasks awaiting its records one turn
after it arrives). Kafka answers the requests of one connection in order, so the oldest pending
request always has the earliest deadline: a single timer per connection (armed for the oldest
request) enforces `request_timeout_ms` for all of them, and a timeout closes the connection,
failing everything on it as retriable, as the Java client does.

Writes are flow-controlled (asyncio's pause_writing/resume_writing): once more than a
request's worth (max_request_size) waits in the transport's buffer, unsent by the kernel, the
connection is `paused` and the sender writes it no Produce request until it drains below half
of that; `on_resume` then wakes the sender. At acks=0, where a request counts as done once
written, this is what keeps the bytes of a slow broker inside buffer_memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import math
import os
import socket
import ssl
import threading
from collections import deque
from functools import partial
from typing import Any, Callable, Mapping, cast

from ..errors import (
    AuthenticationError,
    BrokerUnsupportedVersionError,
    CorruptMessageError,
    FramingError,
    KafkaConnectionError,
    KafkaError,
    RebootstrapRequiredError,
    RequestTimeoutError,
    error_for_code,
)
from .._version import __version__
from ..protocol.framing import MAX_RESPONSE_BYTES, Framing, Response
from ..protocol.messages import CLIENT_VERSIONS, ApiKey, pick_version
from ..protocol.sasl import SaslMechanism


# What a connection writes while it re-authenticates; anything else waits (KIP-368).
_SASL_EXCHANGE = frozenset((ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE))

# Called with (response body, None) or (None, exception).
ResponseCallback = Callable[["dict[str, Any] | None", "BaseException | None"], None]


class _Pending:
    __slots__ = ("api_key", "on_response", "deadline")

    def __init__(self, api_key: ApiKey, on_response: ResponseCallback, deadline: float):
        self.api_key = api_key
        self.on_response = on_response
        self.deadline = deadline


class BrokerConnection(asyncio.Protocol):
    """A connected, version-negotiated link to one broker. Create with `connect()`."""

    def __init__(self, node_id: int, host: str, port: int, client_id: str,
                 request_timeout: float, max_response_bytes: int = MAX_RESPONSE_BYTES,
                 max_request_size: int = 1 << 20) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.versions: dict[ApiKey, int] = {}
        self.broker_ranges: dict[int, tuple[int, int]] = {}
        # The cluster's finalized features (KIP-584) as this broker knew them, by name: the
        # level of each, and the epoch that orders answers of different brokers.
        self.finalized_features: dict[str, int] = {}
        self.features_epoch = -1
        self.in_flight_produce = 0
        # Loop time until which the broker asked us to hold back (KIP-219): requests sent
        # meanwhile are held and written when it ends (the sender drains no batch for it).
        self.throttled_until = 0.0
        self._throttle_held: list[tuple[ApiKey, Mapping[str, Any], ResponseCallback | None,
                                        int | None]] = []
        self._release_timer: asyncio.TimerHandle | None = None
        self.session_lifetime_ms = 0  # the broker's limit on the SASL session (KIP-368)
        # While re-authenticating (KIP-368): the requests sent meanwhile, written once it ends.
        self._held: list[tuple[ApiKey, Mapping[str, Any], ResponseCallback | None,
                               int | None]] | None = None
        # Loop time at which re-authentication is due (inf: never), the timer that begins it
        # on an idle connection, and the owner's callback that runs reauthenticate() once it
        # has begun.
        self._reauthenticate_at = math.inf
        self._reauthenticate_timer: asyncio.TimerHandle | None = None
        self.on_reauthentication_due: Callable[[BrokerConnection], None] | None = None
        # A request that gets no response (acks=0 Produce) was written since the last barrier().
        self.written_unanswered = False
        # More than max_request_size is buffered unsent (pause_writing): the sender writes
        # this connection no Produce request until it drains; `on_resume` (set by the owner)
        # is called when it has.
        self.paused = False
        self.on_resume: Callable[[], None] | None = None
        self._max_request_size = max_request_size
        self._loop = asyncio.get_running_loop()
        # Its socket, made here (not by the loop) so that a child forked while it is being
        # opened finds it too (close_in_forked_child); then the transport's.
        self._socket: socket.socket | None = None
        self._transport: asyncio.Transport | None = None
        self._handshaking_tls = False  # connected, in the TLS handshake (a failure says so)
        # Opened without SASL, nothing answered but ApiVersions yet: a SASL listener closes
        # such a connection at the next request (a loss then says so).
        self._only_versions_answered = False
        self._joins_lines = False  # the transport's writelines() copies (connection_made)
        self._framing = Framing(client_id, self.address, max_response_bytes=max_response_bytes)
        # The callback and deadline of each request awaiting its response, oldest first.
        self._pending: dict[int, _Pending] = {}
        # Responses that arrived behind a large one still being decoded in a worker thread
        # (the first, while `_decoding`): delivered in order once it is done.
        self._backlog: deque[tuple[_Pending, Response]] = deque()
        self._decoding = False
        self._timer: asyncio.TimerHandle | None = None
        self._close_exc: KafkaError | None = None
        # Set by the owner: called with (this connection, the exception it closed with).
        self.on_close: Callable[[BrokerConnection, KafkaError], None] | None = None

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port}>"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    async def connect(cls, node_id: int, host: str, port: int, *, client_id: str,
                      request_timeout: float, connect_timeout: float,
                      ssl_context: ssl.SSLContext | None = None,
                      sasl: SaslMechanism | None = None,
                      max_response_bytes: int = MAX_RESPONSE_BYTES,
                      max_request_size: int = 1 << 20,
                      expected_cluster_id: str | None = None,
                      opening: set[BrokerConnection] | None = None) -> BrokerConnection:
        """Open the socket (TLS if given a context), negotiate API versions, authenticate
        (SASL if given a mechanism); raise KafkaConnectionError or AuthenticationError.
        With `expected_cluster_id`, ask the broker to check that it is `node_id` of that
        cluster (KIP-1242): RebootstrapRequiredError if it is not. The connection is in
        `opening` meanwhile (a fork then makes it inert in the child too), and stays there
        once open: the caller takes it out after putting it where a fork finds it next."""
        conn = cls(node_id, host, port, client_id, request_timeout, max_response_bytes,
                   max_request_size)
        if opening is not None:
            opening.add(conn)
        try:
            return await conn._open(connect_timeout, ssl_context, sasl, expected_cluster_id)
        except BaseException:
            if opening is not None:
                opening.discard(conn)
            raise

    async def _open(self, connect_timeout: float, ssl_context: ssl.SSLContext | None,
                    sasl: SaslMechanism | None,
                    expected_cluster_id: str | None) -> BrokerConnection:
        host, port, node_id = self.host, self.port, self.node_id
        try:
            await asyncio.wait_for(self._connect_socket(ssl_context), connect_timeout)
        except ssl.SSLError as exc:
            raise AuthenticationError(
                f"TLS handshake with {host}:{port} failed: {exc.reason or exc}. Check "
                "ssl_cafile (the CA that signed the broker's certificate) and that the broker's "
                "certificate names this host") from exc
        except (asyncio.TimeoutError, OSError) as exc:
            if self._handshaking_tls:
                # A PLAINTEXT listener reads the ClientHello as the start of a request: Tansu
                # waits for the rest, Kafka closes the connection (librdkafka says so too).
                protocol = "SASL_SSL" if sasl is not None else "SSL"
                what = (f"got no answer within {connect_timeout:.1f} s"
                        if isinstance(exc, asyncio.TimeoutError) else
                        "was cut short by the broker "
                        f"({exc.strerror or str(exc) or 'connection closed'})")
                raise KafkaConnectionError(
                    f"connected to {host}:{port}, but its TLS handshake {what}: is it a TLS "
                    f"listener? (security_protocol={protocol!r}; a PLAINTEXT listener does not "
                    "answer a TLS client, or closes the connection)") from None
            if isinstance(exc, asyncio.TimeoutError):
                raise KafkaConnectionError(
                    f"connecting to {host}:{port} timed out after {connect_timeout:.1f} s: is "
                    "the broker reachable from here? (check bootstrap_servers and advertised "
                    "listeners)") from None
            # A broker metadata named is at the address it advertises, which bootstrap_servers
            # does not decide: a broker in a container advertising its own name, say. (Or it
            # is down: one Kafka node restarting, the usual case in development.)
            hint = "Is a Kafka broker running there? (check bootstrap_servers)" if node_id < 0 \
                else (f"It is where broker {node_id} says it is (its advertised.listeners): "
                      "is the broker up, and that address reachable from here?")
            raise KafkaConnectionError(
                f"cannot connect to {host}:{port}: {exc.strerror or exc}. {hint}") from exc
        try:
            await self._negotiate_versions(expected_cluster_id)
            self._only_versions_answered = sasl is None
            if sasl is not None:
                await self.authenticate(sasl)
        except BaseException:
            self.close()
            raise
        return self

    async def _connect_socket(self, ssl_context: ssl.SSLContext | None) -> None:
        """loop.create_connection(host, port) with a socket of our own (`_socket`): each
        address in turn until one connects, then the transport (TLS's handshake included)."""
        loop = self._loop
        try:  # a numeric address needs no lookup (nor a worker thread)
            addresses = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                           flags=socket.AI_NUMERICHOST)
        except socket.gaierror:  # a name: in the loop's executor, as asyncio's getaddrinfo
            # does (uvloop's uses libuv's thread pool, whose threads a child forked later
            # joins at its exit though they are not in it: SIGSEGV)
            addresses = await loop.run_in_executor(None, socket.getaddrinfo, self.host,
                                                   self.port, 0, socket.SOCK_STREAM)
        if not addresses:
            raise OSError(f"getaddrinfo({self.host!r}) returned no address")
        first_error: OSError | None = None
        for family, kind, proto, _, address in addresses:
            try:  # (a family the host cannot make, IPv6 turned off: the next address)
                self._socket = sock = socket.socket(family, kind, proto)
            except OSError as exc:
                first_error = first_error or exc
                continue
            try:
                sock.setblocking(False)
                await _connect(loop, sock, address)
                break
            except BaseException as exc:
                sock.close()
                if not isinstance(exc, OSError):
                    raise
                first_error = first_error or exc
        else:
            assert first_error is not None
            raise first_error
        # (Failed, the transport closes the socket: asyncio's closes it, uvloop's detaches it.)
        self._handshaking_tls = ssl_context is not None
        await loop.create_connection(lambda: self, sock=sock, ssl=ssl_context,
                                     server_hostname=self.host if ssl_context else None)

    async def authenticate(self, mechanism: SaslMechanism) -> None:
        """SaslHandshake names the mechanism, then SaslAuthenticate carries each step (KIP-152).
        Again later on the same connection to re-authenticate (KIP-368); `session_lifetime_ms`
        is then the broker's limit (0: none)."""
        response = await self.request(ApiKey.SASL_HANDSHAKE, {"mechanism": mechanism.name})
        if response["error_code"]:
            raise AuthenticationError(
                f"{self.address} does not offer SASL {mechanism.name}; it offers "
                f"{', '.join(response['mechanisms'] or []) or 'none'}")
        token = await _step(mechanism, None)
        while token is not None:
            # The message may hold the password (PLAIN): no local of a frame a failure's
            # traceback shows (error reporters capture locals) keeps it once it is written.
            body = {"auth_bytes": token}
            token = None
            try:
                response = await self.request(ApiKey.SASL_AUTHENTICATE, body)
            finally:
                body.clear()
            if response["error_code"]:
                raise AuthenticationError(
                    f"SASL {mechanism.name} authentication with {self.address} failed: "
                    f"{response['error_message'] or error_for_code(response['error_code'])}")
            token = await _step(mechanism, response["auth_bytes"])
        self.session_lifetime_ms = response.get("session_lifetime_ms", 0)

    @property
    def reauthenticating(self) -> bool:
        """Whether a re-authentication is under way: requests sent now are held until it
        ends (the sender drains no batch for this connection meanwhile)."""
        return self._held is not None

    def reauthenticate_at(self, when: float) -> None:
        """Begin re-authenticating (KIP-368) at loop time `when`: as the first request from
        then on is about to be written, as Java's client does, or by a timer if none is
        (a timer alone fires late after the loop stalled: a request queued meanwhile was
        written first, after the session ended, and the broker hung up on it)."""
        self._reauthenticate_at = when
        self._reauthenticate_timer = self._loop.call_at(when, self._begin_reauthentication)

    def _begin_reauthentication(self) -> None:
        """Hold what is sent from now on and have the owner call reauthenticate()."""
        self._reauthenticate_at = math.inf
        if self._reauthenticate_timer is not None:
            self._reauthenticate_timer.cancel()
            self._reauthenticate_timer = None
        if self._held is None and self._close_exc is None \
                and self.on_reauthentication_due is not None:
            self._held = []
            self.on_reauthentication_due(self)

    async def reauthenticate(self, mechanism: SaslMechanism) -> None:
        """Authenticate again on this open connection (KIP-368). Every request sent meanwhile
        (and since it was due) is held and written after it, in order: between SaslHandshake
        and the exchange's end a broker closes a connection that sends anything but
        SaslAuthenticate. The requests already in flight are not waited for, as Java's
        KafkaChannel does not wait: a broker handles a connection's requests one at a time,
        in order, so their answers come before the SaslHandshake's, each to its callback as
        usual. If it fails (or is cancelled) the connection closes, failing what it held,
        and the error is raised; closed before it begins, it just ends."""
        if self._held is None:
            self._held = []
        try:
            if self._close_exc is not None:
                return
            await self.authenticate(mechanism)
        except BaseException as exc:
            self.close(exc if isinstance(exc, KafkaError) and exc.fatal else None)
            raise
        finally:
            held, self._held = self._held, None
        if self._close_exc is not None:
            return  # close() failed them
        for api_key, body, on_response, version in held:
            self.send(api_key, body, on_response, version=version)

    async def _negotiate_versions(self, expected_cluster_id: str | None) -> None:
        body = {"client_software_name": "aioproducer", "client_software_version": __version__,
                "cluster_id": expected_cluster_id, "node_id": self.node_id}
        # v5 only to check where we are (asked only of a cluster known to speak it): some
        # brokers close the connection on a version they lack instead of answering
        # UNSUPPORTED_VERSION (Tansu does on v5).
        version = CLIENT_VERSIONS[ApiKey.API_VERSIONS][1] if expected_cluster_id else 3
        response = await self.request(ApiKey.API_VERSIONS, body, version=version)
        if response["error_code"] == BrokerUnsupportedVersionError.error_code:
            # The broker answers with its own range in a v0 body; retry at its highest.
            ranges = {k["api_key"]: (k["min_version"], k["max_version"])
                      for k in response["api_keys"]}
            version = pick_version(ApiKey.API_VERSIONS, ranges.get(ApiKey.API_VERSIONS))
            response = await self.request(ApiKey.API_VERSIONS, body, version=version)
        if response["error_code"] == RebootstrapRequiredError.error_code:
            raise RebootstrapRequiredError(
                f"{self.address} is not broker {self.node_id} of cluster "
                f"{expected_cluster_id!r}, as the metadata said (KIP-1242: it answered "
                "ApiVersions with REBOOTSTRAP_REQUIRED)")
        if response["error_code"]:
            raise error_for_code(response["error_code"], f"ApiVersions from {self.address}")
        self.broker_ranges = {k["api_key"]: (k["min_version"], k["max_version"])
                              for k in response["api_keys"]}
        self.features_epoch = response.get("finalized_features_epoch", -1)
        self.finalized_features = {f["name"]: f["max_version_level"]
                                   for f in response.get("finalized_features") or ()}

    def version_for(self, api_key: ApiKey) -> int:
        """The highest version of `api_key` both sides speak (cached per connection)."""
        version = self.versions.get(api_key)
        if version is None:
            version = pick_version(api_key, self.broker_ranges.get(api_key))
            self.versions[api_key] = version
        return version

    # -- sending ---------------------------------------------------------------------------

    def send(self, api_key: ApiKey, body: Mapping[str, Any], on_response: ResponseCallback | None,
             *, version: int | None = None) -> None:
        """Write a request now. `on_response(body, None)` is called with the decoded response
        as soon as it arrives, `on_response(None, exc)` if the request fails (the connection
        closed, timed out, or the response was corrupt). With None (acks=0 produce) no
        response is awaited: one the broker sends anyway is ignored.
        """
        if self._close_exc is not None:
            raise self._close_exc
        now = self._loop.time()
        if (self._held is not None or self.throttled_until or now >= self._reauthenticate_at) \
                and api_key not in _SASL_EXCHANGE:
            if now >= self._reauthenticate_at:
                self._begin_reauthentication()
            if self._held is not None:
                self._held.append((api_key, body, on_response, version))
                return
            if self.throttled_until > now:
                self._throttle_held.append((api_key, body, on_response, version))
                if self._release_timer is None:
                    self._release_timer = self._loop.call_at(self.throttled_until,
                                                             self._release_throttled)
                return
        if version is None:
            version = self.version_for(api_key)
        frame, correlation_id = self._framing.send_request(
            api_key, version, body, expect_response=on_response is not None)
        if on_response is not None:
            deadline = now + self.request_timeout
            self._pending[correlation_id] = _Pending(api_key, on_response, deadline)
            if api_key == ApiKey.PRODUCE:
                self.in_flight_produce += 1
            if self._timer is None:
                self._timer = self._loop.call_at(deadline, self._check_timeouts)
        else:
            self.written_unanswered = True
        assert self._transport is not None
        if isinstance(frame, bytes):
            self._transport.write(frame)
        elif self._joins_lines:
            self._write_parts(frame)
        else:  # large batches not copied into the request: one writev of its parts
            self._transport.writelines(frame)

    def _write_parts(self, frame: list[bytes | memoryview]) -> None:
        """A part at a time while the socket takes them whole (nothing copied); the rest
        joined into one write once it does not, as writelines() does: the transport's
        buffer then grows once, not once a part (each growth after a partial send copies
        all it holds)."""
        transport = self._transport
        assert transport is not None
        for index, part in enumerate(frame):
            if transport.get_write_buffer_size():
                transport.writelines(frame[index:])
                return
            transport.write(part)

    def _release_throttled(self) -> None:
        """The throttle ended: write what it held, in order (held again if it grew)."""
        self._release_timer = None
        held, self._throttle_held = self._throttle_held, []
        for api_key, body, on_response, version in held:
            self.send(api_key, body, on_response, version=version)

    async def request(self, api_key: ApiKey, body: Mapping[str, Any], *,
                      version: int | None = None) -> dict[str, Any]:
        """Send and await the response body."""
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self.send(api_key, body, partial(_settle, future), version=version)
        return await future

    @property
    def closed(self) -> bool:
        return self._close_exc is not None

    def barrier(self) -> asyncio.Future[dict[str, Any]]:
        """A future answered once the broker has handled every request written before it
        (the acks=0 Produce requests, which get no answer of their own): the response to a
        cheap request (ApiVersions) written after them. On TLS as on plaintext, so closing
        the connection then loses nothing; failed if the connection closes first (Kafka
        closes it when it refuses an acks=0 request), or after request_timeout_ms."""
        # A broker handles one connection's requests one at a time, in order ("requests will
        # be processed in the order they are sent", kafka.apache.org/protocol#protocol_network).
        # Apache Kafka: SocketServer's Processor.processCompletedReceives mutes the channel as
        # it hands a request on, and reads the next only once processNewResponses unmutes it:
        # for an acks=0 Produce, after KafkaApis.handleProduceRequest appended the records
        # (no delayed produce below acks=-1: ReplicaManager.delayedProduceRequestRequired) and
        # sent its NoOpResponse. Tansu 0.6: TcpBytesService.serve reads, handles and answers
        # one request at a time (and answers acks=0 Produce requests too).
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self.send(ApiKey.API_VERSIONS, {"client_software_name": "aioproducer",
                                        "client_software_version": __version__},
                  partial(_settle, future))
        self.written_unanswered = False
        return future

    def close(self, exc: KafkaError | None = None) -> None:
        """Close the socket and fail every pending request with `exc` (retriable by default)."""
        if self._close_exc is not None:
            return
        self._close_exc = exc or KafkaConnectionError(f"connection to {self.address} closed")
        for timer in (self._timer, self._release_timer, self._reauthenticate_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._release_timer = self._reauthenticate_timer = None
        pending, self._pending = self._pending, {}
        backlog, self._backlog = self._backlog, deque()
        held = (self._held or []) + self._throttle_held
        self._held, self._throttle_held = None, []
        self.in_flight_produce = 0
        callbacks = [entry.on_response for entry, _ in backlog] + \
            [entry.on_response for entry in pending.values()] + \
            [on_response for _, _, on_response, _ in held if on_response is not None]
        for on_response in callbacks:
            # In a loop turn of their own: close() may be called from code the callbacks
            # would re-enter.
            self._loop.call_soon(on_response, None, self._close_exc)
        if self._transport is not None:
            self._transport.abort()
        if self.on_close is not None:
            self.on_close(self, self._close_exc)

    def close_in_forked_child(self, loop_runs_here: bool) -> None:
        """close(), in a child forked after this began connecting, without touching the
        parent's socket: the child's descriptor of it is made to name an unconnected socket
        first (dup2), so what the child's copy of the loop does with it, the close (or the
        cancelled connect) included, reads, writes and unregisters nothing of the parent's
        (an epoll instance and its interest list are shared with the parent: the child's
        unregistering the socket stopped the parent's loop from hearing of it). A
        `shutdown` would end the parent's connection too. Without `loop_runs_here` (the
        loop's thread is the parent's alone, a BlockingProducer's: that loop never runs
        here, and asyncio's debug mode refuses a call into it from this thread) the
        descriptor is all it changes."""
        # (A socket closed meanwhile says -1: asyncio's transport closes it, uvloop's
        # detaches it.)
        if self._socket is not None and self._socket.fileno() >= 0:
            with socket.socket() as unconnected:
                os.dup2(unconnected.fileno(), self._socket.fileno())
        if not loop_runs_here:
            return
        # (asyncio's transport with writes buffered asks the selector to watch the socket
        # for reads only, which it no longer watches here: OSError, the transport let go.)
        with contextlib.suppress(OSError):
            self.close(KafkaConnectionError(
                f"connection to {self.address} left to the parent process (os.fork())"))

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self._transport = cast(asyncio.Transport, transport)
        # Python 3.11's plain socket transport keeps asyncio's default writelines(), which
        # joins the parts (a copy of every byte of the request) before writing; uvloop's and
        # 3.12's write the parts where they lie (writev, sendmsg), and the TLS transport
        # takes them as a list.
        self._joins_lines = type(self._transport).writelines is asyncio.WriteTransport.writelines
        # Paused above one request's worth, so a request never pauses an empty buffer by
        # itself; resumed at half of it, so the next request is written while the kernel
        # still has bytes to send (asyncio's default, 64 KiB, would pause on every large
        # request and let the socket run dry before the next).
        high = self._max_request_size
        self._transport.set_write_buffer_limits(high, high // 2)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.on_resume is not None:
            self.on_resume()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        if self._only_versions_answered and self._pending:
            reason += (": it closed the connection after answering only ApiVersions: is it a "
                       "SASL listener? (it closes a connection that does not authenticate: set "
                       "security_protocol='SASL_PLAINTEXT' or 'SASL_SSL' and the sasl_ settings)")
        self.close(KafkaConnectionError(f"connection to {self.address} lost{reason}"))

    def data_received(self, data: bytes) -> None:
        if self._close_exc is not None:  # what was pending has failed already
            return
        try:
            responses = self._framing.receive_data(data)
        except FramingError as exc:
            self._handle(exc.responses)
            self.close(exc)
            return
        self._handle(responses)

    def _handle(self, responses: list[Response]) -> None:
        """Each response to its request's callback, in order, until the connection closes.
        A large one (deferred by the framing) is decoded in a worker thread first, and those
        after it wait for it."""
        pending = self._pending
        for response in responses:
            entry = pending.pop(response.correlation_id)
            if entry.api_key == ApiKey.PRODUCE:
                self.in_flight_produce -= 1
            if self._backlog or response.deferred is not None:
                self._backlog.append((entry, response))
                if not self._decoding:
                    self._decode_next()
                continue
            self._handle_one(entry, response)
            if self._close_exc is not None:  # by a callback or the error: close() failed the rest
                return

    def _decode_next(self) -> None:
        """Deliver the backlog up to its first deferred response, and start decoding that
        one in a worker thread (its GIL is shared, but the loop gets its turn every switch
        interval, so timers fire and other connections are served meanwhile)."""
        backlog = self._backlog
        while backlog and backlog[0][1].deferred is None:
            if self._close_exc is not None:
                return
            entry, response = backlog.popleft()
            self._handle_one(entry, response)
        if backlog and self._close_exc is None:
            self._decoding = True
            decoded = self._loop.run_in_executor(None, _decode_without_gc, backlog[0][1])
            decoded.add_done_callback(self._decoded)

    def _decoded(self, done: asyncio.Future[None]) -> None:
        self._decoding = False
        if self._close_exc is not None or done.cancelled():
            return
        error = done.exception()
        if error is not None:  # (decode() raises nothing else: a MemoryError, say)
            self.close(CorruptMessageError(f"{self.address}: a response could not be decoded: "
                                           f"{type(error).__name__}"))
            return
        entry, response = self._backlog.popleft()
        self._handle_one(entry, response)
        self._decode_next()

    def _handle_one(self, entry: _Pending, response: Response) -> None:
        self._only_versions_answered = False
        error = response.error
        if error is None:
            self._note_throttle(response.body)
            self._deliver(entry, response.body, None)
        else:  # this request gets the error; the others fail as the connection closes
            self._deliver(entry, None, error)
            self.close(error if isinstance(error, CorruptMessageError) else None)

    def _note_throttle(self, body: dict[str, Any] | None) -> None:
        """Any response may say the client went over a quota. A broker that speaks Produce v6
        (Kafka 2.0+, KIP-219) answers at once and expects the client to send it nothing for
        throttle_time_ms, as the Java client holds every request to it; an older one delayed
        the answer itself."""
        throttle_ms = body.get("throttle_time_ms", 0) if body is not None else 0
        if throttle_ms > 0 and self.broker_ranges.get(ApiKey.PRODUCE, (0, 0))[1] >= 6:
            self.throttled_until = max(self.throttled_until,
                                       self._loop.time() + throttle_ms / 1000)

    def _deliver(self, entry: _Pending, body: dict[str, Any] | None,
                 exc: BaseException | None) -> None:
        try:
            entry.on_response(body, exc)
        except Exception as error:  # a bug in a callback must not break the framing of the rest
            self._loop.call_exception_handler({
                "message": f"{self!r}: error in the {entry.api_key.name} response callback",
                "exception": error, "protocol": self})

    def _check_timeouts(self) -> None:
        self._timer = None
        if not self._pending:
            return
        oldest = next(iter(self._pending.values()))
        now = self._loop.time()
        if oldest.deadline <= now:
            self.close(RequestTimeoutError(
                f"{oldest.api_key.name} request to {self.address} got no response within "
                f"request_timeout_ms={self.request_timeout * 1000:.0f}; connection closed"))
        else:
            self._timer = self._loop.call_at(oldest.deadline, self._check_timeouts)


_gc_lock = threading.Lock()
_gc_paused = 0  # decodes under way; the collector is off while there is one
_gc_was_enabled = False


def _decode_without_gc(response: Response) -> None:
    """Decode a large response (in a worker thread) with the cyclic garbage collector off:
    the hundreds of thousands of dicts a large Metadata response becomes would otherwise set
    off full collections in this thread, each holding the GIL (and so the event loop) for
    tens to hundreds of milliseconds. Reference counting still frees what dies meanwhile."""
    global _gc_paused, _gc_was_enabled
    with _gc_lock:
        if not _gc_paused:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_paused += 1
    try:
        response.decode()
    finally:
        with _gc_lock:
            _gc_paused -= 1
            if not _gc_paused and _gc_was_enabled:
                gc.enable()


async def _connect(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                   address: Any) -> None:
    """sock.connect(address), waiting without blocking, as loop.sock_connect() does (but
    uvloop's looks the address up again, in libuv's thread pool: see _connect_socket)."""
    error = sock.connect_ex(address)
    if error in (errno.EINPROGRESS, errno.EINTR):
        fd = sock.fileno()
        writable = loop.create_future()
        loop.add_writer(fd, _wake, writable)
        try:
            await writable
        finally:
            loop.remove_writer(fd)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, os.strerror(error))


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _step(mechanism: SaslMechanism, challenge: bytes | None) -> bytes | None:
    """One step of a SASL exchange; SCRAM's key derivation (PBKDF2, which releases the GIL)
    in a worker thread, so that the loop's timers and other connections go on meanwhile."""
    if mechanism.costly:
        return await asyncio.to_thread(mechanism.step, challenge)
    return mechanism.step(challenge)


def _settle(future: asyncio.Future[Any], body: dict[str, Any] | None,
            exc: BaseException | None) -> None:
    if not future.done():  # the awaiting task may have been cancelled
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(body)
