"""Fuzzing the response decoders, briefly (a fixed seed, a bounded count: a few seconds in
CI), with the two implementations of the Produce response decoder held to each other.

Every response the client reads is made from its schema with random content, then mutated
(bytes flipped, cut, inserted, lengths set to -1 or huge). Whatever the bytes, decoding gives
a dict or raises CorruptMessageError (UnsupportedVersionError for ApiVersions' fallback),
never another exception, a crash or a hang, and a dict holds None only where the schema
allows null (a negative length elsewhere is corrupt, not None). For Produce responses the compiled decoder
either declines (None: the generated codec decides) or returns exactly what the generated
codec returns. A longer run of the same target, under AddressSanitizer and UBSan: see
tests/README.md.
"""

from __future__ import annotations

import functools
import os
import random
import struct
import time
from typing import Any

import pytest

from aioproducer.errors import CorruptMessageError, UnsupportedVersionError
from aioproducer.protocol import messages
from aioproducer.protocol.messages import CLIENT_VERSIONS, ApiKey, decode_response
from aioproducer.protocol.primitives import Field, compile_writer

try:
    from aioproducer._speedups import _c
except ImportError:  # test_speedups says why
    _c = None

# Mutated frames per run; FUZZ_CASES=1000000 for a long run (tests/README.md).
CASES = int(os.environ.get("FUZZ_CASES", "4000"))
SEED = int(os.environ.get("FUZZ_SEED", "40"))


def _value(rng: random.Random, kind: Any, version: int, nullable: bool) -> Any:
    if isinstance(kind, tuple):
        return [_struct(rng, kind, version) for _ in range(rng.randrange(4))]
    if kind.startswith("["):
        return [_value(rng, kind[1:-1], version, False) for _ in range(rng.randrange(4))]
    if nullable and rng.random() < 0.2:
        return None
    if kind in ("int8", "int16", "int32", "int64"):
        bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}[kind]
        return rng.choice([0, -1, 1, rng.randrange(-(1 << bits - 1), 1 << bits - 1)])
    if kind == "uint16":
        return rng.randrange(1 << 16)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "string":
        return rng.choice(["", "t", "topic-é", "x" * rng.randrange(40)])
    if kind in ("bytes", "records"):
        return os.urandom(rng.randrange(30)) if rng.random() < 0.8 else b""
    if kind == "uuid":
        return rng.randbytes(16)
    raise AssertionError(kind)


def _struct(rng: random.Random, fields: tuple[Field, ...], version: int) -> dict[str, Any]:
    return {f.name: _value(rng, f.kind, version, version >= f.nullable_from)
            for f in fields if f.versions[0] <= version <= f.versions[1] and f.tag is None}


@functools.lru_cache(maxsize=None)
def _writer(api_key: ApiKey, version: int) -> Any:
    flexible = version >= messages.FLEXIBLE_FROM[api_key]
    return compile_writer(messages._RESPONSES[api_key], version, flexible)


def _frame(api_key: ApiKey, version: int, body: dict[str, Any]) -> bytes:
    parts: list[bytes] = [struct.pack(">i", 7)]
    if version >= messages.FLEXIBLE_FROM[api_key] and api_key != ApiKey.API_VERSIONS:
        parts.append(b"\x00")  # response header v1: no tagged fields
    _writer(api_key, version)(parts, body)
    return b"".join(parts)


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randrange(1, 4)):
        choice = rng.randrange(6)
        at = rng.randrange(len(data) + 1)
        if choice == 0 and data:  # flip a byte
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif choice == 1:  # cut
            del data[at:]
        elif choice == 2:  # insert
            data[at:at] = os.urandom(rng.randrange(1, 6))
        elif choice == 3 and at + 4 <= len(data):  # a 32-bit length of -1 or huge
            data[at:at + 4] = struct.pack(">i", rng.choice([-1, -2, 0x7FFFFFFF, 1 << 20]))
        elif choice == 4 and at + 2 <= len(data):  # a 16-bit one
            data[at:at + 2] = struct.pack(">h", rng.choice([-1, -2, 0x7FFF]))
        elif at < len(data):  # a varint's byte: 0 (null) or a continuation
            data[at] = rng.choice([0x00, 0x80, 0xFF])
    return bytes(data)


def _conforms(fields: tuple[Field, ...], version: int, value: dict[str, Any]) -> None:
    """Every field of the version is there, and None only where the schema allows null."""
    for f in fields:
        if not f.versions[0] <= version <= f.versions[1] or f.tag is not None:
            continue
        item = value[f.name]
        if item is None:
            assert version >= f.nullable_from or f.kind == "records", f"{f.name} is None"
        elif isinstance(f.kind, tuple):
            for element in item:
                _conforms(f.kind, version, element)
        elif f.kind.startswith("["):
            assert None not in item, f"{f.name} holds None"


def _decoded(api_key: ApiKey, version: int, frame: bytes) -> dict[str, Any] | str:
    """The generated codec's answer, or "corrupt"; any other exception fails the test."""
    try:
        return messages._decode_response(api_key, version, frame)
    except (CorruptMessageError, UnsupportedVersionError):
        return "corrupt"


def test_every_decoder_survives_mutated_responses():
    rng = random.Random(SEED)
    kinds = [(api_key, version) for api_key, (low, high) in CLIENT_VERSIONS.items()
             for version in range(low, high + 1)]
    # A bound, not a speed assertion: a hang fails (a long run gets proportionally longer).
    deadline = time.monotonic() + 60 * max(1, CASES / 4000)
    outcomes = {"decoded": 0, "corrupt": 0}
    for _ in range(CASES):
        api_key, version = rng.choice(kinds)
        frame = _frame(api_key, version, _struct(rng, messages._RESPONSES[api_key], version))
        assert decode_response(api_key, version, frame) is not None  # the unmutated one
        try:
            body = decode_response(api_key, version, _mutate(rng, frame))
        except (CorruptMessageError, UnsupportedVersionError):
            outcomes["corrupt"] += 1
        else:
            if api_key == ApiKey.API_VERSIONS and body["error_code"] == 35:
                version = 0  # (a broker's fallback: decoded as v0)
            _conforms(messages._RESPONSES[api_key], version, body)
            outcomes["decoded"] += 1
        assert time.monotonic() < deadline
    assert min(outcomes.values()) > CASES // 20, outcomes  # both paths were exercised


@pytest.mark.skipif(_c is None, reason="the C speed-up did not build")
def test_the_c_and_python_produce_decoders_agree_on_mutated_responses():
    rng = random.Random(SEED + 1)
    schema = messages._RESPONSES[ApiKey.PRODUCE]
    low, high = CLIENT_VERSIONS[ApiKey.PRODUCE]
    agreed = 0
    for _ in range(CASES):
        version = rng.randrange(low, high + 1)
        body = _struct(rng, schema, version)
        for topic in body["responses"]:  # what the C decoder takes: no record errors
            for partition in topic["partition_responses"]:
                partition["record_errors"] = []
        frame = _frame(ApiKey.PRODUCE, version, body)
        for candidate in (frame, _mutate(rng, frame)):
            ours = _c.decode_produce(version, candidate)
            theirs = _decoded(ApiKey.PRODUCE, version, candidate)
            if ours is not None:
                assert ours == theirs, (version, candidate.hex())
                agreed += 1
    assert agreed > CASES // 2  # the C decoder took most of them, not declined them all


@pytest.mark.parametrize("version", [8, 9])
def test_a_null_array_in_a_produce_response_is_corrupt_in_both_decoders(version):
    """A negative count for `responses` (not nullable): the C decoder declines it, and the
    generated codec raises CorruptMessageError, where it gave None (and a TypeError later)."""
    frame = _frame(ApiKey.PRODUCE, version, {"responses": [], "throttle_time_ms": 0})
    position = 4 + (version >= 9)
    nulled = frame[:position] + (b"\x00" if version >= 9 else b"\xff\xff\xff\xff") + \
        frame[position + (1 if version >= 9 else 4):]
    if _c is not None:
        assert _c.decode_produce(version, nulled) is None
    with pytest.raises(CorruptMessageError, match="responses is null"):
        decode_response(ApiKey.PRODUCE, version, nulled)
