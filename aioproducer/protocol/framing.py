"""Kafka's framing, sans-I/O: requests out as bytes, bytes in as responses.

A `Framing` is the protocol state of one connection, with no socket, loop or clock (in the
style of h11), so it can be tested by feeding it bytes. `send_request()` gives the frame to
write and its correlation id; `receive_data()` takes whatever the socket read and gives back
the responses it completes, in order, keeping a partial frame for the next read. The I/O
around it (`client/connection.py`) owns the socket, the callbacks and the timeouts.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from typing import Any, Mapping

from ..errors import (
    CorrelationIdError,
    CorruptMessageError,
    FrameSizeError,
    FramingError,
    KafkaError,
    UnsupportedVersionError,
)
from .messages import ApiKey, Frame, decode_response, encode_request

log = logging.getLogger(__name__)

_INT32 = struct.Struct(">i")  # the size prefix, and the correlation id after it
# The default of the receive_message_max_bytes setting: a response larger than this is
# refused before it is buffered (the connection closes). librdkafka's receive.message.max.bytes
# default. Produce responses are tiny; Metadata for the topics a producer uses stays far below
# (a topic of 100,000 partitions of 3 replicas: about 7 MB); decoded, a Metadata response
# takes up to ~17 times its size in memory.
MAX_RESPONSE_BYTES = 100_000_000
# A response frame larger than this is handed back undecoded (Response.deferred) for the I/O
# layer to decode off its event loop: decoding takes ~0.1 s per MiB of Metadata, during which
# no timer or other connection would run. Produce responses are far smaller.
INLINE_DECODE_BYTES = 64 * 1024


class Response:
    """A response matched to its request: the decoded `body`, or the `error` that decoding it
    raised (CorruptMessageError, UnsupportedVersionError), which fails only that request.
    A large one comes `deferred`: (api key, version, frame) to decode() where it suits the
    caller (a worker thread), which sets body or error."""

    __slots__ = ("correlation_id", "body", "error", "deferred")

    def __init__(self, correlation_id: int, body: dict[str, Any] | None,
                 error: KafkaError | None,
                 deferred: tuple[ApiKey, int, bytes] | None = None) -> None:
        self.correlation_id = correlation_id
        self.body = body
        self.error = error
        self.deferred = deferred

    def decode(self) -> None:
        """Decode a deferred response (no loop or shared state: safe in another thread)."""
        if self.deferred is None:
            return
        api_key, version, frame = self.deferred
        try:
            self.body = decode_response(api_key, version, frame)
        except (CorruptMessageError, UnsupportedVersionError) as exc:
            self.error = exc
        self.deferred = None

    def __repr__(self) -> str:
        return f"<Response {self.correlation_id} {self.error or self.body}>"


class Framing:
    """The frames of one connection: numbers the requests, cuts the byte stream into
    response frames, and matches each to its request (in order) to decode it."""

    def __init__(self, client_id: str | None, peer: str, *,
                 max_response_bytes: int = MAX_RESPONSE_BYTES,
                 inline_decode_bytes: int | None = INLINE_DECODE_BYTES) -> None:
        self.client_id = client_id
        self.peer = peer  # named in error messages
        self.max_response_bytes = max_response_bytes
        # Frames larger than this come back deferred (None: every frame decoded here).
        self._inline = inline_decode_bytes if inline_decode_bytes is not None else 1 << 62
        self._next_correlation_id = 0
        # (correlation id, api key, version) of each request awaiting its response, oldest first.
        self._in_flight: deque[tuple[int, ApiKey, int]] = deque()
        self._buffer = bytearray()  # the start of a frame the next read completes

    def send_request(self, api_key: ApiKey, version: int, body: Mapping[str, Any], *,
                     expect_response: bool = True) -> tuple[Frame, int]:
        """The frame to write (bytes, or a list of parts to write in order: see
        encode_request), and its correlation id. With expect_response=False (acks=0
        produce) no response is awaited: one the broker sends anyway is dropped."""
        correlation_id = self._next_correlation_id
        frame = encode_request(api_key, version, correlation_id, self.client_id, body)
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        if expect_response:
            self._in_flight.append((correlation_id, api_key, version))
        return frame, correlation_id

    def receive_data(self, data: bytes) -> list[Response]:
        """The responses `data` completes, in order; a frame it leaves unfinished is kept.
        Raises a FramingError (with the responses before it) if the stream breaks."""
        buffer = self._buffer
        if not buffer:  # the usual case: whole frames, sliced straight from the read's bytes
            responses, used = self._read_frames(data)
            if used < len(data):
                buffer += memoryview(data)[used:]
            return responses
        buffer += data  # a frame started in an earlier read
        with memoryview(buffer) as view:  # frames copied out once, not sliced then copied
            responses, used = self._read_frames(view)
        del buffer[:used]
        return responses

    def _read_frames(self, source: bytes | memoryview) -> tuple[list[Response], int]:
        """The responses of the whole frames at the start of `source`, and the bytes they
        take."""
        in_flight = self._in_flight
        responses: list[Response] = []
        start = 0
        end = len(source)
        try:
            while end - start >= 4:
                (size,) = _INT32.unpack_from(source, start)
                if size < 4:
                    raise FrameSizeError(
                        f"{self.peer} sent a frame of {size} bytes: it does not speak the Kafka "
                        "protocol (wrong port? TLS expected?)")
                if size > self.max_response_bytes:
                    said = f"{self.peer} sent a frame of {size} bytes, over receive_message_" \
                        f"max_bytes={self.max_response_bytes}: not a Kafka broker"
                    text = _text_line(source[start:start + 80])
                    raise FrameSizeError(
                        f"{said}: it answered {text!r} (wrong port?)" if text else
                        f"{said} (wrong port? TLS expected?), or one whose answers need a "
                        "larger limit")
                if end - start - 4 < size:
                    break
                (correlation_id,) = _INT32.unpack_from(source, start + 4)
                frame = bytes(source[start + 4:start + 4 + size])  # one copy, bytes or view
                start += 4 + size
                if in_flight and in_flight[0][0] == correlation_id:
                    _, api_key, version = in_flight.popleft()
                elif any(waiting[0] == correlation_id for waiting in in_flight):
                    raise CorrelationIdError(
                        f"{self.peer} answered request {correlation_id} before request "
                        f"{in_flight[0][0]}: a Kafka broker answers in order")
                else:
                    # A response to a request that expected none (acks=0 produce: some brokers
                    # answer anyway). Anything else unknown would be a broker bug; nothing
                    # waits for it.
                    log.debug("%s: ignoring response with correlation id %d",
                              self.peer, correlation_id)
                    continue
                if size > self._inline:
                    responses.append(Response(correlation_id, None, None,
                                              (api_key, version, frame)))
                    continue
                try:
                    body = decode_response(api_key, version, frame)
                except (CorruptMessageError, UnsupportedVersionError) as exc:
                    responses.append(Response(correlation_id, None, exc))
                else:
                    responses.append(Response(correlation_id, body, None))
        except FramingError as exc:
            exc.responses = responses
            raise
        return responses, start


def _text_line(head: bytes | memoryview) -> str | None:
    """The first line of an answer in text, whose first bytes read as a huge frame size: an
    HTTP server's status line ('HTTP/1.1 400 Bad Request', at a Schema Registry's port, say),
    an SSH or SMTP banner. None for binary (a TLS alert, a larger Kafka response)."""
    line = bytes(head).split(b"\n", 1)[0].rstrip(b"\r")
    if len(line) >= 4 and all(32 <= byte < 127 for byte in line):
        return line.decode("ascii")
    return None
