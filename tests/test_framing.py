"""The sans-I/O framing, fed bytes by hand: no broker, no event loop."""

from __future__ import annotations

import struct

import pytest

from aioproducer.errors import CorrelationIdError, CorruptMessageError, FrameSizeError, \
    RetriableError
from aioproducer.protocol.framing import MAX_RESPONSE_BYTES, Framing, Response
from aioproducer.protocol.messages import ApiKey

END_TXN = {"transactional_id": "tx", "producer_id": 7, "producer_epoch": 1, "committed": True}
INIT = {"transactional_id": None, "transaction_timeout_ms": 60000}
ACKS_0 = {"transactional_id": None, "acks": 0, "timeout_ms": 1000, "topic_data": []}


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _end_txn_response(correlation_id: int, error_code: int = 0) -> bytes:
    """EndTxn v0: throttle_time_ms, error_code."""
    return _frame(struct.pack(">iih", correlation_id, 0, error_code))


def _init_response(correlation_id: int, producer_id: int) -> bytes:
    """InitProducerId v0: throttle_time_ms, error_code, producer_id, producer_epoch."""
    return _frame(struct.pack(">iihqh", correlation_id, 0, 0, producer_id, 3))


def _outcomes(responses: list[Response]) -> list[tuple]:
    return [(r.correlation_id, r.body, r.error) for r in responses]


def _three_requests() -> tuple[Framing, bytes, list[tuple]]:
    """A framing with three requests out, the stream that answers them, and what it gives."""
    framing = Framing("client-7", "broker:9092")
    ids = [framing.send_request(ApiKey.END_TXN, 0, END_TXN)[1],
           framing.send_request(ApiKey.INIT_PRODUCER_ID, 0, INIT)[1],
           framing.send_request(ApiKey.END_TXN, 0, END_TXN)[1]]
    stream = _end_txn_response(ids[0]) + _init_response(ids[1], 42) + \
        _end_txn_response(ids[2], error_code=51)
    expected = [
        (ids[0], {"throttle_time_ms": 0, "error_code": 0}, None),
        (ids[1], {"throttle_time_ms": 0, "error_code": 0, "producer_id": 42,
                  "producer_epoch": 3}, None),
        (ids[2], {"throttle_time_ms": 0, "error_code": 51}, None),
    ]
    return framing, stream, expected


def test_requests_are_whole_frames_numbered_in_order():
    framing = Framing("client-7", "broker:9092")
    sent = [framing.send_request(ApiKey.END_TXN, 0, END_TXN) for _ in range(3)]
    assert [correlation_id for _, correlation_id in sent] == [0, 1, 2]
    for frame, correlation_id in sent:
        size, api_key, version, in_header = struct.unpack_from(">ihhi", frame)
        assert (size, api_key, version, in_header) == \
            (len(frame) - 4, ApiKey.END_TXN, 0, correlation_id)


def test_several_frames_in_one_read_come_out_in_order():
    framing, stream, expected = _three_requests()
    assert _outcomes(framing.receive_data(stream)) == expected


@pytest.mark.parametrize("pieces", [2, 3])
def test_frames_cut_at_every_point_read_alike(pieces):
    """Cut once at every byte (or twice at every pair of bytes): the same responses, each
    handed over by the read that completes it."""
    _, stream, expected = _three_requests()
    ends = [len(_end_txn_response(0)), len(_end_txn_response(0)) + len(_init_response(0, 0)),
            len(stream)]
    points = range(len(stream) + 1)
    cuts = [(i,) for i in points] if pieces == 2 else \
        [(i, j) for i in points for j in points if i <= j]
    for cut in cuts:
        framing, stream, _ = _three_requests()
        bounds = [0, *cut, len(stream)]
        got: list[tuple] = []
        for low, high in zip(bounds, bounds[1:]):
            got += _outcomes(framing.receive_data(stream[low:high]))
            assert len(got) == sum(end <= high for end in ends), cut
        assert got == expected, cut


def test_byte_by_byte_reads_the_same():
    framing, stream, expected = _three_requests()
    got: list[tuple] = []
    for i in range(len(stream)):
        got += _outcomes(framing.receive_data(stream[i:i + 1]))
    assert got == expected


def test_a_response_that_does_not_decode_fails_only_its_request():
    framing, _, _ = _three_requests()
    truncated = _frame(struct.pack(">ii", 0, 0))  # EndTxn without its error code
    responses = framing.receive_data(truncated + _init_response(1, 42))
    assert isinstance(responses[0].error, CorruptMessageError) and responses[0].body is None
    assert (responses[1].correlation_id, responses[1].body["producer_id"]) == (1, 42)


@pytest.mark.parametrize("size", [MAX_RESPONSE_BYTES + 1, 2**31 - 1, 3, 0, -1])
def test_a_size_no_kafka_broker_sends_is_refused_after_the_frames_before_it(size):
    framing, _, expected = _three_requests()
    first = _end_txn_response(0)
    with pytest.raises(FrameSizeError, match="broker:9092 sent a frame of") as raised:
        framing.receive_data(first + struct.pack(">i", size) + b"HTTP/1.1")
    assert _outcomes(raised.value.responses) == expected[:1]
    assert isinstance(raised.value, CorruptMessageError) and raised.value.retriable


def test_a_size_is_refused_before_its_frame_is_buffered():
    framing, _, _ = _three_requests()
    with pytest.raises(FrameSizeError):
        framing.receive_data(struct.pack(">i", MAX_RESPONSE_BYTES + 1))


def test_a_response_is_not_matched_past_an_unanswered_request():
    framing, _, expected = _three_requests()
    with pytest.raises(CorrelationIdError, match="answered request 2 before request 1") as raised:
        framing.receive_data(_end_txn_response(0) + _end_txn_response(2))
    assert _outcomes(raised.value.responses) == expected[:1]
    assert isinstance(raised.value, RetriableError)


def test_a_request_that_expects_no_response_is_skipped_even_if_answered():
    """acks=0 produce: nothing waits for it. A broker that answers anyway is not an error,
    and the requests around it still get their own responses."""
    framing = Framing(None, "broker:9092")
    before = framing.send_request(ApiKey.END_TXN, 0, END_TXN)[1]
    frame, unanswered = framing.send_request(ApiKey.PRODUCE, 3, ACKS_0, expect_response=False)
    after = framing.send_request(ApiKey.END_TXN, 0, END_TXN)[1]
    assert struct.unpack_from(">i", frame, 8)[0] == unanswered == before + 1
    got = framing.receive_data(_end_txn_response(before) + _end_txn_response(unanswered) +
                               _end_txn_response(after))
    assert [r.correlation_id for r in got] == [before, after]
    assert framing.receive_data(_end_txn_response(unanswered)) == []  # again: still dropped

